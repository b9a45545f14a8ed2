"""The admin client's producer and transaction calls: DescribeProducers to
partition leaders, ListTransactions to every broker, DescribeTransactions to each id's
coordinator."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

from samsa.client._cluster import KEY_TRANSACTION, Cluster
from samsa.client._errors import KafkaError
from samsa.client._retry import INVALID_METADATA, RetryLater
from samsa.client._transactions import REFIND, RETRY, TxnChannel
from samsa.client._types import (
    ProducerInfo,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request


class TransactionAdmin:
    """Producer and transaction calls of :class:`AsyncAdmin`, on its cluster."""

    def __init__(self, cluster: Cluster, api_timeout: float) -> None:
        self.cluster = cluster
        self.api_timeout = api_timeout

    async def describe_producers(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, list[ProducerInfo]]:
        """DescribeProducers, sent to each partition's leader (found again when stale)."""
        tps = list(dict.fromkeys(TopicPartition(*tp) for tp in partitions))
        out: dict[TopicPartition, list[ProducerInfo]] = {}

        names = sorted({tp.topic for tp in tps})
        await self.cluster.refresh(names)
        for tp in tps:
            info = self.cluster.topics.get(tp.topic)
            if info is None or tp.partition not in info.partitions:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp.topic}-{tp.partition}")

        async def attempt() -> None:
            by_node: dict[int, list[TopicPartition]] = {}
            for tp in tps:
                if tp in out:
                    continue
                leader = self.cluster.leader(*tp)
                if leader is None:
                    await self.cluster.refresh(names)
                    raise KafkaError(ErrorCode.LEADER_NOT_AVAILABLE, f"{tp.topic}-{tp.partition}")
                by_node.setdefault(leader, []).append(tp)
            stale = 0
            for node, group in by_node.items():
                topics: dict[str, list[int]] = {}
                for tp in group:
                    topics.setdefault(tp.topic, []).append(tp.partition)
                resp = await self.cluster.send(
                    node,
                    ApiKey.DESCRIBE_PRODUCERS,
                    (0, 0),
                    "DescribeProducersRequest",
                    lambda v, topics=topics: {
                        "topics": tuple(
                            make_request(
                                ApiKey.DESCRIBE_PRODUCERS,
                                v,
                                "TopicRequest",
                                name=t,
                                partition_indexes=tuple(ps),
                            )
                            for t, ps in topics.items()
                        )
                    },
                )
                for t in resp.topics:
                    for p in t.partitions:
                        code = int(p.error_code)
                        if code in INVALID_METADATA:
                            stale = code
                            continue
                        if code:
                            raise KafkaError(code, f"{t.name}-{p.partition_index}")
                        out[TopicPartition(t.name, int(p.partition_index))] = [
                            ProducerInfo(
                                int(s.producer_id),
                                int(s.producer_epoch),
                                int(s.last_sequence),
                                int(s.last_timestamp),
                                int(s.coordinator_epoch),
                                int(s.current_txn_start_offset),
                            )
                            for s in p.active_producers
                        ]
            if stale:
                await self.cluster.refresh(names)
                raise RetryLater(stale, "DescribeProducers")

        await self.cluster.retry(attempt, what="DescribeProducers")
        return out

    async def abort_transaction(
        self, tp: TopicPartition, producer_id: int, producer_epoch: int, coordinator_epoch: int
    ) -> None:
        """Write an ABORT marker for ``producer_id``'s open transaction on ``tp``, as a
        coordinator would (Java's ``Admin.abortTransaction``, KIP-664): WriteTxnMarkers to
        the partition's leader, which closes a hanging transaction whose coordinator forgot
        it. An older epoch than the partition's producer state is refused by the leader."""

        def fields(v: int, topics: dict[str, list[int]]) -> dict[str, Any]:
            marker = make_request(
                ApiKey.WRITE_TXN_MARKERS, v, "WritableTxnMarker", producer_id=producer_id,
                producer_epoch=producer_epoch, transaction_result=False,
                coordinator_epoch=coordinator_epoch,
                topics=tuple(
                    make_request(ApiKey.WRITE_TXN_MARKERS, v, "WritableTxnMarkerTopic", name=t,
                                 partition_indexes=tuple(ps))
                    for t, ps in topics.items()
                ),
            )  # fmt: skip
            return {"markers": (marker,)}

        def results(resp: Any) -> Iterable[tuple[TopicPartition, int, Any]]:
            for m in resp.markers:
                for t in m.topics:
                    for p in t.partitions:
                        yield (
                            TopicPartition(t.name, int(p.partition_index)),
                            int(p.error_code),
                            None,
                        )

        await self.cluster.leader_call(
            [TopicPartition(*tp)], ApiKey.WRITE_TXN_MARKERS, (1, 1), "WriteTxnMarkersRequest",
            fields, results, timeout=self.api_timeout,
        )  # fmt: skip

    async def list_transactions(
        self, *, states: Iterable[str] = (), producer_ids: Iterable[int] = ()
    ) -> list[TransactionListing]:
        """ListTransactions on every broker (each lists the ids it coordinates)."""
        state_filters, pid_filters = tuple(states), tuple(producer_ids)

        async def call(node: int) -> list[TransactionListing]:
            resp = await self.cluster.send(
                node,
                ApiKey.LIST_TRANSACTIONS,
                (0, 1),
                "ListTransactionsRequest",
                lambda v: {
                    "state_filters": state_filters,
                    "producer_id_filters": pid_filters,
                    "duration_filter": -1,
                },
            )
            if resp.error_code:
                raise KafkaError(int(resp.error_code), "ListTransactions")
            return [
                TransactionListing(t.transactional_id, int(t.producer_id), t.transaction_state)
                for t in resp.transaction_states
            ]

        found = await self.cluster.each_broker("ListTransactions", call)
        return sorted((t for ts in found for t in ts), key=lambda t: t.transactional_id)

    async def describe_transactions(
        self, transactional_ids: Iterable[str]
    ) -> dict[str, TransactionDescription]:
        """DescribeTransactions, sent to each id's transaction coordinator; an unknown id
        is described with ``error`` TRANSACTIONAL_ID_NOT_FOUND."""
        channel = TxnChannel(self.cluster, timeout=self.api_timeout)
        out: dict[str, TransactionDescription] = {}
        for tid in transactional_ids:
            resp, _ = await channel.call(
                KEY_TRANSACTION,
                tid,
                ApiKey.DESCRIBE_TRANSACTIONS,
                (0, 0),
                "DescribeTransactionsRequest",
                lambda v, tid=tid: {"transactional_ids": (tid,)},
                # a per-id error (TRANSACTIONAL_ID_NOT_FOUND) is reported in the result
                lambda r: [
                    int(t.error_code)
                    for t in r.transaction_states
                    if t.error_code in RETRY or t.error_code in REFIND
                ],
            )
            for t in resp.transaction_states:
                out[t.transactional_id] = TransactionDescription(
                    t.transactional_id,
                    t.transaction_state,
                    int(t.producer_id),
                    int(t.producer_epoch),
                    _millis(t.transaction_timeout),
                    _millis(t.transaction_start_time),
                    tuple(TopicPartition(d.topic, int(p)) for d in t.topics for p in d.partitions),
                    int(t.error_code),
                )
        return out


def _millis(value: Any) -> int:
    """kio decodes durations as timedelta and timestamps as datetime; -1 means unset."""
    if value is None:
        return -1
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return int(value)
