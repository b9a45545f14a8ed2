"""Group configs (Kafka 4.x, KIP-848/932/1071): per-group overrides of the group coordinator's
settings, on config resources of type GROUP.

As Kafka, every group has all of Kafka 4.4's group keys, described at their broker default
(the broker synonym's value) for a group that does not exist, and a group's own values are set
by (Incremental)AlterConfigs, validated as Kafka's GroupConfig validates them (the type, the
key's own lower bound, then the broker's bounds). They are kept in
``<data dir>/group-configs.json``, written atomically before a change is answered, as Kafka
keeps them in its metadata log. samsa's consumer-group coordinator applies
``consumer.session.timeout.ms`` and ``consumer.heartbeat.interval.ms`` per group, and its share
partitions (``broker/share.py``) ``share.auto.offset.reset``, ``share.isolation.level``,
``share.record.lock.duration.ms``, ``share.delivery.count.limit`` and
``share.partition.max.record.locks``; the streams keys are kept and described only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from samsa.broker.config import BrokerConfig, ConfigError, broker_setting
from samsa.broker.kafka_dynamic_keys import type_problem
from samsa.broker.topic_config import ConfigSource, ConfigType, DescribedConfig, Synonym
from samsa.log.durable import write_atomically

GROUP_CONFIGS_FILE = "group-configs.json"
MAX_GROUPS = 10_000  # groups with configs of their own a broker keeps


class GroupConfigError(ValueError):
    """A group config change refused: ``code`` is INVALID_CONFIG (42 for INVALID_REQUEST)."""

    def __init__(self, message: str, invalid_request: bool = False) -> None:
        super().__init__(message)
        self.invalid_request = invalid_request


@dataclass(frozen=True, slots=True)
class GroupKey:
    config_type: ConfigType
    synonym: str  # the broker setting it overrides (itself when there is none)
    default: str
    at_least: int | None = None  # the key's own bound (Kafka's ConfigDef)
    bounds: tuple[int | None, int | None] = (None, None)  # the broker's min and max
    choices: tuple[str, ...] = ()


_I, _S, _B, _L = ConfigType.INT, ConfigType.STRING, ConfigType.BOOLEAN, ConfigType.LIST
_SESSION, _HEARTBEAT, _ASSIGN = (45_000, 60_000), (5_000, 15_000), (0, 15_000)

# Kafka 4.4's keys, in the order its DescribeConfigs lists them.
GROUP_KEYS: dict[str, GroupKey] = {
    "consumer.session.timeout.ms": GroupKey(
        _I, "group.consumer.session.timeout.ms", "45000", 1, _SESSION
    ),
    "streams.assignor.name": GroupKey(_S, "group.streams.assignors", "sticky"),
    "consumer.assignment.interval.ms": GroupKey(
        _I, "group.consumer.assignment.interval.ms", "1000", 0, _ASSIGN
    ),
    "errors.deadletterqueue.copy.record.enable": GroupKey(
        _B, "errors.deadletterqueue.copy.record.enable", "false"
    ),
    "share.auto.offset.reset": GroupKey(_S, "share.auto.offset.reset", "latest"),
    "streams.rack.aware.assignment.tags": GroupKey(
        _L, "group.streams.rack.aware.assignment.tags", ""
    ),
    "share.renew.acknowledge.enable": GroupKey(_B, "share.renew.acknowledge.enable", "true"),
    "streams.initial.rebalance.delay.ms": GroupKey(
        _I, "group.streams.initial.rebalance.delay.ms", "3000", 0
    ),
    "share.session.timeout.ms": GroupKey(
        _I, "group.share.session.timeout.ms", "45000", 1, _SESSION
    ),
    "streams.assignment.interval.ms": GroupKey(
        _I, "group.streams.assignment.interval.ms", "1000", 0, _ASSIGN
    ),
    "share.heartbeat.interval.ms": GroupKey(
        _I, "group.share.heartbeat.interval.ms", "5000", 1, _HEARTBEAT
    ),
    "streams.heartbeat.interval.ms": GroupKey(
        _I, "group.streams.heartbeat.interval.ms", "5000", 1, _HEARTBEAT
    ),
    "share.delivery.count.limit": GroupKey(_I, "group.share.delivery.count.limit", "5", 2, (2, 10)),
    "errors.deadletterqueue.topic.name": GroupKey(_S, "errors.deadletterqueue.topic.name", ""),
    "consumer.heartbeat.interval.ms": GroupKey(
        _I, "group.consumer.heartbeat.interval.ms", "5000", 1, _HEARTBEAT
    ),
    "share.record.lock.duration.ms": GroupKey(
        _I, "group.share.record.lock.duration.ms", "30000", 1000, (15_000, 60_000)
    ),
    "share.assignment.interval.ms": GroupKey(
        _I, "group.share.assignment.interval.ms", "1000", 0, _ASSIGN
    ),
    "share.isolation.level": GroupKey(
        _S,
        "share.isolation.level",
        "read_uncommitted",
        choices=("read_committed", "read_uncommitted"),
    ),
    "streams.session.timeout.ms": GroupKey(
        _I, "group.streams.session.timeout.ms", "45000", 1, _SESSION
    ),
    "share.partition.max.record.locks": GroupKey(
        _I, "group.share.partition.max.record.locks", "2000", 100, (100, 4000)
    ),
    "streams.num.standby.replicas": GroupKey(
        _I, "group.streams.num.standby.replicas", "0", 0, (None, 2)
    ),
}

LIST_DEFAULTS = {n: k.default for n, k in GROUP_KEYS.items() if k.config_type == _L}


def check_operations(ops: list[tuple[str, int, str | None]]) -> None:
    """Kafka's refusals of IncrementalAlterConfigs operations on a GROUP resource that come
    before the merge: a SET or APPEND without a value, a list operation."""
    for name, op, value in ops:
        if op in (0, 2) and value is None:  # SET, APPEND
            raise GroupConfigError(f"Null value not supported for : {name}", invalid_request=True)
        # Kafka 4.4 refuses list operations on every group key, the list-typed one included.
        if op in (2, 3):
            verb = "APPEND" if op == 2 else "SUBTRACT"
            raise GroupConfigError(f"Can't {verb} to key {name} because its type is not LIST.")


def validate(group_id: str, configs: Mapping[str, str]) -> None:
    """GroupConfigError with Kafka's words unless ``configs`` may be ``group_id``'s set."""
    if group_id == "":
        raise GroupConfigError("Default group resources are not allowed.", invalid_request=True)
    for name in configs:
        if name not in GROUP_KEYS:
            raise GroupConfigError(f"Unknown group config name: {name}")
    for name, value in configs.items():
        key = GROUP_KEYS[name]
        problem = type_problem(name, value, key.config_type)
        if problem:
            raise GroupConfigError(problem)
        if key.choices and value not in key.choices:
            raise GroupConfigError(
                f"Invalid value {value} for configuration {name}: String must be one of: "
                + ", ".join(key.choices)
            )
        if name == "share.auto.offset.reset" and not (
            value in ("earliest", "latest") or value.startswith("by_duration:")
        ):
            raise GroupConfigError(
                f"Invalid value {value} for configuration {name}: Invalid value `{value}` for "
                f"configuration {name}. The value must be either 'earliest', 'latest' or of the "
                "format 'by_duration:<PnDTnHnMn.nS>'."
            )
        if key.config_type == _I and key.at_least is not None and int(value) < key.at_least:
            raise GroupConfigError(
                f"Invalid value {value} for configuration {name}: Value must be at least "
                f"{key.at_least}"
            )
    for name, value in configs.items():
        lo, hi = GROUP_KEYS[name].bounds
        if lo is not None and not lo <= int(value) <= (hi if hi is not None else int(value)):
            raise GroupConfigError(f"{name} must be in the range {lo} to {hi} inclusive.")
        if lo is None and hi is not None and int(value) > hi:
            raise GroupConfigError(f"{name} must be less than or equal to {hi}")


class GroupConfigs:
    """Every group's own configs, and their file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.groups: dict[str, dict[str, str]] = {}

    def load(self) -> None:
        """Read the file, if any; ConfigError, naming it, if it is damaged."""
        if not self.path.exists():
            return
        try:
            doc = json.loads(self.path.read_text())
            if not isinstance(doc, dict) or doc.get("version") != 1:
                raise ValueError("expected a JSON object with version 1")
            groups = doc["groups"]
            for gid, configs in groups.items():
                validate(gid, configs)
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise ConfigError(f"cannot read the group configs from {self.path}: {exc}") from None
        self.groups = {gid: dict(c) for gid, c in groups.items()}

    def get(self, group_id: str) -> dict[str, str]:
        return dict(self.groups.get(group_id, {}))

    def alter(self, group_id: str, configs: Mapping[str, str], validate_only: bool) -> None:
        """Make ``configs`` the group's own set (validated), on disk first."""
        validate(group_id, configs)
        if group_id not in self.groups and configs and len(self.groups) >= MAX_GROUPS:
            raise GroupConfigError(
                f"at most {MAX_GROUPS} groups may have configs of their own", invalid_request=True
            )
        if validate_only:
            return
        groups = {g: c for g, c in self.groups.items() if g != group_id}
        if configs:
            groups[group_id] = dict(configs)
        doc = {"version": 1, "groups": groups}
        write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
        self.groups = groups

    def int_value(self, group_id: str, name: str) -> int | None:
        value = self.groups.get(group_id, {}).get(name)
        return None if value is None else int(value)

    def describe(self, group_id: str, broker: BrokerConfig) -> list[DescribedConfig]:
        """Every group key: the group's own value, else the broker's (as Kafka lists them)."""
        if group_id == "":
            raise GroupConfigError("Group name must not be empty", invalid_request=True)
        own = self.groups.get(group_id, {})
        out = []
        for name, key in GROUP_KEYS.items():
            synonyms = []
            if name in own:
                synonyms.append(Synonym(name, own[name], ConfigSource.GROUP_CONFIG))
            found = broker_setting(broker, key.synonym)
            if found is not None and not found[1]:
                synonyms.append(Synonym(key.synonym, found[0], ConfigSource.STATIC_BROKER_CONFIG))
            else:
                value = found[0] if found is not None else key.default
                synonyms.append(Synonym(key.synonym, value, ConfigSource.DEFAULT_CONFIG))
            top = synonyms[0]
            out.append(DescribedConfig(name, top.value, top.source, key.config_type,
                                       tuple(synonyms), ""))  # fmt: skip
        return out
