"""Client batches whose records are malformed, against Kafka 4.4 and samsa side by side.

Every batch here has a valid header and CRC-32C: only its records are wrong. Each is sent to
both brokers with Produce v11; the error code and what the partition's end offset moved by
must be Kafka's, except where docs/semantics.md records a deviation (D-REC-1..3), which the
tests below assert exactly. Before these checks samsa read no record of a batch on a plain
topic and answered 0 to every case here.
"""

from __future__ import annotations

import gzip
import random
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cramjam
import crc32c
import lz4.frame
import pytest
import zstandard
from confluent_kafka import Consumer, TopicPartition

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import Compression, _zigzag_varint, encode_record
from samsa.testing import init_producer_id, produce_request
from samsa.testing.kafka import KafkaNode

INFLATED_LIMIT = 4 * 1024 * 1024  # samsa's message.max.inflated.bytes in this module
PLAIN = "plain"
COMPACTED = "compacted"


def _varint(v: int) -> bytes:
    out = bytearray()
    _zigzag_varint(v, out)
    return bytes(out)


def _batch(
    records: bytes,
    count: int,
    *,
    codec: int = Compression.NONE,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    max_ts: int | None = None,
) -> bytes:
    """A v2 batch around ``records`` (already in ``codec``) with a valid header and CRC."""
    now = int(time.time() * 1000)
    after = struct.pack(
        ">hiqqqhii",
        codec,
        count - 1,
        now,
        now if max_ts is None else max_ts,
        pid,
        epoch,
        seq,
        count,
    )
    after += records
    return struct.pack(">qiibI", 0, len(after) + 9, 0, 2, crc32c.crc32c(after)) + after


def _rec(delta: int, key: bytes | None = b"k", ts: int = 0, value: bytes = b"v") -> bytes:
    return encode_record(delta, ts, key, value)


def _fields(body: bytes) -> bytes:
    """A record of raw field bytes (after its length)."""
    return _varint(len(body)) + body


_NO_HEADER_FIELDS = b"\x00" + _varint(0) + _varint(0) + _varint(1) + b"k" + _varint(1) + b"v"
_SEEDED = random.Random(27)

# name -> (topic, batch, Kafka's code); samsa must answer the same and write the same.
CASES: dict[str, tuple[str, bytes, int]] = {
    "valid": (PLAIN, _batch(_rec(0) + _rec(1), 2), 0),
    "valid gzip": (PLAIN, _batch(gzip.compress(_rec(0)), 1, codec=Compression.GZIP), 0),
    "random bytes labelled gzip": (
        PLAIN,
        _batch(_SEEDED.randbytes(200), 1, codec=Compression.GZIP),
        ErrorCode.UNKNOWN_SERVER_ERROR,
    ),
    "random bytes labelled zstd": (
        PLAIN,
        _batch(_SEEDED.randbytes(200), 1, codec=Compression.ZSTD),
        ErrorCode.UNKNOWN_SERVER_ERROR,
    ),
    "random bytes labelled lz4": (
        PLAIN,
        _batch(_SEEDED.randbytes(200), 1, codec=Compression.LZ4),
        ErrorCode.UNKNOWN_SERVER_ERROR,
    ),
    "random bytes labelled snappy": (
        PLAIN,
        _batch(b"\x05" + _SEEDED.randbytes(200), 1, codec=Compression.SNAPPY),
        ErrorCode.UNKNOWN_SERVER_ERROR,
    ),
    "truncated gzip": (
        PLAIN,
        _batch(
            gzip.compress(b"".join(_rec(i) for i in range(100)))[:40], 100, codec=Compression.GZIP
        ),
        ErrorCode.UNKNOWN_SERVER_ERROR,
    ),
    "claims 1,000,000 records, holds one": (PLAIN, _batch(_rec(0), 1_000_000), 87),
    "claims 1,000,000 records, holds one, gzip": (
        PLAIN,
        _batch(gzip.compress(_rec(0)), 1_000_000, codec=Compression.GZIP),
        ErrorCode.INVALID_RECORD,
    ),
    "one record more than declared": (PLAIN, _batch(_rec(0) + _rec(1), 1), 87),
    "one record more than declared, zstd": (
        PLAIN,
        _batch(bytes(cramjam.zstd.compress(_rec(0) + _rec(1))), 1, codec=Compression.ZSTD),
        ErrorCode.INVALID_RECORD,
    ),
    "record length past the batch": (PLAIN, _batch(_varint(50) + _rec(0)[1:], 1), 87),
    "record length longer than its fields": (
        PLAIN,
        _batch(_fields(_NO_HEADER_FIELDS + _varint(0) + b"\x00\x00"), 1),
        ErrorCode.INVALID_RECORD,
    ),
    "record length longer than its fields, gzip": (
        PLAIN,
        _batch(
            gzip.compress(_fields(_NO_HEADER_FIELDS + _varint(0) + b"\x00\x00")),
            1,
            codec=Compression.GZIP,
        ),
        ErrorCode.INVALID_RECORD,
    ),
    "negative header count": (PLAIN, _batch(_fields(_NO_HEADER_FIELDS + _varint(-2)), 1), 87),
    "negative header key length": (
        PLAIN,
        _batch(_fields(_NO_HEADER_FIELDS + _varint(1) + _varint(-1) + _varint(1) + b"x"), 1),
        ErrorCode.INVALID_RECORD,
    ),
    "negative header key length, lz4": (
        PLAIN,
        _batch(
            lz4.frame.compress(  # frame flags Kafka's KafkaLZ4BlockInputStream reads
                _fields(_NO_HEADER_FIELDS + _varint(1) + _varint(-1) + _varint(1) + b"x"),
                block_linked=False,
                store_size=False,
            ),
            1,
            codec=Compression.LZ4,
        ),
        ErrorCode.INVALID_RECORD,
    ),
    "offset delta varint of six bytes": (
        PLAIN,
        _batch(_fields(b"\x00" + _varint(0) + b"\x80\x80\x80\x80\x80\x00" + b"\x02k\x02v\x00"), 1),
        ErrorCode.INVALID_RECORD,
    ),
    # Kafka reads any negative length as a null key (Utils.readBytes): accepted
    "key length -5": (PLAIN, _batch(_fields(b"\x00\x00\x00" + _varint(-5) + b"\x02v\x00"), 1), 0),
    "a timestamp out of the window, the header's max timestamp lying": (
        PLAIN,
        _batch(_rec(0) + _rec(1, ts=10**12), 2),
        ErrorCode.INVALID_TIMESTAMP,
    ),
    "keyless records on a compacted topic": (
        COMPACTED,
        _batch(_rec(0, key=None) + _rec(1) + _rec(2, key=None), 3),
        ErrorCode.INVALID_RECORD,
    ),
    "a keyless record on a compacted topic, snappy": (
        COMPACTED,
        _batch(bytes(cramjam.snappy.compress_raw(_rec(0, key=None))), 1, codec=Compression.SNAPPY),
        ErrorCode.INVALID_RECORD,
    ),
}


class _Side:
    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.split(":")
        self.bootstrap = bootstrap
        self.conn = BlockingConnection(host, int(port))
        for topic, configs in ((PLAIN, {}), (COMPACTED, {"cleanup.policy": "compact"})):
            assert self.create(topic, configs) == 0

    def create(self, topic: str, configs: dict[str, str]) -> int:
        v = 7
        cfg = tuple(
            make_request(ApiKey.CREATE_TOPICS, v, "CreatableTopicConfig", name=k, value=val)
            for k, val in configs.items()
        )
        t = make_request(
            ApiKey.CREATE_TOPICS,
            v,
            "CreatableTopic",
            name=topic,
            num_partitions=1,
            replication_factor=1,
            assignments=(),
            configs=cfg,
        )
        req = make_request(
            ApiKey.CREATE_TOPICS,
            v,
            "CreateTopicsRequest",
            topics=(t,),
            timeout=10_000,
            validate_only=False,
        )
        return int(self.conn.request(ApiKey.CREATE_TOPICS, v, req).topics[0].error_code)

    def end_offset(self, topic: str) -> int:
        v = 7
        part = make_request(
            ApiKey.LIST_OFFSETS, v, "ListOffsetsPartition", partition_index=0, timestamp=-1
        )
        t = make_request(ApiKey.LIST_OFFSETS, v, "ListOffsetsTopic", name=topic, partitions=(part,))
        req = make_request(
            ApiKey.LIST_OFFSETS,
            v,
            "ListOffsetsRequest",
            replica_id=-1,
            isolation_level=0,
            topics=(t,),
        )
        resp = self.conn.request(ApiKey.LIST_OFFSETS, v, req)
        return int(resp.topics[0].partitions[0].offset)

    def produce(self, topic: str, batch: bytes) -> tuple[int, int, Any]:
        """(error code, records written, the partition's response)."""
        before = self.end_offset(topic)
        resp = self.conn.request(
            ApiKey.PRODUCE, 11, produce_request({(topic, 0): batch}, version=11)
        )
        p = resp.responses[0].partition_responses[0]
        return int(p.error_code), self.end_offset(topic) - before, p

    def init_producer_id(self) -> int:
        deadline = time.monotonic() + 30
        while True:  # Kafka's transaction coordinator loads its partitions first
            code, pid, _ = init_producer_id(self.conn)
            if code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert code == 0
        return pid


@pytest.fixture(scope="module")
def sides(kafka: KafkaNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, _Side]]:
    samsa = BrokerProcess(
        tmp_path_factory.mktemp("samsa"),
        {"message.max.inflated.bytes": str(INFLATED_LIMIT)},
    ).start()
    try:
        both = {"kafka": _Side(kafka.bootstrap), "samsa": _Side(samsa.bootstrap)}
        time.sleep(1)  # Kafka's new partitions get their leader
        yield both
        for side in both.values():
            side.conn.close()
    finally:
        samsa.stop()


@pytest.mark.parametrize("name", list(CASES))
def test_malformed_records_get_kafkas_answer_and_write_nothing(
    sides: dict[str, _Side], name: str
) -> None:
    topic, batch, expected = CASES[name]
    kafka_code, kafka_written, _ = sides["kafka"].produce(topic, batch)
    samsa_code, samsa_written, _ = sides["samsa"].produce(topic, batch)
    assert kafka_code == expected, "Kafka's answer changed: update the case"
    assert (samsa_code, samsa_written) == (kafka_code, kafka_written)
    assert samsa_written == (0 if expected else int.from_bytes(batch[57:61], "big"))


def test_d_rec_1_offset_deltas_other_than_0_to_n_are_refused(sides: dict[str, _Side]) -> None:
    """Kafka stores an uncompressed batch whose records say offset deltas 5, 6 as it is (a
    consumer then sees offsets the log never assigned) and fails a compressed one with
    UNKNOWN_SERVER_ERROR; samsa refuses both as INVALID_RECORD."""
    plain = _batch(_rec(5) + _rec(6), 2)
    zipped = _batch(gzip.compress(_rec(5) + _rec(6)), 2, codec=Compression.GZIP)
    assert sides["kafka"].produce(PLAIN, plain)[:2] == (0, 2)
    assert sides["kafka"].produce(PLAIN, zipped)[:2] == (ErrorCode.UNKNOWN_SERVER_ERROR, 0)
    for batch in (plain, zipped):
        assert sides["samsa"].produce(PLAIN, batch)[:2] == (ErrorCode.INVALID_RECORD, 0)


def test_d_rec_2_records_inflating_past_the_bound_are_refused(sides: dict[str, _Side]) -> None:
    """A zstd batch of ~1 KB whose one record inflates to 5 MiB: Kafka stores it; samsa
    (message.max.inflated.bytes = 4 MiB here) refuses it as MESSAGE_TOO_LARGE, and so a zstd
    frame asking for a window over 16 MiB."""
    bomb = _batch(
        bytes(cramjam.zstd.compress(_rec(0, value=bytes(5 << 20)), level=19)),
        1,
        codec=Compression.ZSTD,
    )
    assert len(bomb) < 4096
    assert sides["kafka"].produce(PLAIN, bomb)[:2] == (0, 1)
    code, written, p = sides["samsa"].produce(PLAIN, bomb)
    assert (code, written) == (ErrorCode.MESSAGE_TOO_LARGE, 0)
    assert "message.max.inflated.bytes" in p.error_message
    # a zstd frame asking the decoder for 32 MiB of history (Kafka's zstd-jni allows 128)
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=25)
    cobj = zstandard.ZstdCompressor(compression_params=params).compressobj()
    wide = _batch(cobj.compress(_rec(0)) + cobj.flush(), 1, codec=Compression.ZSTD)
    assert sides["kafka"].produce(PLAIN, wide)[:2] == (0, 1)
    code, written, p = sides["samsa"].produce(PLAIN, wide)
    assert (code, written) == (ErrorCode.MESSAGE_TOO_LARGE, 0) and "window" in p.error_message


def test_d_rec_3_a_producer_id_never_issued_is_refused(sides: dict[str, _Side]) -> None:
    """Kafka's partition leader cannot know which ids its controller handed out and accepts
    any; samsa issues every id itself and refuses one it never issued as UNKNOWN_PRODUCER_ID.
    An issued id is accepted by both."""
    for name, side in sides.items():
        never = side.init_producer_id() + 10_000  # past any id issued (blocks of 1000)
        code, written, _ = side.produce(PLAIN, _batch(_rec(0), 1, pid=never, epoch=0, seq=0))
        expected = 0 if name == "kafka" else ErrorCode.UNKNOWN_PRODUCER_ID
        assert (code, written) == (expected, 1 if name == "kafka" else 0), name
        issued = side.init_producer_id()
        assert side.produce(PLAIN, _batch(_rec(0), 1, pid=issued, epoch=0, seq=0))[:2] == (0, 1)


def test_a_consumer_reads_past_what_was_refused(sides: dict[str, _Side], tmp_path: Path) -> None:
    """Random bytes labelled gzip used to be stored, and librdkafka then failed on them at
    their offset for good. Refused, they leave nothing for a consumer to trip on."""
    samsa = sides["samsa"]
    topic = "after-refusal"
    assert samsa.create(topic, {}) == 0
    assert samsa.produce(topic, _batch(random.Random(1).randbytes(300), 1, codec=1))[0] != 0
    assert samsa.produce(topic, _batch(_rec(0, value=b"good"), 1))[:2] == (0, 1)
    c = Consumer(
        {"bootstrap.servers": samsa.bootstrap, "group.id": "g", "enable.auto.commit": False}
    )
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 20
        got = None
        while got is None and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got = msg.value()
        assert got == b"good"
    finally:
        c.close()
