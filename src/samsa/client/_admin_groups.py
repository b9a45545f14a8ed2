"""The admin client's group calls: listing, describing (KIP-848 groups by
ConsumerGroupDescribe, classic ones by DescribeGroups, as Java's AdminClient) and reading a
group's committed offsets."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from samsa.client._assignors import assigned_partitions
from samsa.client._cluster import KEY_GROUP, Cluster
from samsa.client._errors import KafkaError
from samsa.client._types import (
    TopicPartition,
)
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"  # "consumer": a KIP-848 consumer-protocol group


@dataclass(frozen=True, slots=True)
class GroupMember:
    member_id: str
    client_id: str
    client_host: str
    assignment: tuple[TopicPartition, ...]
    instance_id: str | None = None
    # consumer (KIP-848) groups only: the member's epoch and the assignment it is moving to
    member_epoch: int = -1
    target_assignment: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str  # classic: the chosen assignor; consumer: the server-side assignor
    members: tuple[GroupMember, ...]
    error: int = 0
    group_type: str = "classic"
    group_epoch: int = -1  # consumer groups only
    assignment_epoch: int = -1  # consumer groups only


class GroupAdmin:
    """Group calls of :class:`AsyncAdmin`, on its cluster."""

    def __init__(self, cluster: Cluster, api_timeout: float) -> None:
        self.cluster = cluster
        self.api_timeout = api_timeout

    async def list_groups(self) -> list[GroupListing]:
        async def call(node: int) -> list[GroupListing]:
            resp = await self.cluster.send(
                node,
                ApiKey.LIST_GROUPS,
                (0, 5),
                "ListGroupsRequest",
                lambda v: {"states_filter": (), "types_filter": ()},
            )
            if resp.error_code:
                raise KafkaError(int(resp.error_code), "ListGroups")
            return [
                GroupListing(
                    g.group_id,
                    g.protocol_type,
                    getattr(g, "group_state", ""),
                    getattr(g, "group_type", "") or "classic",
                )
                for g in resp.groups
            ]

        found = await self.cluster.each_broker("ListGroups", call)
        return sorted((g for gs in found for g in gs), key=lambda g: g.group_id)

    async def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        """Each group as Java's AdminClient describes it: ConsumerGroupDescribe to the
        group's coordinator, and DescribeGroups for a group it does not know as a consumer
        (KIP-848) group (GROUP_ID_NOT_FOUND) or when the broker predates that API. An
        unknown group is described by DescribeGroups as Dead."""
        out: list[GroupDescription] = []
        for group_id in group_ids:
            found = await self._describe_consumer_group(group_id)
            out.append(found if found is not None else await self._describe_classic(group_id))
        return out

    async def _describe_consumer_group(self, group_id: str) -> GroupDescription | None:
        """ConsumerGroupDescribe; None when the group is not a consumer group."""
        try:
            resp, code = await self.cluster.coordinator_call(
                KEY_GROUP,
                group_id,
                ApiKey.CONSUMER_GROUP_DESCRIBE,
                (0, 0),
                "ConsumerGroupDescribeRequest",
                lambda v: {"group_ids": (group_id,), "include_authorized_operations": False},
                lambda r: [int(g.error_code) for g in r.groups],
            )
        except KafkaError as exc:
            if exc.code == ErrorCode.UNSUPPORTED_VERSION:
                return None
            raise
        g = resp.groups[0]
        if code == ErrorCode.GROUP_ID_NOT_FOUND:
            return None
        if code:
            raise KafkaError(code, g.error_message or f"describe group {group_id}")

        def tps(assignment: Any) -> tuple[TopicPartition, ...]:
            return tuple(
                sorted(
                    TopicPartition(t.topic_name, int(p))
                    for t in assignment.topic_partitions
                    for p in t.partitions
                )
            )

        members = tuple(
            GroupMember(
                m.member_id,
                m.client_id,
                m.client_host,
                tps(m.assignment),
                m.instance_id,
                int(m.member_epoch),
                tps(m.target_assignment),
            )
            for m in g.members
        )
        return GroupDescription(
            g.group_id,
            g.group_state,
            "consumer",
            g.assignor_name,
            members,
            0,
            "consumer",
            int(g.group_epoch),
            int(g.assignment_epoch),
        )

    async def _describe_classic(self, group_id: str) -> GroupDescription:
        resp, _ = await self.cluster.coordinator_call(
            KEY_GROUP,
            group_id,
            ApiKey.DESCRIBE_GROUPS,
            (0, 5),
            "DescribeGroupsRequest",
            lambda v: {"groups": (group_id,), "include_authorized_operations": False},
            lambda r: [int(g.error_code) for g in r.groups],
        )
        g = resp.groups[0]
        members = tuple(
            GroupMember(
                m.member_id,
                m.client_id,
                m.client_host,
                tuple(assigned_partitions(m.member_assignment))
                if g.protocol_type == "consumer"
                else (),
                getattr(m, "group_instance_id", None),
            )
            for m in g.members
        )
        return GroupDescription(
            g.group_id, g.group_state, g.protocol_type, g.protocol_data, members, int(g.error_code)
        )

    async def list_group_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        """The group's committed offsets (OffsetFetch for all its partitions), as Java's
        ``listConsumerGroupOffsets``; partitions without one are left out."""
        resp, _ = await self.cluster.coordinator_call(
            KEY_GROUP,
            group_id,
            ApiKey.OFFSET_FETCH,
            (1, 7),
            "OffsetFetchRequest",
            lambda v: {"group_id": group_id, "topics": None, "require_stable": False},
            lambda r: [int(r.error_code)] if hasattr(r, "error_code") else [],
        )
        out: dict[TopicPartition, int] = {}
        for t in resp.topics:
            for p in t.partitions:
                if int(p.error_code):
                    raise KafkaError(int(p.error_code), f"{t.name}-{p.partition_index}")
                if int(p.committed_offset) >= 0:
                    out[TopicPartition(t.name, int(p.partition_index))] = int(p.committed_offset)
        return out
