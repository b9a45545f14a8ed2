"""A share consumer (KIP-932, Kafka's ``KafkaShareConsumer``): members of a share group share
the partitions, and each record is delivered to one member at a time, locked to it until it
acknowledges it or the lock expires.

The consumer heartbeats its share group (ShareGroupHeartbeat: member id of its own, epochs,
the partitions assigned), fetches from each assigned partition's leader in a share session
(ShareFetch: epoch 0 opens it, each request moves it on, -1 closes it) and hands out only the
records the broker says it acquired (AcquiredRecords), with their delivery counts.
Acknowledgements ride on the next ShareFetch, or go alone with :meth:`commit`
(ShareAcknowledge). In ``implicit`` mode (the default, as Kafka's) the records of a poll are
accepted by the next poll, commit or close; in ``explicit`` mode each must be acknowledged
(:meth:`acknowledge`) before the next poll. :meth:`close` acknowledges what is pending, closes
the sessions (the broker gives back what this member still holds) and leaves the group.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from samsa.client._cluster import KEY_GROUP, Cluster
from samsa.client._errors import KafkaError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import decode_records, iter_batches

ACCEPT, RELEASE, REJECT = 1, 2, 3
_SESSION_LOST = (ErrorCode.SHARE_SESSION_NOT_FOUND, ErrorCode.INVALID_SHARE_SESSION_EPOCH)
_REJOIN = (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH)

Tp = tuple[uuid.UUID, int]


@dataclass(frozen=True, slots=True)
class ShareConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    delivery_count: int


class AsyncShareConsumer:
    def __init__(
        self,
        bootstrap: str | list[str],
        group_id: str,
        *,
        client_id: str = "samsa",
        acknowledgement_mode: str = "implicit",
        max_records: int = 500,
        max_wait_ms: int = 500,
    ) -> None:
        if acknowledgement_mode not in ("implicit", "explicit"):
            raise ValueError("acknowledgement_mode is implicit or explicit")
        self.group_id = group_id
        self.explicit = acknowledgement_mode == "explicit"
        self.max_records = max_records
        self.max_wait_ms = max_wait_ms
        # As Kafka's share consumer: a random Uuid in its 22-character base64 form.
        self.member_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self.member_epoch = 0
        self._cluster = Cluster(bootstrap, client_id=client_id)
        self._topics: tuple[str, ...] = ()
        self._assignment: dict[uuid.UUID, frozenset[int]] = {}
        self._next_heartbeat = 0.0
        self._interval = 5.0
        self._sessions: dict[int, int] = {}  # broker -> the share-session epoch to send next
        self._acks: dict[Tp, list[tuple[int, int, int]]] = defaultdict(list)
        self._unacknowledged: dict[tuple[str, int, int], Tp] = {}  # the last poll's records

    @property
    def assignment(self) -> dict[uuid.UUID, frozenset[int]]:
        return dict(self._assignment)

    async def subscribe(self, topics: list[str]) -> None:
        self._topics = tuple(sorted(set(topics)))
        await self._heartbeat()

    # -- membership

    async def _heartbeat(self, epoch: int | None = None) -> None:
        send_epoch = self.member_epoch if epoch is None else epoch
        joining = send_epoch == 0

        def fields(v: int) -> dict[str, Any]:
            return {
                "group_id": self.group_id,
                "member_id": self.member_id,
                "member_epoch": send_epoch,
                "rack_id": None,
                "subscribed_topic_names": self._topics if joining else None,
            }

        k = ApiKey.SHARE_GROUP_HEARTBEAT
        resp, code = await self._cluster.coordinator_call(
            KEY_GROUP, self.group_id, k, (1, 1), "ShareGroupHeartbeatRequest", fields
        )
        if code in _REJOIN and epoch is None:
            self.member_epoch = 0  # as Kafka's: join again with the same member id
            return await self._heartbeat()
        if code:
            raise KafkaError(code, f"ShareGroupHeartbeat for {self.group_id!r}")
        self.member_epoch = resp.member_epoch
        self._interval = max(0.1, resp.heartbeat_interval.total_seconds())
        self._next_heartbeat = time.monotonic() + self._interval
        if resp.assignment is not None:
            self._assignment = {
                tp.topic_id: frozenset(tp.partitions) for tp in resp.assignment.topic_partitions
            }

    # -- acknowledgements

    def acknowledge(self, record: ShareConsumerRecord, kind: int = ACCEPT) -> None:
        """Accept, release or reject a record of the last poll (sent with the next poll,
        commit or close)."""
        tp = self._unacknowledged.pop((record.topic, record.partition, record.offset), None)
        if tp is None:
            raise ValueError("not a record of the last poll, or acknowledged already")
        self._acks[tp].append((record.offset, record.offset, kind))

    def _accept_the_rest(self) -> None:
        if self.explicit and self._unacknowledged:
            raise ValueError("explicit mode: acknowledge every record before polling again")
        for (_t, _p, offset), tp in self._unacknowledged.items():
            self._acks[tp].append((offset, offset, ACCEPT))
        self._unacknowledged.clear()

    def _batches(self, k: int, v: int, tp: Tp) -> tuple[Any, ...]:
        acks = self._acks.pop(tp, [])
        return tuple(
            make_request(
                k,
                v,
                "AcknowledgementBatch",
                first_offset=f,
                last_offset=last,
                acknowledge_types=(kind,),
            )
            for f, last, kind in acks
        )

    # -- fetching

    async def poll(self, timeout: float = 1.0) -> list[ShareConsumerRecord]:
        self._accept_the_rest()
        if self.member_epoch == 0 or time.monotonic() >= self._next_heartbeat:
            await self._heartbeat()
        names = {t.topic_id: name for name, t in self._cluster.topics.items()}
        if any(tid not in names for tid in self._assignment):
            await self._cluster.refresh(list(self._topics))
            names = {t.topic_id: name for name, t in self._cluster.topics.items()}
        by_node: dict[int, list[Tp]] = defaultdict(list)
        for tid, parts in self._assignment.items():
            for p in sorted(parts):
                node = self._cluster.leader(names.get(tid, ""), p) if tid in names else None
                if node is not None:
                    by_node[node].append((tid, p))
        for tp in list(self._acks):  # acknowledgements of partitions no longer assigned
            node = self._cluster.leader(names.get(tp[0], ""), tp[1])
            if node is not None and tp not in by_node[node]:
                by_node[node].append(tp)
        if not by_node:
            await asyncio.sleep(min(timeout, 0.1))
            return []
        wait_ms = min(self.max_wait_ms, int(timeout * 1000))
        results = await asyncio.gather(
            *(self._fetch(node, tps, names, wait_ms) for node, tps in by_node.items())
        )
        return [r for records in results for r in records]

    async def _fetch(
        self, node: int, tps: list[Tp], names: dict[uuid.UUID, str], wait_ms: int
    ) -> list[ShareConsumerRecord]:
        k, epoch = ApiKey.SHARE_FETCH, self._sessions.get(node, 0)
        topics: dict[uuid.UUID, list[Any]] = defaultdict(list)
        for tp in tps:
            batches = self._batches(k, 1, tp)
            part = make_request(k, 1, "FetchPartition", partition_index=tp[1],
                                acknowledgement_batches=batches)  # fmt: skip
            topics[tp[0]].append(part)
        req = make_request(
            k, 1, "ShareFetchRequest", group_id=self.group_id, member_id=self.member_id,
            share_session_epoch=epoch, max_wait=wait_ms, min_bytes=1, max_bytes=50 << 20,
            max_records=self.max_records, batch_size=self.max_records,
            topics=tuple(make_request(k, 1, "FetchTopic", topic_id=tid, partitions=tuple(ps))
                         for tid, ps in topics.items()),
            forgotten_topics_data=(),
        )  # fmt: skip
        conn = await self._cluster.connection(node)
        resp = await conn.request(
            k, req, version=1, timeout=self._cluster.request_timeout + wait_ms / 1000
        )
        if resp.error_code in _SESSION_LOST:
            self._sessions[node] = 0  # a new session next time; those acks are lost
            return []
        if resp.error_code:
            raise KafkaError(int(resp.error_code), "ShareFetch")
        self._sessions[node] = 1 if epoch == 0 else epoch + 1
        out: list[ShareConsumerRecord] = []
        for topic in resp.responses:
            name = names.get(topic.topic_id, "")
            for part in topic.partitions:
                out += self._records(name, (topic.topic_id, part.partition_index), part)
        return out

    def _records(self, name: str, tp: Tp, part: Any) -> list[ShareConsumerRecord]:
        counts: dict[int, int] = {}
        for a in part.acquired_records:
            for offset in range(a.first_offset, a.last_offset + 1):
                counts[offset] = a.delivery_count
        out = []
        for batch in iter_batches(part.records or b""):
            if batch.is_control:
                continue
            for r in decode_records(batch):
                count = counts.pop(r.offset, None)
                if count is not None:
                    out.append(ShareConsumerRecord(name, tp[1], r.offset, r.timestamp, r.key,
                                                   r.value, r.headers, count))  # fmt: skip
                    self._unacknowledged[(name, tp[1], r.offset)] = tp
        # Acquired offsets with no record (compacted away, markers): gaps, as Kafka's client.
        for offset in sorted(counts):
            self._acks[tp].append((offset, offset, 0))
        return out

    # -- committing and closing

    async def commit(self) -> None:
        """Send the pending acknowledgements now (ShareAcknowledge)."""
        if not self.explicit:
            self._accept_the_rest()
        await self._acknowledge(final=False)

    async def _acknowledge(self, final: bool) -> None:
        k = ApiKey.SHARE_ACKNOWLEDGE
        names = {t.topic_id: name for name, t in self._cluster.topics.items()}
        by_node: dict[int, list[Tp]] = defaultdict(list)
        for tp in list(self._acks):
            node = self._cluster.leader(names.get(tp[0], ""), tp[1])
            if node is not None:
                by_node[node].append(tp)
        nodes = set(by_node) | (set(self._sessions) if final else set())
        for node in nodes:
            epoch = self._sessions.get(node, 0)
            if epoch == 0:
                continue  # no session there: nothing acquired to acknowledge
            topics: dict[uuid.UUID, list[Any]] = defaultdict(list)
            for tp in by_node.get(node, []):
                batches = self._batches(k, 1, tp)
                part = make_request(k, 1, "AcknowledgePartition", partition_index=tp[1],
                                    acknowledgement_batches=batches)  # fmt: skip
                topics[tp[0]].append(part)
            req = make_request(
                k, 1, "ShareAcknowledgeRequest", group_id=self.group_id,
                member_id=self.member_id, share_session_epoch=-1 if final else epoch,
                topics=tuple(make_request(k, 1, "AcknowledgeTopic", topic_id=tid,
                                          partitions=tuple(ps)) for tid, ps in topics.items()),
            )  # fmt: skip
            conn = await self._cluster.connection(node)
            resp = await conn.request(k, req, version=1)
            if resp.error_code in _SESSION_LOST:
                self._sessions[node] = 0
            elif resp.error_code:
                raise KafkaError(int(resp.error_code), "ShareAcknowledge")
            else:
                self._sessions[node] = 0 if final else epoch + 1

    async def close(self) -> None:
        try:
            if not self.explicit:
                self._accept_the_rest()
            await self._acknowledge(final=True)
            if self.member_epoch > 0:
                await self._heartbeat(epoch=-1)
        finally:
            await self._cluster.close()
