"""``__consumer_offsets`` compacted under the group coordinator: a restart replays the
compacted log into the same committed offsets as the whole history gave, transactional offset
commits (committed and aborted, with plain commits between their records and their markers)
and offset deletions included."""

from __future__ import annotations

import random
import time
from pathlib import Path

from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.coordinator.offsets_records import (
    OffsetCommitKey,
    OffsetCommitValue,
    encode_key,
    encode_value,
)
from samsa.protocol.errors import ErrorCode

OFFSETS = "__consumer_offsets"
GROUPS = ["plain-a", "plain-b", "txn-group"]
PID = 900


def _config(data_dir: Path) -> BrokerConfig:
    return BrokerConfig(
        data_dir=data_dir,
        offsets_topic_num_partitions=1,
        offsets_topic_segment_bytes=2048,  # many segments for a small history
        log_cleaner_enable=False,
        log_cleaner_delete_retention_ms=0,
    )


def _committed(broker: Broker) -> dict[tuple[str, str, int], int]:
    offsets = broker.groups.coordinator.offsets
    return {(g, t, p): v.offset for g in GROUPS for (t, p), v in offsets.committed(g).items()}


def test_offsets_replay_the_same_after_compaction(tmp_path: Path) -> None:
    rng = random.Random(3)
    broker = Broker(_config(tmp_path))
    broker.start()
    broker.groups.ensure_topic()
    logs = broker.coordinator_logs
    epoch = 0
    # What was written, applied as Kafka does, independently of the coordinator's replay: a
    # transaction's offset applies at its COMMIT marker unless a plain commit of the same
    # partition came after it in the log; an abort applies nothing; a tombstone deletes.
    model: dict[tuple[str, str, int], int] = {}
    for _round in range(400):
        group = rng.choice(GROUPS)
        key = OffsetCommitKey(group, "t", rng.randrange(4))
        choice = rng.random()
        if group == "txn-group" and choice < 0.3:
            # A transactional commit, a plain one in between, then COMMIT or ABORT.
            value = OffsetCommitValue(offset=rng.randrange(10**6), commit_timestamp=1)
            appended = logs.append(
                OFFSETS,
                0,
                [(encode_key(key), encode_value(value))],
                producer_id=PID,
                producer_epoch=epoch,
                transactional=True,
            )
            assert appended.error == ErrorCode.NONE
            newer = rng.random() < 0.5
            if newer:
                other = OffsetCommitValue(offset=rng.randrange(10**6), commit_timestamp=1)
                logs.append(OFFSETS, 0, [(encode_key(key), encode_value(other))])
                model[(group, "t", key.partition)] = other.offset
            commit = rng.random() < 0.6
            assert logs.write_marker(OFFSETS, 0, PID, epoch, 0, commit) == ErrorCode.NONE
            if commit and not newer:
                model[(group, "t", key.partition)] = value.offset
        elif group != "txn-group" and choice < 0.1:
            logs.append(OFFSETS, 0, [(encode_key(key), None)])  # offset deleted
            model.pop((group, "t", key.partition), None)
        else:
            value = OffsetCommitValue(offset=rng.randrange(10**6), commit_timestamp=1)
            logs.append(OFFSETS, 0, [(encode_key(key), encode_value(value))])
            model[(group, "t", key.partition)] = value.offset
    # Last records that compaction must not get wrong: an aborted transactional commit over
    # a plain one (the plain one must stay), a committed one (its marker must stay with it).
    plain = OffsetCommitValue(offset=111, commit_timestamp=1)
    logs.append(
        OFFSETS, 0, [(encode_key(OffsetCommitKey("txn-group", "t", 0)), encode_value(plain))]
    )
    model[("txn-group", "t", 0)] = 111
    for partition, commit in ((0, False), (1, True)):
        value = OffsetCommitValue(offset=222 + partition, commit_timestamp=1)
        key = OffsetCommitKey("txn-group", "t", partition)
        logs.append(
            OFFSETS,
            0,
            [(encode_key(key), encode_value(value))],
            producer_id=PID,
            producer_epoch=epoch,
            transactional=True,
        )
        assert logs.write_marker(OFFSETS, 0, PID, epoch, 0, commit) == ErrorCode.NONE
        if commit:
            model[("txn-group", "t", partition)] = 222 + partition
    # A committed transactional offset with a plain commit after it, before its marker: the
    # plain one is newer and stays.
    key = encode_key(OffsetCommitKey("txn-group", "t", 2))
    txn_value = encode_value(OffsetCommitValue(offset=333, commit_timestamp=1))
    logs.append(OFFSETS, 0, [(key, txn_value)], producer_id=PID, producer_epoch=epoch,
                transactional=True)  # fmt: skip
    logs.append(OFFSETS, 0, [(key, encode_value(OffsetCommitValue(444, commit_timestamp=1)))])
    assert logs.write_marker(OFFSETS, 0, PID, epoch, 0, True) == ErrorCode.NONE
    model[("txn-group", "t", 2)] = 444
    broker.close()
    # The whole history, replayed, comes back to what was written; and so does every replay
    # of the compacted log below.
    broker = Broker(_config(tmp_path))
    broker.start()
    expected = _committed(broker)
    assert expected == model
    assert expected[("txn-group", "t", 0)] == 111 and expected[("txn-group", "t", 1)] == 223
    log = broker.topics.topics[OFFSETS].partitions[0].log
    before = sum(s.size for s in log.segments)
    broker.close()
    for pass_ in range(2):  # the second pass removes markers and tombstones the first kept
        broker = Broker(_config(tmp_path))
        broker.start()
        log = broker.topics.topics[OFFSETS].partitions[0].log
        for i in range(60):  # another group's commits: new dirty segments
            value = OffsetCommitValue(offset=i, commit_timestamp=1)
            key = OffsetCommitKey("filler", "t", pass_)
            broker.coordinator_logs.append(OFFSETS, 0, [(encode_key(key), encode_value(value))])
        assert broker.cleaner.clean(log, time.time_ns() // 1_000_000)
        broker.close()
        broker = Broker(_config(tmp_path))
        broker.start()
        try:
            assert _committed(broker) == expected
            log = broker.topics.topics[OFFSETS].partitions[0].log
            after = sum(s.size for s in log.segments)
        finally:
            broker.close()
    assert after < before / 2
