"""Broker settings, under Kafka's names where Kafka has one.

A config file is a Java-style properties file (``key=value`` lines, ``#`` comments), like
Kafka's ``server.properties``; command-line flags override it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

INT_MAX = 2**31 - 1  # Kafka's INT settings are 32-bit
LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1

# Kafka name -> attribute name
_KAFKA_NAMES: dict[str, str] = {
    "num.partitions": "num_partitions",
    "auto.create.topics.enable": "auto_create_topics_enable",
    "log.segment.bytes": "log_segment_bytes",
    "log.index.interval.bytes": "log_index_interval_bytes",
    "producer.id.expiration.ms": "producer_id_expiration_ms",
    "producer.id.expiration.check.interval.ms": "producer_id_expiration_check_interval_ms",
    "log.flush.interval.messages": "log_flush_interval_messages",
    "log.flush.scheduler.interval.ms": "log_flush_scheduler_interval_ms",
    "message.max.bytes": "message_max_bytes",
    "message.max.inflated.bytes": "message_max_inflated_bytes",  # samsa's own
    "socket.request.max.bytes": "socket_request_max_bytes",
    "queued.max.request.bytes": "queued_max_request_bytes",
    "socket.request.read.timeout.ms": "socket_request_read_timeout_ms",
    "connections.max.idle.ms": "connections_max_idle_ms",
    "max.connections": "max_connections",
    "max.connections.per.ip": "max_connections_per_ip",
    "log.max.open.files": "log_max_open_files",
    "max.partitions": "max_partitions",
    "quota.window.num": "quota_window_num",
    "quota.window.size.seconds": "quota_window_size_seconds",
    "max.incremental.fetch.session.cache.slots": "max_incremental_fetch_session_cache_slots",
    "telemetry.max.bytes": "telemetry_max_bytes",
    "broker.id": "broker_id",
    "node.id": "broker_id",
    "log.dirs": "data_dir",
    "log.dir": "data_dir",
    "default.replication.factor": "default_replication_factor",
    "log.retention.ms": "log_retention_ms",
    "log.retention.bytes": "log_retention_bytes",
    "log.roll.ms": "log_roll_ms",
    "log.cleanup.policy": "log_cleanup_policy",
    "log.message.timestamp.type": "log_message_timestamp_type",
    # Broker defaults of more topic configs (broker/topic_config.py, rules 39-43).
    "compression.type": "compression_type",
    "compression.gzip.level": "compression_gzip_level",
    "compression.lz4.level": "compression_lz4_level",
    "compression.zstd.level": "compression_zstd_level",
    "min.insync.replicas": "min_insync_replicas",
    "log.message.timestamp.before.max.ms": "log_message_timestamp_before_max_ms",
    "log.message.timestamp.after.max.ms": "log_message_timestamp_after_max_ms",
    "log.flush.interval.ms": "log_flush_interval_ms",
    "log.roll.jitter.ms": "log_roll_jitter_ms",
    # Broker defaults of topic keys samsa validates and keeps (rule 43), dynamic as in Kafka.
    "log.index.size.max.bytes": "log_index_size_max_bytes",
    "log.preallocate": "log_preallocate",
    "log.segment.delete.delay.ms": "log_segment_delete_delay_ms",
    "unclean.leader.election.enable": "unclean_leader_election_enable",
    "log.message.downconversion.enable": "log_message_downconversion_enable",
    "log.retention.check.interval.ms": "log_retention_check_interval_ms",
    "log.cleaner.enable": "log_cleaner_enable",
    "log.cleaner.backoff.ms": "log_cleaner_backoff_ms",
    "log.cleaner.dedupe.buffer.size": "log_cleaner_dedupe_buffer_size",
    "log.cleaner.io.max.bytes.per.second": "log_cleaner_io_max_bytes_per_second",
    "log.cleaner.min.cleanable.ratio": "log_cleaner_min_cleanable_ratio",
    "log.cleaner.min.compaction.lag.ms": "log_cleaner_min_compaction_lag_ms",
    "log.cleaner.max.compaction.lag.ms": "log_cleaner_max_compaction_lag_ms",
    "log.cleaner.delete.retention.ms": "log_cleaner_delete_retention_ms",
    "offsets.topic.num.partitions": "offsets_topic_num_partitions",
    "offsets.topic.segment.bytes": "offsets_topic_segment_bytes",
    "transaction.state.log.segment.bytes": "transaction_state_log_segment_bytes",
    "group.initial.rebalance.delay.ms": "group_initial_rebalance_delay_ms",
    "group.min.session.timeout.ms": "group_min_session_timeout_ms",
    "group.max.session.timeout.ms": "group_max_session_timeout_ms",
    "group.consumer.session.timeout.ms": "group_consumer_session_timeout_ms",
    "group.consumer.heartbeat.interval.ms": "group_consumer_heartbeat_interval_ms",
    "group.consumer.assignors": "group_consumer_assignors",
    "group.consumer.max.size": "group_consumer_max_size",
    "group.max.size": "group_max_size",
    "group.consumer.migration.policy": "group_consumer_migration_policy",
    "group.share.session.timeout.ms": "group_share_session_timeout_ms",
    "group.share.heartbeat.interval.ms": "group_share_heartbeat_interval_ms",
    "group.share.record.lock.duration.ms": "group_share_record_lock_duration_ms",
    "group.share.delivery.count.limit": "group_share_delivery_count_limit",
    "group.share.partition.max.record.locks": "group_share_partition_max_record_locks",
    "group.share.max.size": "group_share_max_size",
    "group.share.max.share.sessions": "group_share_max_share_sessions",
    "offsets.retention.minutes": "offsets_retention_minutes",
    "offsets.retention.check.interval.ms": "offsets_retention_check_interval_ms",
    "transaction.state.log.num.partitions": "transaction_state_log_num_partitions",
    "transaction.max.timeout.ms": "transaction_max_timeout_ms",
    "transactional.id.expiration.ms": "transactional_id_expiration_ms",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (
        "transaction_abort_timed_out_transaction_cleanup_interval_ms"
    ),
    "transaction.remove.expired.transaction.cleanup.interval.ms": (
        "transaction_remove_expired_transaction_cleanup_interval_ms"
    ),
    # Kafka's finalized feature (KRaft sets it with kafka-features; here a broker setting).
    "transaction.version": "transaction_version",
    "transaction.two.phase.commit.enable": "transaction_two_phase_commit_enable",
    # Listeners and security (see broker/listeners.py and broker/sasl.py).
    "listeners": "listeners",
    "advertised.listeners": "advertised_listeners",
    "listener.security.protocol.map": "listener_security_protocol_map",
    "ssl.keystore.type": "ssl_keystore_type",
    "ssl.keystore.location": "ssl_keystore_location",
    "ssl.keystore.key": "ssl_keystore_key",
    "ssl.keystore.certificate.chain": "ssl_keystore_certificate_chain",
    "ssl.key.password": "ssl_key_password",
    "ssl.truststore.type": "ssl_truststore_type",
    "ssl.truststore.location": "ssl_truststore_location",
    "ssl.client.auth": "ssl_client_auth",
    "ssl.principal.mapping.rules": "ssl_principal_mapping_rules",
    "sasl.enabled.mechanisms": "sasl_enabled_mechanisms",
    "sasl.plain.users.file": "sasl_plain_users_file",
    "connections.max.reauth.ms": "connections_max_reauth_ms",
    "sasl.server.max.receive.size": "sasl_server_max_receive_size",
    "connection.failed.authentication.delay.ms": "connection_failed_authentication_delay_ms",
    "sasl.server.authentication.timeout.ms": "sasl_server_authentication_timeout_ms",
    "sasl.max.connections.per.ip": "sasl_max_connections_per_ip",
    # OAUTHBEARER (broker/oauthbearer.py): KIP-768's OIDC validator, and samsa's names for the
    # options Kafka's unsecured validator takes from JAAS (unsecuredValidator...).
    "sasl.oauthbearer.jwks.endpoint.url": "sasl_oauthbearer_jwks_endpoint_url",
    "sasl.oauthbearer.jwks.endpoint.refresh.ms": "sasl_oauthbearer_jwks_endpoint_refresh_ms",
    "sasl.oauthbearer.expected.audience": "sasl_oauthbearer_expected_audience",
    "sasl.oauthbearer.expected.issuer": "sasl_oauthbearer_expected_issuer",
    "sasl.oauthbearer.clock.skew.seconds": "sasl_oauthbearer_clock_skew_seconds",
    "sasl.oauthbearer.sub.claim.name": "sasl_oauthbearer_sub_claim_name",
    "sasl.oauthbearer.scope.claim.name": "sasl_oauthbearer_scope_claim_name",
    "sasl.oauthbearer.unsecured.validator.principal.claim.name": (
        "sasl_oauthbearer_unsecured_validator_principal_claim_name"
    ),
    "sasl.oauthbearer.unsecured.validator.scope.claim.name": (
        "sasl_oauthbearer_unsecured_validator_scope_claim_name"
    ),
    "sasl.oauthbearer.unsecured.validator.required.scope": (
        "sasl_oauthbearer_unsecured_validator_required_scope"
    ),
    "sasl.oauthbearer.unsecured.validator.allowable.clock.skew.ms": (
        "sasl_oauthbearer_unsecured_validator_allowable_clock_skew_ms"
    ),
    # Authorization (see broker/authorizer.py).
    "authorizer.class.name": "authorizer_class_name",
    "super.users": "super_users",
    "allow.everyone.if.no.acl.found": "allow_everyone_if_no_acl_found",
    # samsa's own: Prometheus metrics over HTTP (broker/metrics.py).
    "metrics.port": "metrics_port",
    # A test setting (default 0: off): sleep this long after each coordinator batch replayed
    # at start-up, so that tests can watch a broker serve while its coordinators load.
    "test.coordinator.load.batch.delay.ms": "test_coordinator_load_batch_delay_ms",
    "metrics.host": "metrics_host",
    "metrics.listener": "metrics_listener",
}


class ConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Range:
    """The valid values of an integer setting: Kafka's ConfigDef type (INT is 32-bit, LONG
    64-bit) and validator (``atLeast``/``between``)."""

    low: int
    high: int = INT_MAX
    # Any negative value means "no limit" (Kafka reads log.retention.ms < 0 as -1).
    negative_is_unlimited: bool = False

    def problem(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{value!r} is not an integer"
        if self.negative_is_unlimited and value < 0:
            return None
        if self.low <= value <= self.high:
            return None
        if self.high not in (INT_MAX, LONG_MAX):
            allowed = f"between {self.low} and {self.high}"
        elif value > self.high:
            bits = 32 if self.high == INT_MAX else 64
            return f"must be at most {self.high} (a {bits}-bit integer), got {value}"
        else:
            allowed = f"at least {self.low}"
        if self.negative_is_unlimited:
            allowed = f"-1 (no limit) or {allowed}"
        return f"must be {allowed}, got {value}"


# Attribute -> valid values, from Kafka's config definitions (Kafka 4.x). Every integer
# setting has an entry (a unit test checks), so a new setting slots in with one line.
_RANGES: dict[str, Range] = {
    "port": Range(0, 65535),  # 0: pick a free port
    "advertised_port": Range(0, 65535),  # None or 0: the listen port
    "broker_id": Range(0),  # KRaft requires node.id >= 0
    "num_partitions": Range(1),
    "default_replication_factor": Range(1),  # Kafka: no validator; below 1 means nothing
    # Kafka 4 (KIP-1030): atLeast(1024 * 1024); smaller values roll a segment per batch.
    "log_segment_bytes": Range(1024 * 1024),
    "log_index_interval_bytes": Range(0),
    "producer_id_expiration_ms": Range(1),
    "producer_id_expiration_check_interval_ms": Range(1),
    "log_flush_interval_messages": Range(1, LONG_MAX),
    "log_flush_scheduler_interval_ms": Range(1, LONG_MAX),  # Kafka: none; <1 would spin
    "message_max_bytes": Range(0),
    "message_max_inflated_bytes": Range(1),
    "socket_request_max_bytes": Range(1),
    # <= 0: unbounded; otherwise at least socket.request.max.bytes (checked in validate).
    "queued_max_request_bytes": Range(LONG_MIN, LONG_MAX),
    "socket_request_read_timeout_ms": Range(1),  # samsa's own
    "connections_max_idle_ms": Range(LONG_MIN, LONG_MAX),  # Kafka: no validator; < 0: never
    "max_connections": Range(0),
    # Kafka allows 0 only with max.connections.per.ip.overrides, which samsa does not have.
    "max_connections_per_ip": Range(1),
    "log_max_open_files": Range(1),  # samsa's own
    "max_partitions": Range(1),  # samsa's own
    "quota_window_num": Range(1),
    "quota_window_size_seconds": Range(1),
    "max_incremental_fetch_session_cache_slots": Range(0),
    "telemetry_max_bytes": Range(1),  # as Kafka: atLeast(1)
    "connections_max_reauth_ms": Range(0, LONG_MAX),  # Kafka: no validator; 0: no deadline
    "sasl_server_max_receive_size": Range(1),  # Kafka: no validator; 0 would refuse all
    "connection_failed_authentication_delay_ms": Range(0),
    "sasl_server_authentication_timeout_ms": Range(1),  # samsa's own
    "sasl_max_connections_per_ip": Range(1),  # samsa's own
    "sasl_oauthbearer_jwks_endpoint_refresh_ms": Range(1),
    "sasl_oauthbearer_clock_skew_seconds": Range(0),
    "sasl_oauthbearer_unsecured_validator_allowable_clock_skew_ms": Range(0),
    "metrics_port": Range(0, 65535),  # samsa's own; 0: pick a free port
    "test_coordinator_load_batch_delay_ms": Range(0, 60_000),
    # KafkaConfig: "log.retention.ms must be unlimited (-1) or, greater than or equal to 1".
    "log_retention_ms": Range(1, LONG_MAX, negative_is_unlimited=True),
    "log_retention_bytes": Range(LONG_MIN, LONG_MAX),  # negative: no size limit
    "log_roll_ms": Range(1, LONG_MAX),
    "compression_gzip_level": Range(-1, 9),  # 1-9, or -1 (checked in validate)
    "compression_lz4_level": Range(1, 17),
    "compression_zstd_level": Range(-131072, 22),
    "min_insync_replicas": Range(1),
    "log_message_timestamp_before_max_ms": Range(0, LONG_MAX),
    "log_message_timestamp_after_max_ms": Range(0, LONG_MAX),
    "log_flush_interval_ms": Range(0, LONG_MAX),
    "log_roll_jitter_ms": Range(0, LONG_MAX),
    "log_index_size_max_bytes": Range(4),
    "log_segment_delete_delay_ms": Range(0, LONG_MAX),
    "log_retention_check_interval_ms": Range(1, LONG_MAX),
    "log_cleaner_backoff_ms": Range(0, LONG_MAX),
    # KafkaConfig: "log.cleaner.dedupe.buffer.size must be at least 1MB per cleaner thread".
    "log_cleaner_dedupe_buffer_size": Range(1024 * 1024, LONG_MAX),
    "log_cleaner_min_compaction_lag_ms": Range(0, LONG_MAX),
    "log_cleaner_max_compaction_lag_ms": Range(1, LONG_MAX),
    "log_cleaner_delete_retention_ms": Range(0, LONG_MAX),
    "offsets_topic_num_partitions": Range(1),
    "offsets_topic_segment_bytes": Range(1),
    "transaction_state_log_segment_bytes": Range(1),
    # The three classic-group timeouts have no validator in Kafka; negatives mean nothing.
    "group_initial_rebalance_delay_ms": Range(0),
    "group_min_session_timeout_ms": Range(0),
    "group_max_session_timeout_ms": Range(0),
    "group_consumer_session_timeout_ms": Range(1),  # KIP-848 groups, as Kafka: atLeast(1)
    "group_consumer_heartbeat_interval_ms": Range(1),
    "group_consumer_max_size": Range(1),
    "group_max_size": Range(1),
    # KIP-932 share groups (broker/share.py, coordinator/share_group.py)
    "group_share_session_timeout_ms": Range(1),
    "group_share_heartbeat_interval_ms": Range(1),
    "group_share_record_lock_duration_ms": Range(1000, 3_600_000),
    "group_share_delivery_count_limit": Range(2, 10),
    "group_share_partition_max_record_locks": Range(100, 10_000),
    "group_share_max_size": Range(1, 1000),
    "group_share_max_share_sessions": Range(1),
    "offsets_retention_minutes": Range(1),
    "offsets_retention_check_interval_ms": Range(1, LONG_MAX),
    "transaction_state_log_num_partitions": Range(1),
    "transaction_max_timeout_ms": Range(1),
    "transactional_id_expiration_ms": Range(1),
    "transaction_abort_timed_out_transaction_cleanup_interval_ms": Range(1),
    "transaction_remove_expired_transaction_cleanup_interval_ms": Range(1),
    "transaction_version": Range(0, 2),
}

# Names for settings that have no Kafka property of their own.
_DISPLAY_NAMES = {"port": "listener port", "advertised_port": "advertised listener port"}


def setting_name(attr: str) -> str:
    """The name a user knows a setting by (its Kafka names, e.g. ``broker.id/node.id``)."""
    names = [k for k, a in _KAFKA_NAMES.items() if a == attr]
    return "/".join(names) if names else _DISPLAY_NAMES.get(attr, attr)


# Settings whose values DescribeConfigs never shows (Kafka's PASSWORD type).
SENSITIVE = frozenset({"ssl.key.password", "ssl.keystore.key"})


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return _java_double(value)
    return str(value)


def _java_double(value: float) -> str:
    """A double as Java's Double.toString writes it (Kafka's DescribeConfigs shows that):
    plain between 10^-3 and 10^7, else d.dddE±n."""
    if value != value:
        return "NaN"
    if abs(value) == float("inf"):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        return repr(value)
    mantissa, _, exponent = repr(value).partition("e")
    if not exponent:  # repr wrote it plain: make it scientific
        mantissa, _, exponent = f"{value:.16e}".partition("e")
        mantissa = mantissa.rstrip("0")
    if "." not in mantissa:
        mantissa += ".0"
    elif mantissa.endswith("."):
        mantissa += "0"
    return f"{mantissa}E{int(exponent)}"


# Broker keys whose Kafka default is null (the value comes from another key: log.retention.ms
# from log.retention.hours, log.flush.interval.ms from the scheduler's interval): Kafka's
# DescribeConfigs shows null while they are unset, and so does samsa's.
_NULL_DEFAULTS = frozenset(
    {"log.retention.ms", "log.roll.ms", "log.roll.jitter.ms", "log.flush.interval.ms"}
)


def broker_setting(config: BrokerConfig, name: str) -> tuple[str | None, bool] | None:
    """(value as Kafka shows it, whether it is the default) of the setting under Kafka's
    ``name``; None if samsa has no such setting. A value equal to the default counts as
    the default (samsa does not track which settings were given)."""
    attr = _KAFKA_NAMES.get(name)
    if attr is None:
        return None
    value = getattr(config, attr)
    default = next(f.default for f in fields(BrokerConfig) if f.name == attr)
    if value == default and name in _NULL_DEFAULTS:
        return None, True
    return _text(value), value == default


def setting_attr(name: str) -> str | None:
    """The BrokerConfig attribute of the setting Kafka calls ``name``; None if samsa has none."""
    return _KAFKA_NAMES.get(name)


def default_setting(name: str) -> str | None:
    """Kafka's default of the setting ``name``, as DescribeConfigs shows it."""
    if name in _NULL_DEFAULTS:
        return None
    attr = _KAFKA_NAMES[name]
    return _text(next(f.default for f in fields(BrokerConfig) if f.name == attr))


def broker_settings(config: BrokerConfig) -> list[tuple[str, str | None, bool]]:
    """(Kafka name, value, is default) of every broker setting, for DescribeConfigs."""
    out = []
    for name in sorted(_KAFKA_NAMES):
        if name.startswith("test."):
            continue  # a knob of samsa's own tests, not a setting to describe
        found = broker_setting(config, name)
        assert found is not None
        out.append((name, found[0], found[1]))
    return out


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    data_dir: Path = Path("./samsa-data")
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None
    advertised_port: int | None = None
    broker_id: int = 0
    cluster_id: str | None = None  # kept in the data dir's meta.properties; created at first start
    num_partitions: int = 1
    default_replication_factor: int = 1
    auto_create_topics_enable: bool = True
    log_segment_bytes: int = 1_073_741_824
    log_index_interval_bytes: int = 4096
    producer_id_expiration_ms: int = 86_400_000
    producer_id_expiration_check_interval_ms: int = 600_000
    log_flush_interval_messages: int = LONG_MAX
    # How often idle logs are checked against flush.ms (rule 42); Kafka's Long.MAX: never.
    log_flush_scheduler_interval_ms: int = LONG_MAX
    message_max_bytes: int = 1_048_588
    # Kafka has none: the records of one client batch may inflate to this many bytes at most
    # (MESSAGE_TOO_LARGE beyond), the CPU a decompression bomb can cost (log/validator.py).
    message_max_inflated_bytes: int = 64 * 1024 * 1024
    socket_request_max_bytes: int = 104_857_600
    # Bytes of requests being read or waiting to be handled, broker-wide; reading pauses when
    # they would pass it. <= 0: unbounded (Kafka's default, -1); otherwise at least
    # socket.request.max.bytes, as Kafka requires. Bounded by default, unlike Kafka: unbounded
    # is how 20 half-sent 100 MB frames take 2 GB. Twice the largest request, so one of those
    # can be read while smaller ones go on.
    queued_max_request_bytes: int = 209_715_200
    # samsa's own (Kafka has no twin): a request whose first bytes arrived must be complete
    # within this time, else the connection is closed. >= 1. Kafka's request.timeout.ms default.
    socket_request_read_timeout_ms: int = 30_000
    connections_max_idle_ms: int = 600_000  # -1: never close idle connections
    max_connections: int = 2_147_483_647  # >= 0; over it new connections are closed
    max_connections_per_ip: int = 2_147_483_647  # >= 0; likewise per client address
    # Client quotas (broker/quotas.py): rates are measured over this many windows of this size.
    quota_window_num: int = 11
    quota_window_size_seconds: int = 1
    # samsa's own: segment files kept open at once (least recently used closed first), at most
    # half the process's descriptor limit. >= 1.
    log_max_open_files: int = 16_384
    # samsa's own: partitions the broker holds at most, all topics together (internal ones
    # included); CreateTopics and CreatePartitions past it get INVALID_PARTITIONS. Each
    # partition costs a directory, open files and memory: a client must not ask for 2^31.
    max_partitions: int = 100_000
    # KIP-227: fetch sessions kept at once (broker/fetch_session.py); 0: none.
    max_incremental_fetch_session_cache_slots: int = 1000
    telemetry_max_bytes: int = 1024 * 1024  # KIP-714: the largest PushTelemetry, inflated
    log_retention_ms: int = 604_800_000  # 168 hours, Kafka's log.retention.hours default
    log_retention_bytes: int = -1
    # Broker defaults of the topic configs segment.ms, cleanup.policy, message.timestamp.type.
    log_roll_ms: int = 604_800_000  # 168 hours, Kafka's log.roll.hours default
    log_cleanup_policy: str = "delete"
    log_message_timestamp_type: str = "CreateTime"
    # ... and of compression.type (+ levels), min.insync.replicas, the KIP-937 window,
    # flush.ms and segment.jitter.ms (Kafka 4's defaults).
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    min_insync_replicas: int = 1
    log_message_timestamp_before_max_ms: int = LONG_MAX
    log_message_timestamp_after_max_ms: int = 3_600_000
    log_flush_interval_ms: int = LONG_MAX
    log_roll_jitter_ms: int = 0
    # ... and of the topic keys that are trivially true here or describe Kafka's file layout
    # (rule 43): validated, kept and described.
    log_index_size_max_bytes: int = 10_485_760
    log_preallocate: bool = False
    log_segment_delete_delay_ms: int = 60_000
    unclean_leader_election_enable: bool = False
    log_message_downconversion_enable: bool = True
    log_retention_check_interval_ms: int = 300_000
    log_cleaner_enable: bool = True
    log_cleaner_backoff_ms: int = 15_000  # sleep between checks when there is nothing to clean
    log_cleaner_dedupe_buffer_size: int = 134_217_728  # bounds the offset map (24 B per key)
    log_cleaner_io_max_bytes_per_second: float = 1.7976931348623157e308  # Double.MAX_VALUE
    log_cleaner_min_cleanable_ratio: float = 0.5
    log_cleaner_min_compaction_lag_ms: int = 0
    log_cleaner_max_compaction_lag_ms: int = LONG_MAX
    log_cleaner_delete_retention_ms: int = 86_400_000  # tombstones stay a day
    offsets_topic_num_partitions: int = 50
    # Internal topics roll sooner than others so that their cleaner has inactive segments.
    offsets_topic_segment_bytes: int = 104_857_600
    transaction_state_log_segment_bytes: int = 104_857_600
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_assignors: str = "uniform,range"  # the first is the default
    # Kafka's default is Integer.MAX_VALUE; bounded here as every client-made resource is.
    group_consumer_max_size: int = 1000
    group_max_size: int = 1000  # classic groups; bounded, as group.consumer.max.size (D-GROUP-1)
    group_share_session_timeout_ms: int = 45_000
    group_share_heartbeat_interval_ms: int = 5_000
    group_share_record_lock_duration_ms: int = 30_000
    group_share_delivery_count_limit: int = 5
    group_share_partition_max_record_locks: int = 2000
    group_share_max_size: int = 200
    group_share_max_share_sessions: int = 2000
    # Online migration of non-empty groups between the protocols (rule 38); Kafka 4's default.
    group_consumer_migration_policy: str = "bidirectional"
    offsets_retention_minutes: int = 10080  # 7 days
    offsets_retention_check_interval_ms: int = 600_000
    transaction_state_log_num_partitions: int = 50
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 604_800_000  # 7 days
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = 10_000
    transaction_remove_expired_transaction_cleanup_interval_ms: int = 3_600_000
    # 2: transactions v2 (KIP-890 part 2) offered in ApiVersions; 0 or 1 offer TV1 only.
    transaction_version: int = 2
    # KIP-939: may producers open two-phase-commit transactions (no timeout)?
    transaction_two_phase_commit_enable: bool = False
    # Kafka's listener syntax, NAME://HOST:PORT,... (None: one PLAINTEXT listener on
    # host:port, the --host/--port shortcut). Parsed and checked in broker/listeners.py.
    listeners: str | None = None
    advertised_listeners: str | None = None
    listener_security_protocol_map: str | None = None
    ssl_keystore_type: str = "PEM"  # the only type samsa reads (Kafka's default is JKS)
    ssl_keystore_location: str | None = None  # PEM: private key and certificate chain
    ssl_keystore_key: str | None = None  # PEM text, with ssl.keystore.certificate.chain
    ssl_keystore_certificate_chain: str | None = None
    ssl_key_password: str | None = None
    ssl_truststore_type: str = "PEM"
    ssl_truststore_location: str | None = None  # PEM CA certificates for client certificates
    ssl_client_auth: str = "none"  # none | requested | required, on SSL listeners
    ssl_principal_mapping_rules: str = "DEFAULT"
    # Kafka's default is GSSAPI, which samsa does not serve; PLAIN must be asked for.
    sasl_enabled_mechanisms: str = "SCRAM-SHA-256,SCRAM-SHA-512"
    # samsa's own: PLAIN users, one USER=PASSWORD line each (Kafka keeps them in JAAS config).
    sasl_plain_users_file: str | None = None
    # Kafka's listener.name.<listener>.<setting>: (LISTENER, setting, value), applied over the
    # global ssl.* / sasl.* settings for that listener only (broker/listeners.py).
    listener_overrides: tuple[tuple[str, str, str], ...] = ()
    # KIP-368: a SASL session lasts this long; the client re-authenticates on the connection
    # before then, or the broker closes it at its next request. 0: sessions never expire.
    connections_max_reauth_ms: int = 0
    # Before SASL authentication completes a frame may be at most this big (Kafka's setting
    # and default), and it does not draw on queued.max.request.bytes.
    sasl_server_max_receive_size: int = 524_288
    # Kafka's: a failed authentication is answered, and the connection closed, this much later,
    # reading stopped meanwhile, so passwords cannot be tried at the speed of the network.
    connection_failed_authentication_delay_ms: int = 100
    # samsa's own (Kafka has none: a silent connection stays until connections.max.idle.ms): a
    # connection to a SASL listener must authenticate within this time or is closed.
    sasl_server_authentication_timeout_ms: int = 5_000
    # samsa's own: connections from one address to one SASL listener (Kafka's
    # max.connections.per.ip, unlimited by default there, still applies across listeners).
    sasl_max_connections_per_ip: int = 256
    # OAUTHBEARER (KIP-255, KIP-768): with a JWKS URL (file:// or http:// on loopback) tokens
    # are signed JWTs checked against it; without one, Kafka's default: unsecured JWTs.
    sasl_oauthbearer_jwks_endpoint_url: str | None = None
    sasl_oauthbearer_jwks_endpoint_refresh_ms: int = 3_600_000
    sasl_oauthbearer_expected_audience: str = ""  # comma-separated; empty: not checked
    sasl_oauthbearer_expected_issuer: str | None = None
    sasl_oauthbearer_clock_skew_seconds: int = 30
    sasl_oauthbearer_sub_claim_name: str = "sub"
    sasl_oauthbearer_scope_claim_name: str = "scope"
    sasl_oauthbearer_unsecured_validator_principal_claim_name: str = "sub"
    sasl_oauthbearer_unsecured_validator_scope_claim_name: str = "scope"
    sasl_oauthbearer_unsecured_validator_required_scope: str = ""  # comma-separated
    sasl_oauthbearer_unsecured_validator_allowable_clock_skew_ms: int = 0
    # Empty: no authorization (anyone may do anything). Kafka's StandardAuthorizer (or the
    # older AclAuthorizer) class name turns ACLs on (broker/authorizer.py).
    authorizer_class_name: str = ""
    super_users: str = ""  # principals separated by ';', e.g. User:admin;User:ops
    allow_everyone_if_no_acl_found: bool = False
    # samsa's own: serve Prometheus metrics at http://metrics.host:metrics.port/metrics.
    # None: no metrics endpoint; 0: a free port (logged). metrics.host None: the host of the
    # listener named by metrics.listener, else the broker's host.
    metrics_port: int | None = None
    metrics_host: str | None = None
    metrics_listener: str | None = None
    # Tests only: a slow coordinator replay at start-up (see its Kafka-style name above).
    test_coordinator_load_batch_delay_ms: int = 0

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)

    def validate(self) -> BrokerConfig:
        """Check every setting against Kafka's documented range; ConfigError names the first
        bad one, its value and what is allowed."""
        for f in fields(self):
            bound = _RANGES.get(f.name)
            value = getattr(self, f.name)
            if bound is None or value is None:
                continue
            problem = bound.problem(value)
            if problem is not None:
                raise ConfigError(f"{setting_name(f.name)} {problem}")
        if not 0.0 <= self.log_cleaner_min_cleanable_ratio <= 1.0:
            raise ConfigError(  # Kafka: between(0, 1)
                "log.cleaner.min.cleanable.ratio must be between 0 and 1, "
                f"got {self.log_cleaner_min_cleanable_ratio}"
            )
        # Empty (KIP-1161): the logs neither delete nor compact; an empty entry is refused.
        policy = [p.strip() for p in self.log_cleanup_policy.split(",")]
        if self.log_cleanup_policy.strip() and any(p not in ("compact", "delete") for p in policy):
            raise ConfigError(
                f"log.cleanup.policy must be a list of compact and delete (or empty), "
                f"got {self.log_cleanup_policy!r}"
            )
        if self.log_message_timestamp_type not in ("CreateTime", "LogAppendTime"):
            raise ConfigError(
                "log.message.timestamp.type must be CreateTime or LogAppendTime, "
                f"got {self.log_message_timestamp_type!r}"
            )
        if self.compression_type not in (
            "producer",
            "uncompressed",
            "gzip",
            "snappy",
            "lz4",
            "zstd",
        ):
            raise ConfigError(
                "compression.type must be one of producer, uncompressed, gzip, snappy, lz4, "
                f"zstd, got {self.compression_type!r}"
            )
        if self.compression_gzip_level == 0:
            raise ConfigError("compression.gzip.level must be between 1 and 9 or -1, got 0")
        if not self.log_cleaner_io_max_bytes_per_second > 0:
            raise ConfigError(
                "log.cleaner.io.max.bytes.per.second must be positive, "
                f"got {self.log_cleaner_io_max_bytes_per_second}"
            )
        from samsa.coordinator.assignors import ASSIGNORS

        names = [a.strip() for a in self.group_consumer_assignors.split(",")]
        if not names or any(n not in ASSIGNORS for n in names):
            raise ConfigError(
                f"group.consumer.assignors must name assignors of {sorted(ASSIGNORS)}, "
                f"got {self.group_consumer_assignors!r}"
            )
        policies = ("bidirectional", "upgrade", "downgrade", "disabled")
        if self.group_consumer_migration_policy.lower() not in policies:
            raise ConfigError(  # Kafka's validator ignores case
                f"group.consumer.migration.policy must be one of {', '.join(policies)}, "
                f"got {self.group_consumer_migration_policy!r}"
            )
        if 0 < self.queued_max_request_bytes < self.socket_request_max_bytes:
            raise ConfigError(  # as KafkaConfig requires
                f"queued.max.request.bytes must be -1 (no limit) or at least "
                f"socket.request.max.bytes ({self.socket_request_max_bytes}), "
                f"got {self.queued_max_request_bytes}"
            )
        from samsa.broker.authorizer import AclError, authorizer_enabled, parse_super_users
        from samsa.broker.listeners import check_security_config

        check_security_config(self)
        if self.metrics_listener is not None:
            from samsa.broker.metrics import metrics_bind_host

            metrics_bind_host(self)  # names a listener, with metrics.port and no metrics.host
        try:
            authorizer_enabled(self.authorizer_class_name)
            parse_super_users(self.super_users)
        except AclError as exc:
            raise ConfigError(str(exc)) from None
        return self

    def with_overrides(self, **overrides: Any) -> BrokerConfig:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def with_properties(self, props: dict[str, str]) -> BrokerConfig:
        """Apply Kafka-named settings; unknown names are an error rather than ignored."""
        types = {f.name: f.type for f in fields(self)}
        values: dict[str, Any] = {}
        for key, raw in props.items():
            if key in ("log.retention.hours", "log.retention.minutes"):
                unit = 3_600_000 if key.endswith("hours") else 60_000
                values["log_retention_ms"] = _convert(key, raw, "int") * unit
                continue
            if key == "log.roll.hours":
                values["log_roll_ms"] = _convert(key, raw, "int") * 3_600_000
                continue
            if key.startswith(LISTENER_PREFIX):
                values.setdefault("listener_overrides", list(self.listener_overrides))
                values["listener_overrides"].append(_listener_override(key, raw, types))
                continue
            if key == "listeners":
                # The first listener's address is host/port: --host/--port override it.
                first = raw.split(",")[0].split("://")[-1]
                values["host"], values["port"] = parse_host_port(first)
            attr = _KAFKA_NAMES.get(key)
            if attr is None:
                raise ConfigError(f"unknown setting {key!r}")
            values[attr] = _convert(key, raw, str(types[attr]))
        if "listener_overrides" in values:
            values["listener_overrides"] = tuple(values["listener_overrides"])
        return replace(self, **values)


LISTENER_PREFIX = "listener.name."


def per_listener(key: str) -> bool:
    """Settings a listener may override: its TLS, SASL and re-authentication ones."""
    return key.startswith(("ssl.", "sasl.")) or key == "connections.max.reauth.ms"


def _listener_override(key: str, raw: str, types: dict[str, Any]) -> tuple[str, str, str]:
    """(LISTENER, setting, value) of ``listener.name.<listener>.<setting>``, checked."""
    listener, _, setting = key[len(LISTENER_PREFIX) :].partition(".")
    attr = _KAFKA_NAMES.get(setting)
    if not listener or attr is None or not per_listener(setting):
        raise ConfigError(
            f"{key}: expected listener.name.<listener>.<setting> with an ssl.*, sasl.* or "
            "connections.max.reauth.ms setting"
        )
    _convert(key, raw, str(types[attr]))  # the value is checked now, applied per listener
    return (listener.upper(), setting, raw)


def _convert(key: str, raw: str, type_name: str) -> Any:
    raw = raw.strip()
    if "Path" in type_name:
        dirs = [d.strip() for d in raw.split(",") if d.strip()]
        if len(dirs) != 1:
            raise ConfigError(f"{key}: exactly one data directory is supported, got {raw!r}")
        return Path(dirs[0])
    try:
        if "bool" in type_name:
            if raw.lower() not in ("true", "false"):
                raise ValueError(raw)
            return raw.lower() == "true"
        if "int" in type_name:
            # Java's parseInt/parseLong syntax: no '_' separators, no 0x prefix.
            if not _INTEGER.match(raw):
                raise ValueError(raw)
            return int(raw)
        if "float" in type_name:
            return float(raw)
    except ValueError:
        raise ConfigError(f"{key}: {raw!r} is not a valid {type_name}") from None
    return raw


_INTEGER = re.compile(r"^[+-]?[0-9]+$")


def parse_properties(text: str) -> dict[str, str]:
    props: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep < 0:
            raise ConfigError(f"line {lineno}: expected key=value, got {line!r}")
        props[line[:sep].strip()] = line[sep + 1 :].strip()
    return props


def load_config_file(path: Path) -> dict[str, str]:
    try:
        return parse_properties(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None


def parse_host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)
