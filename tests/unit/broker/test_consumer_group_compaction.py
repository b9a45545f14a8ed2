"""KIP-848 consumer groups in a compacted ``__consumer_offsets``: after many joins, heartbeats,
leaves and rejoins (tombstones among them), a restart replays the compacted log into the same
groups as the whole history gave (docs/semantics.md, rule 34), and compaction shrinks it."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.coordinator.consumer_group_coordinator import ConsumerHeartbeat
from samsa.protocol.errors import ErrorCode

OFFSETS = "__consumer_offsets"


def _config(data_dir: Path) -> BrokerConfig:
    return BrokerConfig(
        data_dir=data_dir,
        offsets_topic_num_partitions=1,
        offsets_topic_segment_bytes=4096,  # many segments for a small history
        log_cleaner_enable=False,
        log_cleaner_delete_retention_ms=0,
    )


def _groups(broker: Broker) -> dict[str, Any]:
    return {
        k: v
        for k, v in broker.groups.coordinator.durable_state().items()
        if k.startswith("consumer:")
    }


def _churn(broker: Broker, rng: random.Random, rounds: int) -> None:
    epochs: dict[tuple[str, str], int] = {}  # (group, member) -> epoch
    owned: dict[tuple[str, str], Any] = {}
    for _ in range(rounds):
        group = rng.choice(["ga", "gb"])
        member = rng.choice(["m1", "m2", "m3"])
        key = (group, member)
        epoch = epochs.get(key, 0)
        if epoch > 0 and rng.random() < 0.15:
            req = ConsumerHeartbeat(group, member, -1)
            assert broker.groups.consumer_heartbeat(req).error == ErrorCode.NONE
            del epochs[key]
            owned.pop(key, None)
            continue
        req = ConsumerHeartbeat(
            group,
            member,
            epoch,
            rebalance_timeout_ms=60_000 if epoch == 0 else -1,
            subscribed_topic_names=("t",) if epoch == 0 else None,
            owned={} if epoch == 0 else owned.get(key, {}),
        )
        r = broker.groups.consumer_heartbeat(req)
        assert r.error == ErrorCode.NONE, r
        epochs[key] = r.member_epoch
        if r.assignment is not None:
            owned[key] = r.assignment


def test_consumer_groups_replay_the_same_after_compaction(tmp_path: Path) -> None:
    rng = random.Random(5)
    broker = Broker(_config(tmp_path))
    broker.start()
    broker.topics.create("t", 6, int(time.time() * 1000))
    _churn(broker, rng, 300)
    expected = _groups(broker)
    assert expected["consumer:ga"]["members"] and expected["consumer:gb"]["members"]
    broker.close()
    broker = Broker(_config(tmp_path))
    broker.start()
    assert _groups(broker) == expected  # the whole history, replayed
    log = broker.topics.topics[OFFSETS].partitions[0].log
    before = sum(s.size for s in log.segments)
    broker.close()
    for _pass in range(2):  # the second pass removes tombstones the first kept
        broker = Broker(_config(tmp_path))
        broker.start()
        log = broker.topics.topics[OFFSETS].partitions[0].log
        # Another group's heartbeats: new dirty segments, the old ones become cleanable.
        for i in range(40):
            req = ConsumerHeartbeat("filler", f"f{i}", 0, None, None, 60_000, ("t",), owned={})
            assert broker.groups.consumer_heartbeat(req).error == ErrorCode.NONE
        expected = _groups(broker)
        assert broker.cleaner.clean(log, time.time_ns() // 1_000_000)
        broker.close()
        broker = Broker(_config(tmp_path))
        broker.start()
        try:
            assert _groups(broker) == expected
            log = broker.topics.topics[OFFSETS].partitions[0].log
            after = sum(s.size for s in log.segments)
        finally:
            broker.close()
    assert after < before
