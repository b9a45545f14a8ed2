"""The topic-level configs samsa supports: one table, used by CreateTopics, DescribeConfigs,
AlterConfigs and IncrementalAlterConfigs.

Each key has Kafka's name, type, default and validator, the :class:`LogConfig` field it sets,
and its broker synonyms (the ``log.*`` settings a topic without its own value inherits), in
Kafka's order: the most specific broker name first, the one holding Kafka's default last.
A topic's own values are its dynamic configs (source DYNAMIC_TOPIC_CONFIG); otherwise the
broker synonym set at the most specific level wins: this broker's dynamic config
(DYNAMIC_BROKER_CONFIG), the cluster default (DYNAMIC_DEFAULT_BROKER_CONFIG, rule 44), the
broker's static config (STATIC_BROKER_CONFIG), else Kafka's default (DEFAULT_CONFIG).
Unknown keys and invalid values are refused with INVALID_CONFIG, as Kafka does.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from samsa.broker.config import broker_setting

if TYPE_CHECKING:
    from samsa.broker.config import BrokerConfig

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1


class ConfigSource(enum.IntEnum):
    """DescribeConfigs' ``config_source`` (v1+)."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    CLIENT_METRICS_CONFIG = 7  # a client metrics subscription's (KIP-714)
    GROUP_CONFIG = 8  # a group's own (KIP-848)


class ConfigType(enum.IntEnum):
    """DescribeConfigs' ``config_type`` (v3+)."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


_NOT_A_NUMBER = "not an integer"


def _integer(low: int, high: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(_NOT_A_NUMBER) from None
        if not low <= value <= high:
            raise ValueError(
                f"Value must be at least {low}" if value < low else f"must be at most {high}"
            )
        return value

    return parse


def _level(low: int, high: int, default: int | None = None) -> Callable[[str], int]:
    """A KIP-390 compression level: within [low, high], or the codec's default marker."""
    within = _integer(-(2**31), INT_MAX)

    def parse(raw: str) -> int:
        value = within(raw)
        if value != default and not low <= value <= high:
            extra = f" or {default}" if default is not None else ""
            raise ValueError(f"must be between {low} and {high}{extra}")
        return value

    return parse


def _boolean(raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ValueError("must be true or false")
    return value == "true"


_REPLICA = re.compile(r"^\d+:\d+$")


def _throttled_replicas(raw: str) -> str:
    """Kafka's ThrottledReplicaListValidator: '*' or partition:broker pairs."""
    items = [p.strip() for p in raw.split(",") if p.strip()]
    if items != ["*"] and not all(_REPLICA.match(p) for p in items):
        raise ValueError("must be '*' or a list of partitionId:brokerId pairs")
    return ",".join(items)


_NO_TIERED_STORAGE = "samsa has no tiered storage"


def _remote_storage(raw: str) -> bool:
    if _boolean(raw):
        raise ValueError(f"{_NO_TIERED_STORAGE}; only false is accepted")
    return False


def _only(default: str, why: str) -> Callable[[str], object]:
    """A key samsa keeps at Kafka's default: that value (parsed as its type) and no other."""

    def parse(raw: str) -> object:
        if raw.strip().lower() != default:
            raise ValueError(f"{why}; only {default} is accepted")
        return _boolean(raw) if default in ("true", "false") else int(raw)

    return parse


def _local_retention(raw: str) -> int:
    value = _integer(-2, LONG_MAX)(raw)
    if value != -2:
        raise ValueError(
            f"{_NO_TIERED_STORAGE}; only -2 (the whole retention is local) is accepted"
        )
    return value


def _ratio(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("not a number") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be between 0 and 1")
    return value


def _policy(raw: str) -> str:
    """KIP-1161 (Kafka 4.4): an empty list is a policy too, neither delete nor compact, so
    the log is kept whole (but for DeleteRecords); an empty entry in a list is refused."""
    if not raw.strip():
        return ""
    parts = [p.strip().lower() for p in raw.split(",")]
    if any(p not in ("compact", "delete") for p in parts):
        raise ValueError("must be a list of 'compact' and 'delete' (or empty), without blanks")
    return ",".join(sorted(set(parts)))


def _one_of(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw.strip() not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return raw.strip()

    return parse


@dataclass(frozen=True, slots=True)
class TopicConfigKey:
    name: str
    config_type: ConfigType
    field: str  # the LogConfig attribute it sets
    parse: Callable[[str], object]  # raises ValueError with the reason
    default: str  # Kafka's default, in the topic's unit
    # Broker settings it inherits from, most specific first; the last holds Kafka's default
    # (shown as such) with ``default_synonym_value`` in its own unit. None for a key Kafka
    # has no broker setting for.
    synonyms: tuple[str, ...]
    default_synonym_value: str
    doc: str


_KEYS = (
    TopicConfigKey(
        "cleanup.policy",
        ConfigType.LIST,
        "cleanup_policy",
        _policy,
        "delete",
        ("log.cleanup.policy",),
        "delete",
        "'delete' removes old segments by retention; 'compact' keeps the last value of each "
        "key; empty: neither, the log is kept whole.",
    ),
    TopicConfigKey(
        "retention.ms",
        ConfigType.LONG,
        "retention_ms",
        _integer(-1, LONG_MAX),
        "604800000",
        ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
        "168",
        "How long a segment is kept after its newest record; -1: no time limit.",
    ),
    TopicConfigKey(
        "retention.bytes",
        ConfigType.LONG,
        "retention_bytes",
        _integer(-(2**63), LONG_MAX),
        "-1",
        ("log.retention.bytes",),
        "-1",
        "Old segments are deleted while the partition is larger than this; -1: no limit.",
    ),
    TopicConfigKey(
        "segment.bytes",
        ConfigType.INT,
        "segment_bytes",
        _integer(1024 * 1024, INT_MAX),  # Kafka 4 (KIP-1030): at least 1 MiB
        "1073741824",
        ("log.segment.bytes",),
        "1073741824",
        "The size at which the active segment is rolled.",
    ),
    TopicConfigKey(
        "segment.ms",
        ConfigType.LONG,
        "segment_ms",
        _integer(1, LONG_MAX),
        "604800000",
        ("log.roll.ms", "log.roll.hours"),
        "168",
        "An append rolls the active segment once its first batch is older than this.",
    ),
    TopicConfigKey(
        "max.message.bytes",
        ConfigType.INT,
        "max_message_bytes",
        _integer(0, INT_MAX),
        "1048588",
        ("message.max.bytes",),
        "1048588",
        "The largest record batch a Produce may append (MESSAGE_TOO_LARGE above it).",
    ),
    TopicConfigKey(
        "message.timestamp.type",
        ConfigType.STRING,
        "message_timestamp_type",
        _one_of("CreateTime", "LogAppendTime"),
        "CreateTime",
        ("log.message.timestamp.type",),
        "CreateTime",
        "CreateTime keeps the producer's timestamps; LogAppendTime stamps the broker's clock.",
    ),
    TopicConfigKey(
        "min.compaction.lag.ms",
        ConfigType.LONG,
        "min_compaction_lag_ms",
        _integer(0, LONG_MAX),
        "0",
        ("log.cleaner.min.compaction.lag.ms",),
        "0",
        "A record stays uncompacted at least this long.",
    ),
    TopicConfigKey(
        "max.compaction.lag.ms",
        ConfigType.LONG,
        "max_compaction_lag_ms",
        _integer(1, LONG_MAX),
        str(LONG_MAX),
        ("log.cleaner.max.compaction.lag.ms",),
        str(LONG_MAX),
        "A record is eligible for compaction at the latest this long after it was written.",
    ),
    TopicConfigKey(
        "delete.retention.ms",
        ConfigType.LONG,
        "delete_retention_ms",
        _integer(0, LONG_MAX),
        "86400000",
        ("log.cleaner.delete.retention.ms",),
        "86400000",
        "How long tombstones stay in a compacted topic.",
    ),
    TopicConfigKey(
        "min.cleanable.dirty.ratio",
        ConfigType.DOUBLE,
        "min_cleanable_dirty_ratio",
        _ratio,
        "0.5",
        ("log.cleaner.min.cleanable.ratio",),
        "0.5",
        "The share of uncompacted log above which the cleaner compacts it.",
    ),
    TopicConfigKey(
        "compression.type",
        ConfigType.STRING,
        "compression_type",
        _one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
        "producer",
        ("compression.type",),
        "producer",
        "The codec batches are stored in; a batch in another is re-encoded on append "
        "(rule 39). 'producer' keeps the producer's codec, 'uncompressed' stores none.",
    ),
    TopicConfigKey(
        "compression.gzip.level",
        ConfigType.INT,
        "compression_gzip_level",
        _level(1, 9, -1),
        "-1",
        ("compression.gzip.level",),
        "-1",
        "The gzip level of batches the broker re-encodes in gzip (1-9; -1: the default).",
    ),
    TopicConfigKey(
        "compression.lz4.level",
        ConfigType.INT,
        "compression_lz4_level",
        _level(1, 17),
        "9",
        ("compression.lz4.level",),
        "9",
        "The lz4 level of batches the broker re-encodes in lz4.",
    ),
    TopicConfigKey(
        "compression.zstd.level",
        ConfigType.INT,
        "compression_zstd_level",
        _level(-131072, 22),  # zstd's ZSTD_minCLevel() .. ZSTD_maxCLevel()
        "3",
        ("compression.zstd.level",),
        "3",
        "The zstd level of batches the broker re-encodes in zstd.",
    ),
    TopicConfigKey(
        "min.insync.replicas",
        ConfigType.INT,
        "min_insync_replicas",
        _integer(1, INT_MAX),
        "1",
        ("min.insync.replicas",),
        "1",
        "The in-sync replicas an acks=all Produce needs (NOT_ENOUGH_REPLICAS below it); "
        "samsa has one, so above 1 every acks=all write is refused (rule 40).",
    ),
    TopicConfigKey(
        "message.timestamp.before.max.ms",
        ConfigType.LONG,
        "message_timestamp_before_max_ms",
        _integer(0, LONG_MAX),
        str(LONG_MAX),
        ("log.message.timestamp.before.max.ms",),
        str(LONG_MAX),
        "Under CreateTime, a batch with a record timestamp older than this before the broker's "
        "clock is refused with INVALID_TIMESTAMP (rule 41).",
    ),
    TopicConfigKey(
        "message.timestamp.after.max.ms",
        ConfigType.LONG,
        "message_timestamp_after_max_ms",
        _integer(0, LONG_MAX),
        "3600000",
        ("log.message.timestamp.after.max.ms",),
        "3600000",
        "Under CreateTime, a batch with a record timestamp further than this ahead of the "
        "broker's clock is refused with INVALID_TIMESTAMP (rule 41).",
    ),
    TopicConfigKey(
        "flush.messages",
        ConfigType.LONG,
        "flush_interval_messages",
        _integer(1, LONG_MAX),
        str(LONG_MAX),
        ("log.flush.interval.messages",),
        str(LONG_MAX),
        "An append leaving this many records unflushed is fsynced before it is acknowledged "
        "(1: every append; rule 42).",
    ),
    TopicConfigKey(
        "flush.ms",
        ConfigType.LONG,
        "flush_ms",
        _integer(0, LONG_MAX),
        str(LONG_MAX),
        # Kafka: log.flush.interval.ms has no default and falls back to the scheduler's
        ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
        str(LONG_MAX),
        "An append while records older than this are unflushed is fsynced before it is "
        "acknowledged (0: every append; rule 42).",
    ),
    TopicConfigKey(
        "segment.jitter.ms",
        ConfigType.LONG,
        "segment_jitter_ms",
        _integer(0, LONG_MAX),
        "0",
        ("log.roll.jitter.ms", "log.roll.jitter.hours"),
        "0",
        "Each segment rolls up to a random share of this sooner than segment.ms.",
    ),
    TopicConfigKey(
        "index.interval.bytes",
        ConfigType.INT,
        "index_interval_bytes",
        _integer(0, INT_MAX),
        "4096",
        ("log.index.interval.bytes",),
        "4096",
        "Bytes of batches between offset-index entries (new segments take a new value).",
    ),
    TopicConfigKey(
        "segment.index.bytes",
        ConfigType.INT,
        "segment_index_bytes",
        _integer(4, INT_MAX),
        "10485760",
        ("log.index.size.max.bytes",),
        "10485760",
        "Kafka's preallocated index size. samsa: validated and kept; its indexes grow as needed "
        "and a segment rolls by segment.bytes only (rule 43).",
    ),
    TopicConfigKey(
        "preallocate",
        ConfigType.BOOLEAN,
        "preallocate",
        _boolean,
        "false",
        ("log.preallocate",),
        "false",
        "Kafka preallocates new segment files. samsa: validated and kept; files grow as written "
        "(rule 43).",
    ),
    TopicConfigKey(
        "file.delete.delay.ms",
        ConfigType.LONG,
        "file_delete_delay_ms",
        _integer(0, LONG_MAX),
        "60000",
        ("log.segment.delete.delay.ms",),
        "60000",
        "Kafka's wait before deleting a segment's files. samsa: validated and kept; a fetch "
        "holds the files it reads, so they are deleted at once (rule 43).",
    ),
    TopicConfigKey(
        "unclean.leader.election.enable",
        ConfigType.BOOLEAN,
        "unclean_leader_election_enable",
        _boolean,
        "false",
        ("unclean.leader.election.enable",),
        "false",
        "Whether a replica outside the in-sync set may become leader. samsa: one replica, "
        "always the leader, so nothing to elect (rule 43).",
    ),
    TopicConfigKey(
        "leader.replication.throttled.replicas",
        ConfigType.LIST,
        "leader_replication_throttled_replicas",
        _throttled_replicas,
        "",
        (),
        "",
        "Replicas whose replication the leader throttles. samsa: no followers, nothing to "
        "throttle (rule 43).",
    ),
    TopicConfigKey(
        "follower.replication.throttled.replicas",
        ConfigType.LIST,
        "follower_replication_throttled_replicas",
        _throttled_replicas,
        "",
        (),
        "",
        "Replicas whose fetching from the leader is throttled. samsa: no followers (rule 43).",
    ),
    TopicConfigKey(
        "remote.storage.enable",
        ConfigType.BOOLEAN,
        "remote_storage_enable",
        _remote_storage,
        "false",
        (),
        "",
        "Tiered storage. samsa has none: only false is accepted (rule 43).",
    ),
    TopicConfigKey(
        "max.decompressed.message.bytes",
        ConfigType.INT,
        "max_decompressed_message_bytes",
        _only(
            "2147483639",
            "samsa bounds a batch's inflated records by the broker's "
            "message.max.inflated.bytes (D-REC-2)",
        ),
        "2147483639",
        ("max.decompressed.message.bytes",),
        "2147483639",
        "Kafka 4.4's bound on one record's decompressed size. samsa bounds the whole batch's "
        "inflated records instead (message.max.inflated.bytes, D-REC-2): only the default is "
        "accepted (rule 43).",
    ),
    TopicConfigKey(
        "remote.copy.lag.ms",
        ConfigType.LONG,
        "remote_copy_lag_ms",
        _only("0", _NO_TIERED_STORAGE),
        "0",
        ("log.remote.copy.lag.ms",),
        "0",
        "Tiered storage: how long a closed segment waits before its upload. samsa has no "
        "tiered storage: only 0 is accepted (rule 43).",
    ),
    TopicConfigKey(
        "remote.copy.lag.bytes",
        ConfigType.LONG,
        "remote_copy_lag_bytes",
        _only("-1", _NO_TIERED_STORAGE),
        "-1",
        ("log.remote.copy.lag.bytes",),
        "-1",
        "Tiered storage: how many newer bytes a closed segment waits for before its upload. "
        "samsa has no tiered storage: only -1 is accepted (rule 43).",
    ),
    TopicConfigKey(
        "remote.log.copy.disable",
        ConfigType.BOOLEAN,
        "remote_log_copy_disable",
        _only("false", _NO_TIERED_STORAGE),
        "false",
        (),
        "",
        "Tiered storage: stop uploading. samsa has none: only false is accepted (rule 43).",
    ),
    TopicConfigKey(
        "remote.log.delete.on.disable",
        ConfigType.BOOLEAN,
        "remote_log_delete_on_disable",
        _only("false", _NO_TIERED_STORAGE),
        "false",
        (),
        "",
        "Tiered storage: delete the uploaded data when it is turned off. samsa has none: only "
        "false is accepted (rule 43).",
    ),
    TopicConfigKey(
        "errors.deadletterqueue.group.enable",
        ConfigType.BOOLEAN,
        "errors_deadletterqueue_group_enable",
        _only("false", "samsa's share groups write no dead-letter queue"),
        "false",
        (),
        "",
        "Whether share groups may write undeliverable records to this topic (a dead-letter "
        "queue). samsa's share groups archive them and write none: only false is accepted "
        "(rule 43).",
    ),
    TopicConfigKey(
        "local.retention.ms",
        ConfigType.LONG,
        "local_retention_ms",
        _local_retention,
        "-2",
        ("log.local.retention.ms",),
        "-2",
        "Tiered storage's local retention; -2: retention.ms. samsa has no tiered storage: only "
        "-2 is accepted (rule 43).",
    ),
    TopicConfigKey(
        "local.retention.bytes",
        ConfigType.LONG,
        "local_retention_bytes",
        _local_retention,
        "-2",
        ("log.local.retention.bytes",),
        "-2",
        "Tiered storage's local retention; -2: retention.bytes. samsa has no tiered storage: "
        "only -2 is accepted (rule 43).",
    ),
)

# Keys Kafka 4 removed: refused like unknown keys, saying what replaced them.
_REMOVED = {
    "message.timestamp.difference.max.ms": "removed in Kafka 4.0 (KIP-937); use "
    "message.timestamp.before.max.ms and message.timestamp.after.max.ms",
    "message.downconversion.enable": "removed with down-conversion (Kafka 4.4 lists it no "
    "more); samsa never down-converted",
}

TOPIC_CONFIG_KEYS: Mapping[str, TopicConfigKey] = {k.name: k for k in _KEYS}


class InvalidConfigError(ValueError):
    """A topic config that must be refused with INVALID_CONFIG; the message says why."""


class UnknownOperationError(InvalidConfigError):
    """An IncrementalAlterConfigs operation that is none of Kafka's four. Kafka's controller
    fails such a topic or group resource with UNKNOWN_SERVER_ERROR (its op is null there);
    samsa answers that code too, with a message that names the operation."""


def parse_topic_configs(configs: Mapping[str, str]) -> dict[str, object]:
    """The LogConfig field values of a topic's own configs; InvalidConfigError names the first
    unknown key or invalid value."""
    values: dict[str, object] = {}
    for name, raw in configs.items():
        key = TOPIC_CONFIG_KEYS.get(name)
        if key is None:
            why = _REMOVED.get(name)
            raise InvalidConfigError(
                f"Unknown topic config name: {name}" + (f": {why}" if why else "")
            )
        if raw is None:
            raise InvalidConfigError(f"config {name} has no value")
        try:
            values[key.field] = key.parse(raw)
        except ValueError as exc:
            # Kafka's ConfigDef words, which kafka-configs shows as they come
            why = str(exc)
            if why == _NOT_A_NUMBER:
                why = f"Not a number of type {key.config_type.name}"
            raise InvalidConfigError(
                f"Invalid value {raw} for configuration {name}: {why}"
            ) from None
    return values


@dataclass(frozen=True, slots=True)
class Synonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class DescribedConfig:
    name: str
    value: str | None
    source: ConfigSource
    config_type: ConfigType
    synonyms: tuple[Synonym, ...]
    doc: str
    read_only: bool = False
    sensitive: bool = False


def config_synonyms(
    name: str,
    names: Sequence[str],
    levels: Iterable[tuple[Mapping[str, str], ConfigSource]],
    static: BrokerConfig,
    default_of: Callable[[str], str | None],
) -> list[Synonym]:
    """Kafka's ConfigHelper.configSynonyms: the broker keys ``names`` (one setting in several
    units, most specific first) level by level: the dynamic ``levels``, the static settings
    given, then each key's default where ``default_of`` has one; cut to start at ``name``.
    So log.retention.ms set anywhere brings log.retention.hours=168 after it, and set nowhere
    lists nothing (the hours default comes before any of it)."""
    out = [Synonym(n, values[n], source) for values, source in levels for n in names if n in values]
    for n in names:
        found = broker_setting(static, n)
        if found is not None and not found[1]:
            out.append(Synonym(n, found[0], ConfigSource.STATIC_BROKER_CONFIG))
    for n in names:
        default = default_of(n)
        if default is not None:  # as Kafka, a key whose default is null has no such synonym
            out.append(Synonym(n, default, ConfigSource.DEFAULT_CONFIG))
    while out and out[0].name != name:
        out.pop(0)
    return out


def describe_topic_configs(
    broker: BrokerConfig,
    configs: Mapping[str, str],
    dynamic_broker: Mapping[str, str] | None = None,
    dynamic_default: Mapping[str, str] | None = None,
) -> list[DescribedConfig]:
    """Every supported key of a topic with its own ``configs``: value, source, synonyms
    (rule 27). ``broker`` holds the static settings; ``dynamic_broker`` and
    ``dynamic_default`` the dynamic broker configs (rule 44), listed level by level, most
    specific first, as Kafka does."""
    levels = (
        (dynamic_broker or {}, ConfigSource.DYNAMIC_BROKER_CONFIG),
        (dynamic_default or {}, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
    )
    out = []
    for key in _KEYS:
        synonyms: list[Synonym] = []
        if key.name in configs:
            synonyms.append(Synonym(key.name, configs[key.name], ConfigSource.DYNAMIC_TOPIC_CONFIG))
        if key.synonyms:
            # Kafka's default sits on the last broker key, in its own unit.
            last, default = key.synonyms[-1], key.default_synonym_value
            synonyms += config_synonyms(
                key.synonyms[0],
                key.synonyms,
                levels,
                broker,
                lambda n, last=last, default=default: default if n == last else None,
            )
        # A key without a broker synonym has no synonyms at all when the topic has no value.
        source = synonyms[0].source if synonyms else ConfigSource.DEFAULT_CONFIG
        value = synonyms[0].value if source != ConfigSource.DEFAULT_CONFIG else key.default
        out.append(
            DescribedConfig(key.name, value, source, key.config_type, tuple(synonyms), key.doc)
        )
    return out


class AlterOp(enum.IntEnum):
    """IncrementalAlterConfigs' ``config_operation``."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


def apply_incremental(
    current: Mapping[str, str],
    ops: list[tuple[str, int, str | None]],
    list_defaults: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A topic's own configs after IncrementalAlterConfigs' ``(name, op, value)`` list, as
    Kafka computes it: SET replaces, DELETE drops (back to the inherited value), APPEND and
    SUBTRACT (list keys only) edit the topic's list, or the default list if it has none.
    InvalidConfigError for an unknown op, key or a list op on a non-list key; the result
    still has to be validated (:func:`parse_topic_configs`). ``list_defaults`` maps the list
    keys to their defaults when the resource is not a topic (a broker's, rule 44)."""
    topic = list_defaults is None
    if list_defaults is None:
        list_defaults = {k.name: k.default for k in _KEYS if k.config_type == ConfigType.LIST}
    out = dict(current)
    for name, op, value in ops:
        if op == AlterOp.SET:
            if value is None:
                raise InvalidConfigError(f"config {name} has no value to set")
            out[name] = value
        elif op == AlterOp.DELETE:
            out.pop(name, None)
        elif op in (AlterOp.APPEND, AlterOp.SUBTRACT):
            if topic and name not in TOPIC_CONFIG_KEYS:
                raise InvalidConfigError(f"Unknown topic config name: {name}")
            if name not in list_defaults:
                verb = "append" if op == AlterOp.APPEND else "subtract"
                raise InvalidConfigError(f"config value {verb} is not allowed for config {name}")
            old = [p for p in out.get(name, list_defaults[name]).split(",") if p]
            new = [p.strip() for p in (value or "").split(",") if p.strip()]
            if op == AlterOp.APPEND:
                merged = list(dict.fromkeys(old + new))
            else:
                merged = [p for p in old if p not in new]
            out[name] = ",".join(merged)
        else:
            raise UnknownOperationError(f"unknown config operation {op} for config {name}")
    return out
