"""InitProducerId. Without a transactional id: a fresh producer id, epoch 0, every time.

KIP-360 callers (v3+) that send their current producer id and epoch to bump it get a new
producer id as well, which is what Kafka does for a non-transactional producer. With a
transactional id the transaction coordinator answers (epoch bump, fencing, KIP-360), and v6
may ask for a two-phase-commit producer (KIP-939, rule 37): ``enable_2pc`` only where
``transaction.two.phase.commit.enable`` is true, ``keep_prepared_txn`` to take over the
prepared transaction instead of aborting it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized, authorized_any
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.INIT_PRODUCER_ID
log = logging.getLogger("samsa.init_producer_id")


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    ongoing = (-1, -1)
    try:
        # Rule 33: Write on the TransactionalId, and TwoPhaseCommit on it too for a 2PC
        # producer (KIP-939); without one, IdempotentWrite on the cluster or Write on some
        # topic (Kafka 3+).
        txn_id = request.transactional_id
        if txn_id is not None and not (
            authorized(broker, ctx, Op.WRITE, Res.TRANSACTIONAL_ID, txn_id)
            and (
                not _wants_2pc(request)
                or authorized(broker, ctx, Op.TWO_PHASE_COMMIT, Res.TRANSACTIONAL_ID, txn_id)
            )
        ):
            code, pid, epoch = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1
        elif txn_id is None and not (
            authorized(broker, ctx, Op.IDEMPOTENT_WRITE, Res.CLUSTER, CLUSTER_NAME)
            or authorized_any(broker, ctx, Op.WRITE, Res.TOPIC)
        ):
            code, pid, epoch = ErrorCode.CLUSTER_AUTHORIZATION_FAILED, -1, -1
        elif _wants_2pc(request) and not broker.config.transaction_two_phase_commit_enable:
            # Kafka's answer when the broker does not allow 2PC transactions.
            code, pid, epoch = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1
        elif txn_id is not None:
            code, pid, epoch, ongoing = _transactional(broker, request)
        elif _wants_2pc(request) or getattr(request, "keep_prepared_txn", False):
            code, pid, epoch = ErrorCode.INVALID_REQUEST, -1, -1  # 2PC needs a transactional id
        else:
            code, pid, epoch = ErrorCode.NONE, broker.producer_ids.allocate(), 0
        if code == ErrorCode.NONE and broker.authorizer is not None:
            broker.authorizer.bind_producer(pid, ctx.principal)
    except OSError as exc:
        # A block of producer ids could not be reserved durably (nothing else changed).
        # Clients retry COORDINATOR_NOT_AVAILABLE; KAFKA_STORAGE_ERROR would be fatal here.
        log.error("cannot reserve producer ids: %s", exc)
        code, pid, epoch = ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, -1
    return encode_response(
        K,
        v,
        make(
            K,
            v,
            "InitProducerIdResponse",
            throttle_time=0,
            error_code=code,
            producer_id=pid,
            producer_epoch=epoch,
            **(
                {"ongoing_txn_producer_id": ongoing[0], "ongoing_txn_producer_epoch": ongoing[1]}
                if v >= 6
                else {}
            ),
        ),
    )


def _wants_2pc(request: Any) -> bool:
    return bool(getattr(request, "enable2_pc", False))


def _transactional(broker: Broker, request: Any) -> tuple[ErrorCode, int, int, tuple[int, int]]:
    pid = getattr(request, "producer_id", -1)
    epoch = getattr(request, "producer_epoch", -1)
    if (pid == -1) != (epoch == -1):
        return ErrorCode.INVALID_REQUEST, -1, -1, (-1, -1)
    timeout_ms = int(request.transaction_timeout.total_seconds() * 1000)
    result = broker.transactions.init_producer_id(
        request.transactional_id,
        timeout_ms,
        None if pid == -1 else (pid, epoch),
        enable_2pc=_wants_2pc(request),
        keep_prepared=bool(getattr(request, "keep_prepared_txn", False)),
    )
    ongoing = (result.ongoing_producer_id, result.ongoing_producer_epoch)
    return result.error, result.producer_id, result.producer_epoch, ongoing
