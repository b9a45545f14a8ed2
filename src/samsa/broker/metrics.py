"""Prometheus metrics of one broker (``metrics.port``): what it did and what it holds.

Names follow what Kafka users scrape from Kafka's JMX through the Prometheus JMX exporter
(``kafka_server_brokertopicmetrics_messagesin_total{topic=...}``, ...) where Kafka has the
metric, and ``samsa_...`` for the rest; the README lists them all.

Cost: the hot paths only add to plain ``dict`` counters, once per request and partition
(Produce takes the record count from the batch header, Fetch the byte count of the pieces
it answers with), never per record. Everything that needs a scan (producer state, open
transactions, group lag, last stable offsets) is computed at scrape time by
:class:`_StateCollector`, which reads the broker's state on the event loop's thread, the
only one that changes it.

Bounded: a per-topic counter exists only for a topic that exists when it is counted, and
counters of deleted topics are dropped (when a new topic is first counted, and at each
scrape), so a client cannot grow them with made-up names. Group lag, whose group ids come
from clients, is capped at ``MAX_GROUP_LAG_SERIES`` series per scrape; what is left out is
counted in ``samsa_consumergroup_lag_series_omitted``. What clients push (KIP-714,
``samsa_client_...``) is bounded by :mod:`samsa.broker.client_metrics`.

The registry is this broker's own (not ``prometheus_client``'s global one), so brokers in
one process do not clash. ``broker/server.py`` serves it over HTTP (:func:`http_response`
builds the answer; this module touches no socket).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from samsa.broker.client_metrics import (
    MAX_CLIENT_INSTANCES,
    MAX_SERIES,
    MAX_SERIES_PER_CLIENT,
    kafka_uuid,
    monotonic_ms,
)
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import api_name

if TYPE_CHECKING:
    from samsa.broker.broker import Broker
    from samsa.broker.config import BrokerConfig
    from samsa.broker.topics import Partition
    from samsa.log.log import AppendResult
    from samsa.protocol.hotpath import FetchPartitionResult, ProducePartitionResult
    from samsa.protocol.records import RecordBatchView

T = TypeVar("T")
_METRIC_NAME = re.compile(r"[^a-zA-Z0-9_]")

# Request latency in milliseconds, as Kafka's RequestMetrics report it (TotalTimeMs): from
# sub-millisecond ApiVersions to long-polling fetches (fetch.max.wait.ms is up to 30 s).
LATENCY_BUCKETS_MS = (
    0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
)  # fmt: skip
# fsync of one log, in milliseconds (Kafka's LogFlushRateAndTimeMs).
FSYNC_BUCKETS_MS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 5000)
MAX_GROUP_LAG_SERIES = 10_000
_FENCED = (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED)
# Transaction coordinator states of a transaction that has begun and not completed.
_OPEN_TXN_STATES = ("ONGOING", "PREPARE_COMMIT", "PREPARE_ABORT")

# (attribute, metric name without _total, help) of the per-topic counters.
_TOPIC_COUNTERS = (
    ("messages_in", "kafka_server_brokertopicmetrics_messagesin",
     "Records appended (duplicates and refused batches excluded)"),
    ("bytes_in", "kafka_server_brokertopicmetrics_bytesin",
     "Bytes of record batches appended (duplicates and refused batches excluded)"),
    ("bytes_out", "kafka_server_brokertopicmetrics_bytesout",
     "Bytes of record batches sent in Fetch responses"),
    ("produce_requests", "kafka_server_brokertopicmetrics_totalproducerequests",
     "Partitions of Produce requests, one per partition per request"),
    ("failed_produce", "kafka_server_brokertopicmetrics_failedproducerequests",
     "Partitions of Produce requests answered with an error"),
    ("fetch_requests", "kafka_server_brokertopicmetrics_totalfetchrequests",
     "Partitions of Fetch responses, one per partition per response"),
    ("failed_fetch", "kafka_server_brokertopicmetrics_failedfetchrequests",
     "Partitions of Fetch responses answered with an error"),
    ("duplicates", "samsa_produce_duplicates",
     "Idempotent batches recognised as retries and not written again"),
    ("out_of_order", "samsa_produce_out_of_order_sequence",
     "Batches refused with OUT_OF_ORDER_SEQUENCE_NUMBER"),
    ("fenced", "samsa_produce_fenced",
     "Batches refused from a fenced producer (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED)"),
)  # fmt: skip


def metrics_bind_host(config: BrokerConfig) -> str:
    """The interface the endpoint listens on: ``metrics.host``, else the host of the listener
    ``metrics.listener`` names (e.g. an internal network's, keeping metrics off a public one),
    else the broker's host. ConfigError for a listener name ``listeners`` does not have."""
    from samsa.broker.config import ConfigError
    from samsa.broker.listeners import parse_listeners

    if config.metrics_listener is None:
        return config.metrics_host or config.host
    if config.metrics_host is not None:
        raise ConfigError("set metrics.host or metrics.listener, not both")
    if config.metrics_port is None:
        raise ConfigError("metrics.listener needs metrics.port (the endpoint's own port)")
    hosts = {lst.name: lst.host for lst in parse_listeners(config)}
    name = config.metrics_listener.strip().upper()
    if name not in hosts:
        raise ConfigError(
            f"metrics.listener {config.metrics_listener!r} is not one of the listeners "
            f"({', '.join(hosts)})"
        )
    return hosts[name]


def request_label(api_key: int) -> str:
    """Kafka's name of an API as its RequestMetrics label it: ``ApiVersions``."""
    return "".join(word.capitalize() for word in api_name(api_key).split("_"))


class BrokerMetrics:
    """The broker's registry, the counters the hooks add to, and their scrape-time view."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.registry = CollectorRegistry(auto_describe=False)
        # topic -> count; see the module docstring for how they stay bounded.
        self.messages_in: dict[str, int] = {}
        self.bytes_in: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}
        self.produce_requests: dict[str, int] = {}
        self.failed_produce: dict[str, int] = {}
        self.fetch_requests: dict[str, int] = {}
        self.failed_fetch: dict[str, int] = {}
        self.duplicates: dict[str, int] = {}
        self.out_of_order: dict[str, int] = {}
        self.fenced: dict[str, int] = {}
        self.latency = Histogram(
            "kafka_network_requestmetrics_totaltimems",
            "Milliseconds from the start of handling a request to its response being ready",
            ["request"],
            buckets=LATENCY_BUCKETS_MS,
            registry=self.registry,
        )
        self._latency_by_key: dict[int, Any] = {}
        self.fsync = Histogram(
            "kafka_log_logflushstats_logflushrateandtimems",
            "Milliseconds of each fsync of a log's data",
            buckets=FSYNC_BUCKETS_MS,
            registry=self.registry,
        )
        self.registry.register(_StateCollector(self))

    # -- hooks (one call from each place that does the work) ------------------------------------

    def timed(self, api_key: int, started: float, result: T) -> T:
        """Record a request's latency: now if ``result`` is its answer (or None), else when
        the awaitable completes (returned wrapped)."""
        if result is None or isinstance(result, bytes | list):
            self._observe(api_key, started)
            return result
        return self._timed(api_key, started, result)  # type: ignore[arg-type, return-value]

    async def _timed(self, api_key: int, started: float, pending: Awaitable[Any]) -> Any:
        try:
            return await pending
        finally:
            self._observe(api_key, started)

    def _observe(self, api_key: int, started: float) -> None:
        child = self._latency_by_key.get(api_key)
        if child is None:
            child = self._latency_by_key[api_key] = self.latency.labels(request_label(api_key))
        child.observe((time.perf_counter() - started) * 1000)

    def appended(self, partition: Partition, batch: RecordBatchView, result: AppendResult) -> None:
        """After ``Broker.append``: records and bytes in, or a duplicate."""
        if result.error != ErrorCode.NONE:
            return
        topic = partition.topic
        if result.duplicate:
            self._add(self.duplicates, topic, 1)
        else:
            self._add(self.messages_in, topic, batch.record_count)
            self._add(self.bytes_in, topic, batch.size)

    def produced(self, results: Iterable[tuple[str, Sequence[ProducePartitionResult]]]) -> None:
        """After a Produce request: one request per partition, and the refusals."""
        for topic, parts in results:
            self._add(self.produce_requests, topic, len(parts))
            for part in parts:
                code = part.error_code
                if code == ErrorCode.NONE:
                    continue
                self._add(self.failed_produce, topic, 1)
                if code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER:
                    self._add(self.out_of_order, topic, 1)
                elif code in _FENCED:
                    self._add(self.fenced, topic, 1)

    def fetched(self, results: Iterable[tuple[Any, Sequence[FetchPartitionResult]]]) -> None:
        """Before a Fetch response goes: its partitions, bytes out and errors."""
        by_id = self.broker.topics.topics_by_id
        for key, parts in results:
            if not isinstance(key, str):  # v13+: a topic id
                known = by_id.get(key)
                if known is None:
                    continue
                key = known.name
            self._add(self.fetch_requests, key, len(parts))
            sent = 0
            for part in parts:
                sent += part.records_size
                if part.error_code != ErrorCode.NONE:
                    self._add(self.failed_fetch, key, 1)
            if sent:
                self._add(self.bytes_out, key, sent)

    def fsynced(self, seconds: float) -> None:
        """One log fsynced (called from the flusher's worker thread; Histogram locks)."""
        self.fsync.observe(seconds * 1000)

    # -- bounded per-topic counters -------------------------------------------------------------

    def _add(self, counts: dict[str, int], topic: str, n: int) -> None:
        try:
            counts[topic] += n
        except KeyError:
            if topic not in self.broker.topics.topics:
                return  # only topics that exist get a series
            self.prune()
            counts[topic] = n

    def prune(self) -> None:
        """Drop the counters of topics that no longer exist."""
        existing = self.broker.topics.topics
        for attr, _name, _help in _TOPIC_COUNTERS:
            counts: dict[str, int] = getattr(self, attr)
            for topic in [t for t in counts if t not in existing]:
                del counts[topic]

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric (call on the event loop's thread)."""
        return generate_latest(self.registry)


class _StateCollector:
    """The metrics read from the broker's state at scrape time."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        broker = m.broker
        m.prune()
        topics = sorted(broker.topics.topics)
        for attr, name, text in _TOPIC_COUNTERS:
            # Every topic that exists, from 0: a rate() needs the series before the first event.
            family = CounterMetricFamily(name, text, labels=["topic"])
            counts: dict[str, int] = getattr(m, attr)
            for topic in topics:
                family.add_metric([topic], counts.get(topic, 0))
            yield family
        yield from _partition_gauges(broker)
        yield from _transaction_gauges(broker)
        yield from _group_lag(broker)
        yield from _cleaner_counters(broker)
        yield from _client_telemetry(broker)


def _partition_gauges(broker: Broker) -> Iterator[Metric]:
    count = GaugeMetricFamily(
        "kafka_server_replicamanager_partitioncount", "Partitions on this broker"
    )
    labels = ["topic", "partition"]
    end = GaugeMetricFamily("kafka_log_log_logendoffset", "Log end offset", labels=labels)
    start = GaugeMetricFamily("kafka_log_log_logstartoffset", "Log start offset", labels=labels)
    lso_lag = GaugeMetricFamily(
        "samsa_log_last_stable_offset_lag",
        "High watermark minus last stable offset: records read_committed consumers cannot "
        "see yet because a transaction is open",
        labels=labels,
    )
    entries = GaugeMetricFamily(
        "samsa_producer_state_entries", "Producers with state on the partition", labels=labels
    )
    size = GaugeMetricFamily(
        "samsa_producer_state_bytes",
        "Bytes of producer state: 32 per retained batch plus the entries' own size",
        labels=labels,
    )
    n = 0
    for topic in list(broker.topics.topics.values()):
        for p in topic.partitions:
            n += 1
            plog = p.log
            key = [topic.name, str(p.index)]
            end.add_metric(key, plog.log_end_offset)
            start.add_metric(key, plog.log_start_offset)
            lso_lag.add_metric(key, plog.high_watermark - plog.last_stable_offset)
            producers = plog.producer_state.entries()
            entries.add_metric(key, len(producers))
            size.add_metric(key, sum(_entry_bytes(e) for e in producers))
    count.add_metric([], n)
    return iter((count, end, start, lso_lag, entries, size))


def _entry_bytes(entry: Any) -> int:
    return sys.getsizeof(entry) + 32 * len(entry.batches)


def _transaction_gauges(broker: Broker) -> Iterator[Metric]:
    now_ms = time.time_ns() // 1_000_000
    starts = [
        meta.start_timestamp_ms
        for meta in broker.transactions.coordinator.txns.values()
        if meta.state.name in _OPEN_TXN_STATES
    ]
    ongoing = GaugeMetricFamily(
        "samsa_transactions_ongoing",
        "Transactions begun and not yet complete (Ongoing, PrepareCommit, PrepareAbort)",
    )
    ongoing.add_metric([], len(starts))
    oldest = GaugeMetricFamily(
        "samsa_transactions_oldest_age_seconds",
        "Age of the oldest transaction begun and not yet complete (0 if none)",
    )
    started = [s for s in starts if s >= 0]
    oldest.add_metric([], max(0.0, (now_ms - min(started)) / 1000) if started else 0.0)
    return iter((ongoing, oldest))


def _group_lag(broker: Broker) -> Iterator[Metric]:
    labels = ["consumergroup", "topic", "partition"]
    lag = GaugeMetricFamily(
        "kafka_consumergroup_lag",
        "Log end offset minus the group's committed offset, per partition",
        labels=labels,
    )
    offset = GaugeMetricFamily(
        "kafka_consumergroup_current_offset", "The group's committed offset", labels=labels
    )
    omitted = 0
    series = 0
    topics = broker.topics
    store = broker.groups.coordinator.offsets
    for group_id, _kind, _state in sorted(broker.groups.list_groups([])):
        for (topic, index), value in sorted(store.committed(group_id).items()):
            partition = topics.get_partition(topic, index)
            if partition is None:
                continue
            if series >= MAX_GROUP_LAG_SERIES:
                omitted += 1
                continue
            series += 1
            key = [group_id, topic, str(index)]
            lag.add_metric(key, max(0, partition.log.log_end_offset - value.offset))
            offset.add_metric(key, value.offset)
    left_out = GaugeMetricFamily(
        "samsa_consumergroup_lag_series_omitted",
        f"Group partitions left out of kafka_consumergroup_lag (over {MAX_GROUP_LAG_SERIES})",
    )
    left_out.add_metric([], omitted)
    return iter((lag, offset, left_out))


def _cleaner_counters(broker: Broker) -> Iterator[Metric]:
    stats = broker.cleaner.stats
    for attr, text in (
        ("cleanings", "Compactions of a log completed"),
        ("bytes_read", "Bytes the cleaner read"),
        ("bytes_written", "Bytes the cleaner wrote"),
        ("records_removed", "Records compaction removed"),
        ("batches_removed", "Batches compaction removed"),
    ):
        family = CounterMetricFamily(f"samsa_log_cleaner_{attr}", text)
        family.add_metric([], getattr(stats, attr))
        yield family


def _client_telemetry(broker: Broker) -> Iterator[Metric]:
    """What clients pushed (KIP-714), one gauge family per metric name, labelled by client
    instance and client id besides the data point's own attributes; bounded by the manager
    (instances, series per instance, series in all), stale instances dropped first."""
    manager = broker.client_metrics
    manager.expire(monotonic_ms())
    families: dict[str, Metric] = {}
    for inst, name, labels, value in manager.series():
        prom = "samsa_client_" + _METRIC_NAME.sub("_", name)
        family = families.get(prom)
        if family is None:
            family = families[prom] = Metric(prom, f"Pushed by clients (KIP-714): {name}", "gauge")
        tags = {
            "client_instance_id": kafka_uuid(inst.instance_id),
            "client_id": inst.info.client_id,
        }
        for k, v in labels:
            tags.setdefault(k, v)  # the broker's labels win over a same-named attribute
        family.add_sample(prom, tags, value)
    yield from families.values()
    for attr, text in (
        ("instances", "Client instances the broker keeps telemetry state for"),
        ("series_count", "Series of pushed client metrics kept"),
    ):
        gauge = GaugeMetricFamily(f"samsa_client_telemetry_{attr.removesuffix('_count')}", text)
        gauge.add_metric(
            [], len(manager.instances) if attr == "instances" else manager.series_count
        )
        yield gauge
    for attr, text in (
        ("series_dropped", f"Pushed series not kept (over {MAX_SERIES_PER_CLIENT} a client "
                           f"or {MAX_SERIES} in all)"),
        ("instances_evicted", f"Client instances dropped for newer ones (over "
                              f"{MAX_CLIENT_INSTANCES})"),
    ):  # fmt: skip
        counter = CounterMetricFamily(f"samsa_client_telemetry_{attr}", text)
        counter.add_metric([], getattr(manager, attr))
        yield counter


# -- HTTP: the answer to one request (the socket side is in broker/server.py) -------------------

MAX_HTTP_REQUEST_BYTES = 8192


def http_response(head: bytes, exposition: Callable[[], bytes]) -> bytes:
    """The HTTP/1.0 answer to a request whose head (request line and headers) is ``head``:
    the metrics for ``GET /metrics`` (or ``/``), a clear error otherwise."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return _http(400, "Bad Request", b"malformed request line\n")
    method, target, _version = parts
    path = target.split("?", 1)[0]
    if path not in ("/metrics", "/"):
        return _http(404, "Not Found", b"metrics are at /metrics\n")
    if method not in ("GET", "HEAD"):
        return _http(405, "Method Not Allowed", b"use GET\n", b"Allow: GET, HEAD\r\n")
    body = exposition()
    if method == "HEAD":
        return _http(200, "OK", b"", content_length=len(body))
    return _http(200, "OK", body, content_type=CONTENT_TYPE_LATEST)


def _http(
    status: int,
    reason: str,
    body: bytes,
    extra: bytes = b"",
    *,
    content_type: str = "text/plain; charset=utf-8",
    content_length: int | None = None,
) -> bytes:
    length = len(body) if content_length is None else content_length
    head = (
        f"HTTP/1.0 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n"
    ).encode()
    return head + extra + b"\r\n" + body
