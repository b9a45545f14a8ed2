"""Group membership: one interface, two protocols (classic, and KIP-848's consumer protocol).

The consumer asks a :class:`Membership` only whether it must (re)join, to join, to leave, to
rejoin after a refused commit, and which generation and member id its commits carry. Each
implementation has a state enum and checks every transition against its table, so a state
reached by an unforeseen path fails loudly instead of silently fetching for partitions the
member may no longer own.

Classic (:class:`ClassicMembership`): FindCoordinator, JoinGroup (with the consumer
protocol's subscription), the leader computes the assignment with the range or round-robin
assignor and sends it with SyncGroup, every member decodes its own. A background task
heartbeats; REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION mark the
membership for a rejoin, done in the next poll after committing (auto-commit) what was
consumed; rejoining gives the partitions up first (eager protocol, as Java's onJoinPrepare),
so nothing fetched for them is handed out once another member may own them. Leaving sends
LeaveGroup.

Consumer protocol (:class:`ConsumerProtocolMembership`, ``group.protocol=consumer``): the
broker assigns. The member heartbeats with ConsumerGroupHeartbeat (its member epoch,
subscription and owned partitions) and applies each assignment it is sent: it commits
(auto-commit) and drops the partitions taken away, takes the new ones, and reports what it
owns at once, so the coordinator can hand the dropped partitions on. A fenced member
(FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID) loses its partitions and rejoins with epoch 0;
leaving heartbeats with epoch -1 (-2 for a static member).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Protocol

from samsa.client._assignors import ASSIGNORS, assigned_partitions, encode_plan
from samsa.client._cluster import KEY_GROUP, Cluster
from samsa.client._config import Config
from samsa.client._errors import KafkaError
from samsa.client._subscription import SubscriptionState
from samsa.client._types import TopicPartition
from samsa.protocol.consumer_protocol import (
    PROTOCOL_TYPE,
    decode_subscription,
    encode_subscription,
)
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

log = logging.getLogger("samsa.client.consumer")

REJOIN_ERRORS = frozenset(
    {
        ErrorCode.REBALANCE_IN_PROGRESS,
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.ILLEGAL_GENERATION,
        ErrorCode.FENCED_INSTANCE_ID,
    }
)

# (partitions, keep their positions): replaces the consumer's assignment
Assign = Callable[[list[TopicPartition], bool], None]
# an auto-commit of these offsets (None: every position)
Commit = Callable[[dict[TopicPartition, int] | None], Awaitable[None]]


class GroupChannel:
    """Requests to a group's coordinator, found (again) as needed."""

    def __init__(self, cluster: Cluster, group_id: str) -> None:
        self.cluster = cluster
        self.group_id = group_id

    async def request(
        self,
        api_key: int,
        lo: int,
        hi: int,
        cls: str,
        *,
        codes: Any = None,
        retry_codes: frozenset[int] = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}),
        timeout: float | None = None,
        request_timeout: float | None = None,
        **fields: Any,
    ) -> Any:
        """A request to the group coordinator, resent after a lost connection, a moved
        coordinator (found again) or a ``retry_codes`` answer until ``timeout`` (default
        ``default.api.timeout.ms``). Fields may be callables of the negotiated version
        (nested entities are built for it). Other answers are the caller's to handle."""

        def build(v: int) -> dict[str, Any]:
            return {k: f(v) if callable(f) else f for k, f in fields.items()}

        resp, _ = await self.cluster.coordinator_call(
            KEY_GROUP,
            self.group_id,
            api_key,
            (lo, hi),
            cls,
            build,
            codes or (lambda r: (int(getattr(r, "error_code", 0)),)),
            retry_codes=retry_codes,
            timeout=timeout,
            request_timeout=request_timeout,
        )
        return resp


class Membership(Protocol):
    group: GroupChannel
    generation: int  # the generation (classic) or member epoch (consumer protocol); -1: none
    member_id: str
    commit_version: int  # the highest OffsetCommit version its fields allow

    @property
    def needs_join(self) -> bool:
        """Whether the next poll must (re)join before fetching (when subscribed)."""

    def request_rejoin(self) -> None:
        """A commit was refused (the group rebalanced), or the subscription changed."""

    async def join(self) -> None: ...

    async def leave(self) -> None:
        """Leave the group (best effort); the member has no generation afterwards."""

    async def stop(self) -> None:
        """End the heartbeats (on close)."""


class _Member:
    """What both memberships share: collaborators, the state table, the heartbeat task."""

    TRANSITIONS: ClassVar[dict[Any, frozenset[Any]]]
    INITIAL: ClassVar[Any]

    def __init__(
        self,
        config: Config,
        group: GroupChannel,
        subscriptions: SubscriptionState,
        assign: Assign,
        auto_commit: Commit | None,
    ) -> None:
        self.config = config
        self.group = group
        self.cluster = group.cluster
        self.subscriptions = subscriptions
        self._assign = assign
        self._auto_commit = auto_commit
        self.state: Any = self.INITIAL
        self.generation = -1
        self.closed = False
        self.heartbeat_task: asyncio.Task[None] | None = None
        self.request_timeout = config.seconds("request.timeout.ms")
        self.api_timeout = config.seconds("default.api.timeout.ms")

    def _to(self, state: enum.Enum) -> None:
        if state is not self.state:
            if state not in self.TRANSITIONS[self.state]:
                raise RuntimeError(f"group member: no transition {self.state.name} -> {state.name}")
            self.state = state

    def _start_heartbeats(self, beat: Callable[[], Awaitable[None]]) -> None:
        if self.heartbeat_task is None or self.heartbeat_task.done():
            self.heartbeat_task = asyncio.get_running_loop().create_task(beat())

    def _leave_timeout(self) -> float:
        # best effort, as Java's: without it the member expires after its session
        return min(self.api_timeout, self.request_timeout, 5.0)

    async def stop(self) -> None:
        self.closed = True
        if self.heartbeat_task is not None:
            self.heartbeat_task.cancel()
            with contextlib.suppress(BaseException):
                await self.heartbeat_task


class ClassicState(enum.Enum):
    UNJOINED = "unjoined"  # no generation: joins when subscribed
    COMPLETING_REBALANCE = "completing"  # JoinGroup answered (a generation), SyncGroup next
    STABLE = "stable"  # the generation's partitions assigned; heartbeating
    REJOIN_NEEDED = "rejoin"  # a generation still held (commits carry it), rejoin next poll


_C = ClassicState


class ClassicMembership(_Member):
    commit_version = 8
    TRANSITIONS: ClassVar[dict[Any, frozenset[Any]]] = {
        _C.UNJOINED: frozenset({_C.COMPLETING_REBALANCE}),
        _C.COMPLETING_REBALANCE: frozenset({_C.STABLE, _C.REJOIN_NEEDED, _C.UNJOINED}),
        _C.STABLE: frozenset({_C.REJOIN_NEEDED, _C.UNJOINED}),
        _C.REJOIN_NEEDED: frozenset({_C.COMPLETING_REBALANCE, _C.STABLE, _C.UNJOINED}),
    }

    INITIAL = _C.UNJOINED

    def __init__(self, *args: Any, assignor: str) -> None:
        super().__init__(*args)
        self.assignor = assignor
        self.retry_backoff = self.config.seconds("retry.backoff.ms")
        self.member_id = ""

    @property
    def needs_join(self) -> bool:
        return self.state is not _C.STABLE

    def request_rejoin(self) -> None:
        if self.state in (_C.STABLE, _C.COMPLETING_REBALANCE):
            self._to(_C.REJOIN_NEEDED)

    def _unjoined(self) -> None:
        self.member_id = ""
        self.generation = -1
        self._to(_C.UNJOINED)

    async def join(self) -> None:
        if self._auto_commit and self.generation >= 0 and self.subscriptions.partitions():
            with contextlib.suppress(KafkaError):
                await self._auto_commit(None)
        # Eager protocol (Java's onJoinPrepare): rejoining gives every partition up, and what
        # was fetched for them is dropped whatever this join's outcome. A SyncGroup refused
        # (the group rebalanced again) can come after the others' succeeded: they own those
        # partitions now, and handing out the records fetched ahead would deliver them twice.
        self._assign([], True)
        await self.cluster.refresh(self.subscriptions.topics)
        resp = await self._join_group()
        self.member_id = resp.member_id
        self.generation = int(resp.generation_id)
        self._to(_C.COMPLETING_REBALANCE)
        assignments: list[tuple[str, bytes]] = []
        if resp.leader == resp.member_id:
            assignments = await self._plan(resp.members, resp.protocol_name or self.assignor)
        resp2 = await self._sync_group(resp.protocol_name, assignments)
        code = int(resp2.error_code)
        if code in REJOIN_ERRORS:
            if code != ErrorCode.REBALANCE_IN_PROGRESS:
                self.member_id = ""
            self.request_rejoin()
            return
        if code:
            raise KafkaError(code, "SyncGroup")
        tps = assigned_partitions(resp2.assignment)
        log.info("group %s generation %d: assigned %s", self.group.group_id, self.generation, tps)
        self._assign(tps, False)  # a new generation: positions from the committed offsets
        if self.state is not _C.UNJOINED:  # (a heartbeat answered "fenced" meanwhile)
            self._to(_C.STABLE)
        self._start_heartbeats(self._heartbeat)

    async def _join_group(self) -> Any:
        c = self.config
        rebalance = c["rebalance.timeout.ms"] or c.int("max.poll.interval.ms")
        while True:
            resp = await self.group.request(
                ApiKey.JOIN_GROUP,
                0,
                7,
                "JoinGroupRequest",
                # the coordinator holds a JoinGroup until the rebalance completes (Java)
                request_timeout=max(self.request_timeout, int(rebalance) / 1000 + 5),
                group_id=self.group.group_id,
                session_timeout=c.int("session.timeout.ms"),
                rebalance_timeout=int(rebalance),
                member_id=self.member_id,
                group_instance_id=c["group.instance.id"],
                protocol_type=PROTOCOL_TYPE,
                protocols=lambda v: (
                    make_request(
                        ApiKey.JOIN_GROUP,
                        v,
                        "JoinGroupRequestProtocol",
                        name=self.assignor,
                        metadata=encode_subscription(
                            self.subscriptions.topics,
                            self.subscriptions.partitions(),
                            generation=self.generation,
                        ),
                    ),
                ),
                reason=None,
            )
            code = int(resp.error_code)
            if code == ErrorCode.MEMBER_ID_REQUIRED:
                self.member_id = resp.member_id
                continue
            if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
                self.member_id = ""
                continue
            if code == ErrorCode.REBALANCE_IN_PROGRESS:
                await asyncio.sleep(self.retry_backoff)
                continue
            if code:
                raise KafkaError(code, "JoinGroup")
            return resp

    async def _plan(self, members: Any, assignor: str) -> list[tuple[str, bytes]]:
        """The leader's assignment of every member's subscription."""
        subs = {m.member_id: list(decode_subscription(m.metadata).topics) for m in members}
        topics = sorted({t for ts in subs.values() for t in ts})
        await self.cluster.refresh(topics)
        counts = {t: self.cluster.partition_count(t) or 0 for t in topics}
        return encode_plan(ASSIGNORS[assignor](subs, counts))

    async def _sync_group(self, protocol: str, assignments: list[tuple[str, bytes]]) -> Any:
        return await self.group.request(
            ApiKey.SYNC_GROUP,
            0,
            5,
            "SyncGroupRequest",
            group_id=self.group.group_id,
            generation_id=self.generation,
            member_id=self.member_id,
            group_instance_id=self.config["group.instance.id"],
            protocol_type=PROTOCOL_TYPE,
            protocol_name=protocol,
            assignments=lambda v: tuple(
                make_request(
                    ApiKey.SYNC_GROUP, v, "SyncGroupRequestAssignment", member_id=m, assignment=a
                )
                for m, a in assignments
            ),
        )

    async def _heartbeat(self) -> None:
        interval = self.config.seconds("heartbeat.interval.ms")
        while not self.closed and self.state is not _C.UNJOINED:
            await asyncio.sleep(interval)
            if self.state is not _C.STABLE:
                continue
            try:
                resp = await self.group.request(
                    ApiKey.HEARTBEAT,
                    0,
                    4,
                    "HeartbeatRequest",
                    timeout=interval,  # retried within the interval, then the next one
                    group_id=self.group.group_id,
                    generation_id=self.generation,
                    member_id=self.member_id,
                    group_instance_id=self.config["group.instance.id"],
                )
            except KafkaError as exc:
                log.debug("heartbeat: %s", exc)
                continue
            except Exception:  # a bug must not end heartbeats silently (the member expires)
                log.exception("heartbeat failed")
                continue
            code = int(resp.error_code)
            if code == ErrorCode.REBALANCE_IN_PROGRESS:
                self.request_rejoin()
            elif code in REJOIN_ERRORS:
                self._unjoined()
            elif code:
                log.warning("heartbeat: %s", KafkaError(code))

    async def leave(self) -> None:
        if self.generation < 0 or not self.member_id:
            return
        if self.heartbeat_task is not None:
            self.heartbeat_task.cancel()
        with contextlib.suppress(KafkaError, OSError):
            await self.group.request(
                ApiKey.LEAVE_GROUP,
                0,
                4,
                "LeaveGroupRequest",
                timeout=self._leave_timeout(),
                group_id=self.group.group_id,
                member_id=self.member_id,
                members=lambda v: (
                    (
                        make_request(
                            ApiKey.LEAVE_GROUP,
                            v,
                            "MemberIdentity",
                            member_id=self.member_id,
                            group_instance_id=self.config["group.instance.id"],
                        ),
                    )
                    if v >= 3
                    else ()
                ),
            )
        self._unjoined()


class ConsumerState(enum.Enum):
    UNJOINED = "unjoined"  # no member epoch (new, left or fenced): joins with epoch 0
    JOINING = "joining"  # an epoch received; the join completes
    STABLE = "stable"  # heartbeating, applying each assignment sent
    REJOIN_NEEDED = "rejoin"  # a commit was refused: heartbeat at once in the next poll


_K = ConsumerState


class ConsumerProtocolMembership(_Member):
    commit_version = 9  # v9: the member epoch of a KIP-848 group
    TRANSITIONS: ClassVar[dict[Any, frozenset[Any]]] = {
        _K.UNJOINED: frozenset({_K.JOINING}),
        _K.JOINING: frozenset({_K.STABLE, _K.UNJOINED}),
        _K.STABLE: frozenset({_K.REJOIN_NEEDED, _K.UNJOINED}),
        _K.REJOIN_NEEDED: frozenset({_K.STABLE, _K.UNJOINED}),
    }

    INITIAL = _K.UNJOINED

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        # KIP-848 members name themselves (ConsumerGroupHeartbeat v1), once per consumer.
        self.member_id = str(uuid.uuid4())
        self.heartbeat_interval = self.config.seconds("heartbeat.interval.ms")

    @property
    def needs_join(self) -> bool:
        return self.state is not _K.STABLE

    def request_rejoin(self) -> None:
        if self.state is _K.STABLE:
            self._to(_K.REJOIN_NEEDED)

    async def _consumer_heartbeat(self, epoch: int, timeout: float | None = None) -> Any:
        """One ConsumerGroupHeartbeat with everything (subscription, owned partitions)."""
        c = self.config
        ids = {t: info.topic_id for t, info in self.cluster.topics.items()}
        owned: dict[Any, list[int]] = {}
        for tp in self.subscriptions.partitions():
            if ids.get(tp.topic) is not None:
                owned.setdefault(ids[tp.topic], []).append(tp.partition)
        rebalance = c["rebalance.timeout.ms"] or c.int("max.poll.interval.ms")
        joining_or_leaving = epoch <= 0
        return await self.group.request(
            ApiKey.CONSUMER_GROUP_HEARTBEAT,
            0,
            1,
            "ConsumerGroupHeartbeatRequest",
            timeout=timeout,
            group_id=self.group.group_id,
            member_id=self.member_id,
            member_epoch=epoch,
            instance_id=c["group.instance.id"],
            rack_id=None,
            rebalance_timeout=int(rebalance),
            subscribed_topic_names=tuple(self.subscriptions.topics) if epoch >= 0 else None,
            subscribed_topic_regex=None,
            server_assignor=c["group.remote.assignor"],
            topic_partitions=lambda v: (
                None
                if epoch < 0
                else tuple(
                    make_request(
                        ApiKey.CONSUMER_GROUP_HEARTBEAT,
                        v,
                        "TopicPartitions",
                        topic_id=tid,
                        partitions=tuple(sorted(ps)),
                    )
                    for tid, ps in ([] if joining_or_leaving else owned.items())
                )
            ),
        )

    async def join(self) -> None:
        await self.cluster.refresh(self.subscriptions.topics)
        if self.generation < 0:
            self._assign([], True)  # a new incarnation owns nothing
        resp = await self._consumer_heartbeat(0 if self.generation < 0 else self.generation)
        await self._on_consumer_heartbeat(resp)
        if int(resp.error_code):
            raise KafkaError(int(resp.error_code), f"ConsumerGroupHeartbeat: {resp.error_message}")
        self._to(_K.STABLE)
        self._start_heartbeats(self._heartbeat)

    async def _on_consumer_heartbeat(self, resp: Any) -> bool:
        """Apply a heartbeat's answer; True if the assignment changed."""
        code = int(resp.error_code)
        if code in (ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID):
            # Fenced: the partitions are someone else's now; nothing of them is committed.
            log.info("group %s: fenced (%s), rejoining", self.group.group_id, ErrorCode(code).name)
            self.generation = -1
            self._to(_K.UNJOINED)
            self._assign([], True)
            return True
        if code:
            return False
        self.generation = int(resp.member_epoch)
        if self.state is _K.UNJOINED:
            self._to(_K.JOINING)
        self.heartbeat_interval = resp.heartbeat_interval.total_seconds()
        if resp.assignment is None:
            return False
        return await self._reconcile(resp.assignment.topic_partitions)

    async def _reconcile(self, assigned: Any) -> bool:
        """Take the assignment sent (topic ids); True if it differs from the one owned."""
        names = {info.topic_id: t for t, info in self.cluster.topics.items()}
        if any(tp.topic_id not in names for tp in assigned):
            await self.cluster.refresh(self.subscriptions.topics)
            names = {info.topic_id: t for t, info in self.cluster.topics.items()}
        new = [
            TopicPartition(names[tp.topic_id], p)
            for tp in assigned
            if tp.topic_id in names
            for p in tp.partitions
        ]
        owned = self.subscriptions.partitions()
        if set(new) == set(owned):
            return False
        revoked = [tp for tp in owned if tp not in set(new)]
        if revoked and self._auto_commit:
            positions = {tp: self.subscriptions.position(tp) for tp in revoked}
            with contextlib.suppress(KafkaError, OSError):
                await self._auto_commit({tp: p for tp, p in positions.items() if p is not None})
        log.info("group %s epoch %d: assigned %s", self.group.group_id, self.generation, new)
        self._assign(new, True)
        return True

    async def _heartbeat(self) -> None:
        changed = False
        while not self.closed and self.generation >= 0:
            if not changed:  # after a change, tell the coordinator what is owned at once
                await asyncio.sleep(self.heartbeat_interval)
            if self.generation < 0 or self.closed:
                return
            try:
                resp = await self._consumer_heartbeat(
                    self.generation, timeout=self.heartbeat_interval
                )
                changed = await self._on_consumer_heartbeat(resp)
            except KafkaError as exc:
                log.debug("heartbeat: %s", exc)
                changed = False
            except Exception:  # a bug must not end heartbeats silently (the member expires)
                log.exception("heartbeat failed")
                changed = False

    async def leave(self) -> None:
        if self.generation < 0:
            return
        if self.heartbeat_task is not None:
            self.heartbeat_task.cancel()
        epoch = -2 if self.config["group.instance.id"] is not None else -1
        with contextlib.suppress(KafkaError, OSError):
            await self._consumer_heartbeat(epoch, timeout=self._leave_timeout())
        self.generation = -1
        self._to(_K.UNJOINED)
