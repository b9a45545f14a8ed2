"""Bytes flipped in the files of a stopped broker (clean stop or SIGKILL), then a restart:
corruption is detected, not served or believed.

* ``__consumer_offsets``: a committed offset whose record was damaged is never returned as
  another number; the previous commit stands.
* ``__transaction_state``: InitProducerId never returns another producer's id; when the
  record of a transactional id's newest instance is cut, that instance is fenced and the next
  one gets a producer id nobody held.
* a user partition: a damaged batch is cut (with an error in the broker's log), not served.
* an index entry off a batch boundary: fetches over its range work (the index is rebuilt)
  instead of closing the connection on every restart.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import HEADER_SIZE, NewRecord, RecordBatchView, build_batch
from samsa.testing import (
    FETCH_VERSION,
    add_partitions_to_txn,
    create_topic,
    fetch_request,
    init_producer_id,
    produce_one,
)

T = 15.0
TOPIC = "flips"


def _conn(port: int) -> BlockingConnection:
    return BlockingConnection("127.0.0.1", port, timeout=5.0)


def _batches(log_file: Path) -> list[tuple[int, RecordBatchView]]:
    data = log_file.read_bytes()
    out, pos = [], 0
    while pos < len(data):
        view = RecordBatchView(data, pos)
        out.append((pos, view))
        pos += view.size
    return out


def _flip_in_batch(log_file: Path, index: int, needle: bytes) -> None:
    """Flip the lowest bit of the last byte of ``needle`` in the records of batch ``index``."""
    pos, view = _batches(log_file)[index]
    data = bytearray(log_file.read_bytes())
    at = data.index(needle, pos + HEADER_SIZE, pos + view.size)
    data[at + len(needle) - 1] ^= 0x01
    log_file.write_bytes(bytes(data))


def _only_segment(data_dir: Path, topic: str, partition: int = 0) -> Path:
    (path,) = sorted((data_dir / f"{topic}-{partition}").glob("*.log"))
    return path


# -- __consumer_offsets -------------------------------------------------------------------------


def test_a_damaged_committed_offset_is_not_returned_as_another_number(
    broker_factory: type[BrokerProcess],
) -> None:
    b = broker_factory(overrides={"offsets.topic.num.partitions": "1"}).start()
    with _conn(b.port) as conn:
        assert create_topic(conn, TOPIC) == 0
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g", "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(TOPIC, 0, 12000)], asynchronous=False)
        c.commit(offsets=[TopicPartition(TOPIC, 0, 12345)], asynchronous=False)
    finally:
        c.close()
    b.stop()
    offsets_log = _only_segment(b.data_dir, "__consumer_offsets")
    _flip_in_batch(offsets_log, -1, struct.pack(">q", 12345))  # the record now says 12344
    b.start()
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g", "enable.auto.commit": False})
    try:
        (tp,) = c.committed([TopicPartition(TOPIC, 0)], timeout=T)
    finally:
        c.close()
    assert tp.offset == 12000
    assert b.log_contains("damage at rest")


# -- __transaction_state ------------------------------------------------------------------------


def _add_partition(conn: BlockingConnection, txn_id: str, pid: int, epoch: int) -> int:
    return add_partitions_to_txn(conn, txn_id, pid, epoch, TOPIC, (0,))[0]


def _init(conn: BlockingConnection, txn_id: str) -> tuple[int, int]:
    deadline = time.monotonic() + T
    while True:
        error, pid, epoch = init_producer_id(conn, txn_id)
        # Retried as a client does: an open transaction ending, or (right after a restart)
        # the coordinator still replaying the id's partition.
        if error not in (ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS):
            assert error == ErrorCode.NONE
            return pid, epoch
        assert time.monotonic() < deadline
        time.sleep(0.05)


TXN_OVERRIDES = {"transaction.state.log.num.partitions": "1"}


def test_the_previous_instance_is_fenced_after_its_record_is_cut(
    broker_factory: type[BrokerProcess],
) -> None:
    b = broker_factory(overrides=TXN_OVERRIDES).start()
    with _conn(b.port) as conn:
        assert create_topic(conn, TOPIC) == 0
        first = _init(conn, "tx")
        second = _init(conn, "tx")  # the instance whose InitProducerId record gets damaged
        assert second == (first[0], first[1] + 1)
    b.kill()
    state_log = _only_segment(b.data_dir, "__transaction_state")
    _flip_in_batch(state_log, -1, struct.pack(">q", second[0]))
    b.start()
    # Replay (and its fencing) runs once the broker serves.
    assert b.wait_for_log("fencing 1 transactional id(s)")
    with _conn(b.port) as conn:
        # The second instance can do nothing...
        assert _add_partition(conn, "tx", *second) == ErrorCode.PRODUCER_FENCED
        # ... and a third never gets its producer id and epoch.
        third = _init(conn, "tx")
        assert third[0] != second[0]
        assert _add_partition(conn, "tx", *third) == ErrorCode.NONE
        assert _add_partition(conn, "tx", *second) != ErrorCode.NONE


def test_init_producer_id_never_returns_another_producers_id(
    broker_factory: type[BrokerProcess],
) -> None:
    b = broker_factory(overrides=TXN_OVERRIDES).start()
    with _conn(b.port) as conn:
        a = _init(conn, "a")
        b_pid = _init(conn, "b")[0]
    b.stop()
    assert b_pid == a[0] + 1 and b_pid % 2 == 1  # one bit away from a's
    state_log = _only_segment(b.data_dir, "__transaction_state")
    _flip_in_batch(state_log, -1, struct.pack(">q", b_pid))  # b's record now names a's id
    b.start()
    with _conn(b.port) as conn:
        pid, _ = _init(conn, "b")
        assert pid != a[0]


def test_a_damaged_producer_id_block_is_refused_not_reused(
    broker_factory: type[BrokerProcess],
) -> None:
    b = broker_factory().start()
    with _conn(b.port) as conn:
        assert init_producer_id(conn)[:2] == (0, 0)
    b.stop()
    ids = b.data_dir / "producer-ids"
    text = ids.read_bytes()
    assert text.startswith(b"1000 ")
    ids.write_bytes(b"0" + text[1:])  # one bit: the next block would start at 0 again
    with pytest.raises(RuntimeError, match="producer-ids is corrupt"):
        b.start()


# -- user partitions ----------------------------------------------------------------------------


def _batch(i: int) -> bytes:
    return build_batch(
        [NewRecord(value=b"%d-%d" % (i, j) + b"x" * 200, timestamp=0) for j in range(5)]
    )


def _fetch(conn: BlockingConnection, offset: int, max_bytes: int = 10 * 1024 * 1024) -> list[int]:
    """Base offsets of the batches a fetch at ``offset`` returns."""
    resp = conn.request(
        ApiKey.FETCH,
        FETCH_VERSION,
        fetch_request({(TOPIC, 0): offset}, partition_max_bytes=max_bytes),
    )
    (p,) = resp.responses[0].partitions
    assert p.error_code == ErrorCode.NONE
    data = bytes(p.records or b"")
    out, pos = [], 0
    while pos + HEADER_SIZE <= len(data):
        view = RecordBatchView(data, pos)
        if pos + view.size > len(data):
            break
        assert view.crc_is_valid()
        out.append(view.base_offset)
        pos += view.size
    return out


def test_a_damaged_batch_is_cut_not_served(broker_factory: type[BrokerProcess]) -> None:
    b = broker_factory().start()
    with _conn(b.port) as conn:
        assert create_topic(conn, TOPIC) == 0
        for i in range(10):
            assert produce_one(conn, TOPIC, 0, _batch(i)) == (0, 5 * i)
    b.stop()
    _flip_in_batch(_only_segment(b.data_dir, TOPIC), 6, b"6-2")
    b.start()
    assert b.log_contains("CRC mismatch")
    with _conn(b.port) as conn:
        assert _fetch(conn, 0) == [0, 5, 10, 15, 20, 25]


def test_fetch_over_an_index_entry_off_a_batch_boundary_works(
    broker_factory: type[BrokerProcess],
) -> None:
    b = broker_factory(overrides={"log.index.interval.bytes": "1"}).start()
    with _conn(b.port) as conn:
        assert create_topic(conn, TOPIC) == 0
        for i in range(10):
            assert produce_one(conn, TOPIC, 0, _batch(i)) == (0, 5 * i)
    b.stop()
    log_file = _only_segment(b.data_dir, TOPIC)
    index = log_file.with_suffix(".index")
    good = index.read_bytes()
    assert len(good) == 8 * 9  # an entry for every batch after the first
    # The entry for the 5th batch (offsets 20-24) points 9 bytes into it: a fetch from
    # offsets 24-29 starts from it.
    position = _batches(log_file)[4][0]
    with open(index, "r+b") as f:
        f.seek(8 * 3)
        f.write(struct.pack(">ii", 24, position + 9))
    for _ in range(2):  # the damage would have failed every fetch, after every restart
        b.start()
        with _conn(b.port) as conn:
            assert _fetch(conn, 26, 1) == [25]
            assert _fetch(conn, 0) == [5 * i for i in range(10)]
        b.stop()
    assert b.log_contains("is not the start of that batch")
    assert index.read_bytes() == good
