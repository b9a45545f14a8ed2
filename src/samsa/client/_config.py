"""confluent-kafka-style configuration: dotted Kafka property names, typed on read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from samsa.client import _security
from samsa.client._errors import ConfigError
from samsa.protocol.records import Compression

COMMON: dict[str, Any] = {
    "bootstrap.servers": "127.0.0.1:9092",
    "client.id": "samsa",
    "request.timeout.ms": 30_000,
    "retry.backoff.ms": 100,
    "retry.backoff.max.ms": 1_000,
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 1_000,
    "socket.connection.setup.timeout.ms": 10_000,
    "metadata.max.age.ms": 300_000,
    **_security.DEFAULTS,  # security.protocol, sasl.*, ssl.*
}

PRODUCER: dict[str, Any] = {
    **COMMON,
    # Java's producer lets the broker auto-create a topic it sends to (if the broker allows).
    "allow.auto.create.topics": True,
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 5,
    "batch.size": 16_384,
    "max.request.size": 1_048_576,  # also bounds a produce_batch() batch (see there)
    "compression.type": "none",
    "delivery.timeout.ms": 120_000,
    "max.in.flight.requests.per.connection": 5,
    "max.block.ms": 60_000,
    "buffer.memory": 32 * 1024 * 1024,
    "transactional.id": None,
    "transaction.timeout.ms": 60_000,
    # KIP-939: two-phase-commit transactions (no timeout; resume_transaction takes the
    # prepared one over with InitProducerId keep_prepared_txn). The broker must allow it.
    "transaction.two.phase.commit.enable": False,
    "partitioner": "murmur2_random",
}

CONSUMER: dict[str, Any] = {
    **COMMON,
    "group.id": None,
    "group.instance.id": None,
    "auto.offset.reset": "latest",
    "enable.auto.commit": True,
    "auto.commit.interval.ms": 5_000,
    "isolation.level": "read_uncommitted",
    "fetch.min.bytes": 1,
    "fetch.max.bytes": 52_428_800,
    "fetch.max.wait.ms": 500,
    "max.partition.fetch.bytes": 1_048_576,
    "max.poll.records": 500,
    "session.timeout.ms": 45_000,
    "heartbeat.interval.ms": 3_000,
    "max.poll.interval.ms": 300_000,
    "rebalance.timeout.ms": None,
    "partition.assignment.strategy": "range",
    # "consumer": KIP-848's protocol (ConsumerGroupHeartbeat; the broker assigns, with
    # group.remote.assignor if set); "classic": JoinGroup/SyncGroup.
    "group.protocol": "classic",
    "group.remote.assignor": None,
    "check.crcs": True,
    # how long a blocking call (commit, committed, list_offsets, ...) retries
    "default.api.timeout.ms": 60_000,
}

ADMIN: dict[str, Any] = {**COMMON, "default.api.timeout.ms": 60_000}

_ALIASES = {
    "compression.codec": "compression.type",
    "queue.buffering.max.ms": "linger.ms",
    "message.timeout.ms": "delivery.timeout.ms",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "request.required.acks": "acks",
    **_security.ALIASES,
}

CODECS = {
    "none": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


class Config:
    """Validated settings; ``explicit`` holds the keys the user set."""

    def __init__(self, defaults: Mapping[str, Any], given: Mapping[str, Any] | None) -> None:
        self.values = dict(defaults)
        self.explicit: set[str] = set()
        for key, value in (given or {}).items():
            name = _ALIASES.get(key, key.replace("_", "."))
            if name not in defaults:
                raise ConfigError(f"unknown configuration property {key!r}")
            self.values[name] = value
            self.explicit.add(name)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def int(self, key: str) -> int:
        try:
            return int(self.values[key])
        except (TypeError, ValueError):
            raise ConfigError(f"{key} must be an integer, got {self.values[key]!r}") from None

    def bool(self, key: str) -> bool:
        v = self.values[key]
        if isinstance(v, str):
            if v.lower() in ("true", "1", "yes"):
                return True
            if v.lower() in ("false", "0", "no"):
                return False
            raise ConfigError(f"{key} must be true or false, got {v!r}")
        return bool(v)

    def seconds(self, key: str) -> float:
        return self.int(key) / 1000.0

    def acks(self) -> int:
        v = str(self.values["acks"]).lower()
        if v in ("all", "-1"):
            return -1
        if v in ("0", "1"):
            return int(v)
        raise ConfigError(f"acks must be all, -1, 0 or 1, got {v!r}")

    def codec(self) -> int:
        v = str(self.values["compression.type"]).lower()
        if v not in CODECS:
            raise ConfigError(f"compression.type must be one of {sorted(CODECS)}, got {v!r}")
        return CODECS[v]
