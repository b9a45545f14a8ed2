"""Differential scenarios of the admin APIs: CreateTopics validation, DescribeConfigs of topics
and the broker, AlterConfigs / IncrementalAlterConfigs refusals, CreatePartitions,
DeleteRecords, the ACL APIs without an authorizer, UpdateFeatures, DescribeCluster and
ApiVersions, answered by samsa as by Apache Kafka."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from _scenario import batch, producer, topic

from samsa.protocol.messages import ApiKey, make_request
from samsa.testing.oracle import Deviation, Outcome, Rule, Side

Run = Callable[..., Outcome]


def _creatable(name: str, partitions: int = 1, factor: int = -1, **configs: str) -> Any:
    k, v = ApiKey.CREATE_TOPICS, 7
    return make_request(
        k, v, "CreatableTopic", name=name, num_partitions=partitions, replication_factor=factor,
        assignments=(),
        configs=tuple(make_request(k, v, "CreatableTopicConfig", name=n.replace("_", "."),
                                   value=x) for n, x in configs.items()),
    )  # fmt: skip


def create(s: Side, label: str, t: Any, validate_only: bool = False) -> Any:
    k, v = ApiKey.CREATE_TOPICS, 7
    req = make_request(k, v, "CreateTopicsRequest", topics=(t,), timeout=10_000,
                       validate_only=validate_only)  # fmt: skip
    return s.call(label, k, v, req)


def test_create_topics_validation(differential: Run) -> None:
    def scenario(s: Side) -> None:
        existing = topic(s)
        create(s, "factor-too-large", _creatable(s.unique("rf"), factor=3))
        create(s, "no-partitions", _creatable(s.unique("p0"), partitions=0))
        create(s, "negative-partitions", _creatable(s.unique("pn"), partitions=-5))
        create(s, "bad-name", _creatable("bad/name"))
        create(s, "dot", _creatable("."))
        create(s, "too-long", _creatable("x" * 250))
        create(s, "exists", _creatable(existing))
        create(s, "unknown-config", _creatable(s.unique("uc"), no_such_config="1"))
        create(s, "bad-value", _creatable(s.unique("bv"), retention_ms="soon"))
        create(s, "bad-policy", _creatable(s.unique("bp"), cleanup_policy="sometimes"))
        create(s, "validate-only", _creatable(s.unique("vo"), 3, retention_ms="1000"), True)
        create(s, "validate-only-exists", _creatable(existing), True)

    # The answer lists every topic config as Kafka 4.4 does; min.insync.replicas is 24th.
    differential(scenario, deviations=[
        Deviation("validate-only.topics[0].configs[23].config_source", 5, 3, "D-ADMIN-2"),
    ])  # fmt: skip


def _resource(k: int, v: int, cls: str, rtype: int, name: str, **extra: Any) -> Any:
    return make_request(k, v, cls, resource_type=rtype, resource_name=name, **extra)


def describe_configs(
    s: Side, label: str, rtype: int, name: str, keys: tuple[str, ...], settle: str | None = None
) -> Any:
    """DescribeConfigs; with ``settle``, asked again (for up to 20 s) until the first key has
    that value: Kafka's broker applies an altered topic config a moment after answering."""
    k, v = ApiKey.DESCRIBE_CONFIGS, 4
    res = _resource(k, v, "DescribeConfigsResource", rtype, name, configuration_keys=keys)
    req = make_request(k, v, "DescribeConfigsRequest", resources=(res,), include_synonyms=True,
                       include_documentation=False)  # fmt: skip
    if settle is None:
        return s.call(label, k, v, req)
    return s.call(label, k, v, req, retry=lambda r: r.results[0].configs[0].value != settle)


TOPIC_KEYS = ("retention.ms", "cleanup.policy", "max.message.bytes", "min.insync.replicas",
              "segment.bytes", "compression.type", "message.timestamp.type")  # fmt: skip


def test_describe_configs_of_a_topic_and_the_broker(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = s.unique("t")
        s.create_topic(t, configs={"retention.ms": "12345", "cleanup.policy": "compact"})
        describe_configs(s, "topic", 2, t, TOPIC_KEYS)
        describe_configs(s, "unknown-topic", 2, s.unique("none"), TOPIC_KEYS)
        describe_configs(s, "broker-default-level", 4, "", ("log.retention.ms",))

    mir = "topic.results[0].configs[4]"  # min.insync.replicas
    differential(
        scenario,
        deviations=[
            Deviation(f"{mir}.config_source", 5, 3, "D-ADMIN-2"),
            Deviation(f"{mir}.synonyms.len", 1, 2, "D-ADMIN-2"),
            Deviation(f"{mir}.synonyms[0].source", 5, 3, "D-ADMIN-2"),
        ],
    )


def incremental(
    s: Side,
    label: str,
    rtype: int,
    name: str,
    ops: list[tuple[str, int, Any]],
    validate_only: bool = False,
) -> Any:
    k, v = ApiKey.INCREMENTAL_ALTER_CONFIGS, 1
    res = _resource(k, v, "AlterConfigsResource", rtype, name, configs=tuple(
        make_request(k, v, "AlterableConfig", name=n, config_operation=op, value=x)
        for n, op, x in ops))  # fmt: skip
    req = make_request(k, v, "IncrementalAlterConfigsRequest", resources=(res,),
                       validate_only=validate_only)  # fmt: skip
    return s.call(label, k, v, req)


def alter(s: Side, label: str, rtype: int, name: str, configs: dict[str, str]) -> Any:
    k, v = ApiKey.ALTER_CONFIGS, 2
    entries = tuple(make_request(k, v, "AlterableConfig", name=n, value=x)
                    for n, x in configs.items())  # fmt: skip
    res = _resource(k, v, "AlterConfigsResource", rtype, name, configs=entries)
    req = make_request(k, v, "AlterConfigsRequest", resources=(res,), validate_only=False)
    return s.call(label, k, v, req)


def test_alter_configs_refusals(differential: Run) -> None:
    """Each resource refused on its own; an operation that is none of the four fails a topic
    or group resource with UNKNOWN_SERVER_ERROR as in Kafka (a broker's: INVALID_REQUEST)."""

    def scenario(s: Side) -> None:
        t = topic(s)
        alter(s, "unknown-topic", 2, s.unique("none"), {"retention.ms": "1"})
        alter(s, "bad-value", 2, t, {"retention.ms": "soon"})
        alter(s, "unknown-key", 2, t, {"no.such.config": "1"})
        alter(s, "ok", 2, t, {"retention.ms": "5000"})
        incremental(s, "append-to-non-list", 2, t, [("retention.ms", 2, "1")])
        incremental(s, "subtract-ok", 2, t, [("cleanup.policy", 3, "delete")])
        incremental(s, "unknown-op", 2, t, [("retention.ms", 9, "1")])
        incremental(s, "unknown-op-broker", 4, "", [("log.retention.ms", 9, "1")])
        incremental(s, "unknown-op-group", 32, s.unique("g"),
                    [("consumer.session.timeout.ms", 9, "45000")])  # fmt: skip
        incremental(s, "unknown-op-client-metrics", 16, s.unique("m"),
                    [("interval.ms", 9, "1000")])  # fmt: skip
        incremental(s, "set-twice", 2, t, [("retention.ms", 0, "1"), ("retention.ms", 0, "2")])
        incremental(s, "wrong-broker", 4, "77", [("log.retention.ms", 0, "1000")])
        incremental(s, "not-dynamic", 4, "", [("log.dirs", 0, "/x")])
        describe_configs(s, "after", 2, t, ("retention.ms",))

    differential(scenario)


def test_empty_cleanup_policy(differential: Run) -> None:
    """Kafka 4.4 takes an empty cleanup.policy (KIP-1161), by CreateTopics, AlterConfigs or
    IncrementalAlterConfigs, for a topic or the broker's default: the log neither deletes
    nor compacts, and DeleteRecords may still move its start. An empty entry in a list is
    refused."""

    def scenario(s: Side) -> None:
        t = s.unique("t")
        create(s, "create-empty", _creatable(t, cleanup_policy=""))
        s.wait_leaders(t, 1)  # Kafka's broker learns of the new topic a moment after answering
        describe_configs(s, "created", 2, t, ("cleanup.policy",))
        pid, epoch = producer(s)
        s.produce("write", {(t, 0): batch(pid, epoch, 0, 5)})
        delete_records(s, "delete-records", t, 0, 2)
        create(s, "create-blank", _creatable(s.unique("b"), cleanup_policy=" "))
        create(s, "create-empty-element", _creatable(s.unique("e"), cleanup_policy="delete,"))
        u = topic(s, suffix="u")
        alter(s, "alter-empty", 2, u, {"cleanup.policy": ""})
        describe_configs(s, "altered", 2, u, ("cleanup.policy",), settle="")
        incremental(s, "set-compact", 2, u, [("cleanup.policy", 0, "compact")])
        incremental(s, "set-empty", 2, u, [("cleanup.policy", 0, "")])
        describe_configs(s, "set", 2, u, ("cleanup.policy",), settle="")
        # The broker's default too; validate_only, as Kafka applies a broker change later
        # and the node serves the scenarios after this one.
        ops = [("log.cleanup.policy", 0, "")]
        incremental(s, "broker-empty", 4, "", ops, validate_only=True)
        s.fetch("log", {(t, 0): 0})
        s.fetch("log-after-2", {(t, 0): 2})

    # Each CreateTopics answer lists min.insync.replicas 24th (D-ADMIN-2).
    differential(scenario, deviations=[
        Deviation(f"{label}.topics[0].configs[23].config_source", 5, 3, "D-ADMIN-2")
        for label in ("create-empty", "create-blank")
    ])  # fmt: skip


def test_create_partitions(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = topic(s)
        k, v = ApiKey.CREATE_PARTITIONS, 3

        def grow(label: str, name: str, count: int, validate_only: bool = False) -> None:
            req = make_request(k, v, "CreatePartitionsRequest", timeout=10_000,
                               validate_only=validate_only,
                               topics=(make_request(k, v, "CreatePartitionsTopic", name=name,
                                                    count=count, assignments=None),))  # fmt: skip
            s.call(label, k, v, req)

        grow("validate-only", t, 3, validate_only=True)
        grow("grow", t, 3)
        grow("same", t, 3)
        grow("shrink", t, 2)
        grow("unknown", s.unique("none"), 2)
        s.wait_leaders(t, 3)

    differential(scenario)


def delete_records(s: Side, label: str, t: str, partition: int, offset: int) -> Any:
    k, v = ApiKey.DELETE_RECORDS, 2
    part = make_request(k, v, "DeleteRecordsPartition", partition_index=partition, offset=offset)
    req = make_request(k, v, "DeleteRecordsRequest", timeout=10_000,
                       topics=(make_request(k, v, "DeleteRecordsTopic", name=t,
                                            partitions=(part,)),))  # fmt: skip
    return s.call(label, k, v, req)


def test_delete_records(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = topic(s)
        pid, epoch = producer(s)
        s.produce("write", {(t, 0): batch(pid, epoch, 0, 5)})
        delete_records(s, "before-2", t, 0, 2)
        delete_records(s, "backwards", t, 0, 1)
        delete_records(s, "past-end", t, 0, 9)
        delete_records(s, "to-end", t, 0, -1)
        delete_records(s, "unknown-partition", t, 4, 1)
        s.fetch("log", {(t, 0): 0})

    differential(scenario)


def test_acl_apis_without_an_authorizer(differential: Run) -> None:
    def scenario(s: Side) -> None:
        k, v = ApiKey.DESCRIBE_ACLS, 3
        s.call("describe", k, v, make_request(k, v, "DescribeAclsRequest", resource_type_filter=1,
               resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
               host_filter=None, operation=1, permission_type=1))  # fmt: skip
        k, v = ApiKey.CREATE_ACLS, 3
        creation = make_request(k, v, "AclCreation", resource_type=2, resource_name="t",
                                resource_pattern_type=3, principal="User:x", host="*",
                                operation=3, permission_type=3)  # fmt: skip
        s.call("create", k, v, make_request(k, v, "CreateAclsRequest", creations=(creation,)))
        k, v = ApiKey.DELETE_ACLS, 3
        f = make_request(k, v, "DeleteAclsFilter", resource_type_filter=1,
                         resource_name_filter=None, pattern_type_filter=1, principal_filter=None,
                         host_filter=None, operation=1, permission_type=1)  # fmt: skip
        s.call("delete", k, v, make_request(k, v, "DeleteAclsRequest", filters=(f,)))

    differential(scenario)


def test_update_features_and_describe_cluster(differential: Run) -> None:
    def scenario(s: Side) -> None:
        k, v = ApiKey.UPDATE_FEATURES, 1

        def update(label: str, name: str, level: int, upgrade_type: int = 1) -> None:
            f = make_request(k, v, "FeatureUpdateKey", feature=name, max_version_level=level,
                             upgrade_type=upgrade_type)  # fmt: skip
            s.call(label, k, v, make_request(k, v, "UpdateFeaturesRequest", timeout_ms=10_000,
                                             feature_updates=(f,), validate_only=True))  # fmt: skip

        update("unknown-feature", "no.such.feature", 1)
        update("too-high", "transaction.version", 99)
        update("same-level", "transaction.version", 2)
        k = ApiKey.DESCRIBE_CLUSTER
        for v in (1, 2):  # v2 (KIP-1073): fenced brokers listed when asked, flagged
            s.call(f"cluster-v{v}", k, v, make_request(k, v, "DescribeClusterRequest",
                                                       include_cluster_authorized_operations=False,
                                                       endpoint_type=1,
                                                       include_fenced_brokers=True))  # fmt: skip

    differential(scenario)


def test_broker_group_size_limits(differential: Run) -> None:
    def scenario(s: Side) -> None:
        node = "1" if s.name == "kafka" else "0"
        describe_configs(s, "limits", 4, node, ("group.max.size", "group.consumer.max.size"))

    # D-GROUP-1: samsa bounds both group sizes (Kafka: Integer.MAX_VALUE).
    deviations = [
        Deviation(f"limits.results[0].configs[{i}].{field}", "1000", "2147483647", "D-GROUP-1")
        for i in (0, 1)
        for field in ("value", "synonyms[0].value")
    ]
    differential(scenario, deviations=deviations, rules={"resource_name": Rule.NODE})


# Kafka 4.4's APIs samsa does not serve (D-ADMIN-5): (min, max) by key; and where both serve
# an API, the versions that differ, as (samsa, Kafka).
KAFKA_ONLY_APIS = {
    34: (1, 2), 38: (1, 3), 39: (1, 2), 40: (1, 2), 41: (1, 3),
    55: (0, 2), 64: (0, 0),
    80: (0, 1), 81: (0, 0), 83: (0, 0), 84: (0, 0), 85: (0, 1),
    86: (0, 0), 87: (0, 1), 88: (0, 1), 89: (0, 1),
    93: (0, 0), 94: (0, 0),
}  # fmt: skip
OTHER_VERSIONS = {
    0: ((3, 13), (0, 13)),
    18: ((0, 4), (0, 5)), 22: ((0, 6), (0, 5)), 28: ((0, 5), (0, 6)),
    42: ((0, 2), (0, 3)), 78: ((1, 1), (1, 2)), 79: ((1, 1), (1, 2)),
}  # fmt: skip


def test_api_versions(differential: Run) -> None:
    def scenario(s: Side) -> None:
        k, v = ApiKey.API_VERSIONS, 3
        req = make_request(k, v, "ApiVersionsRequest", client_software_name="samsa-oracle",
                           client_software_version="1")  # fmt: skip
        resp = s.conn.request(k, v, req)
        s.note("error", resp.error_code)
        s.note("apis", {str(a.api_key): [a.min_version, a.max_version] for a in resp.api_keys})

    deviations = [
        Deviation(f"apis.{key}", "<absent>", list(versions), "D-ADMIN-5")
        for key, versions in KAFKA_ONLY_APIS.items()
    ]
    # D-TELEM-1: Kafka lists the telemetry APIs only with a telemetry exporter plugin.
    deviations += [Deviation(f"apis.{key}", [0, 0], "<absent>", "D-TELEM-1") for key in (71, 72)]
    for key, (mine, theirs) in OTHER_VERSIONS.items():
        for i, field in enumerate(("min", "max")):
            if mine[i] != theirs[i]:
                deviations.append(Deviation(f"apis.{key}[{i}]", mine[i], theirs[i], "D-ADMIN-5"))
                del field
    differential(scenario, deviations=deviations)
