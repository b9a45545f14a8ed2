"""Dynamic broker configs (Kafka's KIP-226, rule 44): the log defaults a running broker takes
from AlterConfigs / IncrementalAlterConfigs on a BROKER resource.

Two sets: the cluster-wide default (resource name ``""``) and this broker's own (its id). A
key's effective value is this broker's dynamic value, else the cluster default's, else the
static one (properties file, command line), else Kafka's default. The keys are those of
Kafka's DynamicLogConfig that samsa has: the first (most specific) broker synonym of each
topic config. Both sets live in ``<data dir>/broker-configs.json``, written atomically before
a change is answered and read at start before the logs open.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path

from samsa.broker.config import (
    SENSITIVE,
    BrokerConfig,
    ConfigError,
    broker_settings,
    default_setting,
    setting_attr,
)
from samsa.broker.kafka_dynamic_keys import (
    BROKER_SETTING_TYPES,
    KAFKA_ONLY_DYNAMIC,
    type_problem,
)
from samsa.broker.topic_config import (
    TOPIC_CONFIG_KEYS,
    ConfigSource,
    ConfigType,
    DescribedConfig,
    Synonym,
    config_synonyms,
)
from samsa.log.durable import write_atomically

DYNAMIC_CONFIGS_FILE = "broker-configs.json"

# Kafka's DynamicLogConfig.ReconfigurableConfigs, as far as samsa has the broker setting.
DYNAMIC_KEYS: frozenset[str] = frozenset(
    k.synonyms[0]
    for k in TOPIC_CONFIG_KEYS.values()
    if k.synonyms and setting_attr(k.synonyms[0]) is not None
)

# Dynamic keys of Kafka's LIST type -> Kafka's default, for IncrementalAlterConfigs' APPEND
# and SUBTRACT on a resource that has no value of its own.
LIST_DEFAULTS: dict[str, str] = {
    k.synonyms[0]: k.default_synonym_value
    for k in TOPIC_CONFIG_KEYS.values()
    if k.synonyms and k.synonyms[0] in DYNAMIC_KEYS and k.config_type == ConfigType.LIST
}

# Kafka's DynamicBrokerConfig.brokerConfigSynonyms: the broker keys that set one thing in
# several units (log.retention.ms/.minutes/.hours, ...), each mapped to its whole group, and
# the defaults of the group's last keys, which samsa has no setting of its own for.
_SYNONYM_GROUPS: dict[str, tuple[str, ...]] = {
    name: k.synonyms
    for k in TOPIC_CONFIG_KEYS.values()
    if len(k.synonyms) > 1
    for name in k.synonyms
}
_GROUP_DEFAULTS: dict[str, str] = {
    k.synonyms[-1]: k.default_synonym_value
    for k in TOPIC_CONFIG_KEYS.values()
    if len(k.synonyms) > 1
}

# Static synonyms in other units: Kafka updates only the first synonym dynamically.
_UNIT_SYNONYMS = frozenset({"log.retention.hours", "log.retention.minutes", "log.roll.hours"})

# How many keys one dynamic set may hold: every dynamic key once.
_MAX_KEYS = len(DYNAMIC_KEYS) + len(KAFKA_ONLY_DYNAMIC)


class DynamicConfigError(ValueError):
    """A dynamic broker config change refused with INVALID_REQUEST, as Kafka's
    ConfigAdminManager refuses every broker config it cannot apply (KAFKA-13609)."""


def _kafka_set(names: list[str]) -> str:
    return "[" + ", ".join(sorted(names)) + "]"  # as Kafka 4's messages print a Java Set


class DynamicBrokerConfigs:
    """The two dynamic sets of one broker, their file, and the configs they make."""

    def __init__(self, static: BrokerConfig, path: Path) -> None:
        self.static = static
        self.path = path
        self.default: dict[str, str] = {}
        self.broker: dict[str, str] = {}

    @property
    def node_id(self) -> int:
        return self.static.broker_id

    def load(self) -> BrokerConfig:
        """Read the file (if any) and return the effective config; ConfigError, naming the
        file, if it is damaged or holds a value this samsa refuses."""
        if not self.path.exists():
            return self.effective(self.static)
        try:
            doc = json.loads(self.path.read_text())
            if not isinstance(doc, dict) or doc.get("version") != 1:
                raise ValueError("expected a JSON object with version 1")
            default, broker = doc["default"], doc["broker"]
            for level in (default, broker):
                if not isinstance(level, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in level.items()
                ):
                    raise ValueError("each level must map config names to strings")
            config = self.effective(self.static, default, broker)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(
                f"cannot read the dynamic broker configs from {self.path}: {exc}"
            ) from None
        self.default, self.broker = dict(default), dict(broker)
        return config

    def level(self, resource_name: str) -> dict[str, str]:
        """A copy of the set the BROKER resource ``resource_name`` names; DynamicConfigError
        (Kafka's messages) for a name that is neither ``""`` nor this broker's id."""
        if resource_name == "":
            return dict(self.default)
        try:
            node = int(resource_name)
        except ValueError:
            raise DynamicConfigError(
                f"Node id must be an integer, but it is: {resource_name}"
            ) from None
        if node != self.node_id:
            raise DynamicConfigError(
                f"Unexpected broker id, expected {self.node_id}, but received {resource_name}"
            )
        return dict(self.broker)

    def effective(
        self,
        current: BrokerConfig,
        default: Mapping[str, str] | None = None,
        broker: Mapping[str, str] | None = None,
    ) -> BrokerConfig:
        """``current`` with each dynamic key at its effective value: ``broker`` over
        ``default`` over the static value. DynamicConfigError names a key that cannot be
        changed at run time or a value that is not valid."""
        default = self.default if default is None else default
        broker = self.broker if broker is None else broker
        for level, per_broker in ((default, False), (broker, True)):
            _check_keys(level, per_broker)
        used = {k: v for k, v in {**default, **broker}.items() if k not in KAFKA_ONLY_DYNAMIC}
        try:
            return self.static_view(current).with_properties(used).validate()
        except ConfigError as exc:
            raise DynamicConfigError(f"Invalid config value: {exc}") from None

    def static_view(self, current: BrokerConfig) -> BrokerConfig:
        """``current`` with the dynamic keys at their static values."""
        attrs = {setting_attr(name) for name in DYNAMIC_KEYS}
        return replace(
            current,
            **{f.name: getattr(self.static, f.name) for f in fields(current) if f.name in attrs},
        )

    def store(self, resource_name: str, configs: Mapping[str, str]) -> None:
        """Make ``configs`` the set of ``resource_name`` (already checked), on disk first."""
        default = dict(configs) if resource_name == "" else self.default
        broker = self.broker if resource_name == "" else dict(configs)
        doc = {"version": 1, "default": default, "broker": broker}
        write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
        self.default, self.broker = default, broker


def _check_keys(configs: Mapping[str, str], per_broker: bool) -> None:
    if len(configs) > _MAX_KEYS:
        raise DynamicConfigError(f"at most {_MAX_KEYS} dynamic broker configs")
    fixed = [
        k
        for k in configs
        if k not in DYNAMIC_KEYS and (setting_attr(k) is not None or k in _UNIT_SYNONYMS)
    ]
    if fixed:
        raise DynamicConfigError(f"Cannot update these configs dynamically: {_kafka_set(fixed)}")
    unknown = [k for k in configs if k not in DYNAMIC_KEYS and k not in KAFKA_ONLY_DYNAMIC]
    if unknown:
        # D-ADMIN-1: Kafka stores any broker key it does not know; samsa refuses those.
        raise DynamicConfigError(f"Unknown broker configs: {_kafka_set(unknown)}")
    if not per_broker:
        fixed = [k for k in configs if k in KAFKA_ONLY_DYNAMIC and KAFKA_ONLY_DYNAMIC[k].per_broker]
        if fixed:
            raise DynamicConfigError(
                "Cannot update these configs at default cluster level, broker id must be "
                f"specified: {_kafka_set(fixed)}"
            )
    for k, v in configs.items():
        key = KAFKA_ONLY_DYNAMIC.get(k)
        problem = key and type_problem(k, v, key.config_type)
        if problem:
            raise DynamicConfigError(problem)


def describe_broker(
    dynamic: DynamicBrokerConfigs, current: BrokerConfig, resource_name: str
) -> list[DescribedConfig]:
    """DescribeConfigs of a BROKER resource (rule 44): this broker's every setting with its
    effective value and the levels it comes from, or for ``""`` the cluster-wide dynamic
    defaults alone, as Kafka lists them."""
    if resource_name == "":
        return [
            DescribedConfig(
                name,
                value,
                ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
                _type(name),
                (Synonym(name, value, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),),
                "",
            )
            for name, value in sorted(dynamic.default.items())
        ]
    dynamic.level(resource_name)  # a wrong broker id is refused as in AlterConfigs
    static = dynamic.static_view(current)
    out = []
    for name, _value, _is_default in broker_settings(static):
        sensitive = name in SENSITIVE
        synonyms = broker_synonyms(dynamic, static, name)
        if sensitive:
            synonyms = [Synonym(s.name, None, s.source) for s in synonyms]
        top = synonyms[0] if synonyms else Synonym(name, None, ConfigSource.DEFAULT_CONFIG)
        out.append(
            DescribedConfig(
                name,
                top.value,
                top.source,
                ConfigType.PASSWORD if sensitive else _type(name),
                tuple(synonyms),
                "",
                read_only=name not in DYNAMIC_KEYS,
                sensitive=sensitive,
            )
        )
    out += [_kafka_only(dynamic, name) for name in sorted(KAFKA_ONLY_DYNAMIC)]
    return out


def _kafka_only(dynamic: DynamicBrokerConfigs, name: str) -> DescribedConfig:
    """A key samsa keeps for Kafka's tools but does not use: its dynamic value, else Kafka's
    default."""
    key = KAFKA_ONLY_DYNAMIC[name]
    synonyms = []
    if name in dynamic.broker:
        synonyms.append(Synonym(name, dynamic.broker[name], ConfigSource.DYNAMIC_BROKER_CONFIG))
    if name in dynamic.default:
        synonyms.append(
            Synonym(name, dynamic.default[name], ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
        )
    if key.default is not None:  # as Kafka, a key without a default has no such synonym
        synonyms.append(Synonym(name, key.default, ConfigSource.DEFAULT_CONFIG))
    sensitive = key.config_type == ConfigType.PASSWORD
    if sensitive:
        synonyms = [Synonym(s.name, None, s.source) for s in synonyms]
    top = synonyms[0] if synonyms else Synonym(name, None, ConfigSource.DEFAULT_CONFIG)
    return DescribedConfig(
        name,
        top.value,
        top.source,
        key.config_type,
        tuple(synonyms),
        "",
        read_only=False,
        sensitive=sensitive,
    )


def broker_synonyms(
    dynamic: DynamicBrokerConfigs, static: BrokerConfig, name: str
) -> list[Synonym]:
    """The levels that set broker setting ``name`` over its synonym group, as Kafka's
    ConfigHelper lists them (:func:`config_synonyms`): this broker's dynamic value, the
    cluster default, the static value, Kafka's default."""
    levels = (
        (dynamic.broker, ConfigSource.DYNAMIC_BROKER_CONFIG),
        (dynamic.default, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
    )
    return config_synonyms(
        name,
        _SYNONYM_GROUPS.get(name, (name,)),
        levels,
        static,
        lambda n: _GROUP_DEFAULTS.get(n) if setting_attr(n) is None else default_setting(n),
    )


def _type(name: str) -> ConfigType:
    if name in KAFKA_ONLY_DYNAMIC:
        return KAFKA_ONLY_DYNAMIC[name].config_type
    for key in TOPIC_CONFIG_KEYS.values():
        if key.synonyms and key.synonyms[0] == name:
            return key.config_type
    return BROKER_SETTING_TYPES.get(name, ConfigType.UNKNOWN)
