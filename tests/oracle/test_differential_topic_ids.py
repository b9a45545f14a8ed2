"""Differential scenarios of the APIs that name topics by id (KIP-516) as Kafka 4.4 serves
them: Produce v13, OffsetCommit and OffsetFetch v10. A known id works as its name does; an
unknown id (or the zero id) is answered UNKNOWN_TOPIC_ID per partition (refused before the
group coordinator; never auto-created), and an all-topics fetch names topics by id."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing.oracle import Outcome, Side, transient

Run = Callable[..., Outcome]

UNKNOWN = uuid.UUID(int=12345)
ZERO = uuid.UUID(int=0)


def _topic_id(s: Side, topic: str) -> uuid.UUID:
    k, v = ApiKey.METADATA, 12
    t = make_request(k, v, "MetadataRequestTopic", topic_id=None, name=topic)
    req = make_request(k, v, "MetadataRequest", topics=(t,), allow_auto_topic_creation=False,
                       include_topic_authorized_operations=False)  # fmt: skip
    return s.conn.request(k, v, req).topics[0].topic_id  # type: ignore[no-any-return]


def _commit(s: Side, label: str, group: str, v: int, topics: list[tuple[Any, list[int]]]) -> None:
    k = ApiKey.OFFSET_COMMIT
    key = "topic_id" if v >= 10 else "name"
    req = make_request(
        k, v, "OffsetCommitRequest", group_id=group, generation_id_or_member_epoch=-1,
        member_id="", group_instance_id=None, retention_time_ms=-1,
        topics=tuple(
            make_request(k, v, "OffsetCommitRequestTopic", **{key: t}, partitions=tuple(
                make_request(k, v, "OffsetCommitRequestPartition", partition_index=p,
                             committed_offset=10 + p, committed_leader_epoch=-1,
                             committed_metadata=f"m{p}")
                for p in parts
            ))
            for t, parts in topics
        ),
    )  # fmt: skip
    s.call(label, k, v, req, retry=transient)


def _fetch(s: Side, label: str, group: str, v: int, topics: list[tuple[Any, list[int]]] | None):  # type: ignore[no-untyped-def]
    k = ApiKey.OFFSET_FETCH
    key = "topic_id" if v >= 10 else "name"
    asked = None if topics is None else tuple(
        make_request(k, v, "OffsetFetchRequestTopics", **{key: t}, partition_indexes=tuple(parts))
        for t, parts in topics
    )  # fmt: skip
    g = make_request(k, v, "OffsetFetchRequestGroup", group_id=group, member_id=None,
                     member_epoch=-1, topics=asked)  # fmt: skip
    req = make_request(k, v, "OffsetFetchRequest", groups=(g,), require_stable=False)
    s.call(label, k, v, req, retry=transient)


def test_offset_commit_and_fetch_by_topic_id(differential: Run) -> None:
    def scenario(s: Side) -> None:
        group, topic = s.unique("g"), s.unique("t")
        s.create_topic(topic, 2)
        tid = _topic_id(s, topic)
        s.find_coordinator("coordinator", group, key_type=0)
        _commit(s, "commit-v10", group, 10, [(tid, [0, 7]), (UNKNOWN, [0]), (ZERO, [1])])
        _commit(s, "commit-v9-by-name", group, 9, [(topic, [1])])
        _fetch(s, "fetch-v10-by-id", group, 10, [(tid, [0, 1, 7]), (UNKNOWN, [0])])
        _fetch(s, "fetch-v10-unknown-only", group, 10, [(UNKNOWN, [0, 1])])
        _fetch(s, "fetch-v10-all", group, 10, None)
        _fetch(s, "fetch-v9-all", group, 9, None)

    differential(scenario)


def _batch(*values: bytes) -> bytes:
    return build_batch([NewRecord(value=v, timestamp=1_700_000_000_000) for v in values])


def test_produce_by_topic_id(differential: Run) -> None:
    def scenario(s: Side) -> None:
        topic = s.unique("t")
        s.create_topic(topic, 2)
        tid = _topic_id(s, topic)
        s.produce("v13-known", {(tid, 0): _batch(b"a", b"b"), (tid, 1): _batch(b"c")}, version=13)
        s.produce("v13-unknown-partition", {(tid, 5): _batch(b"d")}, version=13)
        s.produce("v13-unknown-id", {(UNKNOWN, 0): _batch(b"e")}, version=13)
        s.produce("v13-zero-id", {(ZERO, 0): _batch(b"f")}, version=13)
        s.produce("v13-mixed", {(tid, 0): _batch(b"g"), (UNKNOWN, 1): _batch(b"h")}, version=13)
        s.produce("v12-by-name", {(topic, 0): _batch(b"i")}, version=12)
        s.fetch("read-back", {(topic, 0): 0, (topic, 1): 0})

    differential(scenario)
