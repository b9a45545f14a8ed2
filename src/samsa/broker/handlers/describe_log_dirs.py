"""DescribeLogDirs: the broker's log directory, its partitions' sizes and its disk space.

samsa has one log directory, the data directory. As Kafka's broker: Describe on the cluster
is needed (else 31, CLUSTER_AUTHORIZATION_FAILED, and no directory); ``topics`` null means
every partition (internal topics included), otherwise the partitions named that exist; a
topic none of whose named partitions exists is left out; offset lag is 0 (no future replica);
total and usable bytes (v4) come from the file system, and a directory that cannot be read
answers 56 (KAFKA_STORAGE_ERROR).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from samsa.broker.authorizer import CLUSTER_NAME
from samsa.broker.handlers._base import Body, Op, RequestContext, Res, authorized
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, encode_response, make

if TYPE_CHECKING:
    from samsa.broker.broker import Broker

K = ApiKey.DESCRIBE_LOG_DIRS


def handle(broker: Broker, ctx: RequestContext, request: Any) -> Body:
    v = ctx.version
    if not authorized(broker, ctx, Op.DESCRIBE, Res.CLUSTER, CLUSTER_NAME):
        return _response(v, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ())
    wanted: dict[str, set[int]] | None = None
    if request.topics is not None:
        wanted = {}
        for t in request.topics:
            wanted.setdefault(t.topic, set()).update(t.partitions)
    log_dir = str(broker.data_dir.resolve())
    try:
        st = os.statvfs(log_dir)
    except OSError:
        result = make(K, v, "DescribeLogDirsResult", error_code=ErrorCode.KAFKA_STORAGE_ERROR,
                      log_dir=log_dir, topics=())  # fmt: skip
        return _response(v, ErrorCode.NONE, (result,))
    topics = []
    for name, topic in sorted(broker.topics.topics.items()):
        asked = wanted.get(name, set()) if wanted is not None else None
        parts = tuple(
            make(
                K,
                v,
                "DescribeLogDirsPartition",
                partition_index=p.index,
                partition_size=p.log.size,
                offset_lag=0,
                is_future_key=False,
            )
            for p in topic.partitions
            if asked is None or p.index in asked
        )
        if parts:
            topics.append(make(K, v, "DescribeLogDirsTopic", name=name, partitions=parts))
    result = make(
        K,
        v,
        "DescribeLogDirsResult",
        error_code=ErrorCode.NONE,
        log_dir=log_dir,
        topics=tuple(topics),
        total_bytes=st.f_blocks * st.f_frsize,
        usable_bytes=st.f_bavail * st.f_frsize,
        is_cordoned=False,  # v5 (KIP-1066): samsa's one log directory always takes partitions
    )
    return _response(v, ErrorCode.NONE, (result,))


def _response(v: int, error: ErrorCode, results: tuple[Any, ...]) -> Body:
    return encode_response(
        K,
        v,
        make(K, v, "DescribeLogDirsResponse", throttle_time=0, error_code=error, results=results),
    )
