"""The dynamic broker configs Apache Kafka 4.4 accepts at run time that samsa has no use for
(SASL/Kerberos, SSL engine, thread pools, tiered storage, ...): names, types, Kafka's defaults
and whether Kafka takes them only per broker (not at the cluster-wide default level).

samsa keeps such a key when it is set (validated by its type, as Kafka's ConfigDef parses it)
and reports it in DescribeConfigs, so a tool that sets it sees what Kafka would show; nothing
in samsa reads it. Keys samsa does use are in :mod:`samsa.broker.config`; the SSL keystore and
truststore keys Kafka takes only with a listener prefix are not here (refused as in Kafka).
"""

from __future__ import annotations

from dataclasses import dataclass

from samsa.broker.topic_config import ConfigType

B, S, INT, H, L, D, LI, C, P = (
    ConfigType.BOOLEAN,
    ConfigType.STRING,
    ConfigType.INT,
    ConfigType.SHORT,
    ConfigType.LONG,
    ConfigType.DOUBLE,
    ConfigType.LIST,
    ConfigType.CLASS,
    ConfigType.PASSWORD,
)


@dataclass(frozen=True, slots=True)
class KafkaKey:
    config_type: ConfigType
    default: str | None
    per_broker: bool = False  # Kafka refuses it at the cluster-wide default level


_PER_BROKER = True

KAFKA_ONLY_DYNAMIC: dict[str, KafkaKey] = {
    "background.threads": KafkaKey(INT, "10"),
    "config.providers": KafkaKey(LI, ""),
    "cordoned.log.dirs": KafkaKey(LI, "", _PER_BROKER),
    "errors.deadletterqueue.auto.create.topics.enable": KafkaKey(B, "false"),
    "errors.deadletterqueue.topic.name.prefix": KafkaKey(S, "dlq."),
    "follower.fetch.last.tiered.offset.enable": KafkaKey(B, "false"),
    "group.consumer.assignment.interval.ms": KafkaKey(INT, "1000"),
    "group.coordinator.cached.buffer.max.bytes": KafkaKey(INT, "1048588"),
    "group.share.assignment.interval.ms": KafkaKey(INT, "1000"),
    "group.streams.assignment.interval.ms": KafkaKey(INT, "1000"),
    "log.cleaner.io.buffer.load.factor": KafkaKey(D, "0.9"),
    "log.cleaner.io.buffer.size": KafkaKey(INT, "524288"),
    "log.cleaner.threads": KafkaKey(INT, "1"),
    "log.local.retention.bytes": KafkaKey(L, "-2"),
    "log.local.retention.ms": KafkaKey(L, "-2"),
    "log.remote.copy.lag.bytes": KafkaKey(L, "-1"),
    "log.remote.copy.lag.ms": KafkaKey(L, "0"),
    "max.connection.creation.rate": KafkaKey(INT, "2147483647"),
    "max.connections.per.ip.overrides": KafkaKey(S, ""),
    "max.decompressed.message.bytes": KafkaKey(INT, "2147483639"),
    "metric.reporters": KafkaKey(LI, "org.apache.kafka.common.metrics.JmxReporter"),
    "num.io.threads": KafkaKey(INT, "8"),
    "num.network.threads": KafkaKey(INT, "3"),
    "num.recovery.threads.per.data.dir": KafkaKey(INT, "2"),
    "num.replica.fetchers": KafkaKey(INT, "1"),
    "principal.builder.class": KafkaKey(
        C,
        "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder",
        _PER_BROKER,
    ),
    "remote.fetch.max.wait.ms": KafkaKey(INT, "500"),
    "remote.list.offsets.request.timeout.ms": KafkaKey(L, "30000"),
    "remote.log.index.file.cache.total.size.bytes": KafkaKey(L, "1073741824"),
    "remote.log.manager.copier.thread.pool.size": KafkaKey(INT, "10"),
    "remote.log.manager.copy.max.bytes.per.second": KafkaKey(L, "9223372036854775807"),
    "remote.log.manager.expiration.thread.pool.size": KafkaKey(INT, "10"),
    "remote.log.manager.fetch.max.bytes.per.second": KafkaKey(L, "9223372036854775807"),
    "remote.log.manager.follower.thread.pool.size": KafkaKey(INT, "2"),
    "remote.log.reader.threads": KafkaKey(INT, "10"),
    "sasl.jaas.config": KafkaKey(P, None, _PER_BROKER),
    "sasl.kerberos.kinit.cmd": KafkaKey(S, "/usr/bin/kinit", _PER_BROKER),
    "sasl.kerberos.min.time.before.relogin": KafkaKey(L, "60000", _PER_BROKER),
    "sasl.kerberos.principal.to.local.rules": KafkaKey(LI, "DEFAULT", _PER_BROKER),
    "sasl.kerberos.service.name": KafkaKey(S, None, _PER_BROKER),
    "sasl.kerberos.ticket.renew.jitter": KafkaKey(D, "0.05", _PER_BROKER),
    "sasl.kerberos.ticket.renew.window.factor": KafkaKey(D, "0.8", _PER_BROKER),
    "sasl.login.refresh.buffer.seconds": KafkaKey(H, "300", _PER_BROKER),
    "sasl.login.refresh.min.period.seconds": KafkaKey(H, "60", _PER_BROKER),
    "sasl.login.refresh.window.factor": KafkaKey(D, "0.8", _PER_BROKER),
    "sasl.login.refresh.window.jitter": KafkaKey(D, "0.05", _PER_BROKER),
    "sasl.mechanism.inter.broker.protocol": KafkaKey(S, "GSSAPI", _PER_BROKER),
    "share.coordinator.cached.buffer.max.bytes": KafkaKey(INT, "1048588"),
    "ssl.cipher.suites": KafkaKey(LI, "", _PER_BROKER),
    "ssl.enabled.protocols": KafkaKey(LI, "TLSv1.2,TLSv1.3", _PER_BROKER),
    "ssl.endpoint.identification.algorithm": KafkaKey(S, "https", _PER_BROKER),
    "ssl.engine.factory.class": KafkaKey(C, None, _PER_BROKER),
    "ssl.keymanager.algorithm": KafkaKey(S, "SunX509", _PER_BROKER),
    "ssl.protocol": KafkaKey(S, "TLSv1.3", _PER_BROKER),
    "ssl.provider": KafkaKey(S, None, _PER_BROKER),
    "ssl.secure.random.implementation": KafkaKey(S, None, _PER_BROKER),
    "ssl.trustmanager.algorithm": KafkaKey(S, "PKIX", _PER_BROKER),
    "transaction.partition.verification.enable": KafkaKey(B, "true"),
}

# Kafka 4.4's types of the broker settings that are no topic config's synonym, as its
# DescribeConfigs reports them (config_type).
BROKER_SETTING_TYPES: dict[str, ConfigType] = {
    "advertised.listeners": ConfigType.LIST,
    "authorizer.class.name": ConfigType.STRING,
    "auto.create.topics.enable": ConfigType.BOOLEAN,
    "broker.id": ConfigType.INT,
    "connections.max.idle.ms": ConfigType.LONG,
    "connections.max.reauth.ms": ConfigType.LONG,
    "default.replication.factor": ConfigType.INT,
    "group.consumer.assignors": ConfigType.LIST,
    "group.consumer.heartbeat.interval.ms": ConfigType.INT,
    "group.consumer.max.size": ConfigType.INT,
    "group.consumer.migration.policy": ConfigType.STRING,
    "group.consumer.session.timeout.ms": ConfigType.INT,
    "group.initial.rebalance.delay.ms": ConfigType.INT,
    "group.max.session.timeout.ms": ConfigType.INT,
    "group.max.size": ConfigType.INT,
    "group.min.session.timeout.ms": ConfigType.INT,
    "listener.security.protocol.map": ConfigType.STRING,
    "listeners": ConfigType.LIST,
    "log.cleaner.backoff.ms": ConfigType.LONG,
    "log.cleaner.dedupe.buffer.size": ConfigType.LONG,
    "log.cleaner.enable": ConfigType.BOOLEAN,
    "log.cleaner.io.max.bytes.per.second": ConfigType.DOUBLE,
    "log.dir": ConfigType.LIST,
    "log.dirs": ConfigType.LIST,
    "log.flush.scheduler.interval.ms": ConfigType.LONG,
    "log.retention.check.interval.ms": ConfigType.LONG,
    "max.connections": ConfigType.INT,
    "max.connections.per.ip": ConfigType.INT,
    "max.incremental.fetch.session.cache.slots": ConfigType.INT,
    "node.id": ConfigType.INT,
    "num.partitions": ConfigType.INT,
    "offsets.retention.check.interval.ms": ConfigType.LONG,
    "offsets.retention.minutes": ConfigType.INT,
    "offsets.topic.num.partitions": ConfigType.INT,
    "offsets.topic.segment.bytes": ConfigType.INT,
    "producer.id.expiration.ms": ConfigType.INT,
    "queued.max.request.bytes": ConfigType.LONG,
    "sasl.enabled.mechanisms": ConfigType.LIST,
    "socket.request.max.bytes": ConfigType.INT,
    "ssl.client.auth": ConfigType.STRING,
    "ssl.key.password": ConfigType.PASSWORD,
    "ssl.keystore.certificate.chain": ConfigType.PASSWORD,
    "ssl.keystore.key": ConfigType.PASSWORD,
    "ssl.keystore.location": ConfigType.STRING,
    "ssl.keystore.type": ConfigType.STRING,
    "ssl.principal.mapping.rules": ConfigType.STRING,
    "ssl.truststore.location": ConfigType.STRING,
    "ssl.truststore.type": ConfigType.STRING,
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": ConfigType.INT,
    "transaction.max.timeout.ms": ConfigType.INT,
    "transaction.remove.expired.transaction.cleanup.interval.ms": ConfigType.INT,
    "transaction.state.log.num.partitions": ConfigType.INT,
    "transaction.state.log.segment.bytes": ConfigType.INT,
    "transaction.two.phase.commit.enable": ConfigType.BOOLEAN,
    "transactional.id.expiration.ms": ConfigType.INT,
}

_INT_BOUNDS = {
    ConfigType.SHORT: (-(1 << 15), (1 << 15) - 1),
    ConfigType.INT: (-(1 << 31), (1 << 31) - 1),
    ConfigType.LONG: (-(1 << 63), (1 << 63) - 1),
}


def type_problem(name: str, value: str, config_type: ConfigType) -> str | None:
    """Why ``value`` does not parse as ``config_type`` (Kafka's ConfigDef words), or None."""
    text = value.strip()
    if config_type in _INT_BOUNDS:
        lo, hi = _INT_BOUNDS[config_type]
        try:
            ok = lo <= int(text) <= hi
        except ValueError:
            ok = False
        if not ok:
            return f"Invalid value {value} for configuration {name}: Not a number of type " + (
                config_type.name
            )
    elif config_type == ConfigType.DOUBLE:
        try:
            float(text)
        except ValueError:
            return f"Invalid value {value} for configuration {name}: Not a number of type DOUBLE"
    elif config_type == ConfigType.BOOLEAN and text.lower() not in ("true", "false"):
        return (
            f"Invalid value {value} for configuration {name}: Expected value to be either true "
            "or false"
        )
    return None
