"""Authorization (docs/semantics.md, rule 33), in-process: Kafka's ACL decisions (DENY wins,
implied operations, LITERAL/PREFIXED/wildcard, super.users, allow.everyone.if.no.acl.found),
ACL storage, the ACL matrix against every API that checks one, and the issue's attacks
replayed, each refused with Kafka's error code while the victim's data stays intact."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from _handlers import handle
from samsa.broker import authorizer as authz
from samsa.broker.authorizer import (
    CLUSTER_NAME,
    AclBinding,
    AclError,
    AclFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from samsa.broker.broker import Broker, StartupError
from samsa.broker.config import BrokerConfig, ConfigError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch, decode_records, iter_batches
from samsa.testing import fetch_request, idempotent_batch, produce_request

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
HOST = "10.0.0.7"  # every in-process request comes from here
ADMIN = "User:admin"
ALICE = "User:alice"
T, G, C, X = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(
    rtype: ResourceType,
    name: str,
    op: Operation,
    principal: str = ALICE,
    *,
    pattern: PatternType = LIT,
    permission: Permission = ALLOW,
    host: str = "*",
) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, permission)


# -- the authorizer alone ------------------------------------------------------------------


def decide(bindings: list[AclBinding], op: Operation, rtype: ResourceType, name: str) -> bool:
    return _authorizer(bindings).authorize(ALICE, HOST, op, rtype, name)


_dirs = iter(range(1_000_000))


def _authorizer(bindings: list[AclBinding], **kw: Any) -> Authorizer:
    import tempfile

    auth = Authorizer(Path(tempfile.mkdtemp(prefix=f"acl{next(_dirs)}-")), **kw)
    assert auth.create(bindings) == [None] * len(bindings)
    return auth


@pytest.mark.parametrize(
    ("bindings", "op", "allowed"),
    [
        ([], Operation.READ, False),  # no ACL: allow.everyone.if.no.acl.found is false
        ([acl(T, "orders", Operation.READ)], Operation.READ, True),
        ([acl(T, "orders", Operation.READ)], Operation.WRITE, False),
        # Read, Write, Delete and Alter imply Describe; AlterConfigs implies DescribeConfigs.
        ([acl(T, "orders", Operation.READ)], Operation.DESCRIBE, True),
        ([acl(T, "orders", Operation.WRITE)], Operation.DESCRIBE, True),
        ([acl(T, "orders", Operation.DELETE)], Operation.DESCRIBE, True),
        ([acl(T, "orders", Operation.ALTER)], Operation.DESCRIBE, True),
        ([acl(T, "orders", Operation.CREATE)], Operation.DESCRIBE, False),
        ([acl(T, "orders", Operation.ALTER_CONFIGS)], Operation.DESCRIBE_CONFIGS, True),
        ([acl(T, "orders", Operation.DESCRIBE_CONFIGS)], Operation.ALTER_CONFIGS, False),
        ([acl(T, "orders", Operation.ALL)], Operation.DELETE, True),
        # DENY wins; a DENY of Read does not deny the Describe that Write implies.
        (
            [
                acl(T, "orders", Operation.ALL),
                acl(T, "ord", Operation.READ, pattern=PRE, permission=DENY),
            ],
            Operation.READ,
            False,
        ),
        (
            [acl(T, "orders", Operation.WRITE), acl(T, "orders", Operation.READ, permission=DENY)],
            Operation.DESCRIBE,
            True,
        ),
        (
            [acl(T, "*", Operation.READ, permission=DENY), acl(T, "orders", Operation.READ)],
            Operation.READ,
            False,
        ),
        ([acl(T, "orders", Operation.ALL, permission=DENY)], Operation.DESCRIBE, False),
        # Patterns and wildcards.
        ([acl(T, "ord", Operation.READ, pattern=PRE)], Operation.READ, True),
        ([acl(T, "orders-x", Operation.READ, pattern=PRE)], Operation.READ, False),
        ([acl(T, "ord", Operation.READ)], Operation.READ, False),  # literal is not a prefix
        ([acl(T, "*", Operation.READ)], Operation.READ, True),
        ([acl(T, "orders", Operation.READ, "User:*")], Operation.READ, True),
        ([acl(T, "orders", Operation.READ, "User:bob")], Operation.READ, False),
        ([acl(T, "orders", Operation.READ, host=HOST)], Operation.READ, True),
        ([acl(T, "orders", Operation.READ, host="10.9.9.9")], Operation.READ, False),
        ([acl(G, "orders", Operation.READ)], Operation.READ, False),  # another resource type
    ],
)
def test_acl_decisions(bindings: list[AclBinding], op: Operation, allowed: bool) -> None:
    assert decide(bindings, op, T, "orders") is allowed


def test_super_users_and_allow_everyone_if_no_acl_found() -> None:
    auth = _authorizer(
        [acl(T, "guarded", Operation.READ, "User:bob")],
        super_users=[ADMIN],
        allow_everyone_if_no_acl_found=True,
    )
    assert auth.authorize(ADMIN, HOST, Operation.DELETE, T, "guarded")  # super user
    assert auth.authorize(ALICE, HOST, Operation.READ, T, "open")  # no ACL on it at all
    assert not auth.authorize(ALICE, HOST, Operation.READ, T, "guarded")  # an ACL, not hers
    strict = _authorizer([], super_users=[ADMIN])
    assert not strict.authorize(ALICE, HOST, Operation.READ, T, "open")
    assert strict.authorize(ADMIN, HOST, Operation.ALTER, C, CLUSTER_NAME)


def test_authorize_by_resource_type() -> None:
    auth = _authorizer([acl(T, "team-a.", Operation.WRITE, pattern=PRE)])
    assert auth.authorize_any(ALICE, HOST, Operation.WRITE, T)
    assert not auth.authorize_any("User:bob", HOST, Operation.WRITE, T)
    auth.create([acl(T, "*", Operation.WRITE, permission=DENY)])
    assert not auth.authorize_any(ALICE, HOST, Operation.WRITE, T)


def test_filters_and_deletion() -> None:
    a1 = acl(T, "orders", Operation.READ)
    a2 = acl(T, "ord", Operation.WRITE, pattern=PRE)
    a3 = acl(T, "*", Operation.DESCRIBE, "User:bob")
    a4 = acl(G, "orders", Operation.READ)
    auth = _authorizer([a1, a2, a3, a4])
    assert auth.describe(AclFilter()) == [a1, a2, a3, a4]
    # MATCH: every binding that applies to the resource named.
    assert auth.describe(AclFilter(T, "orders", PatternType.MATCH)) == [a1, a2, a3]
    assert auth.describe(AclFilter(T, "orders", PatternType.LITERAL)) == [a1]
    assert auth.describe(AclFilter(principal="User:bob")) == [a3]
    assert auth.describe(AclFilter(operation=Operation.WRITE)) == [a2]
    with pytest.raises(AclError):
        auth.describe(AclFilter(resource_type=ResourceType.UNKNOWN))
    assert auth.delete([AclFilter(resource_type=G), AclFilter(principal="User:bob")]) == [
        [a4],
        [a3],
    ]
    assert auth.bindings() == [a1, a2]
    reloaded = Authorizer(auth.path.parent)  # durable: what a restart reads
    assert reloaded.bindings() == [a1, a2]


@pytest.mark.parametrize(
    "bad",
    [
        acl(ResourceType.ANY, "x", Operation.READ),
        acl(T, "x", Operation.ANY),
        acl(T, "x", Operation.READ, pattern=PatternType.MATCH),
        acl(T, "x", Operation.READ, permission=Permission.ANY),
        acl(C, "my-cluster", Operation.ALTER),
        acl(T, "", Operation.READ),
        acl(T, "x", Operation.READ, "alice"),
    ],
)
def test_invalid_bindings_are_refused_and_nothing_is_stored(bad: AclBinding) -> None:
    auth = _authorizer([])
    (err,) = auth.create([bad])
    assert isinstance(err, AclError) and err.code == ErrorCode.INVALID_REQUEST
    assert auth.bindings() == [] and not auth.path.exists()


def test_acl_count_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(authz, "MAX_ACLS", 2)
    auth = _authorizer([acl(T, "a", Operation.READ), acl(T, "b", Operation.READ)])
    r1, r2 = auth.create([acl(T, "a", Operation.READ), acl(T, "c", Operation.READ)])
    assert r1 is None  # already there: nothing new to hold
    assert isinstance(r2, AclError) and r2.code == ErrorCode.POLICY_VIOLATION
    assert "at most 2" in str(r2)
    assert len(Authorizer(auth.path.parent).bindings()) == 2


def test_producer_owner_bindings_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(authz, "MAX_PRODUCER_OWNERS", 3)
    auth = _authorizer([])
    for pid in range(5):
        auth.bind_producer(pid, ALICE)
    assert len(auth._producer_owners) == 3
    assert not auth.producer_owner_ok(4, "User:mallory")
    assert auth.producer_owner_ok(4, ALICE)


def test_settings(tmp_path: Path) -> None:
    from samsa.broker.config import parse_properties

    props = parse_properties(
        f"authorizer.class.name={STANDARD}\nsuper.users=User:admin;User:ops\n"
        "allow.everyone.if.no.acl.found=true\n"
    )
    config = BrokerConfig(data_dir=tmp_path).with_properties(props).validate()
    broker = Broker(config)
    assert broker.authorizer is not None
    assert broker.authorizer.super_users == {ADMIN, "User:ops"}
    assert broker.authorizer.allow_everyone_if_no_acl_found
    assert Broker(BrokerConfig(data_dir=tmp_path / "open")).authorizer is None  # default: off
    old = BrokerConfig(
        data_dir=tmp_path, authorizer_class_name="kafka.security.authorizer.AclAuthorizer"
    )
    assert Broker(old).authorizer is not None
    with pytest.raises(ConfigError, match=r"authorizer\.class\.name"):
        BrokerConfig(authorizer_class_name="com.example.MyAuthorizer").validate()
    with pytest.raises(ConfigError, match=r"super\.users"):
        BrokerConfig(authorizer_class_name=STANDARD, super_users="admin").validate()
    (tmp_path / "acls.json").write_text("{not json")
    with pytest.raises(StartupError, match="cannot read ACLs"):
        Broker(config)


# -- the APIs --------------------------------------------------------------------------------


class Harness:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.auth = broker.authorizer
        assert self.auth is not None

    def call(self, principal: str, key: int, v: int, cls: str, /, **fields: Any) -> Any:
        return self.send(principal, key, v, make_request(key, v, cls, **fields))

    def send(self, principal: str, key: int, v: int, request: Any) -> Any:
        return handle(self.broker, principal, key, v, request, HOST)

    def grant(self, *bindings: AclBinding) -> None:
        assert self.auth.create(list(bindings)) == [None] * len(bindings)

    def reset(self) -> None:
        self.auth.delete([AclFilter()])

    # Requests used below, as the principal.
    def produce(self, principal: str, topic: str, records: bytes, txn_id: str | None = None) -> int:
        req = produce_request({(topic, 0): records})
        if txn_id is not None:
            import dataclasses

            req = dataclasses.replace(req, transactional_id=txn_id)
        resp = self.send(principal, ApiKey.PRODUCE, 9, req)
        return int(resp.responses[0].partition_responses[0].error_code)

    def fetch(self, principal: str, topic: str) -> tuple[int, list[Any]]:
        resp = self.send(principal, ApiKey.FETCH, 12, fetch_request({(topic, 0): 0}))
        part = resp.responses[0].partitions[0]
        return int(part.error_code), list(iter_batches(part.records or b""))

    def init_pid(self, principal: str, txn_id: str | None = None) -> tuple[int, int, int]:
        r = self.call(
            principal,
            ApiKey.INIT_PRODUCER_ID,
            4,
            "InitProducerIdRequest",
            transactional_id=txn_id,
            transaction_timeout=60_000,
            producer_id=-1,
            producer_epoch=-1,
        )
        return int(r.error_code), r.producer_id, r.producer_epoch

    def end_txn(self, principal: str, txn_id: str, pid: int, epoch: int, commit: bool) -> int:
        r = self.call(
            principal,
            ApiKey.END_TXN,
            3,
            "EndTxnRequest",
            transactional_id=txn_id,
            producer_id=pid,
            producer_epoch=epoch,
            committed=commit,
        )
        return int(r.error_code)

    def add_partitions(self, principal: str, txn_id: str, pid: int, epoch: int, topic: str) -> int:
        r = self.call(
            principal,
            ApiKey.ADD_PARTITIONS_TO_TXN,
            3,
            "AddPartitionsToTxnRequest",
            v3_and_below_transactional_id=txn_id,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=(
                make_request(
                    ApiKey.ADD_PARTITIONS_TO_TXN,
                    3,
                    "AddPartitionsToTxnTopic",
                    name=topic,
                    partitions=(0,),
                ),
            ),
        )
        return int(r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code)

    def commit_offset(self, principal: str, group: str, topic: str, offset: int) -> int:
        part = make_request(
            ApiKey.OFFSET_COMMIT,
            8,
            "OffsetCommitRequestPartition",
            partition_index=0,
            committed_offset=offset,
            committed_leader_epoch=-1,
            committed_metadata="",
        )
        r = self.call(
            principal,
            ApiKey.OFFSET_COMMIT,
            8,
            "OffsetCommitRequest",
            group_id=group,
            generation_id_or_member_epoch=-1,
            member_id="",
            group_instance_id=None,
            topics=(
                make_request(
                    ApiKey.OFFSET_COMMIT,
                    8,
                    "OffsetCommitRequestTopic",
                    name=topic,
                    partitions=(part,),
                ),
            ),
        )
        return int(r.topics[0].partitions[0].error_code)

    def fetch_offset(self, principal: str, group: str, topic: str) -> tuple[int, int]:
        """(error, committed offset) of partition 0; the group's error if it has one."""
        g = make_request(
            ApiKey.OFFSET_FETCH,
            8,
            "OffsetFetchRequestGroup",
            group_id=group,
            topics=(
                make_request(
                    ApiKey.OFFSET_FETCH,
                    8,
                    "OffsetFetchRequestTopics",
                    name=topic,
                    partition_indexes=(0,),
                ),
            ),
        )
        r = self.call(principal, ApiKey.OFFSET_FETCH, 8, "OffsetFetchRequest", groups=(g,))
        group_result = r.groups[0]
        if group_result.error_code:
            return int(group_result.error_code), -1
        p = group_result.topics[0].partitions[0]
        return int(p.error_code), p.committed_offset


def _broker(path: Path, **overrides: Any) -> Broker:
    config = BrokerConfig(
        data_dir=path,
        authorizer_class_name=STANDARD,
        super_users=ADMIN,
        group_initial_rebalance_delay_ms=0,
        **overrides,
    )
    broker = Broker(config)
    broker.start()
    return broker


@pytest.fixture(scope="module")
def h(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    broker = _broker(tmp_path_factory.mktemp("authz"))
    harness = Harness(broker)
    for topic in ("team-a.orders", "team-b.events", "team-a.doomed"):
        broker.create_topic(topic)
        assert harness.produce(ADMIN, topic, build_batch([NewRecord(value=b"v")])) == 0
    yield harness
    broker.close()


@dataclass(frozen=True)
class Case:
    """One API, the ACL Kafka checks for it, the code it refuses with, a call of it by the
    principal that returns that API's error code, and the code of that call once allowed
    (Apache Kafka 4.4's answer to the same request, when not NONE)."""

    rtype: ResourceType
    name: str
    op: Operation
    refused: ErrorCode
    run: Callable[[Harness, str], int]
    extra: tuple[AclBinding, ...] = field(default=())  # other ACLs the call needs
    allowed: ErrorCode = ErrorCode.NONE


def _topic_cfg(h: Harness, p: str) -> int:
    res = make_request(
        ApiKey.DESCRIBE_CONFIGS,
        4,
        "DescribeConfigsResource",
        resource_type=2,
        resource_name="team-a.orders",
        configuration_keys=None,
    )
    return int(
        h.call(p, ApiKey.DESCRIBE_CONFIGS, 4, "DescribeConfigsRequest", resources=(res,))
        .results[0]
        .error_code
    )


def _broker_cfg(h: Harness, p: str) -> int:
    res = make_request(
        ApiKey.DESCRIBE_CONFIGS,
        4,
        "DescribeConfigsResource",
        resource_type=4,
        resource_name="0",
        configuration_keys=None,
    )
    return int(
        h.call(p, ApiKey.DESCRIBE_CONFIGS, 4, "DescribeConfigsRequest", resources=(res,))
        .results[0]
        .error_code
    )


def _list_offsets(h: Harness, p: str) -> int:
    part = make_request(
        ApiKey.LIST_OFFSETS, 7, "ListOffsetsPartition", partition_index=0, timestamp=-1
    )
    topic = make_request(
        ApiKey.LIST_OFFSETS, 7, "ListOffsetsTopic", name="team-a.orders", partitions=(part,)
    )
    r = h.call(
        p,
        ApiKey.LIST_OFFSETS,
        7,
        "ListOffsetsRequest",
        replica_id=-1,
        isolation_level=0,
        topics=(topic,),
    )
    return int(r.topics[0].partitions[0].error_code)


def _offset_for_leader_epoch(h: Harness, p: str) -> int:
    k = ApiKey.OFFSET_FOR_LEADER_EPOCH
    part = make_request(k, 4, "OffsetForLeaderPartition", partition=0, leader_epoch=0)
    topic = make_request(k, 4, "OffsetForLeaderTopic", topic="team-a.orders", partitions=(part,))
    r = h.call(p, k, 4, "OffsetForLeaderEpochRequest", replica_id=-1, topics=(topic,))
    return int(r.topics[0].partitions[0].error_code)


def _metadata(h: Harness, p: str) -> int:
    t = make_request(
        ApiKey.METADATA, 12, "MetadataRequestTopic", topic_id=None, name="team-a.orders"
    )
    r = h.call(
        p,
        ApiKey.METADATA,
        12,
        "MetadataRequest",
        topics=(t,),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    return int(r.topics[0].error_code)


def _create_topic(h: Harness, p: str) -> int:
    t = make_request(
        ApiKey.CREATE_TOPICS,
        7,
        "CreatableTopic",
        name="team-a.created",
        num_partitions=1,
        replication_factor=1,
        assignments=(),
        configs=(),
    )
    r = h.call(
        p,
        ApiKey.CREATE_TOPICS,
        7,
        "CreateTopicsRequest",
        topics=(t,),
        timeout=1000,
        validate_only=True,
    )
    return int(r.topics[0].error_code)


def _delete_topic(h: Harness, p: str) -> int:
    if "team-a.doomed" not in h.broker.topics.topics:
        h.broker.create_topic("team-a.doomed")
    t = make_request(
        ApiKey.DELETE_TOPICS, 6, "DeleteTopicState", name="team-a.doomed", topic_id=None
    )
    r = h.call(p, ApiKey.DELETE_TOPICS, 6, "DeleteTopicsRequest", topics=(t,), timeout=1000)
    return int(r.responses[0].error_code)


def _describe_producers(h: Harness, p: str) -> int:
    t = make_request(
        ApiKey.DESCRIBE_PRODUCERS, 0, "TopicRequest", name="team-a.orders", partition_indexes=(0,)
    )
    r = h.call(p, ApiKey.DESCRIBE_PRODUCERS, 0, "DescribeProducersRequest", topics=(t,))
    return int(r.topics[0].partitions[0].error_code)


def _heartbeat(h: Harness, p: str) -> int:
    return int(
        h.call(
            p,
            ApiKey.HEARTBEAT,
            4,
            "HeartbeatRequest",
            group_id="team-a.grp",
            generation_id=1,
            member_id="m",
            group_instance_id=None,
        ).error_code
    )


def _join(h: Harness, p: str) -> int:
    proto = make_request(
        ApiKey.JOIN_GROUP, 5, "JoinGroupRequestProtocol", name="range", metadata=b""
    )
    return int(
        h.call(
            p,
            ApiKey.JOIN_GROUP,
            5,
            "JoinGroupRequest",
            group_id="team-a.grp",
            session_timeout=10_000,
            rebalance_timeout=10_000,
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(proto,),
        ).error_code
    )


def _sync(h: Harness, p: str) -> int:
    return int(
        h.call(
            p,
            ApiKey.SYNC_GROUP,
            3,
            "SyncGroupRequest",
            group_id="team-a.grp",
            generation_id=1,
            member_id="m",
            group_instance_id=None,
            assignments=(),
        ).error_code
    )


def _leave(h: Harness, p: str) -> int:
    m = make_request(ApiKey.LEAVE_GROUP, 4, "MemberIdentity", member_id="m", group_instance_id=None)
    return int(
        h.call(
            p, ApiKey.LEAVE_GROUP, 4, "LeaveGroupRequest", group_id="team-a.grp", members=(m,)
        ).error_code
    )


def _describe_group(h: Harness, p: str) -> int:
    r = h.call(
        p,
        ApiKey.DESCRIBE_GROUPS,
        5,
        "DescribeGroupsRequest",
        groups=("team-a.grp",),
        include_authorized_operations=False,
    )
    return int(r.groups[0].error_code)


def _delete_group(h: Harness, p: str) -> int:
    # the group exists (an offset in it) and is empty: deleted, NONE, when allowed
    assert h.commit_offset(ADMIN, "team-a.grp", "team-b.events", 1) == ErrorCode.NONE
    r = h.call(p, ApiKey.DELETE_GROUPS, 2, "DeleteGroupsRequest", groups_names=("team-a.grp",))
    return int(r.results[0].error_code)


def _offset_delete(h: Harness, p: str) -> int:
    # The group must exist for its offsets to be deleted: made here, not by an earlier case.
    assert h.commit_offset(ADMIN, "team-a.grp", "team-b.events", 0) == 0
    part = make_request(ApiKey.OFFSET_DELETE, 0, "OffsetDeleteRequestPartition", partition_index=0)
    t = make_request(
        ApiKey.OFFSET_DELETE,
        0,
        "OffsetDeleteRequestTopic",
        name="team-b.events",
        partitions=(part,),
    )
    return int(
        h.call(
            p, ApiKey.OFFSET_DELETE, 0, "OffsetDeleteRequest", group_id="team-a.grp", topics=(t,)
        ).error_code
    )


def _find(key_type: int, key: str) -> Callable[[Harness, str], int]:
    def run(h: Harness, p: str) -> int:
        r = h.call(
            p,
            ApiKey.FIND_COORDINATOR,
            4,
            "FindCoordinatorRequest",
            key_type=key_type,
            coordinator_keys=(key,),
        )
        return int(r.coordinators[0].error_code)

    return run


def _add_offsets(h: Harness, p: str) -> int:
    return int(
        h.call(
            p,
            ApiKey.ADD_OFFSETS_TO_TXN,
            3,
            "AddOffsetsToTxnRequest",
            transactional_id="team-a.txn",
            producer_id=1,
            producer_epoch=0,
            group_id="team-a.grp",
        ).error_code
    )


def _txn_offset_commit(h: Harness, p: str) -> int:
    part = make_request(
        ApiKey.TXN_OFFSET_COMMIT,
        3,
        "TxnOffsetCommitRequestPartition",
        partition_index=0,
        committed_offset=1,
        committed_leader_epoch=-1,
        committed_metadata="",
    )
    t = make_request(
        ApiKey.TXN_OFFSET_COMMIT,
        3,
        "TxnOffsetCommitRequestTopic",
        name="team-b.events",
        partitions=(part,),
    )
    r = h.call(
        p,
        ApiKey.TXN_OFFSET_COMMIT,
        3,
        "TxnOffsetCommitRequest",
        transactional_id="team-a.txn",
        group_id="team-a.grp",
        producer_id=1,
        producer_epoch=0,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        topics=(t,),
    )
    return int(r.topics[0].partitions[0].error_code)


def _describe_txn(h: Harness, p: str) -> int:
    r = h.call(
        p,
        ApiKey.DESCRIBE_TRANSACTIONS,
        0,
        "DescribeTransactionsRequest",
        transactional_ids=("team-a.txn-described",),
    )
    return int(r.transaction_states[0].error_code)


def _describe_scram(h: Harness, p: str) -> int:
    return int(
        h.call(
            p,
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
            0,
            "DescribeUserScramCredentialsRequest",
            users=None,
        ).error_code
    )


def _elect_leaders(h: Harness, p: str) -> int:
    tp = make_request(ApiKey.ELECT_LEADERS, 2, "TopicPartitions", topic="team-a.orders",
                      partitions=(0,))  # fmt: skip
    r = h.call(p, ApiKey.ELECT_LEADERS, 2, "ElectLeadersRequest", election_type=0,
               topic_partitions=(tp,), timeout=10_000)  # fmt: skip
    code = int(r.replica_election_results[0].partition_result[0].error_code)
    assert code in (ErrorCode.ELECTION_NOT_NEEDED, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    return code


def _update_features(h: Harness, p: str) -> int:
    # validate_only at the finalized level: allowed, it changes nothing (rule 45)
    key = make_request(
        ApiKey.UPDATE_FEATURES,
        1,
        "FeatureUpdateKey",
        feature="transaction.version",
        max_version_level=2,
        upgrade_type=1,
    )
    r = h.call(
        p,
        ApiKey.UPDATE_FEATURES,
        1,
        "UpdateFeaturesRequest",
        feature_updates=(key,),
        validate_only=True,
    )
    allowed = r.error_code == ErrorCode.NONE
    assert [x.feature for x in r.results] == (["transaction.version"] if allowed else [])
    return int(r.error_code)


def _describe_log_dirs(h: Harness, p: str) -> int:
    r = h.call(p, ApiKey.DESCRIBE_LOG_DIRS, 4, "DescribeLogDirsRequest", topics=None)
    if r.error_code == ErrorCode.NONE:  # allowed: the data directory and its partitions
        [result] = r.results
        assert "team-a.orders" in {t.name for t in result.topics}
    else:
        assert r.results == ()
    return int(r.error_code)


def _describe_topic_partitions(h: Harness, p: str) -> int:
    t = make_request(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, "TopicRequest", name="team-a.orders")
    r = h.call(p, ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, "DescribeTopicPartitionsRequest",
               topics=(t,), response_partition_limit=10, cursor=None)  # fmt: skip
    [topic] = r.topics
    assert (len(topic.partitions) > 0) == (topic.error_code == ErrorCode.NONE)
    return int(topic.error_code)


def _list_reassignments(h: Harness, p: str) -> int:
    r = h.call(p, ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, "ListPartitionReassignmentsRequest",
               timeout=1000, topics=None)  # fmt: skip
    assert r.topics == ()  # nothing ever moves on one broker
    return int(r.error_code)


def _alter_reassignments(h: Harness, p: str) -> int:
    k = ApiKey.ALTER_PARTITION_REASSIGNMENTS
    part = make_request(k, 1, "ReassignablePartition", partition_index=0, replicas=(0,))
    t = make_request(k, 1, "ReassignableTopic", name="team-a.orders", partitions=(part,))
    r = h.call(p, k, 1, "AlterPartitionReassignmentsRequest", timeout=1000,
               allow_replication_factor_change=True, topics=(t,))  # fmt: skip
    each = int(r.responses[0].partitions[0].error_code)
    assert each == r.error_code  # NONE (a no-op) or the refusal, at both levels
    return int(r.error_code)


def _alter_scram(h: Harness, p: str) -> int:
    d = make_request(
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        0,
        "ScramCredentialDeletion",
        name="nobody",
        mechanism=1,
    )
    r = h.call(
        p,
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        0,
        "AlterUserScramCredentialsRequest",
        deletions=(d,),
        upsertions=(),
    )
    return int(r.results[0].error_code)


def _create_acl(h: Harness, p: str) -> int:
    c = make_request(
        ApiKey.CREATE_ACLS,
        3,
        "AclCreation",
        resource_type=2,
        resource_name="x",
        resource_pattern_type=3,
        principal="User:nobody",
        host="*",
        operation=3,
        permission_type=3,
    )
    return int(
        h.call(p, ApiKey.CREATE_ACLS, 3, "CreateAclsRequest", creations=(c,)).results[0].error_code
    )


def _describe_acls(h: Harness, p: str) -> int:
    return int(
        h.call(
            p,
            ApiKey.DESCRIBE_ACLS,
            3,
            "DescribeAclsRequest",
            resource_type_filter=1,
            resource_name_filter=None,
            pattern_type_filter=1,
            principal_filter=None,
            host_filter=None,
            operation=1,
            permission_type=1,
        ).error_code
    )


def _delete_acls(h: Harness, p: str) -> int:
    f = make_request(
        ApiKey.DELETE_ACLS,
        3,
        "DeleteAclsFilter",
        resource_type_filter=1,
        resource_name_filter=None,
        pattern_type_filter=1,
        principal_filter="User:nobody",
        host_filter=None,
        operation=1,
        permission_type=1,
    )
    return int(
        h.call(p, ApiKey.DELETE_ACLS, 3, "DeleteAclsRequest", filters=(f,))
        .filter_results[0]
        .error_code
    )


def _alter_configs(rtype: int, name: str) -> Callable[[Harness, str], int]:
    def run(h: Harness, p: str) -> int:
        cfg = make_request(ApiKey.ALTER_CONFIGS, 2, "AlterableConfig", name="retention.ms",
                           value="86400000")  # fmt: skip
        res = make_request(ApiKey.ALTER_CONFIGS, 2, "AlterConfigsResource", resource_type=rtype,
                           resource_name=name, configs=(cfg,) if rtype == 2 else ())  # fmt: skip
        r = h.call(p, ApiKey.ALTER_CONFIGS, 2, "AlterConfigsRequest", resources=(res,),
                   validate_only=True)  # fmt: skip
        return int(r.responses[0].error_code)

    return run


def _incremental_alter_configs(h: Harness, p: str) -> int:
    cfg = make_request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "AlterableConfig",
                       name="retention.ms", config_operation=0, value="86400000")  # fmt: skip
    res = make_request(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "AlterConfigsResource",
                       resource_type=2, resource_name="team-a.orders", configs=(cfg,))  # fmt: skip
    r = h.call(p, ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, "IncrementalAlterConfigsRequest",
               resources=(res,), validate_only=True)  # fmt: skip
    return int(r.responses[0].error_code)


def _create_partitions(h: Harness, p: str) -> int:
    t = make_request(ApiKey.CREATE_PARTITIONS, 3, "CreatePartitionsTopic",
                     name="team-a.orders", count=2, assignments=None)  # fmt: skip
    r = h.call(p, ApiKey.CREATE_PARTITIONS, 3, "CreatePartitionsRequest", topics=(t,),
               timeout=1000, validate_only=True)  # fmt: skip
    return int(r.results[0].error_code)


def _delete_records(h: Harness, p: str) -> int:
    part = make_request(ApiKey.DELETE_RECORDS, 2, "DeleteRecordsPartition", partition_index=0,
                        offset=0)  # fmt: skip
    t = make_request(ApiKey.DELETE_RECORDS, 2, "DeleteRecordsTopic", name="team-a.orders",
                     partitions=(part,))  # fmt: skip
    r = h.call(p, ApiKey.DELETE_RECORDS, 2, "DeleteRecordsRequest", topics=(t,), timeout=1000)
    return int(r.topics[0].partitions[0].error_code)


def _init_txn(h: Harness, p: str) -> int:
    return h.init_pid(p, "team-a.txn")[0]


READ_B = acl(T, "team-b.events", Operation.READ)
GROUP_READ = acl(G, "team-a.grp", Operation.READ)
TA = ErrorCode.TOPIC_AUTHORIZATION_FAILED
TE = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
GA = ErrorCode.GROUP_AUTHORIZATION_FAILED
XA = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
NO_PID = ErrorCode.INVALID_PRODUCER_ID_MAPPING  # producer 1 of a transactional id never begun
Op = Operation
CASES: dict[str, Case] = {
    "Produce": Case(
        T,
        "team-a.orders",
        Op.WRITE,
        TA,
        lambda h, p: h.produce(p, "team-a.orders", build_batch([NewRecord(b"v")])),
    ),
    "Fetch": Case(T, "team-a.orders", Op.READ, TA, lambda h, p: h.fetch(p, "team-a.orders")[0]),
    "ListOffsets": Case(T, "team-a.orders", Op.DESCRIBE, TA, _list_offsets),
    "OffsetForLeaderEpoch": Case(T, "team-a.orders", Op.DESCRIBE, TA, _offset_for_leader_epoch),
    "Metadata": Case(T, "team-a.orders", Op.DESCRIBE, TA, _metadata),
    "CreateTopics": Case(T, "team-a.created", Op.CREATE, TA, _create_topic),
    "DeleteTopics": Case(T, "team-a.doomed", Op.DELETE, TA, _delete_topic),
    "DescribeConfigs(topic)": Case(T, "team-a.orders", Op.DESCRIBE_CONFIGS, TA, _topic_cfg),
    "DescribeConfigs(broker)": Case(C, CLUSTER_NAME, Op.DESCRIBE_CONFIGS, XA, _broker_cfg),
    "DescribeProducers": Case(T, "team-a.orders", Op.READ, TA, _describe_producers),
    "AlterConfigs(topic)": Case(
        T, "team-a.orders", Op.ALTER_CONFIGS, TA, _alter_configs(2, "team-a.orders")
    ),
    "AlterConfigs(broker)": Case(C, CLUSTER_NAME, Op.ALTER_CONFIGS, XA, _alter_configs(4, "0")),
    "IncrementalAlterConfigs": Case(
        T, "team-a.orders", Op.ALTER_CONFIGS, TA, _incremental_alter_configs
    ),
    "CreatePartitions": Case(T, "team-a.orders", Op.ALTER, TA, _create_partitions),
    "DeleteRecords": Case(T, "team-a.orders", Op.DELETE, TA, _delete_records),
    "OffsetCommit": Case(
        G,
        "team-a.grp",
        Op.READ,
        GA,
        lambda h, p: h.commit_offset(p, "team-a.grp", "team-b.events", 1),
        (READ_B,),
    ),
    "OffsetFetch": Case(
        G,
        "team-a.grp",
        Op.READ,
        GA,
        lambda h, p: h.fetch_offset(p, "team-a.grp", "team-b.events")[0],
        (READ_B,),
    ),
    "OffsetDelete": Case(G, "team-a.grp", Op.DELETE, GA, _offset_delete, (READ_B,)),
    "JoinGroup": Case(G, "team-a.grp", Op.READ, GA, _join, allowed=ErrorCode.MEMBER_ID_REQUIRED),
    "SyncGroup": Case(G, "team-a.grp", Op.READ, GA, _sync, allowed=ErrorCode.UNKNOWN_MEMBER_ID),
    "Heartbeat": Case(
        G, "team-a.grp", Op.READ, GA, _heartbeat, allowed=ErrorCode.UNKNOWN_MEMBER_ID
    ),
    "LeaveGroup": Case(G, "team-a.grp", Op.READ, GA, _leave),
    "DescribeGroups": Case(G, "team-a.grp", Op.DESCRIBE, GA, _describe_group),
    "DeleteGroups": Case(G, "team-a.grp", Op.DELETE, GA, _delete_group),
    "FindCoordinator(group)": Case(G, "team-a.grp", Op.DESCRIBE, GA, _find(0, "team-a.grp")),
    "FindCoordinator(txn)": Case(X, "team-a.txn", Op.DESCRIBE, TE, _find(1, "team-a.txn")),
    "InitProducerId(txn)": Case(X, "team-a.txn", Op.WRITE, TE, _init_txn),
    "InitProducerId(idempotent)": Case(
        C, CLUSTER_NAME, Op.IDEMPOTENT_WRITE, XA, lambda h, p: h.init_pid(p)[0]
    ),
    "AddPartitionsToTxn": Case(
        X,
        "team-a.txn",
        Op.WRITE,
        TE,
        lambda h, p: h.add_partitions(p, "team-a.txn", 1, 0, "team-b.events"),
        (acl(T, "team-b.events", Op.WRITE),),
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
    ),
    "AddOffsetsToTxn": Case(X, "team-a.txn", Op.WRITE, TE, _add_offsets, (GROUP_READ,), NO_PID),
    "TxnOffsetCommit": Case(
        X, "team-a.txn", Op.WRITE, TE, _txn_offset_commit, (GROUP_READ, READ_B), NO_PID
    ),
    "EndTxn": Case(
        X,
        "team-a.txn",
        Op.WRITE,
        TE,
        lambda h, p: h.end_txn(p, "team-a.txn", 1, 0, False),
        allowed=NO_PID,
    ),
    "DescribeTransactions": Case(
        X,
        "team-a.txn-described",
        Op.DESCRIBE,
        TE,
        _describe_txn,
        allowed=ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
    ),
    "DescribeUserScramCredentials": Case(C, CLUSTER_NAME, Op.DESCRIBE, XA, _describe_scram),
    "AlterUserScramCredentials": Case(
        C, CLUSTER_NAME, Op.ALTER, XA, _alter_scram, allowed=ErrorCode.RESOURCE_NOT_FOUND
    ),
    "CreateAcls": Case(C, CLUSTER_NAME, Op.ALTER, XA, _create_acl),
    "DescribeAcls": Case(C, CLUSTER_NAME, Op.DESCRIBE, XA, _describe_acls),
    "DeleteAcls": Case(C, CLUSTER_NAME, Op.ALTER, XA, _delete_acls),
    "ElectLeaders": Case(
        C, CLUSTER_NAME, Op.ALTER, XA, _elect_leaders, allowed=ErrorCode.ELECTION_NOT_NEEDED
    ),
    "DescribeLogDirs": Case(C, CLUSTER_NAME, Op.DESCRIBE, XA, _describe_log_dirs),
    "DescribeTopicPartitions": Case(
        T, "team-a.orders", Op.DESCRIBE, TA, _describe_topic_partitions
    ),
    "ListPartitionReassignments": Case(C, CLUSTER_NAME, Op.DESCRIBE, XA, _list_reassignments),
    "AlterPartitionReassignments": Case(C, CLUSTER_NAME, Op.ALTER, XA, _alter_reassignments),
    "UpdateFeatures": Case(C, CLUSTER_NAME, Op.ALTER, XA, _update_features),
}


def _variant(case: Case, variant: str) -> tuple[list[AclBinding], bool]:
    """The ACLs of one column of the matrix, and whether the call is then allowed."""
    exact = acl(case.rtype, case.name, case.op)
    prefix = case.name[:5] if case.rtype != C else case.name
    pattern = PRE if case.rtype != C else LIT
    return {
        "no-acl": ([], False),
        "allow-literal": ([exact], True),
        "allow-prefixed": ([acl(case.rtype, prefix, case.op, pattern=pattern)], True),
        "allow-all-ops": ([acl(case.rtype, case.name, Op.ALL)], True),
        "allow-wildcard-principal": ([acl(case.rtype, case.name, case.op, "User:*")], True),
        "allow-other-principal": ([acl(case.rtype, case.name, case.op, "User:bob")], False),
        "allow-other-host": ([acl(case.rtype, case.name, case.op, host="10.9.9.9")], False),
        "allow-then-deny-prefixed": (
            [exact, acl(case.rtype, prefix, case.op, pattern=pattern, permission=DENY)],
            False,
        ),
    }[variant]


VARIANTS = [
    "no-acl",
    "allow-literal",
    "allow-prefixed",
    "allow-all-ops",
    "allow-wildcard-principal",
    "allow-other-principal",
    "allow-other-host",
    "allow-then-deny-prefixed",
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("api", list(CASES))
def test_acl_matrix(h: Harness, api: str, variant: str) -> None:
    case = CASES[api]
    bindings, allowed = _variant(case, variant)
    h.reset()
    try:
        h.grant(*case.extra, *bindings)
        code = case.run(h, ALICE)
    finally:
        h.reset()
    want = case.allowed if allowed else case.refused
    assert code == want, f"{api} answered {ErrorCode(code).name}, not {want.name}"
    assert case.run(h, ADMIN) == case.allowed  # a super user needs no ACL


def test_metadata_and_lists_show_only_what_the_principal_may_describe(h: Harness) -> None:
    h.reset()
    h.grant(
        acl(T, "team-a.", Op.DESCRIBE, pattern=PRE),
        acl(G, "team-a.", Op.READ, pattern=PRE),
        acl(X, "team-a.txn", Op.WRITE),
        acl(T, "team-a.", Op.WRITE, pattern=PRE),
    )
    try:
        r = h.call(
            ALICE,
            ApiKey.METADATA,
            12,
            "MetadataRequest",
            topics=None,
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        names = {t.name for t in r.topics}
        assert "team-a.orders" in names and "team-b.events" not in names
        assert all(n.startswith("team-a.") for n in names)
        # Auto-creation needs Create: Describe alone gets TOPIC_AUTHORIZATION_FAILED.
        t = make_request(
            ApiKey.METADATA, 12, "MetadataRequestTopic", topic_id=None, name="team-a.auto"
        )
        r = h.call(
            ALICE,
            ApiKey.METADATA,
            12,
            "MetadataRequest",
            topics=(t,),
            allow_auto_topic_creation=True,
            include_topic_authorized_operations=False,
        )
        assert r.topics[0].error_code == TA and "team-a.auto" not in h.broker.topics.topics
        # Produce never creates a topic, whoever may Create (as Kafka: only Metadata does).
        for who in (ALICE, ADMIN):
            code = h.produce(who, "team-a.auto2", build_batch([NewRecord(b"v")]))
            assert code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert "team-a.auto2" not in h.broker.topics.topics
        # Groups and transactions: listed only where Describe is allowed.
        for gid, topic in (("team-a.grp", "team-a.orders"), ("team-b.grp", "team-b.events")):
            assert h.commit_offset(ADMIN, gid, topic, 0) == 0
        r = h.call(ALICE, ApiKey.LIST_GROUPS, 4, "ListGroupsRequest", states_filter=())
        assert {g.group_id for g in r.groups} == {"team-a.grp"}
        r = h.call(ADMIN, ApiKey.LIST_GROUPS, 4, "ListGroupsRequest", states_filter=())
        assert {"team-a.grp", "team-b.grp"} <= {g.group_id for g in r.groups}
        assert h.init_pid(ALICE, "team-a.txn")[0] == 0
        assert h.init_pid(ADMIN, "team-b.txn")[0] == 0
        r = h.call(
            ALICE,
            ApiKey.LIST_TRANSACTIONS,
            1,
            "ListTransactionsRequest",
            state_filters=(),
            producer_id_filters=(),
        )
        assert {t.transactional_id for t in r.transaction_states} == {"team-a.txn"}
    finally:
        h.reset()


def test_describe_topic_partitions_shows_only_what_the_principal_may_describe(
    h: Harness,
) -> None:
    """Every topic: only those with Describe. Named: a denied topic gets 29 with the zero id,
    after the described ones, whether it exists or not; the operations are the principal's."""
    k = ApiKey.DESCRIBE_TOPIC_PARTITIONS

    def describe(*names: str) -> Any:
        topics = tuple(make_request(k, 0, "TopicRequest", name=n) for n in names)
        return h.call(ALICE, k, 0, "DescribeTopicPartitionsRequest", topics=topics,
                      response_partition_limit=2000, cursor=None)  # fmt: skip

    h.reset()
    h.grant(acl(T, "team-a.", Op.DESCRIBE, pattern=PRE), acl(T, "team-a.orders", Op.READ))
    try:
        names = [t.name for t in describe().topics]
        assert "team-a.orders" in names and names == sorted(names)
        assert all(n.startswith("team-a.") for n in names)
        r = describe("team-b.events", "team-b.nothing", "team-a.orders")
        # (the zero id decodes as None)
        got = [(t.name, t.error_code, t.topic_id, len(t.partitions)) for t in r.topics]
        assert got[0][:2] == ("team-a.orders", ErrorCode.NONE) and got[0][2] is not None
        assert sorted(got[1:]) == [("team-b.events", TA, None, 0), ("team-b.nothing", TA, None, 0)]
        assert r.topics[0].topic_authorized_operations == (1 << Op.READ) | (1 << Op.DESCRIBE)
    finally:
        h.reset()


def test_describe_topic_partitions_limit_is_capped(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limit above the broker's cap (Kafka's max.request.partition.size.limit) gets the cap."""
    from samsa.broker.handlers import describe_topic_partitions

    monkeypatch.setattr(describe_topic_partitions, "MAX_PARTITIONS", 1)
    k = ApiKey.DESCRIBE_TOPIC_PARTITIONS
    topics = tuple(
        make_request(k, 0, "TopicRequest", name=n) for n in ("team-a.orders", "team-b.events")
    )
    r = h.call(ADMIN, k, 0, "DescribeTopicPartitionsRequest", topics=topics,
               response_partition_limit=2000, cursor=None)  # fmt: skip
    assert [(t.name, len(t.partitions)) for t in r.topics] == [("team-a.orders", 1)]
    assert (r.next_cursor.topic_name, r.next_cursor.partition_index) == ("team-b.events", 0)


# -- the attacks, replayed ---------------------------------------------------------


VICTIM, MALLORY = "User:victim", "User:mallory"


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[Harness]:
    """The victim owns topic victim.orders, group victim.grp and transactional id
    victim.txn; mallory may write to victim.orders (a shared ingest topic) and owns
    everything named mallory.*."""
    broker = _broker(tmp_path)
    h = Harness(broker)
    h.grant(
        acl(T, "victim.", Op.ALL, VICTIM, pattern=PRE),
        acl(G, "victim.", Op.ALL, VICTIM, pattern=PRE),
        acl(X, "victim.", Op.ALL, VICTIM, pattern=PRE),
        acl(T, "victim.orders", Op.WRITE, MALLORY),
        acl(T, "mallory.", Op.ALL, MALLORY, pattern=PRE),
        acl(G, "mallory.", Op.ALL, MALLORY, pattern=PRE),
        acl(X, "mallory.", Op.ALL, MALLORY, pattern=PRE),
        acl(C, CLUSTER_NAME, Op.CREATE, VICTIM),
    )
    broker.create_topic("victim.orders")
    yield h
    broker.close()


def _values(h: Harness, topic: str) -> list[bytes]:
    code, batches = h.fetch(ADMIN, topic)
    assert code == 0
    return [r.value for b in batches if not b.is_control for r in decode_records(b)]


def test_attack_delete_another_teams_topic(arena: Harness) -> None:
    assert arena.produce(VICTIM, "victim.orders", build_batch([NewRecord(b"order-1")])) == 0
    assert _delete_topic_as(arena, MALLORY, "victim.orders") == TA
    assert _values(arena, "victim.orders") == [b"order-1"]


def _delete_topic_as(h: Harness, p: str, name: str) -> int:
    t = make_request(ApiKey.DELETE_TOPICS, 6, "DeleteTopicState", name=name, topic_id=None)
    r = h.call(p, ApiKey.DELETE_TOPICS, 6, "DeleteTopicsRequest", topics=(t,), timeout=1000)
    return int(r.responses[0].error_code)


def _txn_produce(h: Harness, p: str, txn: str, pid: int, epoch: int, value: bytes) -> int:
    assert h.add_partitions(p, txn, pid, epoch, "victim.orders") == 0
    batch = build_batch(
        [NewRecord(value)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
        transactional=True,
    )
    return h.produce(p, "victim.orders", batch, txn)


def test_attack_fence_or_abort_the_victims_transaction(arena: Harness) -> None:
    assert arena.produce(VICTIM, "victim.orders", build_batch([NewRecord(b"v")])) == 0
    code, pid, epoch = arena.init_pid(VICTIM, "victim.txn")
    assert code == 0
    assert _txn_produce(arena, VICTIM, "victim.txn", pid, epoch, b"paid") == 0
    # Fencing by InitProducerId with the victim's transactional id.
    assert arena.init_pid(MALLORY, "victim.txn")[0] == TE
    # Reading the victim's producer id and epoch, then aborting with EndTxn.
    assert _describe_txn_as(arena, MALLORY, "victim.txn") == TE
    assert arena.end_txn(MALLORY, "victim.txn", pid, epoch, False) == TE
    # Writing into the victim's transaction with the victim's producer id.
    forged = build_batch(
        [NewRecord(b"forged")],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=1,
        transactional=True,
    )
    assert arena.produce(MALLORY, "victim.orders", forged, "victim.txn") == TE
    assert arena.produce(MALLORY, "victim.orders", forged, "mallory.txn") == TE
    # The victim's transaction is intact: it commits, with only its own record.
    assert arena.end_txn(VICTIM, "victim.txn", pid, epoch, True) == 0
    assert _values(arena, "victim.orders") == [b"v", b"paid"]


def _describe_txn_as(h: Harness, p: str, txn: str) -> int:
    r = h.call(
        p, ApiKey.DESCRIBE_TRANSACTIONS, 0, "DescribeTransactionsRequest", transactional_ids=(txn,)
    )
    return int(r.transaction_states[0].error_code)


def test_attack_move_another_groups_offset(arena: Harness) -> None:
    arena.produce(VICTIM, "victim.orders", build_batch([NewRecord(b"a"), NewRecord(b"b")]))
    assert arena.commit_offset(VICTIM, "victim.grp", "victim.orders", 2) == 0
    assert arena.commit_offset(MALLORY, "victim.grp", "victim.orders", 999_999) == GA
    assert arena.fetch_offset(MALLORY, "victim.grp", "victim.orders")[0] == GA
    assert arena.fetch_offset(VICTIM, "victim.grp", "victim.orders") == (0, 2)


def test_attack_forge_the_victims_next_sequence(arena: Harness) -> None:
    code, victim_pid, _ = arena.init_pid(VICTIM)
    assert code == 0
    assert (
        arena.produce(VICTIM, "victim.orders", idempotent_batch(victim_pid, 0, 0, value=b"real"))
        == 0
    )
    # Mallory (Write on the topic, so InitProducerId is allowed) sees that producer ids
    # are sequential; DescribeProducers, which would show the last sequence, needs Read.
    code, mallory_pid, _ = arena.init_pid(MALLORY)
    assert code == 0 and mallory_pid == victim_pid + 1
    assert _describe_producers_as(arena, MALLORY, "victim.orders") == TA
    forged = idempotent_batch(victim_pid, 0, 1, value=b"forged")
    assert arena.produce(MALLORY, "victim.orders", forged) == XA
    # The victim's real batch with that sequence is written, not taken for a duplicate.
    real = idempotent_batch(victim_pid, 0, 1, value=b"real")
    assert arena.produce(VICTIM, "victim.orders", real) == 0
    assert _values(arena, "victim.orders") == [b"real-0", b"real-0"]
    code, batches = arena.fetch(ADMIN, "victim.orders")
    assert [(b.producer_id, b.base_sequence) for b in batches] == [(victim_pid, 0), (victim_pid, 1)]


def _describe_producers_as(h: Harness, p: str, topic: str) -> int:
    t = make_request(
        ApiKey.DESCRIBE_PRODUCERS, 0, "TopicRequest", name=topic, partition_indexes=(0,)
    )
    r = h.call(p, ApiKey.DESCRIBE_PRODUCERS, 0, "DescribeProducersRequest", topics=(t,))
    return int(r.topics[0].partitions[0].error_code)


def test_without_an_authorizer_nothing_is_checked(tmp_path: Path) -> None:
    broker = Broker(BrokerConfig(data_dir=tmp_path))
    broker.start()
    try:
        h = Harness.__new__(Harness)
        h.broker = broker
        broker.create_topic("t")
        assert h.produce("User:anyone", "t", build_batch([NewRecord(b"v")])) == 0
        assert _delete_topic_as(h, "User:other", "t") == 0
        # The ACL APIs say there is no authorizer, as Kafka does.
        assert _create_acl(h, ADMIN) == ErrorCode.SECURITY_DISABLED
        assert _describe_acls(h, ADMIN) == ErrorCode.SECURITY_DISABLED
    finally:
        broker.close()


def _bits(*ops: Operation) -> int:
    return sum(1 << op for op in ops)


def test_authorized_operations_fields(h: Harness) -> None:
    """KIP-430's bit fields, as Kafka fills them: what the principal may do on the resource."""
    h.reset()
    h.grant(
        acl(T, "team-a.", Op.READ, pattern=PRE),
        acl(T, "team-a.orders", Op.ALTER_CONFIGS),
        acl(G, "team-a.grp", Op.DELETE),
        acl(C, CLUSTER_NAME, Op.IDEMPOTENT_WRITE),
    )
    try:
        t = make_request(
            ApiKey.METADATA, 10, "MetadataRequestTopic", topic_id=None, name="team-a.orders"
        )
        r = h.call(
            ALICE,
            ApiKey.METADATA,
            10,
            "MetadataRequest",
            topics=(t,),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=True,
            include_topic_authorized_operations=True,
        )
        assert r.topics[0].topic_authorized_operations == _bits(
            Op.READ, Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS
        )
        assert r.cluster_authorized_operations == 0  # no Describe on the cluster
        r = h.call(
            ALICE,
            ApiKey.DESCRIBE_GROUPS,
            5,
            "DescribeGroupsRequest",
            groups=("team-a.grp",),
            include_authorized_operations=True,
        )
        assert r.groups[0].authorized_operations == _bits(Op.DELETE, Op.DESCRIBE)
        h.grant(acl(C, CLUSTER_NAME, Op.DESCRIBE))
        r = h.call(
            ALICE,
            ApiKey.DESCRIBE_CLUSTER,
            1,
            "DescribeClusterRequest",
            include_cluster_authorized_operations=True,
            endpoint_type=1,
        )
        assert r.cluster_authorized_operations == _bits(Op.DESCRIBE, Op.IDEMPOTENT_WRITE)
        r = h.call(ADMIN, ApiKey.DESCRIBE_CLUSTER, 1, "DescribeClusterRequest",
                   include_cluster_authorized_operations=False, endpoint_type=1)  # fmt: skip
        assert r.cluster_authorized_operations == -(2**31)  # not asked for
    finally:
        h.reset()


def test_fetch_by_topic_id_needs_read(h: Harness) -> None:
    """Fetch v13+ names topics by id (KIP-516): the check applies to the topic it names."""
    topic_id = h.broker.topics.topics["team-a.orders"].topic_id
    part = make_request(ApiKey.FETCH, 13, "FetchPartition", partition=0, fetch_offset=0,
                        partition_max_bytes=1 << 20)  # fmt: skip
    topic = make_request(ApiKey.FETCH, 13, "FetchTopic", topic_id=topic_id, partitions=(part,))
    request = make_request(
        ApiKey.FETCH, 13, "FetchRequest", cluster_id=None, replica_id=-1, max_wait=0,
        min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(topic,), forgotten_topics_data=(), rack_id="",
    )  # fmt: skip

    def code() -> int:
        resp = h.send(ALICE, ApiKey.FETCH, 13, request)
        return int(resp.responses[0].partitions[0].error_code)

    h.reset()
    try:
        assert code() == TA
        h.grant(acl(T, "team-a.orders", Op.READ))
        assert code() == ErrorCode.NONE
    finally:
        h.reset()


def test_delete_topic_by_id_does_not_tell_the_name(h: Harness) -> None:
    topic_id = h.broker.topics.topics["team-a.orders"].topic_id
    state = make_request(ApiKey.DELETE_TOPICS, 6, "DeleteTopicState", name=None, topic_id=topic_id)

    def result() -> Any:
        r = h.call(
            ALICE, ApiKey.DELETE_TOPICS, 6, "DeleteTopicsRequest", topics=(state,), timeout=1000
        )
        return r.responses[0]

    h.reset()
    try:
        r = result()
        assert (r.error_code, r.name) == (TA, None)
        h.grant(acl(T, "team-a.orders", Op.DESCRIBE))  # may know it, may not delete it
        r = result()
        assert (r.error_code, r.name) == (TA, "team-a.orders")
        assert "team-a.orders" in h.broker.topics.topics
    finally:
        h.reset()


def test_two_phase_commit_implies_nothing() -> None:
    tpc = [acl(X, "tpc", Op.TWO_PHASE_COMMIT)]
    assert decide(tpc, Op.TWO_PHASE_COMMIT, X, "tpc")
    assert not decide(tpc, Op.DESCRIBE, X, "tpc")
    assert not decide(tpc, Op.WRITE, X, "tpc")
    assert not decide([acl(X, "tpc", Op.WRITE)], Op.TWO_PHASE_COMMIT, X, "tpc")


def _init_2pc(h: Harness, p: str, txn_id: str, enable_2pc: bool = True) -> int:
    r = h.call(
        p,
        ApiKey.INIT_PRODUCER_ID,
        6,
        "InitProducerIdRequest",
        transactional_id=txn_id,
        transaction_timeout=60_000,
        producer_id=-1,
        producer_epoch=-1,
        enable2_pc=enable_2pc,
        keep_prepared_txn=False,
    )
    return int(r.error_code)


@pytest.mark.parametrize(
    ("ops", "denied", "enable_2pc", "allowed"),
    [
        ([Op.WRITE, Op.TWO_PHASE_COMMIT], [], True, True),
        ([Op.ALL], [], True, True),
        ([Op.WRITE], [], True, False),
        ([Op.TWO_PHASE_COMMIT], [], True, False),
        ([Op.WRITE, Op.TWO_PHASE_COMMIT], [Op.TWO_PHASE_COMMIT], True, False),
        ([Op.WRITE], [], False, True),  # an ordinary transactional producer needs only Write
    ],
)
def test_two_phase_commit_needs_write_and_two_phase_commit(
    tmp_path: Path, ops: list[Operation], denied: list[Operation], enable_2pc: bool, allowed: bool
) -> None:
    """KIP-939: InitProducerId with enable_2pc needs Write and TwoPhaseCommit on the
    TransactionalId (TwoPhaseCommit implies nothing and Write does not imply it)."""
    broker = _broker(tmp_path, transaction_two_phase_commit_enable=True)
    h = Harness(broker)
    try:
        h.grant(*(acl(X, "tpc", op) for op in ops))
        h.grant(*(acl(X, "tpc", op, permission=DENY) for op in denied))
        code = _init_2pc(h, ALICE, "tpc", enable_2pc)
        assert code == (ErrorCode.NONE if allowed else TE)
    finally:
        broker.close()


def test_producer_id_bindings_survive_a_restart(tmp_path: Path) -> None:
    broker = _broker(tmp_path)
    h = Harness(broker)
    h.grant(acl(T, "shared", Op.ALL, VICTIM), acl(T, "shared", Op.ALL, MALLORY))
    broker.create_topic("shared")
    code, pid, _ = h.init_pid(VICTIM)
    assert code == 0
    assert h.produce(VICTIM, "shared", idempotent_batch(pid, 0, 0, value=b"real")) == 0
    broker.close()
    with open(tmp_path / authz.PRODUCER_OWNERS_FILE, "a") as f:
        f.write('[12, "User:torn')  # a line a crash cut short
    broker = _broker(tmp_path)
    h = Harness(broker)
    try:
        assert h.produce(MALLORY, "shared", idempotent_batch(pid, 0, 1, value=b"forged")) == XA
        assert h.produce(VICTIM, "shared", idempotent_batch(pid, 0, 1, value=b"real")) == 0
        assert _values(h, "shared") == [b"real-0", b"real-0"]
    finally:
        broker.close()


def test_producer_owners_file_is_rewritten_when_mostly_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(authz, "MAX_PRODUCER_OWNERS", 10)
    auth = _authorizer([])
    for i in range(3000):
        auth.bind_producer(i, f"User:u{i % 7}", durable=False)  # compaction is the point
    lines = auth.owners_path.read_text().splitlines()
    assert len(lines) <= 2 * 10 + 1000
    reloaded = Authorizer(auth.path.parent)
    assert reloaded._producer_owners == {i: f"User:u{i % 7}" for i in range(2990, 3000)}


def _fsynced_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the path of every file descriptor fsynced from here on."""
    paths: list[str] = []
    real = authz.os.fsync

    def fsync(fd: int) -> None:
        paths.append(authz.os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(authz.os, "fsync", fsync)
    return paths


def test_producer_owner_bindings_are_fsynced_before_init_producer_id_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _broker(tmp_path)
    h = Harness(broker)
    try:
        h.grant(acl(C, CLUSTER_NAME, Op.IDEMPOTENT_WRITE))
        fsynced = _fsynced_paths(monkeypatch)
        code, pid, _ = h.init_pid(ALICE)
        assert code == 0
        assert str(h.auth.owners_path) in fsynced
        # A binding made by a first batch is not fsynced (losing it only rebinds it).
        fsynced.clear()
        assert h.auth.producer_owner_ok(pid + 1000, ALICE)
        assert str(h.auth.owners_path) not in fsynced
    finally:
        broker.close()


def test_damaged_producer_owner_records_are_skipped_and_the_rest_kept() -> None:
    auth = _authorizer([])
    for i in range(5):
        auth.bind_producer(i, f"User:u{i}")
    data = bytearray(auth.owners_path.read_bytes())
    lines = data.split(b"\n")
    at = sum(len(x) + 1 for x in lines[:2]) + lines[2].index(b"u2")
    data[at] ^= 0x03  # User:u2 -> User:v2 in the third record: its checksum no longer matches
    data += b'0badc0de [5, "User:to'  # and a record a crash cut short
    auth.owners_path.write_bytes(bytes(data))
    reloaded = Authorizer(auth.path.parent)
    assert reloaded._producer_owners == {0: "User:u0", 1: "User:u1", 3: "User:u3", 4: "User:u4"}
    # The file was rewritten without the damage, so appends start on a line of their own.
    reloaded.bind_producer(6, "User:u6")
    assert Authorizer(auth.path.parent)._producer_owners == {
        **reloaded._producer_owners,
        6: "User:u6",
    }
    assert len(auth.owners_path.read_bytes().splitlines()) == 5


def test_producer_owner_records_without_a_checksum_are_read_and_rewritten() -> None:
    auth = _authorizer([])
    auth.owners_path.write_text('[7, "User:old"]\n')
    reloaded = Authorizer(auth.path.parent)
    assert reloaded._producer_owners == {7: "User:old"}
    assert auth.owners_path.read_bytes() == authz._owner_record(7, "User:old")
