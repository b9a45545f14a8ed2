"""Option parsing for the Spark source and sink, with the names of Spark's Kafka connector.

Nothing here imports pyspark, so the rules are testable without a SparkSession. Every bad
option raises :class:`SparkOptionError` naming the option and what it accepts.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from samsa.client import TopicPartition
from samsa.protocol.constants import EARLIEST, LATEST

# Spark's Kafka connector refuses these kafka.* options because it manages them itself.
_MANAGED = {
    "group.id": "the source reads by assignment, not with a consumer group",
    "auto.offset.reset": "use startingOffsets instead",
    "enable.auto.commit": "offsets are tracked in Spark's checkpoint, not committed",
    "key.deserializer": "keys are always returned as binary",
    "value.deserializer": "values are always returned as binary",
    "key.serializer": "keys are written as binary (cast the column to string or binary)",
    "value.serializer": "values are written as binary (cast the column to string or binary)",
    "interceptor.classes": "interceptors are not supported",
    "transactional.id": "the exactly-once sink derives transactional ids itself "
    "(see transactionalIdPrefix)",
    "enable.idempotence": "the sink is always idempotent",
}
# kafka.* settings accepted and passed to the samsa client.
_CLIENT_COMMON = {
    "client.id",
    "request.timeout.ms",
    "retry.backoff.ms",
    "retry.backoff.max.ms",
    "socket.connection.setup.timeout.ms",
    "metadata.max.age.ms",
    # listeners' security, under the samsa client's (confluent-kafka's) names
    "security.protocol",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
}
_CONSUMER_KEYS = _CLIENT_COMMON | {
    "fetch.min.bytes",
    "fetch.max.bytes",
    "fetch.max.wait.ms",
    "max.partition.fetch.bytes",
    "max.poll.records",
    "check.crcs",
}
_PRODUCER_KEYS = _CLIENT_COMMON | {
    "acks",
    "linger.ms",
    "batch.size",
    "compression.type",
    "delivery.timeout.ms",
    "max.in.flight.requests.per.connection",
    "max.block.ms",
    "buffer.memory",
    "transaction.timeout.ms",
    "transaction.two.phase.commit.enable",  # KIP-939: the task-to-driver hand-off by 2PC
}
# The JVM client's names Spark's Kafka connector users write, read as the samsa client's.
_JAAS_MODULES = ("PlainLoginModule", "ScramLoginModule")
_JAAS_OPTION = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _jaas(value: str) -> dict[str, str]:
    """sasl.username / sasl.password from a PLAIN or SCRAM ``sasl.jaas.config``."""
    # a backslash escapes the next character inside quotes, as in Java's JAAS parser
    found = {k: re.sub(r"\\(.)", r"\1", v) for k, v in _JAAS_OPTION.findall(value)}
    if not any(m in value for m in _JAAS_MODULES) or set(found) != {"username", "password"}:
        raise SparkOptionError(
            "option kafka.sasl.jaas.config: samsa reads a PlainLoginModule or "
            'ScramLoginModule entry with username="..." and password="..."'
        )
    return {"sasl.username": found["username"], "sasl.password": found["password"]}


class SparkOptionError(ValueError):
    """A missing, unknown or malformed option of the samsa Spark source or sink."""


def lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    """Spark option names are case-insensitive: compare them lower-cased."""
    return {str(k).lower(): str(v) for k, v in options.items()}


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise SparkOptionError(f"option {name} must be true or false, got {raw!r}")


def _positive_int(opts: Mapping[str, str], name: str) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise SparkOptionError(f"option {name} must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise SparkOptionError(f"option {name} must be a positive integer, got {raw!r}")
    return value


def client_config(
    opts: Mapping[str, str], *, role: Literal["consumer", "producer"]
) -> dict[str, Any]:
    """The samsa client settings from the ``kafka.*`` options (prefix removed)."""
    servers = opts.get("kafka.bootstrap.servers")
    if not servers or not servers.strip():
        raise SparkOptionError(
            "option kafka.bootstrap.servers is required (a comma-separated host:port list)"
        )
    allowed = _CONSUMER_KEYS if role == "consumer" else _PRODUCER_KEYS
    config: dict[str, Any] = {"bootstrap.servers": servers.strip()}
    for key, value in opts.items():
        if not key.startswith("kafka.") or key == "kafka.bootstrap.servers":
            continue
        name = key[len("kafka.") :]
        if name == "isolation.level":
            continue  # handled by the source itself
        if name in _MANAGED:
            raise SparkOptionError(f"option kafka.{name} is not supported: {_MANAGED[name]}")
        if name == "sasl.jaas.config":
            config.update(_jaas(value))
            continue
        if name == "ssl.truststore.type":
            if value.strip().upper() != "PEM":
                raise SparkOptionError(
                    f"option kafka.ssl.truststore.type: samsa reads PEM only, got {value!r}"
                )
            continue
        if name == "ssl.truststore.location":
            config["ssl.ca.location"] = value  # a PEM file of CA certificates
            continue
        if name not in allowed:
            raise SparkOptionError(
                f"option kafka.{name} is not a samsa {role} setting; "
                f"supported: {', '.join(sorted('kafka.' + k for k in allowed))}"
            )
        config[name] = value
    return config


# --- subscriptions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Subscription:
    """Which partitions a query reads: exactly one of subscribe, subscribePattern, assign."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartition, ...] = ()

    def resolve(self, partitions_of: Mapping[str, int]) -> list[TopicPartition]:
        """The partitions to read given the cluster's topics (name -> partition count)."""
        if self.kind == "assign":
            return list(self.assigned)
        if self.kind == "subscribe":
            names = [t for t in self.topics if t in partitions_of]
        else:
            rx = re.compile(self.pattern or "")
            names = sorted(t for t in partitions_of if rx.fullmatch(t) and not t.startswith("__"))
        return [TopicPartition(t, p) for t in names for p in range(partitions_of[t])]

    def topic_names(self) -> list[str] | None:
        """Topics to ask metadata for (None: all topics, for a pattern)."""
        if self.kind == "subscribe":
            return list(self.topics)
        if self.kind == "assign":
            return sorted({tp.topic for tp in self.assigned})
        return None


def parse_subscription(opts: Mapping[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    names = {"subscribe": "subscribe", "subscribepattern": "subscribePattern", "assign": "assign"}
    if len(given) != 1:
        found = ", ".join(names[k] for k in given) or "none"
        raise SparkOptionError(
            "exactly one of the options subscribe, subscribePattern, assign must be given "
            f"(found: {found})"
        )
    kind = given[0]
    raw = opts[kind]
    if kind == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise SparkOptionError("option subscribe must list at least one topic")
        return Subscription("subscribe", topics=topics)
    if kind == "subscribepattern":
        if not raw.strip():
            raise SparkOptionError("option subscribePattern must not be empty")
        try:
            re.compile(raw)
        except re.error as exc:
            raise SparkOptionError(f"option subscribePattern is not a valid regex: {exc}") from None
        return Subscription("subscribePattern", pattern=raw)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not data:
        raise SparkOptionError(
            'option assign must be a JSON object of topic -> partition list, e.g. {"t":[0,1]}, '
            f"got {raw!r}"
        )
    tps: list[TopicPartition] = []
    for topic, parts in data.items():
        if not isinstance(parts, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts
        ):
            raise SparkOptionError(
                f"option assign: partitions of {topic!r} must be a list of non-negative integers"
            )
        tps.extend(TopicPartition(str(topic), p) for p in parts)
    return Subscription("assign", assigned=tuple(sorted(set(tps))))


# --- offsets -------------------------------------------------------------------------------

OffsetSpec = Literal["earliest", "latest"] | dict[TopicPartition, int]


def parse_offsets(
    opts: Mapping[str, str], name: str, default: Literal["earliest", "latest"], *, streaming: bool
) -> OffsetSpec:
    """``earliest``, ``latest`` or JSON ``{"topic":{"0":23,"1":-2}}`` (-2 earliest, -1 latest)."""
    raw = opts.get(name.lower())
    if raw is None:
        return default
    word = raw.strip().lower()
    ending = name == "endingOffsets"
    if word in ("earliest", "latest"):
        if ending and word == "earliest":
            raise SparkOptionError("option endingOffsets cannot be earliest")
        if not ending and not streaming and word == "latest":
            raise SparkOptionError("option startingOffsets cannot be latest for a batch query")
        return word  # type: ignore[return-value]
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise SparkOptionError(
            f'option {name} must be earliest, latest or JSON like {{"topic":{{"0":23,"1":-2}}}}'
            f", got {raw!r}"
        )
    out: dict[TopicPartition, int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise SparkOptionError(f"option {name}: {topic!r} must map partitions to offsets")
        for part, off in parts.items():
            if not str(part).isdigit() or not isinstance(off, int) or isinstance(off, bool):
                raise SparkOptionError(
                    f"option {name}: {topic}/{part} must be a partition number mapped to an "
                    f"integer offset, got {off!r}"
                )
            if off < EARLIEST:
                raise SparkOptionError(f"option {name}: offset {off} of {topic}/{part} is < -2")
            if ending and off == EARLIEST:
                raise SparkOptionError(
                    f"option endingOffsets: -2 (earliest) is not allowed ({topic}/{part})"
                )
            if not ending and not streaming and off == LATEST:
                raise SparkOptionError(
                    f"option startingOffsets: -1 (latest) is not allowed in a batch query "
                    f"({topic}/{part})"
                )
            out[TopicPartition(str(topic), int(part))] = off
    return out


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Canonical offset document: topics sorted, partitions in numeric order."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def offsets_from_json(doc: Mapping[str, Any]) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for topic, parts in doc.items():
        for part, off in dict(parts).items():
            out[TopicPartition(str(topic), int(part))] = int(off)
    return out


# --- the source ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceOptions:
    client: dict[str, Any]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    isolation_level: str
    fail_on_data_loss: bool
    include_headers: bool
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    poll_timeout_s: float
    streaming: bool

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        opts = lower_keys(options)
        client = client_config(opts, role="consumer")
        iso = opts.get("kafka.isolation.level", "read_committed").strip().lower()
        if iso not in ("read_committed", "read_uncommitted"):
            raise SparkOptionError(
                f"option kafka.isolation.level must be read_committed or read_uncommitted, "
                f"got {opts['kafka.isolation.level']!r}"
            )
        if streaming and "endingoffsets" in opts:
            raise SparkOptionError("option endingOffsets is for batch queries only")
        if not streaming and "maxoffsetspertrigger" in opts:
            raise SparkOptionError("option maxOffsetsPerTrigger is for streaming queries only")
        poll = _positive_int(opts, "kafkaConsumer.pollTimeoutMs") or 120_000
        return cls(
            client=client,
            subscription=parse_subscription(opts),
            starting=parse_offsets(
                opts, "startingOffsets", "latest" if streaming else "earliest", streaming=streaming
            ),
            ending=parse_offsets(opts, "endingOffsets", "latest", streaming=streaming),
            isolation_level=iso,
            fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
            include_headers=_bool(opts, "includeHeaders", False),
            max_offsets_per_trigger=_positive_int(opts, "maxOffsetsPerTrigger"),
            min_partitions=_positive_int(opts, "minPartitions"),
            poll_timeout_s=poll / 1000.0,
            streaming=streaming,
        )

    def consumer_config(self) -> dict[str, Any]:
        return {
            "max.poll.records": 10_000,
            "max.partition.fetch.bytes": 4 * 1024 * 1024,
            "fetch.max.wait.ms": 100,
            **self.client,
            "isolation.level": self.isolation_level,
            "enable.auto.commit": False,
            "auto.offset.reset": "none",
        }


# --- the sink ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkOptions:
    client: dict[str, Any]
    topic: str | None
    exactly_once: bool
    transactional_id_prefix: str
    stable_prefix: bool  # derived from the query's identity (survives a driver restart)
    # test hook: (spark partition, records, once-file): attempt 0 of that partition dies
    # after that many records; with a file, only the first time (the file records it)
    inject_task_failure: tuple[int, int, str | None] | None = None
    inject_commit_failure: int | None = None  # batch id after whose commit the driver "crashes"

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool, job_id: str) -> SinkOptions:
        opts = lower_keys(options)
        client = client_config(opts, role="producer")
        topic = opts.get("topic")
        if topic is not None and not topic.strip():
            raise SparkOptionError("option topic must not be empty")
        exactly_once = _bool(opts, "exactlyOnce", True)
        prefix = opts.get("transactionalidprefix")
        stable = True
        if prefix is None:
            identity = opts.get("checkpointlocation") or opts.get("queryname")
            if streaming and identity:
                digest = hashlib.sha1(identity.encode()).hexdigest()[:16]
                prefix = f"samsa-spark-{digest}"
            else:
                prefix = f"samsa-spark-{job_id}"
                stable = not streaming
        elif not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", prefix):
            raise SparkOptionError(
                "option transactionalIdPrefix may hold only letters, digits, '.', '_', '-'"
            )
        fail = opts.get("injecttaskfailure")
        inject: tuple[int, int, str | None] | None = None
        if fail is not None:
            part, sep, rest = fail.partition(":")
            count, _, once = rest.partition(":")
            if not sep or not part.isdigit() or not count.isdigit():
                raise SparkOptionError(
                    f"option injectTaskFailure must be PARTITION:RECORDS[:ONCE_FILE], got {fail!r}"
                )
            inject = (int(part), int(count), once or None)
        crash = opts.get("injectcommitfailure")
        if crash is not None and not crash.isdigit():
            raise SparkOptionError(f"option injectCommitFailure must be a batch id, got {crash!r}")
        return cls(
            client=client,
            topic=topic.strip() if topic else None,
            exactly_once=exactly_once,
            transactional_id_prefix=prefix,
            stable_prefix=stable,
            inject_task_failure=inject,
            inject_commit_failure=int(crash) if crash is not None else None,
        )

    @property
    def marker_group(self) -> str:
        """The group whose offsets record, per Spark partition, the next batch id to commit."""
        return f"{self.transactional_id_prefix}.batches"


MARKER_TOPIC = "__samsa_spark_batches"


def marker_partition(spark_partition: int) -> TopicPartition:
    return TopicPartition(MARKER_TOPIC, spark_partition)
