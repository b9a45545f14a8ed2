"""Client exceptions. Broker error codes become :class:`KafkaError` with Kafka's name."""

from __future__ import annotations

from typing import Any

from samsa.protocol.errors import ErrorCode

# Errors after which an idempotent or transactional producer cannot go on (rule 21).
FATAL_PRODUCER_ERRORS = frozenset(
    {
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
        ErrorCode.TRANSACTION_COORDINATOR_FENCED,
    }
)


class KafkaError(Exception):
    """An error reported by a broker (``code`` is Kafka's error code) or by the client."""

    def __init__(self, code: int, message: str = "") -> None:
        self.code = int(code)
        try:
            self.name = ErrorCode(self.code).name
        except ValueError:
            self.name = f"ERROR_{self.code}"
        super().__init__(f"{self.name} ({self.code})" + (f": {message}" if message else ""))

    @property
    def retriable(self) -> bool:
        try:
            return ErrorCode(self.code).retriable
        except ValueError:
            return False


class KafkaConnectionError(KafkaError):
    """The connection to a broker failed or was lost; outcome of in-flight requests unknown."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.NETWORK_EXCEPTION, message)

    @property
    def retriable(self) -> bool:
        return True


class BootstrapError(KafkaConnectionError):
    """No bootstrap server could ever be reached for ``socket.connection.setup.timeout.ms``:
    most likely a wrong address, so it is not retried further (a cluster once reached is
    retried until the call's own timeout)."""

    @property
    def retriable(self) -> bool:
        return False


class KafkaTimeoutError(KafkaError):
    """A request or a delivery did not complete in time."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.REQUEST_TIMED_OUT, message)


class BufferExhaustedError(KafkaTimeoutError):
    """``buffer.memory`` stayed full for ``max.block.ms``: the producer holds as many
    records as it may and the broker does not take them fast enough (Kafka's
    BufferExhaustedException). Nothing was queued; the record can be produced again."""

    def __init__(self, buffer_memory: int, max_block: float, what: str = "") -> None:
        super().__init__(
            what
            or f"buffer.memory ({buffer_memory} bytes) still full after max.block.ms "
            f"({max_block * 1000:.0f} ms): records are produced faster than the broker "
            "takes them"
        )


class ProducerFencedError(KafkaError):
    """Fatal: another producer with the same identity took over."""


class AbortableTransactionError(KafkaError):
    """The current transaction cannot commit (a record or offset commit failed, or the
    coordinator lost track of it): call ``abort_transaction()``, then go on with a new one.
    ``code`` is the error that caused it."""


class TransactionAbortedError(KafkaError):
    """A record was dropped because its transaction was aborted before it was sent."""

    def __init__(self, message: str = "transaction aborted") -> None:
        super().__init__(ErrorCode.UNKNOWN_SERVER_ERROR, message)


class TransactionStateError(RuntimeError):
    """A transactional call that the producer's current transaction state does not allow
    (for instance ``commit_transaction()`` without ``begin_transaction()``)."""


class ConfigError(ValueError):
    """An unknown or invalid configuration property."""


class ClosedError(RuntimeError):
    """The client was closed."""


class CorruptRecordError(KafkaError):
    """A fetched batch failed its CRC-32C check (Java's ``CorruptRecordException`` as the
    consumer reports it). Not retriable: fetching again returns the same bytes. The consumer
    hands out the records before the batch first; it raises this while its position is at
    ``offset``, until the application seeks past it. ``records`` are the good records that
    preceded the batch in the fetched data."""

    def __init__(
        self, message: str, topic: str = "", partition: int = -1, offset: int = -1
    ) -> None:
        super().__init__(ErrorCode.CORRUPT_MESSAGE, message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.records: list[Any] = []

    @property
    def retriable(self) -> bool:
        return False


class LogTruncationError(KafkaError):
    """The log was truncated below the consumer's position (a leader elected uncleanly, or
    one that lost writes it had not replicated), found by validating the position with the
    new leader (KIP-320), and ``auto.offset.reset`` is ``none`` (Java's
    ``LogTruncationException``, an OFFSET_OUT_OF_RANGE). ``divergent_offsets`` holds, per
    partition, the first offset known to diverge (None: the leader knows nothing of the
    position's epoch); seek there, or elsewhere, to go on. Until then poll raises it again."""

    def __init__(self, truncations: list[Any]) -> None:
        self.truncations = truncations
        self.divergent_offsets: dict[Any, int | None] = {
            t.tp: None if t.divergent is None else t.divergent.offset for t in truncations
        }
        what = ", ".join(
            f"{t.tp.topic}-{t.tp.partition} at {t.position.offset} (epoch "
            f"{t.position.leader_epoch}): "
            + ("epoch unknown to the leader" if t.divergent is None else
               f"diverges from {t.divergent.offset}")
            for t in truncations
        )  # fmt: skip
        super().__init__(ErrorCode.OFFSET_OUT_OF_RANGE, f"log truncated: {what}")

    @property
    def retriable(self) -> bool:
        return False
