"""CreateTopics: one partition directory per partition; replication factor must be 1, and a
manual replica assignment may name only this broker (checked as Kafka's controller does)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.broker.topics import TopicError, topic_log_config, validate_topic_name
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.CREATE_TOPICS
_ZERO = uuid.UUID(int=0)


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    results = []
    seen: set[str] = set()
    for t in request.topics:
        if not (  # rule 33: Create on the cluster, or else on the topic
            authorized(broker, ctx, Op.CREATE, Res.CLUSTER, CLUSTER_NAME)
            or authorized(broker, ctx, Op.CREATE, Res.TOPIC, t.name)
        ):
            code, message = ErrorCode.TOPIC_AUTHORIZATION_FAILED, "not authorized to Create"
        else:
            code, message = _create(broker, t, request.validate_only, t.name in seen)
        seen.add(t.name)
        topic = broker.topics.topics.get(t.name)
        ok = code == ErrorCode.NONE
        n = (len(topic.partitions) if topic else _partitions(broker, t)) if ok else -1
        given = {c.name: c.value for c in t.configs or () if c.value is not None}
        results.append(
            make(
                K,
                v,
                "CreatableTopicResult",
                name=t.name,
                topic_id=_topic_id(topic, ok),
                error_code=code,
                error_message=message,
                topic_config_error_code=0,
                num_partitions=n,
                replication_factor=1 if n > 0 else -1,
                configs=_configs(broker, v, given) if ok else (),
            )
        )
    return encode_response(
        K, v, make(K, v, "CreateTopicsResponse", throttle_time=0, topics=tuple(results))
    )


def _topic_id(topic: Any, ok: bool) -> uuid.UUID:
    """The created topic's id; validate_only answers a fresh id as Kafka's controller does
    (the one it would have used), a refusal the zero id."""
    if not ok:
        return _ZERO
    return topic.topic_id if topic is not None else uuid.uuid4()


def _partitions(broker: Broker, t: Any) -> int:
    if t.assignments:
        return len(t.assignments)
    return int(t.num_partitions if t.num_partitions != -1 else broker.config.num_partitions)


def _manual_partitions(node_id: int, t: Any) -> int:
    """The partition count of a manual assignment, checked in the order and words of Kafka's
    ReplicationControlManager (the counts must be -1; each list non-empty, of registered
    brokers, each once, all of one length; partitions 0..n-1); only this broker is
    registered."""
    if t.replication_factor != -1:
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            "A manual partition assignment was specified, but replication factor was not set "
            "to -1.",
        )
    if t.num_partitions != -1:
        raise TopicError(
            ErrorCode.INVALID_REQUEST,
            "A manual partition assignment was specified, but numPartitions was not set to -1.",
        )
    seen: set[int] = set()
    size: int | None = None
    for a in t.assignments:
        if a.partition_index in seen:
            raise _bad_assignment(
                f"Found multiple manual partition assignments for partition {a.partition_index}"
            )
        seen.add(a.partition_index)
        if not a.broker_ids:
            raise _bad_assignment("The manual partition assignment includes an empty replica list.")
        previous = None
        for b in sorted(a.broker_ids):
            if b != node_id:
                raise _bad_assignment(
                    f"The manual partition assignment includes broker {b}, but no such broker "
                    "is registered."
                )
            if b == previous:
                raise _bad_assignment(
                    f"The manual partition assignment includes the broker {b} more than once."
                )
            previous = b
        if size is not None and size != len(a.broker_ids):
            raise _bad_assignment(
                "The manual partition assignment includes a partition with "
                f"{len(a.broker_ids)} replica(s), but this is not consistent with previous "
                f"partitions, which have {size} replica(s)."
            )
        size = len(a.broker_ids)
    if seen != set(range(len(seen))):
        raise _bad_assignment("partitions should be a consecutive 0-based integer sequence")
    return len(seen)


def _bad_assignment(message: str) -> TopicError:
    return TopicError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, message)


def _configs(broker: Broker, v: int, given: dict[str, str]) -> tuple[Any, ...]:
    """The new topic's configs with their sources (v5+), as DescribeConfigs shows them."""
    if v < 5:
        return ()  # the field does not exist before v5
    return tuple(
        make(
            K,
            v,
            "CreatableTopicConfigs",
            name=d.name,
            value=d.value,
            read_only=d.read_only,
            config_source=int(d.source),
            is_sensitive=d.sensitive,
        )
        for d in broker.describe_topic(given)
    )


def _create(
    broker: Broker, t: Any, validate_only: bool, repeated: bool
) -> tuple[ErrorCode, str | None]:
    if repeated:
        return ErrorCode.INVALID_REQUEST, "topic named twice in one request"
    rf = t.replication_factor
    if not t.assignments and (rf == 0 or rf < -1):
        return (
            ErrorCode.INVALID_REPLICATION_FACTOR,
            "Replication factor must be larger than 0, or -1 to use the default value.",
        )
    if not t.assignments and rf > 1:  # Kafka's words, for its one registered broker
        return (
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"Unable to replicate the partition {rf} time(s): The target replication factor "
            f"of {rf} cannot be reached because only 1 broker(s) are registered or some "
            "brokers have all their log directories cordoned.",
        )
    n = _partitions(broker, t)
    try:
        validate_topic_name(t.name)
        if n < 1 and not t.assignments:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS, f"number of partitions must be >= 1, got {n}"
            )
        if t.name in broker.topics.topics:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{t.name}' already exists.")
        configs = {c.name: c.value for c in t.configs or () if c.value is not None}
        topic_log_config(broker.log_config, t.name, configs)  # INVALID_CONFIG, also if validating
        if t.assignments:
            n = _manual_partitions(broker.config.broker_id, t)
        if not validate_only:
            broker.create_topic(t.name, n, configs)
    except TopicError as exc:
        return exc.code, str(exc)
    return ErrorCode.NONE, None
