"""The asyncio admin client: topics, producers, groups, transactions, cluster."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from samsa.client._aconn import AsyncConnection
from samsa.client._cluster import Cluster
from samsa.client._config import ADMIN, Config
from samsa.client._errors import KafkaError
from samsa.client._transactions import KEY_TRANSACTION, REFIND, RETRY, TxnChannel
from samsa.client._types import (
    NewTopic,
    PartitionMetadata,
    ProducerInfo,
    TopicMetadata,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    client_id: str
    client_host: str
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple[GroupMember, ...]
    error: int = 0


class AsyncAdmin:
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = c = Config(ADMIN, config)
        self.request_timeout = c.seconds("request.timeout.ms")
        self.cluster = Cluster(
            c["bootstrap.servers"], client_id=c["client.id"], request_timeout=self.request_timeout
        )

    async def start(self) -> None:
        await self.cluster.refresh([])

    async def __aenter__(self) -> AsyncAdmin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.cluster.close()

    async def _controller(self) -> AsyncConnection:
        if self.cluster.controller_id < 0 or self.cluster.controller_id not in self.cluster.brokers:
            await self.cluster.refresh([])
        if self.cluster.controller_id in self.cluster.brokers:
            return await self.cluster.connection(self.cluster.controller_id)
        return await self.cluster.any_connection()

    # --- topics ----------------------------------------------------------------------------

    async def create_topics(
        self, topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> dict[str, KafkaError | None]:
        """CreateTopics; maps each name to None (created) or its error."""
        conn = await self._controller()
        v = conn.version(ApiKey.CREATE_TOPICS, 2, 7)
        req = make_request(
            ApiKey.CREATE_TOPICS,
            v,
            "CreateTopicsRequest",
            topics=tuple(
                make_request(
                    ApiKey.CREATE_TOPICS,
                    v,
                    "CreatableTopic",
                    name=t.name,
                    num_partitions=t.num_partitions,
                    replication_factor=t.replication_factor,
                    assignments=(),
                    configs=tuple(
                        make_request(
                            ApiKey.CREATE_TOPICS, v, "CreatableTopicConfig", name=k, value=val
                        )
                        for k, val in t.config.items()
                    ),
                )
                for t in topics
            ),
            timeout=int(self.request_timeout * 1000),
            validate_only=validate_only,
        )
        resp = await conn.request(ApiKey.CREATE_TOPICS, req, version=v)
        return {
            t.name: KafkaError(int(t.error_code), getattr(t, "error_message", None) or "")
            if t.error_code
            else None
            for t in resp.topics
        }

    async def create_topic(self, name: str, num_partitions: int = 1, **config: str) -> None:
        """Create one topic, raising its error (TOPIC_ALREADY_EXISTS included)."""
        err = (await self.create_topics([NewTopic(name, num_partitions, 1, config)]))[name]
        if err is not None:
            raise err
        await self._wait_for_topics([name], present=True)

    async def delete_topics(self, names: Iterable[str]) -> dict[str, KafkaError | None]:
        names = list(names)
        conn = await self._controller()
        v = conn.version(ApiKey.DELETE_TOPICS, 1, 6)
        req = make_request(
            ApiKey.DELETE_TOPICS,
            v,
            "DeleteTopicsRequest",
            topic_names=tuple(names),
            topics=tuple(
                make_request(ApiKey.DELETE_TOPICS, v, "DeleteTopicState", name=n, topic_id=None)
                for n in names
            ),
            timeout=int(self.request_timeout * 1000),
        )
        resp = await conn.request(ApiKey.DELETE_TOPICS, req, version=v)
        out = {
            r.name: KafkaError(int(r.error_code), getattr(r, "error_message", None) or "")
            if r.error_code
            else None
            for r in resp.responses
        }
        await self._wait_for_topics([n for n, e in out.items() if e is None], present=False)
        return out

    async def _wait_for_topics(self, names: list[str], *, present: bool) -> None:
        """Metadata may lag a create or delete a little; wait (bounded) until it agrees."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(self.request_timeout, 10.0)
        while names and loop.time() < deadline:
            await self.cluster.refresh(names)
            if all((n in self.cluster.topics) == present for n in names):
                return
            await asyncio.sleep(0.05)

    async def list_topics(self, *, internal: bool = False) -> list[str]:
        await self.cluster.refresh(None)
        return sorted(n for n, t in self.cluster.topics.items() if internal or not t.internal)

    async def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicMetadata]:
        wanted = None if names is None else list(names)
        await self.cluster.refresh(wanted)
        out: list[TopicMetadata] = []
        for name in sorted(wanted if wanted is not None else self.cluster.topics):
            info = self.cluster.topics.get(name)
            if info is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name)
            out.append(
                TopicMetadata(
                    name,
                    tuple(
                        PartitionMetadata(p.partition, p.leader, p.replicas, p.isr, p.error)
                        for _, p in sorted(info.partitions.items())
                    ),
                    str(info.topic_id) if info.topic_id else None,
                    info.internal,
                    info.error,
                )
            )
        return out

    # --- producers -------------------------------------------------------------------------

    async def describe_producers(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, list[ProducerInfo]]:
        tps = [TopicPartition(*tp) for tp in partitions]
        await self.cluster.refresh(sorted({tp.topic for tp in tps}))
        by_node: dict[int, list[TopicPartition]] = {}
        for tp in tps:
            leader = self.cluster.leader(*tp)
            if leader is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp.topic}-{tp.partition}")
            by_node.setdefault(leader, []).append(tp)
        out: dict[TopicPartition, list[ProducerInfo]] = {}
        for node, group in by_node.items():
            conn = await self.cluster.connection(node)
            v = conn.version(ApiKey.DESCRIBE_PRODUCERS, 0, 0)
            topics: dict[str, list[int]] = {}
            for tp in group:
                topics.setdefault(tp.topic, []).append(tp.partition)
            req = make_request(
                ApiKey.DESCRIBE_PRODUCERS,
                v,
                "DescribeProducersRequest",
                topics=tuple(
                    make_request(
                        ApiKey.DESCRIBE_PRODUCERS,
                        v,
                        "TopicRequest",
                        name=t,
                        partition_indexes=tuple(ps),
                    )
                    for t, ps in topics.items()
                ),
            )
            resp = await conn.request(ApiKey.DESCRIBE_PRODUCERS, req, version=v)
            for t in resp.topics:
                for p in t.partitions:
                    if p.error_code:
                        raise KafkaError(int(p.error_code), f"{t.name}-{p.partition_index}")
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
        return out

    # --- groups ----------------------------------------------------------------------------

    async def list_groups(self) -> list[GroupListing]:
        out: list[GroupListing] = []
        for node in list(self.cluster.brokers):
            conn = await self.cluster.connection(node)
            v = conn.version(ApiKey.LIST_GROUPS, 0, 4)
            req = make_request(ApiKey.LIST_GROUPS, v, "ListGroupsRequest", states_filter=())
            resp = await conn.request(ApiKey.LIST_GROUPS, req, version=v)
            if resp.error_code:
                raise KafkaError(int(resp.error_code), "ListGroups")
            out.extend(
                GroupListing(g.group_id, g.protocol_type, getattr(g, "group_state", ""))
                for g in resp.groups
            )
        return sorted(out, key=lambda g: g.group_id)

    async def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        from samsa.client._consumer import decode_assignment

        conn = await self.cluster.any_connection()
        v = conn.version(ApiKey.DESCRIBE_GROUPS, 0, 5)
        req = make_request(
            ApiKey.DESCRIBE_GROUPS,
            v,
            "DescribeGroupsRequest",
            groups=tuple(group_ids),
            include_authorized_operations=False,
        )
        resp = await conn.request(ApiKey.DESCRIBE_GROUPS, req, version=v)
        out: list[GroupDescription] = []
        for g in resp.groups:
            members = tuple(
                GroupMember(
                    m.member_id,
                    m.client_id,
                    m.client_host,
                    tuple(decode_assignment(m.member_assignment))
                    if g.protocol_type == "consumer"
                    else (),
                )
                for m in g.members
            )
            out.append(
                GroupDescription(
                    g.group_id,
                    g.group_state,
                    g.protocol_type,
                    g.protocol_data,
                    members,
                    int(g.error_code),
                )
            )
        return out

    # --- transactions ----------------------------------------------------------------------

    async def list_transactions(
        self, *, states: Iterable[str] = (), producer_ids: Iterable[int] = ()
    ) -> list[TransactionListing]:
        """ListTransactions on every broker (each lists the ids it coordinates)."""
        out: list[TransactionListing] = []
        await self.cluster.refresh([])
        for node in list(self.cluster.brokers):
            conn = await self.cluster.connection(node)
            v = conn.version(ApiKey.LIST_TRANSACTIONS, 0, 1)
            req = make_request(
                ApiKey.LIST_TRANSACTIONS,
                v,
                "ListTransactionsRequest",
                state_filters=tuple(states),
                producer_id_filters=tuple(producer_ids),
                duration_filter=-1,
            )
            resp = await conn.request(ApiKey.LIST_TRANSACTIONS, req, version=v)
            if resp.error_code:
                raise KafkaError(int(resp.error_code), "ListTransactions")
            out.extend(
                TransactionListing(t.transactional_id, int(t.producer_id), t.transaction_state)
                for t in resp.transaction_states
            )
        return sorted(out, key=lambda t: t.transactional_id)

    async def describe_transactions(
        self, transactional_ids: Iterable[str]
    ) -> dict[str, TransactionDescription]:
        """DescribeTransactions, sent to each id's transaction coordinator; an unknown id
        is described with ``error`` TRANSACTIONAL_ID_NOT_FOUND."""
        channel = TxnChannel(
            self.cluster,
            retry_backoff=self.config.seconds("retry.backoff.ms"),
            timeout=self.request_timeout,
        )
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

    async def describe_cluster(self) -> dict[str, Any]:
        await self.cluster.refresh([])
        return {
            "cluster_id": self.cluster.cluster_id,
            "controller_id": self.cluster.controller_id,
            "brokers": [
                {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
                for b in self.cluster.brokers.values()
            ],
        }


def _millis(value: Any) -> int:
    """kio decodes durations as timedelta and timestamps as datetime; -1 means unset."""
    if value is None:
        return -1
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    return int(value)
