"""Differences a real client's integration tests found between samsa and Apache Kafka (issue
22, part 5): each scenario runs the same raw requests against a Kafka node and a samsa
broker and asserts the two answer alike."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import init_producer_id, produce_request
from samsa.testing.kafka import KafkaNode
from samsa.testing.oracle import wait_served


@pytest.fixture(scope="module")
def samsa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("samsa")).start()
    yield b
    b.stop()


def _conn(bootstrap: str) -> BlockingConnection:
    host, port = bootstrap.rsplit(":", 1)
    return BlockingConnection(host, int(port))


def _request(bootstrap: str, key: int, version: int, name: str, **fields: Any) -> Any:
    with _conn(bootstrap) as c:
        return c.request(key, version, make_request(key, version, name, **fields))


def _both(kafka: KafkaNode, samsa: BrokerProcess) -> list[str]:
    return [kafka.bootstrap, samsa.bootstrap]


def _create_topic(
    bootstrap: str, name: str, partitions: int = 1, configs: dict[str, str] | None = None
) -> int:
    k, v = ApiKey.CREATE_TOPICS, 7
    topic = make_request(
        k,
        v,
        "CreatableTopic",
        name=name,
        num_partitions=partitions,
        replication_factor=1,
        assignments=(),
        configs=tuple(
            make_request(k, v, "CreatableTopicConfig", name=n, value=x)
            for n, x in (configs or {}).items()
        ),
    )
    r = _request(bootstrap, k, v, "CreateTopicsRequest", topics=(topic,), timeout=10_000,
                 validate_only=False)  # fmt: skip
    code = int(r.topics[0].error_code)
    if code == 0:  # Kafka acknowledges before the leader serves the partition
        with _conn(bootstrap) as c:
            wait_served(c, name, partitions, who=bootstrap)
    return code


# --- 1. Produce: each keyless record of a compacted topic is listed -------------------------


def test_keyless_records_on_a_compacted_topic_are_listed_by_index(
    kafka: KafkaNode, samsa: BrokerProcess
) -> None:
    ts = int(time.time() * 1000)
    keys = [b"k", None, b"k2", None]
    batch = build_batch([NewRecord(key=k, value=b"v", timestamp=ts) for k in keys])
    answers = []
    for bootstrap in _both(kafka, samsa):
        assert _create_topic(bootstrap, "compacted", configs={"cleanup.policy": "compact"}) == 0
        for version in (8, 9, 11):
            with _conn(bootstrap) as c:
                r = c.request(
                    ApiKey.PRODUCE,
                    version,
                    produce_request({("compacted", 0): batch}, version=version),
                )
            p = r.responses[0].partition_responses[0]
            answers.append(
                (
                    version,
                    int(p.error_code),
                    [(e.batch_index, e.batch_index_error_message) for e in p.record_errors],
                    p.error_message,
                )
            )
    kafka_answers, samsa_answers = answers[:3], answers[3:]
    assert [(i, m) for i, m in kafka_answers[0][2]] == [
        (1, "Compacted topic cannot accept message without key in topic partition compacted-0"),
        (3, "Compacted topic cannot accept message without key in topic partition compacted-0"),
    ]
    assert samsa_answers == kafka_answers


# --- 2. CreateTopics with a manual replica assignment ------------------------------------


def _assigned_topic(name: str, lists: list[list[int]], count: int = -1, factor: int = -1) -> Any:
    k, v = ApiKey.CREATE_TOPICS, 7
    return make_request(
        k,
        v,
        "CreatableTopic",
        name=name,
        num_partitions=count,
        replication_factor=factor,
        assignments=tuple(
            make_request(k, v, "CreatableReplicaAssignment", partition_index=i, broker_ids=tuple(b))
            for i, b in lists
        ),
        configs=(),
    )


def test_manual_replica_assignment_of_the_live_broker_is_taken(
    kafka: KafkaNode, samsa: BrokerProcess
) -> None:
    answers = []
    for bootstrap, me in ((kafka.bootstrap, kafka.node_id), (samsa.bootstrap, 0)):
        cases = [
            _assigned_topic("m-ok", [(0, [me]), (1, [me]), (2, [me])]),
            _assigned_topic("m-ok", [(0, [me])]),  # now it exists
            _assigned_topic("m-unknown", [(0, [me]), (1, [me + 7])]),
            _assigned_topic("m-twice", [(0, [me, me])]),
            _assigned_topic("m-empty", [(0, [])]),
            _assigned_topic("m-count", [(0, [me])], count=1),
            _assigned_topic("m-factor", [(0, [me])], factor=1),
            _assigned_topic("m-gap", [(1, [me])]),
            _assigned_topic("m-again", [(0, [me]), (0, [me])]),
        ]
        answer = []
        for t in cases:
            r = _request(bootstrap, ApiKey.CREATE_TOPICS, 7, "CreateTopicsRequest", topics=(t,),
                         timeout=10_000, validate_only=False)  # fmt: skip
            res = r.topics[0]
            message = (res.error_message or "").replace(f"broker {me + 7}", "broker N")
            message = message.replace(f"broker {me}", "broker ME")
            if "already exists" in message:
                message = "exists"  # the words differ; the code is what clients act on
            answer.append(
                (
                    t.name,
                    int(res.error_code),
                    message,
                    res.num_partitions,
                    res.replication_factor,
                    bool(res.configs),
                )
            )
        meta = _request(bootstrap, ApiKey.METADATA, 12, "MetadataRequest",
                        topics=(make_request(ApiKey.METADATA, 12, "MetadataRequestTopic",
                                             topic_id=None, name="m-ok"),),
                        allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False)  # fmt: skip
        parts = sorted(
            (p.partition_index, tuple(p.replica_nodes) == (me,)) for p in meta.topics[0].partitions
        )
        answers.append((answer, parts))
    assert answers[0][0][0][1:] == (0, "", 3, 1, True)
    assert answers[0][0][2][1:3] == (
        39,
        "The manual partition assignment includes broker N, but no such broker is registered.",
    )
    assert answers[1] == answers[0]


# --- 5. OffsetCommit / TxnOffsetCommit of unknown topics and partitions -------------------


def _find_coordinator(bootstrap: str, key: str, key_type: int = 0) -> None:
    """FindCoordinator until it answers (Kafka creates its internal topic on the first)."""
    k, v = ApiKey.FIND_COORDINATOR, 4
    deadline = time.monotonic() + 30
    while True:
        r = _request(bootstrap, k, v, "FindCoordinatorRequest", key_type=key_type,
                     coordinator_keys=(key,))  # fmt: skip
        if r.coordinators[0].error_code == 0 or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def _until_coordinator(bootstrap: str, group: str, send: Any, timeout: float = 30) -> Any:
    """``send()`` again while Kafka's group coordinator is still loading or not yet known."""
    deadline = time.monotonic() + timeout
    while True:
        _find_coordinator(bootstrap, group)
        answer = send()
        codes = {c for _t, parts in answer for _p, c in parts}
        if not codes & {14, 15, 16} or time.monotonic() > deadline:  # load, available, not coord
            return answer
        time.sleep(0.2)


def _commit_topics(k: int, v: int, prefix: str, topics: list[tuple[str, list[int]]]) -> Any:
    """The topics of an (Txn)OffsetCommit request, each partition at offset 5."""
    return tuple(
        make_request(k, v, f"{prefix}RequestTopic", name=t, partitions=tuple(
            make_request(k, v, f"{prefix}RequestPartition", partition_index=p,
                         committed_offset=5, committed_leader_epoch=-1, committed_metadata="")
            for p in ps))
        for t, ps in topics
    )  # fmt: skip


def _commit(bootstrap: str, version: int, group: str, topics: list[tuple[str, list[int]]]) -> Any:
    k = ApiKey.OFFSET_COMMIT
    request_topics = _commit_topics(k, version, "OffsetCommit", topics)
    extra = {"retention_time_ms": -1} if version < 5 else {}
    r = _request(bootstrap, k, version, "OffsetCommitRequest", group_id=group,
                 generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                 topics=request_topics, **extra)  # fmt: skip
    return [
        (t.name, [(p.partition_index, int(p.error_code)) for p in t.partitions]) for t in r.topics
    ]


def _txn_commit(bootstrap: str, group: str, topics: list[tuple[str, list[int]]]) -> Any:
    k, v = ApiKey.TXN_OFFSET_COMMIT, 5
    with _conn(bootstrap) as c:
        pid = epoch = -1
        for _ in range(100):
            code, pid, epoch = init_producer_id(c, f"txn-{group}")
            if code == 0:
                break
            time.sleep(0.2)
    request_topics = _commit_topics(k, v, "TxnOffsetCommit", topics)
    r = _request(bootstrap, k, v, "TxnOffsetCommitRequest", transactional_id=f"txn-{group}",
                 group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1,
                 member_id="", group_instance_id=None, topics=request_topics)  # fmt: skip
    return [
        (t.name, [(p.partition_index, int(p.error_code)) for p in t.partitions]) for t in r.topics
    ]


def _committed(bootstrap: str, group: str, topics: list[tuple[str, list[int]]]) -> Any:
    k, v = ApiKey.OFFSET_FETCH, 7
    r = _request(bootstrap, k, v, "OffsetFetchRequest", group_id=group, require_stable=False,
                 topics=tuple(make_request(k, v, "OffsetFetchRequestTopic", name=t,
                                           partition_indexes=tuple(ps))
                              for t, ps in topics))  # fmt: skip
    return int(r.error_code), [
        (t.name, [(p.partition_index, p.committed_offset, int(p.error_code)) for p in t.partitions])
        for t in r.topics
    ]


def test_offset_commits_of_unknown_topics_and_partitions_are_refused_and_not_kept(
    kafka: KafkaNode, samsa: BrokerProcess
) -> None:
    asked = [("two", [0, 1, 5]), ("missing", [0])]
    answers = []
    for bootstrap in _both(kafka, samsa):
        assert _create_topic(bootstrap, "two", partitions=2) == 0
        answer = []
        for version in (2, 8, 9):
            group = f"plain-{version}"
            answer.append(
                _until_coordinator(
                    bootstrap, group, partial(_commit, bootstrap, version, group, asked)
                )
            )
            answer.append(_committed(bootstrap, group, asked))
        # every partition refused: nothing reaches the group
        answer.append(_commit(bootstrap, 9, "refused-only", [("missing", [0]), ("two", [9])]))
        _find_coordinator(bootstrap, "txn-txn", key_type=1)
        answer.append(
            _until_coordinator(bootstrap, "txn", partial(_txn_commit, bootstrap, "txn", asked))
        )
        _find_coordinator(bootstrap, "txn-txn-refused", key_type=1)
        answer.append(_txn_commit(bootstrap, "txn-refused", [("missing", [1])]))
        answers.append(answer)
    assert answers[0][0] == [("two", [(5, 3), (0, 0), (1, 0)]), ("missing", [(0, 3)])]
    kept = [("two", [(0, 5, 0), (1, 5, 0), (5, -1, 0)]), ("missing", [(0, -1, 0)])]
    assert answers[0][1] == (0, kept)
    assert answers[1] == answers[0]


# --- 6. A session ends exactly at its deadline ------------------------------------------

_SESSION_MS = 6000  # Kafka's group.min.session.timeout.ms, the shortest it accepts


def _static_member(bootstrap: str, group: str) -> float:
    """Join ``group`` as its one static member, sync and heartbeat; the monotonic time the
    heartbeat's answer came back (the session's deadline is at most that plus the timeout)."""
    _find_coordinator(bootstrap, group)
    with _conn(bootstrap) as c:
        k, v = ApiKey.JOIN_GROUP, 5
        protocol = make_request(k, v, "JoinGroupRequestProtocol", name="range", metadata=b"")
        deadline = time.monotonic() + 30
        while True:
            join = c.request(k, v, make_request(k, v, "JoinGroupRequest", group_id=group,
                             session_timeout=_SESSION_MS, rebalance_timeout=_SESSION_MS,
                             member_id="", group_instance_id=f"{group}-instance",
                             protocol_type="consumer", protocols=(protocol,)))  # fmt: skip
            if join.error_code not in (14, 15, 16) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert join.error_code == 0, join
        k, v = ApiKey.SYNC_GROUP, 3
        assignment = make_request(k, v, "SyncGroupRequestAssignment",
                                  member_id=join.member_id, assignment=b"")  # fmt: skip
        sync = c.request(k, v, make_request(k, v, "SyncGroupRequest", group_id=group,
                         generation_id=join.generation_id, member_id=join.member_id,
                         group_instance_id=f"{group}-instance",
                         assignments=(assignment,)))  # fmt: skip
        assert sync.error_code == 0, sync
        k, v = ApiKey.HEARTBEAT, 3
        beat = c.request(k, v, make_request(k, v, "HeartbeatRequest", group_id=group,
                         generation_id=join.generation_id, member_id=join.member_id,
                         group_instance_id=f"{group}-instance"))  # fmt: skip
        at = time.monotonic()
        assert beat.error_code == 0, beat
        return at


def test_a_static_members_session_is_over_at_its_deadline(
    kafka: KafkaNode, samsa: BrokerProcess
) -> None:
    """Three groups, each deleted 4 ms after its only member's session ended: with the 50 ms
    tick the member was still there (NON_EMPTY_GROUP) unless the tick fell in those 4 ms."""
    answers = []
    for bootstrap in _both(kafka, samsa):
        groups = [f"expiring-{i}" for i in range(3)]
        beats = {g: _static_member(bootstrap, g) for g in groups}
        answer = []
        for g in groups:
            time.sleep(max(0.0, beats[g] + _SESSION_MS / 1000 + 0.004 - time.monotonic()))
            r = _request(bootstrap, ApiKey.DELETE_GROUPS, 2, "DeleteGroupsRequest",
                         groups_names=(g,))  # fmt: skip
            answer.append((g, int(r.results[0].error_code)))
        answers.append(answer)
    assert answers[0] == [(f"expiring-{i}", 0) for i in range(3)]
    assert answers[1] == answers[0]


# --- 4. Dynamic broker keys Kafka accepts and samsa does not use --------------------------

_BROKER = 4


def _incremental_alter(
    bootstrap: str, rtype: int, name: str, ops: list[tuple[str, int, Any]]
) -> Any:
    k, v = ApiKey.INCREMENTAL_ALTER_CONFIGS, 1
    resource = make_request(
        k,
        v,
        "AlterConfigsResource",
        resource_type=rtype,
        resource_name=name,
        configs=tuple(
            make_request(k, v, "AlterableConfig", name=n, config_operation=op, value=x)
            for n, op, x in ops
        ),
    )
    r = _request(bootstrap, k, v, "IncrementalAlterConfigsRequest", resources=(resource,),
                 validate_only=False)  # fmt: skip
    return int(r.responses[0].error_code), r.responses[0].error_message


def _described(bootstrap: str, rtype: int, name: str, keys: tuple[str, ...] | None) -> Any:
    k, v = ApiKey.DESCRIBE_CONFIGS, 4
    resource = make_request(k, v, "DescribeConfigsResource", resource_type=rtype,
                            resource_name=name, configuration_keys=keys)  # fmt: skip
    r = _request(bootstrap, k, v, "DescribeConfigsRequest", resources=(resource,),
                 include_synonyms=True, include_documentation=False)  # fmt: skip
    res = r.results[0]
    return int(res.error_code), res.error_message, sorted(
        (c.name, c.value, c.read_only, c.config_source, c.is_sensitive, c.config_type,
         [(s.name, s.value, s.source) for s in c.synonyms])
        for c in res.configs
    )  # fmt: skip


def test_dynamic_broker_keys_kafka_accepts_are_kept_and_described(
    kafka: KafkaNode, samsa: BrokerProcess
) -> None:
    keys = ("sasl.kerberos.min.time.before.relogin", "num.io.threads", "sasl.jaas.config")
    answers = []
    for bootstrap, me in ((kafka.bootstrap, str(kafka.node_id)), (samsa.bootstrap, "0")):
        answers.append(
            [
                _incremental_alter(bootstrap, _BROKER, me, [(keys[0], 0, "120000")]),
                _incremental_alter(bootstrap, _BROKER, me, [(keys[0], 0, "soon")]),
                _incremental_alter(bootstrap, _BROKER, "", [(keys[0], 0, "90000")]),
                _incremental_alter(bootstrap, _BROKER, "", [(keys[1], 0, "6")]),
                _incremental_alter(bootstrap, _BROKER, me, [(keys[2], 0, "secret")]),
                _incremental_alter(bootstrap, _BROKER, me, [("broker.id", 0, "5")]),
                _described(bootstrap, _BROKER, me, keys),
                _described(bootstrap, _BROKER, "", keys),
            ]
        )
    # D-ADMIN-1: a key Kafka does not know either is kept by Kafka, refused by samsa.
    unknown = [("no.such.broker.key", 0, "1")]
    assert _incremental_alter(kafka.bootstrap, _BROKER, str(kafka.node_id), unknown) == (0, None)
    assert _incremental_alter(samsa.bootstrap, _BROKER, "0", unknown) == (
        42,
        "Unknown broker configs: [no.such.broker.key]",
    )
    assert answers[0][0] == (0, None)
    assert answers[0][6][2][2][:4] == (keys[0], "120000", False, 2)  # DYNAMIC_BROKER_CONFIG
    for kafka_answer, samsa_answer in zip(answers[0], answers[1], strict=True):
        assert samsa_answer == kafka_answer


# --- 3. Config resources of type GROUP --------------------------------------------------

_GROUP = 32


def _alter(bootstrap: str, rtype: int, name: str, configs: list[tuple[str, str]]) -> Any:
    k, v = ApiKey.ALTER_CONFIGS, 2
    resource = make_request(
        k,
        v,
        "AlterConfigsResource",
        resource_type=rtype,
        resource_name=name,
        configs=tuple(make_request(k, v, "AlterableConfig", name=n, value=x) for n, x in configs),
    )
    r = _request(bootstrap, k, v, "AlterConfigsRequest", resources=(resource,),
                 validate_only=False)  # fmt: skip
    return int(r.responses[0].error_code), r.responses[0].error_message


def test_group_configs_are_described_set_and_validated_as_kafka_does(
    kafka: KafkaNode, samsa: BrokerProcess
) -> None:
    sets = [
        [("consumer.session.timeout.ms", 0, "50000")],
        [("consumer.session.timeout.ms", 0, "5000")],  # below the broker's minimum
        [("consumer.session.timeout.ms", 0, "abc")],
        [
            ("consumer.heartbeat.interval.ms", 0, "7000"),
            ("consumer.session.timeout.ms", 0, "55000"),
        ],
        [("no.such.key", 0, "1")],
        [("share.auto.offset.reset", 0, "earliest")],
        [("share.auto.offset.reset", 0, "bogus")],
        [("share.isolation.level", 0, "read_committed")],
        [("share.isolation.level", 0, "sometimes")],
        [("share.delivery.count.limit", 0, "1")],
        [("streams.num.standby.replicas", 0, "3")],
        [("streams.rack.aware.assignment.tags", 2, "rack")],
        [("consumer.session.timeout.ms", 2, "1")],
        [("consumer.session.timeout.ms", 0, None)],
        [("consumer.heartbeat.interval.ms", 1, None)],
        [("errors.deadletterqueue.topic.name", 0, "dlq")],
    ]
    answers = []
    for bootstrap in _both(kafka, samsa):
        answer: list[Any] = [_described(bootstrap, _GROUP, "no-such-group", None)]
        answer += [_incremental_alter(bootstrap, _GROUP, "configured", ops) for ops in sets]
        answer.append(
            _alter(bootstrap, _GROUP, "replaced", [("share.session.timeout.ms", "50000")])
        )
        answer.append(_incremental_alter(bootstrap, _GROUP, "", sets[0]))
        answer.append(_described(bootstrap, _GROUP, "configured", None))
        answer.append(_described(bootstrap, _GROUP, "replaced", ("share.session.timeout.ms", "x")))
        answer.append(_described(bootstrap, _GROUP, "", None))
        answers.append(answer)
    described = {c[0]: c for c in answers[0][-3][2]}
    assert described["consumer.session.timeout.ms"][1:4] == ("55000", False, 8)  # GROUP_CONFIG
    assert len(answers[0][0][2]) == 21
    for kafka_answer, samsa_answer in zip(answers[0], answers[1], strict=True):
        assert samsa_answer == kafka_answer


def _consumer_heartbeat_interval(bootstrap: str, group: str) -> int:
    """A new member's ConsumerGroupHeartbeat: the heartbeat interval the group gives it."""
    _find_coordinator(bootstrap, group)
    k, v = ApiKey.CONSUMER_GROUP_HEARTBEAT, 0
    request = make_request(k, v, "ConsumerGroupHeartbeatRequest", group_id=group,
                           member_id=str(uuid.uuid4()), member_epoch=0, instance_id=None,
                           rack_id=None, rebalance_timeout=30_000,
                           subscribed_topic_names=("two",), server_assignor=None,
                           topic_partitions=())  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        with _conn(bootstrap) as c:
            r = c.request(k, v, request)
        if r.error_code not in (14, 15, 16) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.error_code == 0, r
    return int(r.heartbeat_interval.total_seconds() * 1000)


def test_a_groups_own_heartbeat_interval_applies_and_survives_a_restart(
    kafka: KafkaNode, samsa: BrokerProcess
) -> None:
    answers = []
    for bootstrap in _both(kafka, samsa):
        ops = [("consumer.heartbeat.interval.ms", 0, "7000")]
        assert _incremental_alter(bootstrap, _GROUP, "own-interval", ops) == (0, None)
        answers.append(
            (
                _consumer_heartbeat_interval(bootstrap, "own-interval"),
                _consumer_heartbeat_interval(bootstrap, "default-interval"),
            )
        )
    assert answers == [(7000, 5000), (7000, 5000)]
    samsa.stop()
    samsa.start()  # kept on disk, as Kafka keeps it in its metadata log
    assert _consumer_heartbeat_interval(samsa.bootstrap, "own-interval") == 7000
    kept = _described(samsa.bootstrap, _GROUP, "own-interval", ("consumer.heartbeat.interval.ms",))
    assert kept[2][0][1:4] == ("7000", False, 8)


# --- DescribeConfigs of a broker: Kafka's keys, with Kafka's defaults (D-ADMIN-6) ------------

# The settings samsa describes that Kafka 4.4 has not: samsa's own bounds and files, and
# what Kafka has under other names or not at all.
SAMSA_ONLY_BROKER_KEYS = {
    "allow.everyone.if.no.acl.found", "log.max.open.files", "log.message.downconversion.enable",
    "max.partitions", "message.max.inflated.bytes", "metrics.host", "metrics.listener",
    "metrics.port", "producer.id.expiration.check.interval.ms", "sasl.max.connections.per.ip",
    "sasl.oauthbearer.unsecured.validator.allowable.clock.skew.ms",
    "sasl.oauthbearer.unsecured.validator.principal.claim.name",
    "sasl.oauthbearer.unsecured.validator.required.scope",
    "sasl.oauthbearer.unsecured.validator.scope.claim.name", "sasl.plain.users.file",
    "sasl.server.authentication.timeout.ms", "socket.request.read.timeout.ms", "super.users",
    "transaction.version",
}  # fmt: skip
# Keys both describe at their defaults, whose defaults differ, and why.
OTHER_BROKER_DEFAULTS = {
    "group.max.size", "group.consumer.max.size",  # D-GROUP-1
    "queued.max.request.bytes",  # bounded (rule 41): Kafka's -1 is unbounded
    "sasl.enabled.mechanisms",  # no GSSAPI: SCRAM-SHA-256,SCRAM-SHA-512
    "ssl.keystore.type", "ssl.truststore.type",  # PEM files, not Java key stores
}  # fmt: skip


def _broker_configs(bootstrap: str, node: str) -> dict[str, tuple[str | None, int]]:
    k, v = ApiKey.DESCRIBE_CONFIGS, 4
    res = make_request(k, v, "DescribeConfigsResource", resource_type=4, resource_name=node,
                       configuration_keys=None)  # fmt: skip
    r = _request(bootstrap, k, v, "DescribeConfigsRequest", resources=(res,),
                 include_synonyms=False, include_documentation=False)  # fmt: skip
    assert int(r.results[0].error_code) == 0, r
    return {c.name: (c.value, int(c.config_source)) for c in r.results[0].configs}


def test_broker_configs_are_kafkas_keys_with_kafkas_defaults(
    kafka: KafkaNode, samsa: BrokerProcess
) -> None:
    """D-ADMIN-6: samsa describes its own settings (119 of Kafka 4.4's ~350 broker keys, and
    its own), each under Kafka's name; where both are at their defaults, the defaults are
    Kafka's but for the bounds and formats listed."""
    theirs = _broker_configs(kafka.bootstrap, str(kafka.node_id))
    mine = _broker_configs(samsa.bootstrap, "0")
    assert set(mine) - set(theirs) == SAMSA_ONLY_BROKER_KEYS
    default = 5  # DEFAULT_CONFIG
    differ = {
        n
        for n in set(mine) & set(theirs)
        if mine[n][1] == theirs[n][1] == default and mine[n][0] != theirs[n][0]
    }
    assert differ == OTHER_BROKER_DEFAULTS, {n: (mine[n][0], theirs[n][0]) for n in differ}
