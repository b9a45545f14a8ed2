"""Kafka's everyday tools against samsa and against Apache Kafka, the same command lines,
compared once ids, ports, timestamps and column widths are normalised (tests/oracle/
_tool_oracle.py): kafka-topics, kafka-configs (topics, brokers, users), kafka-acls,
kafka-features, kafka-get-offsets, kafka-delete-records, kafka-leader-election and
kafka-log-dirs. Where samsa must answer otherwise, the test asserts exactly the D-TOOL
deviation of docs/semantics.md."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from _tool_oracle import AUTHORIZER, Out, Pair, tool_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with tool_pair(tmp_path_factory.mktemp("tools"), AUTHORIZER) as p:
        yield p


def _without_elr_min_isr(out: Out) -> Out:
    """Kafka's output less the cluster-level min.insync.replicas=1 that its controller sets
    when Eligible Leader Replicas are on (D-TOOL-1): a config line of its own, or an entry
    of kafka-topics' Configs: list."""
    lines = []
    for line in out.out:
        if line.startswith("min.insync.replicas=1 "):
            continue
        line = re.sub(r"(?<=Configs: )min\.insync\.replicas=1,?", "", line)
        lines.append(line.replace(",min.insync.replicas=1", "").strip())
    return Out(out.rc, lines, out.err)


def test_kafka_topics_create_describe_alter_delete(pair: Pair) -> None:
    bs = ("--bootstrap-server", "BS")
    created = pair.same(
        "kafka-topics", *bs, "--create", "--topic", "orders", "--partitions", "3",
        "--replication-factor", "1", "--config", "retention.ms=1000000",
    )  # fmt: skip
    assert created.out == ["Created topic orders."]
    twice = pair.same("kafka-topics", *bs, "--create", "--topic", "orders", "--partitions", "3")
    assert twice.rc == 1 and "Topic 'orders' already exists." in twice.text
    # a manual assignment on the one broker is what samsa does anyway; three replicas are not
    assert pair.same("kafka-topics", *bs, "--create", "--topic", "placed",
                     "--replica-assignment", "1,1").rc == 0  # fmt: skip
    three = pair.same("kafka-topics", *bs, "--create", "--topic", "x", "--replication-factor", "3")
    assert three.rc == 1 and "only 1 broker(s) are registered" in three.text
    assert pair.same_read("kafka-topics", *bs, "--list").out == ["orders", "placed"]
    grown = pair.same("kafka-topics", *bs, "--alter", "--topic", "orders", "--partitions", "4")
    assert grown.rc == 0
    down = pair.same("kafka-topics", *bs, "--alter", "--topic", "orders", "--partitions", "2")
    assert "currently has 4 partition(s); 2 would not be an increase" in down.text

    s, k = pair.settled("kafka-topics", *bs, "--describe", "--topic", "orders",
                        agree=lambda s, k: s == _without_elr_min_isr(k))  # fmt: skip
    assert s.rc == 0 and len(s.out) == 5 and "Configs: retention.ms=1000000" in s.out[0]
    assert "Leader: 1 Replicas: 1 Isr: 1 Elr: LastKnownElr:" in s.out[4]
    assert k.out[0].endswith("Configs: min.insync.replicas=1,retention.ms=1000000")
    assert s == _without_elr_min_isr(k)  # D-TOOL-1
    for flags in (["--under-replicated-partitions"], ["--unavailable-partitions"]):
        assert pair.same("kafka-topics", *bs, "--describe", *flags).out == []
    missing = pair.same("kafka-topics", *bs, "--describe", "--topic", "nosuch")
    assert missing.rc == 1 and "Topic 'nosuch' does not exist as expected" in missing.text

    assert pair.same("kafka-topics", *bs, "--delete", "--topic", "orders").rc == 0
    assert pair.same_read("kafka-topics", *bs, "--list", "--exclude-internal").out == ["placed"]


def test_kafka_configs_topics_and_brokers(pair: Pair) -> None:
    bs = ("--bootstrap-server", "BS")
    pair.same("kafka-topics", *bs, "--create", "--topic", "conf", "--partitions", "1")
    topic = ("--entity-type", "topics", "--entity-name", "conf")
    done = pair.same(
        "kafka-configs", *bs, *topic, "--alter",
        "--add-config", "retention.ms=5000,cleanup.policy=[compact,delete]",
    )  # fmt: skip
    assert done.out == ["Completed updating config for topic conf."]
    described = pair.same_read("kafka-configs", *bs, *topic, "--describe")
    # retention.ms has no broker synonym listed: log.retention.hours=168 only follows a
    # log.retention.ms set somewhere, as in Kafka's ConfigHelper
    assert described.out == [
        "Dynamic configs for topic conf are:",
        "cleanup.policy=compact,delete sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:"
        "cleanup.policy=compact,delete, DEFAULT_CONFIG:log.cleanup.policy=delete}",
        "retention.ms=5000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=5000}",
    ]
    pair.same("kafka-configs", *bs, *topic, "--alter", "--delete-config", "retention.ms")
    assert len(pair.same_read("kafka-configs", *bs, *topic, "--describe").out) == 2
    bad = pair.same("kafka-configs", *bs, *topic, "--alter", "--add-config", "retention.ms=x")
    assert bad.rc == 1 and "Not a number of type LONG" in bad.err[-1]
    # Every key both know, with its value, source and synonyms; min.insync.replicas has
    # Kafka's ELR cluster default as an extra synonym (D-TOOL-1).
    s, k = pair.run("kafka-configs", *bs, *topic, "--describe", "--all")
    mine = {line.split("=")[0]: line for line in s.out[1:]}
    theirs = {line.split("=")[0]: line for line in k.out[1:]}
    common = sorted(set(mine) & set(theirs) - {"min.insync.replicas"})
    assert len(common) >= 30 and [mine[n] for n in common] == [theirs[n] for n in common]
    assert mine["retention.ms"] == "retention.ms=604800000 sensitive=false synonyms={}"
    assert theirs["min.insync.replicas"] == mine["min.insync.replicas"].replace(
        "synonyms={", "synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:min.insync.replicas=1, "
    )

    default = ("--entity-type", "brokers", "--entity-default")
    pair.same("kafka-configs", *bs, *default, "--alter", "--add-config", "log.retention.ms=600000")
    s, k = pair.settled("kafka-configs", *bs, *default, "--describe",
                        agree=lambda s, k: s == _without_elr_min_isr(k))  # fmt: skip
    assert s.out == [
        "Default configs for brokers in the cluster are:",
        "log.retention.ms=600000 sensitive=false "
        "synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=600000}",
    ]
    assert s == _without_elr_min_isr(k)  # D-TOOL-1: "min.insync.replicas=1 ... synonyms={...}"
    # Now that log.retention.ms is set, Kafka's ConfigHelper lists the default of its hours
    # synonym after it, for the topic's retention.ms and the broker's log.retention.ms alike.
    for entity, key in ((topic, "retention.ms"), (("--entity-type", "brokers", "--entity-name",
                                                   "1"), "log.retention.ms")):  # fmt: skip
        s, k = pair.settled("kafka-configs", *bs, *entity, "--describe", "--all",
                            agree=lambda s, k, key=key: _line(s, key) == _line(k, key))  # fmt: skip
        assert (
            _line(s, key)
            == _line(k, key)
            == (
                f"{key}=600000 sensitive=false synonyms={{DYNAMIC_DEFAULT_BROKER_CONFIG:"
                "log.retention.ms=600000, DEFAULT_CONFIG:log.retention.hours=168}"
            )
        )
    s, k = pair.run("kafka-configs", *bs, "--entity-type", "brokers", "--entity-name", "1",
                    "--describe")  # fmt: skip
    assert s.out == ["Dynamic configs for broker 1 are:"] and k.out == s.out
    # A dynamic key Kafka knows and samsa does not use is taken by both (kept and described)
    ok = pair.same("kafka-configs", *bs, "--entity-type", "brokers", "--entity-name", "1",
                   "--alter", "--add-config", "log.cleaner.threads=2")  # fmt: skip
    assert ok.rc == 0 and ok.out == ["Completed updating config for broker 1."]
    # D-TOOL-2: a name Kafka does not know either (a misspelling) is refused by samsa, where
    # Kafka stores any name
    s, k = pair.run("kafka-configs", *bs, "--entity-type", "brokers", "--entity-name", "1",
                    "--alter", "--add-config", "log.cleaner.thread=2")  # fmt: skip
    assert k.rc == 0 and k.out == ["Completed updating config for broker 1."]
    assert s.rc == 1 and "log.cleaner.thread" in "\n".join(s.err)


def test_kafka_configs_scram_users(pair: Pair) -> None:
    bs = ("--bootstrap-server", "BS")
    alice = ("--entity-type", "users", "--entity-name", "alice")
    # One change per user and request, as Kafka's controller: both mechanisms at once fail.
    both = pair.same(
        "kafka-configs", *bs, *alice, "--alter", "--add-config",
        "SCRAM-SHA-256=[iterations=8192,password=a-secret],SCRAM-SHA-512=[password=a-secret]",
    )  # fmt: skip
    assert both.rc == 1
    assert any("cannot be altered twice in the same request" in line for line in both.err)
    for mechanism in ("SCRAM-SHA-256=[iterations=8192,password=a-secret]",
                      "SCRAM-SHA-512=[password=a-secret]"):  # fmt: skip
        ok = pair.same("kafka-configs", *bs, *alice, "--alter", "--add-config", mechanism)
        assert ok.out == ["Completed updating config for user alice."]
    described = pair.same_read("kafka-configs", *bs, *alice, "--describe")
    assert described.out == [
        "SCRAM credential configs for user-principal 'alice' are "
        "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096"
    ]
    assert pair.same_read("kafka-configs", *bs, "--entity-type", "users", "--describe") == described
    pair.same("kafka-configs", *bs, *alice, "--alter", "--delete-config", "SCRAM-SHA-512")
    gone = pair.same("kafka-configs", *bs, *alice, "--alter", "--delete-config", "SCRAM-SHA-512")
    assert gone.rc == 1
    assert any("delete a user credential that does not exist" in line for line in gone.err)
    # Client quotas (D-TOOL-4 withdrawn): stored and described as Kafka's
    bob = ("--entity-type", "users", "--entity-name", "bob")
    ok = pair.same("kafka-configs", *bs, *bob, "--alter", "--add-config", "producer_byte_rate=1024")
    assert ok.rc == 0 and ok.out == ["Completed updating config for user bob."]
    s, k = pair.settled("kafka-configs", *bs, *bob, "--describe", agree=lambda s, k: s == k)
    assert s == k
    assert k.out == ["Quota configs for user-principal 'bob' are producer_byte_rate=1024.0"]
    bob_etl = (*bob, "--entity-type", "clients", "--entity-name", "etl")
    ok = pair.same("kafka-configs", *bs, *bob_etl, "--alter", "--add-config",
                   "consumer_byte_rate=2048,request_percentage=12.5")  # fmt: skip
    assert ok.rc == 0
    pair.settled("kafka-configs", *bs, *bob_etl, "--describe", agree=lambda s, k: s == k)
    bad = pair.same("kafka-configs", *bs, *bob, "--alter", "--add-config", "producer_byte_rate=1.5")
    assert bad.rc == 1 and "producer_byte_rate cannot be a fractional value." in bad.err[-1]


def _line(out: Out, key: str) -> str | None:
    """The line of ``key`` in a kafka-configs --describe --all."""
    return next((line.strip() for line in out.out if line.strip().startswith(key + "=")), None)


def _blocks(out: Out) -> list[list[str]]:
    """kafka-acls' per-resource blocks, their ACLs and the blocks in a fixed order (Kafka's
    follow hash sets)."""
    blocks: list[list[str]] = []
    for line in out.out:
        if line.startswith(("Current ACLs", "Adding ACLs")) or not blocks:
            blocks.append([line])
        else:
            blocks[-1].append(line)
    return sorted([block[0], *sorted(block[1:])] for block in blocks)


def test_kafka_acls_add_list_remove(pair: Pair) -> None:
    bs = ("--bootstrap-server", "BS")
    adds = [
        ("--allow-principal", "User:alice", "--operation", "Read", "--operation", "Write",
         "--topic", "t2"),
        ("--allow-principal", "User:bob", "--operation", "Read", "--group", "g-",
         "--resource-pattern-type", "prefixed"),
        ("--deny-principal", "User:eve", "--deny-host", "10.0.0.1", "--operation", "All",
         "--cluster"),
        ("--producer", "--allow-principal", "User:p", "--topic", "t2", "--transactional-id",
         "tx1"),
        ("--consumer", "--allow-principal", "User:c", "--topic", "t2", "--group", "g2"),
    ]  # fmt: skip
    for add in adds:
        s, k = pair.run("kafka-acls", *bs, "--add", *add)
        assert s.rc == 0 and _blocks(s) == _blocks(k)
    for listing in ([], ["--topic", "t2"], ["--principal", "User:bob"], ["--principal", "User:p"]):
        s, k = pair.settled("kafka-acls", *bs, "--list", *listing,
                            agree=lambda s, k: _blocks(s) == _blocks(k))  # fmt: skip
        assert _blocks(s) == _blocks(k) and s.out
    pair.same("kafka-acls", *bs, "--remove", "--allow-principal", "User:alice", "--operation",
              "Write", "--topic", "t2", "--force")  # fmt: skip
    s, k = pair.settled("kafka-acls", *bs, "--list", "--topic", "t2",
                        agree=lambda s, k: _blocks(s) == _blocks(k))  # fmt: skip
    assert _blocks(s) == _blocks(k)
    assert not any("principal=User:alice, host=*, operation=WRITE" in x for x in s.out)


def test_kafka_features(pair: Pair) -> None:
    bs = ("--bootstrap-server", "BS")
    s, k = pair.run("kafka-features", *bs, "describe")

    def feature(line: str) -> str:
        return re.sub(r" Epoch: \d+$", "", line)

    # D-TOOL-3: samsa finalizes the features it implements; Kafka's also lists the KRaft,
    # metadata, Eligible Leader Replicas, share and streams features samsa has none of.
    kafka_only = {"eligible.leader.replicas.version", "kraft.version", "metadata.version",
                  "share.version", "streams.version"}  # fmt: skip
    assert [feature(x) for x in s.out] == [
        feature(x) for x in k.out if x.split(" ")[1] not in kafka_only
    ]
    assert [x.split(" ")[1] for x in s.out] == ["group.version", "transaction.version"]
    assert {x.split(" ")[1] for x in k.out} - {"group.version", "transaction.version"} == (
        kafka_only
    )
    assert pair.same("kafka-features", *bs, "upgrade", "--feature", "group.version=1",
                     "--dry-run").out == ["group.version can be upgraded to 1."]  # fmt: skip
    down = pair.same("kafka-features", *bs, "downgrade", "--feature", "transaction.version=1",
                     "--dry-run")  # fmt: skip
    assert down.out == ["transaction.version can be downgraded to 1."]


def test_offsets_delete_records_log_dirs_leader_election(pair: Pair, tmp_path: Path) -> None:
    bs = ("--bootstrap-server", "BS")
    for topic in ("recs", "empty"):
        pair.same("kafka-topics", *bs, "--create", "--topic", topic, "--partitions", "1")
    lines = "".join(f"k{i}:v{i}\n" for i in range(6))
    pair.same("kafka-console-producer", *bs, "--topic", "recs",
              "--reader-property", "parse.key=true", "--reader-property", "key.separator=:",
              input=lines)  # fmt: skip
    assert pair.same("kafka-get-offsets", *bs, "--topic", "recs").out == ["recs:0:6"]
    deleted = pair.same("kafka-delete-records", *bs, "--offset-json-file",
                        str(_plan(tmp_path, "recs", 0, 4)))  # fmt: skip
    assert deleted.out[-1] == "partition: recs-0 low_watermark: 4"
    assert pair.same("kafka-get-offsets", *bs, "--topic", "recs", "--time", "-2").out == [
        "recs:0:4"
    ]
    beyond = pair.same("kafka-delete-records", *bs, "--offset-json-file",
                       str(_plan(tmp_path, "empty", 0, 5)))  # fmt: skip
    assert "OffsetOutOfRangeException" in beyond.text

    dirs = pair.same("kafka-log-dirs", *bs, "--describe", "--topic-list", "recs")
    report = json.loads(dirs.out[-1])
    assert [b["broker"] for b in report["brokers"]] == [1]
    assert [p["partition"] for p in report["brokers"][0]["logDirs"][0]["partitions"]] == ["recs-0"]

    election = ("kafka-leader-election", *bs, "--election-type")
    assert pair.same(*election, "preferred", "--all-topic-partitions").out == []
    assert pair.same(*election, "unclean", "--topic", "recs", "--partition", "0").out == [
        "Valid replica already elected for partitions recs-0"
    ]
    unknown = pair.same(*election, "preferred", "--topic", "recs", "--partition", "5")
    assert unknown.rc == 1 and "No such partition as recs-5" in unknown.text


def _plan(tmp: Path, topic: str, partition: int, offset: int) -> Path:
    path = tmp / f"{topic}-{partition}.json"
    path.write_text(
        json.dumps({"partitions": [{"topic": topic, "partition": partition, "offset": offset}]})
    )
    return path
