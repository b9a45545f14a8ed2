"""Client telemetry (KIP-714): client metrics subscriptions and what clients push.

As Kafka's ClientMetricsManager. Subscriptions are CLIENT_METRICS config resources (type 16)
with ``metrics`` (name prefixes, ``*`` for all), ``interval.ms`` and ``match`` (client
selectors, ``name=regex``), set with (Incremental)AlterConfigs and kept in
``<data dir>/client-metrics.json``, written atomically before a change is answered, as Kafka
keeps them in its metadata log. :class:`ClientMetricsManager` gives each client instance its
subscription (GetTelemetrySubscriptions), judges its pushes (PushTelemetry) and keeps the
last values it pushed, which ``broker/metrics.py`` exports on ``/metrics``.

Pure: no I/O but the subscriptions' file, no clock (time comes in as ``now_ms``, from
:func:`monotonic_ms`). Bounded:
at most :data:`MAX_SUBSCRIPTIONS` subscriptions, :data:`MAX_CLIENT_INSTANCES` client
instances (the least recently heard from is dropped first, as Kafka's LRU cache), each kept
until ``max(60 s, 3 x its push interval)`` after its last request, and at most
:data:`MAX_SERIES_PER_CLIENT` series per instance and :data:`MAX_SERIES` in all; what does
not fit is counted, not kept.
"""

from __future__ import annotations

import base64
import re
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import re2

from samsa.broker.config import ConfigError
from samsa.broker.topic_config import ConfigSource, ConfigType, DescribedConfig, Synonym
from samsa.log.durable import read_versioned_json, write_versioned_json
from samsa.protocol.errors import ErrorCode
from samsa.protocol.record_check import inflate
from samsa.protocol.records import InvalidBatchError

if TYPE_CHECKING:
    from opentelemetry.proto.metrics.v1 import metrics_pb2

CLIENT_METRICS = 16  # the config resource type
CLIENT_METRICS_FILE = "client-metrics.json"
METRICS, INTERVAL_MS, MATCH = "metrics", "interval.ms", "match"
ALL_METRICS = "*"
DEFAULT_INTERVAL_MS = 5 * 60 * 1000  # Kafka's, for a client no subscription matches
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 100, 3_600_000
TELEMETRY_MAX_BYTES = 1024 * 1024  # Kafka's telemetry.max.bytes default
# ZSTD, LZ4, GZIP, SNAPPY: Kafka's order; clients use the first they support.
ACCEPTED_COMPRESSION = (4, 3, 1, 2)
MIN_EXPIRY_MS = 60_000  # Kafka's client instance cache expiry
MAX_SUBSCRIPTIONS = 1_000
MAX_CLIENT_INSTANCES = 1_024
MAX_SERIES_PER_CLIENT = 500
MAX_SERIES = 20_000
MAX_LABELS = 8  # data point attributes kept per series
MAX_LABEL_CHARS = 128
SELECTORS = (
    "client_instance_id",
    "client_id",
    "client_software_name",
    "client_software_version",
    "client_source_address",
    "client_source_port",
)
# name -> (type, default), in the order Kafka's DescribeConfigs lists them
KEYS: dict[str, tuple[ConfigType, str]] = {
    METRICS: (ConfigType.LIST, ""),
    INTERVAL_MS: (ConfigType.INT, str(DEFAULT_INTERVAL_MS)),
    MATCH: (ConfigType.LIST, ""),
}
LIST_DEFAULTS = {n: d for n, (t, d) in KEYS.items() if t == ConfigType.LIST}


def kafka_uuid(value: uuid.UUID) -> str:
    """A client instance id as Kafka and its clients print it (URL-safe base64)."""
    return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")


def monotonic_ms() -> int:
    """The clock the callers hand the manager: intervals and expiry ignore wall-clock jumps."""
    return time.monotonic_ns() // 1_000_000


class ClientMetricsError(ValueError):
    """A subscription change refused: INVALID_REQUEST, or INVALID_CONFIG for a bad selector,
    as Kafka's ClientMetricsConfigs answers."""

    def __init__(self, message: str, invalid_config: bool = False) -> None:
        super().__init__(message)
        self.invalid_config = invalid_config


def _list(value: str) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()]


def parse_match(patterns: list[str]) -> dict[str, Any]:
    """``selector=regex`` pairs; ClientMetricsError (INVALID_CONFIG) for anything else."""
    out = {}
    for pattern in patterns:
        name, eq, regex = pattern.partition("=")
        name, regex = name.strip(), regex.strip()
        if not eq or "=" in regex or name not in SELECTORS or not regex:
            raise ClientMetricsError(f"Illegal client matching pattern: {pattern}", True)
        options = re2.Options()
        options.log_errors = False
        try:
            out[name] = re2.compile(regex, options=options)
        except re2.error:
            raise ClientMetricsError(f"Illegal client matching pattern: {pattern}", True) from None
    return out


def validate(name: str, configs: Mapping[str, str]) -> None:
    if not name:
        raise ClientMetricsError("Subscription name can't be empty")
    for key in configs:
        if key not in KEYS:
            raise ClientMetricsError(f"Unknown client metrics configuration: {key}")
    if INTERVAL_MS in configs:
        try:
            interval = int(configs[INTERVAL_MS].strip())
        except ValueError:
            interval = -1
        if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
            raise ClientMetricsError(
                f"Invalid value {configs[INTERVAL_MS]} for {INTERVAL_MS}, interval must be "
                f"between {MIN_INTERVAL_MS} and {MAX_INTERVAL_MS} (1 hour)"
            )
    if MATCH in configs:
        parse_match(_list(configs[MATCH]))


@dataclass(frozen=True, slots=True)
class Subscription:
    name: str
    metrics: frozenset[str]
    interval_ms: int
    match: dict[str, Any]

    @classmethod
    def of(cls, name: str, configs: Mapping[str, str]) -> Subscription:
        return cls(
            name,
            frozenset(_list(configs.get(METRICS, ""))),
            int(configs.get(INTERVAL_MS, DEFAULT_INTERVAL_MS)),
            parse_match(_list(configs.get(MATCH, ""))),
        )


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """What a subscription's ``match`` selects on (Kafka's ClientMetricsInstanceMetadata)."""

    client_id: str
    source_address: str
    source_port: str
    software_name: str = ""
    software_version: str = ""

    def matches(self, instance_id: uuid.UUID, match: Mapping[str, Any]) -> bool:
        values = {
            "client_instance_id": kafka_uuid(instance_id),
            "client_id": self.client_id,
            "client_software_name": self.software_name,
            "client_software_version": self.software_version,
            "client_source_address": self.source_address,
            "client_source_port": self.source_port,
        }
        return all(regex.fullmatch(values[k]) is not None for k, regex in match.items())


@dataclass(frozen=True, slots=True)
class Answer:
    """GetTelemetrySubscriptions' answer for one client instance."""

    error: ErrorCode
    instance_id: uuid.UUID
    subscription_id: int = 0
    metrics: tuple[str, ...] = ()
    interval_ms: int = DEFAULT_INTERVAL_MS


@dataclass(slots=True)
class ClientInstance:
    instance_id: uuid.UUID
    info: ClientInfo
    subscription_id: int
    version: int  # the subscriptions' version it was evaluated against
    metrics: tuple[str, ...]
    interval_ms: int
    last_get_ms: int | None = None
    last_push_ms: int | None = None
    last_request_ms: int = 0
    last_error: ErrorCode = ErrorCode.NONE
    terminating: bool = False
    # (metric name, labels) -> value: the last values pushed, deltas summed
    series: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    @property
    def expiry_ms(self) -> int:
        return max(MIN_EXPIRY_MS, 3 * self.interval_ms)


class ClientMetricsConfigs:
    """Every CLIENT_METRICS resource's configs, and their file (as group_config.GroupConfigs)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.resources: dict[str, dict[str, str]] = {}

    def load(self) -> None:
        """Read the file, if any; ConfigError, naming it, if it is damaged."""
        try:
            doc = read_versioned_json(self.path) or {"subscriptions": {}}
            resources = {n: dict(c) for n, c in doc["subscriptions"].items()}
            for name, configs in resources.items():
                validate(name, configs)
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise ConfigError(f"cannot read the client metrics from {self.path}: {exc}") from None
        self.resources = resources

    def get(self, name: str) -> dict[str, str]:
        return dict(self.resources.get(name, {}))

    def alter(self, name: str, configs: Mapping[str, str], validate_only: bool) -> bool:
        """Make ``configs`` the resource's set (validated), on disk first; whether it changed."""
        validate(name, configs)
        if name not in self.resources and configs and len(self.resources) >= MAX_SUBSCRIPTIONS:
            raise ClientMetricsError(f"at most {MAX_SUBSCRIPTIONS} client metrics resources")
        if validate_only:
            return False
        resources = {n: c for n, c in self.resources.items() if n != name}
        if configs:
            resources[name] = dict(configs)
        if resources == self.resources:
            return False
        write_versioned_json(self.path, subscriptions=resources)
        self.resources = resources
        return True

    def describe(self, name: str) -> list[DescribedConfig]:
        """Every key, as Kafka 4.4 describes a CLIENT_METRICS resource (existing or not): the
        resource's own value (its own synonym), else the default (no synonym)."""
        if not name:
            raise ClientMetricsError("Client metrics subscription name must not be empty")
        own = self.resources.get(name, {})
        out = []
        for key, (config_type, default) in KEYS.items():
            if key in own:
                source = ConfigSource.CLIENT_METRICS_CONFIG
                synonyms: tuple[Synonym, ...] = (Synonym(key, own[key], source),)
                out.append(DescribedConfig(key, own[key], source, config_type, synonyms, ""))
            else:
                out.append(DescribedConfig(key, default, ConfigSource.DEFAULT_CONFIG,
                                           config_type, (), ""))  # fmt: skip
        return out


class ClientMetricsManager:
    """Client instances, their subscriptions and the series they pushed (KIP-714)."""

    def __init__(self, configs: ClientMetricsConfigs, max_bytes: int = TELEMETRY_MAX_BYTES) -> None:
        self.configs = configs
        self.max_bytes = max_bytes
        self.version = 0  # bumped on every subscription change: instances re-evaluate
        self.instances: OrderedDict[uuid.UUID, ClientInstance] = OrderedDict()
        self.series_count = 0
        self.series_dropped = 0
        self.instances_evicted = 0
        self._subscriptions = self._parse()

    def _parse(self) -> list[Subscription]:
        return [Subscription.of(n, c) for n, c in sorted(self.configs.resources.items())]

    def subscriptions_changed(self) -> None:
        self._subscriptions = self._parse()
        self.version += 1

    # -- the two APIs ---------------------------------------------------------------------------

    def get_subscriptions(
        self, instance_id: uuid.UUID | None, info: ClientInfo, now_ms: int
    ) -> Answer:
        if instance_id is None or instance_id.int == 0:
            instance_id = uuid.uuid4()
            while instance_id in self.instances:
                instance_id = uuid.uuid4()
        self.expire(now_ms)
        inst = self._instance(instance_id, info, now_ms)
        # A client asking again before its interval is throttled, unless its last push was
        # refused for a subscription it has to fetch anew (then the time is not taken).
        last = max(inst.last_get_ms or 0, inst.last_push_ms or 0)
        never = inst.last_get_ms is None and inst.last_push_ms is None
        if never or now_ms - last >= inst.interval_ms:
            inst.last_get_ms = now_ms
        elif inst.last_error not in _REFETCH:
            return Answer(ErrorCode.THROTTLING_QUOTA_EXCEEDED, instance_id)
        inst.last_error = ErrorCode.NONE
        return Answer(
            ErrorCode.NONE, instance_id, inst.subscription_id, inst.metrics, inst.interval_ms
        )

    def push(
        self,
        instance_id: uuid.UUID | None,
        subscription_id: int,
        terminating: bool,
        compression: int,
        payload: bytes,
        info: ClientInfo,
        now_ms: int,
    ) -> ErrorCode:
        if instance_id is None or instance_id.int in (0, 1):  # Uuid.ZERO and Uuid.METADATA
            return ErrorCode.INVALID_REQUEST
        self.expire(now_ms)
        inst = self._instance(instance_id, info, now_ms)
        code = self._check_push(inst, subscription_id, terminating, compression, payload, now_ms)
        inst.terminating = inst.terminating or terminating
        if code == ErrorCode.NONE and payload:
            code = self._record(inst, compression, payload)
        inst.last_error = code
        return code

    def _check_push(
        self,
        inst: ClientInstance,
        subscription_id: int,
        terminating: bool,
        compression: int,
        payload: bytes,
        now_ms: int,
    ) -> ErrorCode:
        if inst.terminating:
            return ErrorCode.INVALID_REQUEST  # nothing is accepted after a terminating push
        # The first push after a GetTelemetrySubscriptions is accepted at once: clients jitter
        # their interval (0.5x to 1.5x).
        fresh = inst.last_get_ms is not None and (
            inst.last_push_ms is None or inst.last_get_ms > inst.last_push_ms
        )
        if not fresh and not terminating:
            if inst.last_push_ms is not None and now_ms - inst.last_push_ms < inst.interval_ms:
                return ErrorCode.THROTTLING_QUOTA_EXCEEDED
        inst.last_push_ms = now_ms
        if subscription_id != inst.subscription_id:
            return ErrorCode.UNKNOWN_SUBSCRIPTION_ID
        if compression not in (0, *ACCEPTED_COMPRESSION):
            return ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
        if len(payload) > self.max_bytes:
            return ErrorCode.TELEMETRY_TOO_LARGE
        return ErrorCode.NONE

    # -- instances ------------------------------------------------------------------------------

    def _instance(self, instance_id: uuid.UUID, info: ClientInfo, now_ms: int) -> ClientInstance:
        inst = self.instances.get(instance_id)
        if inst is None or inst.version < self.version:
            metrics, interval = self._evaluate(instance_id, info if inst is None else inst.info)
            sub_id = _subscription_id(metrics, interval, instance_id)
            if inst is None:
                inst = ClientInstance(instance_id, info, sub_id, self.version, metrics, interval)
                self.instances[instance_id] = inst
                while len(self.instances) > MAX_CLIENT_INSTANCES:
                    self._drop(next(iter(self.instances)))
                    self.instances_evicted += 1
            else:  # as Kafka's new instance on a subscription change: asked again at once
                inst.subscription_id, inst.version = sub_id, self.version
                inst.metrics, inst.interval_ms = metrics, interval
                inst.last_get_ms = inst.last_push_ms = None
                inst.terminating = False
                self._unsubscribed(inst)
        inst.last_request_ms = now_ms
        self.instances.move_to_end(instance_id)
        return inst

    def _evaluate(self, instance_id: uuid.UUID, info: ClientInfo) -> tuple[tuple[str, ...], int]:
        """The union of the matching subscriptions' metrics and the least of their intervals."""
        metrics: set[str] = set()
        interval = DEFAULT_INTERVAL_MS
        for sub in self._subscriptions:
            if info.matches(instance_id, sub.match):
                metrics |= sub.metrics
                interval = min(interval, sub.interval_ms)
        if ALL_METRICS in metrics:
            metrics = {ALL_METRICS}
        return tuple(sorted(metrics)), interval

    def expire(self, now_ms: int) -> None:
        """Drop the instances not heard from within their expiry."""
        stale = [
            i
            for i, inst in self.instances.items()
            if now_ms - inst.last_request_ms >= inst.expiry_ms
        ]
        for instance_id in stale:
            self._drop(instance_id)

    def _unsubscribed(self, inst: ClientInstance) -> None:
        """Drop the series no longer asked for, which the client will not push again."""
        if ALL_METRICS in inst.metrics:
            return
        for key in [k for k in inst.series if not k[0].startswith(inst.metrics or ("\0",))]:
            del inst.series[key]
            self.series_count -= 1

    def _drop(self, instance_id: uuid.UUID) -> None:
        inst = self.instances.pop(instance_id)
        self.series_count -= len(inst.series)

    # -- payloads -------------------------------------------------------------------------------

    def _record(self, inst: ClientInstance, compression: int, payload: bytes) -> ErrorCode:
        try:
            raw = b"".join(inflate(compression, payload, self.max_bytes))
        except InvalidBatchError as exc:
            if exc.code == ErrorCode.MESSAGE_TOO_LARGE:
                return ErrorCode.TELEMETRY_TOO_LARGE
            return ErrorCode.INVALID_RECORD
        # OTLP's protobuf classes only once a client pushes: ~100 ms of a broker's start-up
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.metrics.v1 import metrics_pb2

        try:
            data = metrics_pb2.MetricsData.FromString(raw)
        except DecodeError:
            return ErrorCode.INVALID_RECORD  # as Kafka: the client stops pushing
        for name, labels, value, delta in _points(data):
            key = (name, labels)
            if key in inst.series:
                inst.series[key] = inst.series[key] + value if delta else value
            elif len(inst.series) >= MAX_SERIES_PER_CLIENT or self.series_count >= MAX_SERIES:
                self.series_dropped += 1
            else:
                inst.series[key] = value
                self.series_count += 1
        return ErrorCode.NONE

    def series(self) -> Iterator[tuple[ClientInstance, str, tuple[tuple[str, str], ...], float]]:
        for inst in self.instances.values():
            for (name, labels), value in inst.series.items():
                yield inst, name, labels, value


_REFETCH = (ErrorCode.UNKNOWN_SUBSCRIPTION_ID, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE)
_DELTA = 1  # AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA in OTLP's metrics.proto
_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_]")
_SCALARS = ("string_value", "int_value", "bool_value", "double_value")


def _subscription_id(metrics: tuple[str, ...], interval_ms: int, instance_id: uuid.UUID) -> int:
    """Changes when the metrics or the interval do, differs between instances (as Kafka's:
    a checksum of both, mixed with the instance id), as a signed int32."""
    crc = zlib.crc32(f"{list(metrics)}{interval_ms}".encode()) ^ (instance_id.int & 0xFFFFFFFF)
    return crc - (1 << 32) if crc >= 1 << 31 else crc


def _labels(attributes: Any) -> tuple[tuple[str, str], ...]:
    """A data point's attributes as Prometheus labels: at most :data:`MAX_LABELS`, names
    made valid, values cut to :data:`MAX_LABEL_CHARS`."""
    out: dict[str, str] = {}
    for kv in list(attributes)[:MAX_LABELS]:
        kind = kv.value.WhichOneof("value")
        text = str(getattr(kv.value, kind)) if kind in _SCALARS else ""
        key = _NAME_CHARS.sub("_", kv.key)[:MAX_LABEL_CHARS]
        if not key or key[0].isdigit() or key.startswith("__"):
            key = "a_" + key  # Prometheus reserves __ and refuses a leading digit
        out[key] = text[:MAX_LABEL_CHARS]
    return tuple(sorted(out.items()))


def _points(
    data: metrics_pb2.MetricsData,
) -> Iterator[tuple[str, tuple[tuple[str, str], ...], float, bool]]:
    """(metric name, labels, value, is a delta) of each number data point; a histogram gives
    its count and sum."""
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                name = metric.name[:MAX_LABEL_CHARS]
                kind = metric.WhichOneof("data")
                if kind in ("gauge", "sum"):
                    body = getattr(metric, kind)
                    delta = kind == "sum" and body.aggregation_temporality == _DELTA
                    for p in body.data_points:
                        value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                        yield name, _labels(p.attributes), float(value), delta
                elif kind == "histogram":
                    delta = metric.histogram.aggregation_temporality == _DELTA
                    for hp in metric.histogram.data_points:
                        labels = _labels(hp.attributes)
                        yield name + ".count", labels, float(hp.count), delta
                        yield name + ".sum", labels, float(hp.sum), delta
