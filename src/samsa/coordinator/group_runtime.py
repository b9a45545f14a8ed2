"""The group coordinator's runtime: :class:`~samsa.coordinator.runtime.CoordinatorRuntime`
over the ``GroupCoordinator`` shard, plus the futures of owed JoinGroup/SyncGroup responses.
KIP-848 heartbeats are answered at once; they are given the broker's topics (``topics``), which
consumer groups subscribe to by name or regex.

Each operation is one cycle of the generic runtime (write the outcome's records, replay them,
docs/semantics.md rule 26), then the shard's outbox is drained: ``Await`` creates a future for
an owed JoinGroup/SyncGroup response, ``Reply`` resolves one. A handler gets a value, or the
future to await.

The topic ``__consumer_offsets`` is created with ``offsets.topic.num.partitions`` partitions
the first time something is written to it (or FindCoordinator asks), not at every broker
start. TxnOffsetCommit is served here, as in Kafka's group coordinator: the transaction
coordinator only verifies the producer (``verify_txn``); the offsets are written as one
transactional batch and staged in the offset store until the marker, which reaches the store
through the marker listener registered at construction (rule 15).

Start-up: the broker serves while ``__consumer_offsets`` replays (the runtime's ``begin_load``,
then ``load_in_background``). Every operation enters through :meth:`_enter`, which answers
COORDINATOR_LOAD_IN_PROGRESS while the group's partition is still being replayed, as Kafka's
coordinator runtime does; each operation says it in its own result type (a Heartbeat is
answered NONE, as Kafka "blindly" answers one for a loading group). A transaction marker for a
loading partition is refused the same way (the marker job retries), so replay alone applies
what the log holds. Listings, and the timers, which span every group, wait for every partition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from samsa.coordinator.consumer_group_coordinator import (
    ConsumerGroupDescription,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    Overrides,
    TopicInfo,
    no_overrides,
)
from samsa.coordinator.group_coordinator import (
    Await,
    CoordinatorRecord,
    GroupConfig,
    GroupCoordinator,
    GroupDescription,
    JoinRequest,
    JoinResult,
    OffsetToCommit,
    Owed,
    Pending,
    Reply,
    SyncResult,
)
from samsa.coordinator.offsets import OFFSETS_TOPIC, FetchedOffset, TopicPartition
from samsa.coordinator.ports import CoordinatorLog, StoreUnavailable
from samsa.coordinator.runtime import CoordinatorRuntime, Outcome
from samsa.coordinator.share_group import (
    ShareGroupDescription,
    ShareHeartbeat,
    ShareHeartbeatResult,
)
from samsa.protocol.errors import ErrorCode

log = logging.getLogger("samsa.coordinator")

JoinResponse = JoinResult | asyncio.Future[JoinResult]
SyncResponse = SyncResult | asyncio.Future[SyncResult]

# (transactional id, producer id, epoch, the partition written): NONE if the producer may.
VerifyTxn = Callable[[str, int, int, TopicPartition], ErrorCode]

_Key = tuple[Owed, str, str]


def _refused(kind: Owed, error: ErrorCode) -> JoinResult | SyncResult:
    return JoinResult(error) if kind is Owed.JOIN else SyncResult(error)


class GroupCoordinatorRuntime:
    def __init__(
        self,
        store: CoordinatorLog,
        config: GroupConfig,
        clock: Callable[[], int],
        verify_txn: VerifyTxn | None = None,
        topics: Callable[[], Mapping[str, TopicInfo]] = dict,
        overrides: Overrides = no_overrides,
    ) -> None:
        self.clock = clock
        # The cluster's topics, which consumer groups subscribe to (by name or regex).
        self.topics = topics
        # ``overrides``: each consumer group's own timeouts (KIP-848 group configs).
        self.coordinator = GroupCoordinator(config, topics=topics, overrides=overrides)
        self.runtime = CoordinatorRuntime(
            self.coordinator,
            store,
            clock,
            "group coordinator",
            lambda: f"{len(self.coordinator.groups)} groups",
        )
        self.store = store
        self.verify_txn = verify_txn
        self._futures: dict[_Key, asyncio.Future[Any]] = {}
        self._timers = False  # deadlines are served by the loop (started and loaded)
        self._started = False
        store.add_marker_listener(self.on_marker)
        store.add_marker_gate(self.marker_gate)
        self.runtime.on_loaded.append(self._partition_loaded)

    # -- lifecycle ----------------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild the coordinator by replaying ``__consumer_offsets`` at once (the broker
        instead replays it while serving: ``runtime.begin_load``, ``load_in_background``)."""
        self.runtime.load()

    def start(self) -> None:
        """Serve the coordinator's timers once every partition is loaded: from then on every
        operation reschedules the one wake-up at its earliest deadline; the first tick arms
        the offsets retention check."""
        self._started = True
        self._partition_loaded(-1)

    def _partition_loaded(self, _partition: int) -> None:
        if self._started and not self._timers and self.runtime.loaded:
            self._timers = True
            self._tick_now()

    def _enter(self, group_id: str) -> ErrorCode:
        """The gate of every operation on a group: COORDINATOR_LOAD_IN_PROGRESS while its
        partition is being replayed; else NONE, once the group's passed deadlines have fired
        (a session must be over for any request that arrives after its deadline, as in Kafka,
        even if the timer has not run yet)."""
        if not group_id:  # refused by the shard (INVALID_GROUP_ID), loading or not
            return ErrorCode.NONE
        loading = self.runtime.gate(self.coordinator.partition_for(group_id))
        if not loading:
            self._run(self.coordinator.fire_group(group_id, self.clock()))
        return loading

    def loading(self) -> ErrorCode:
        """What spans every group (ListGroups) answers: COORDINATOR_LOAD_IN_PROGRESS until
        every partition is replayed, as Kafka's ListGroups while a shard loads."""
        return self.runtime.gate_all()

    def marker_gate(self, topic: str, partition: int) -> ErrorCode:
        """A marker may be written to ``topic``-``partition`` (NONE) unless it is a partition
        of ``__consumer_offsets`` still being replayed."""
        return self.runtime.gate(partition) if topic == OFFSETS_TOPIC else ErrorCode.NONE

    def close(self) -> None:
        self._timers = self._started = False
        self.runtime.close()
        # Owed responses are answered so no connection waits on a broker that is leaving.
        for (kind, _g, _m), fut in list(self._futures.items()):
            if not fut.done():
                fut.set_result(_refused(kind, ErrorCode.COORDINATOR_NOT_AVAILABLE))
        self._futures.clear()

    def ensure_topic(self) -> None:
        """Create ``__consumer_offsets`` unless it exists; StoreUnavailable if it cannot."""
        self.runtime.ensure_topic()

    def on_marker(self, topic: str, partition: int, producer_id: int, commit: bool) -> None:
        """A marker was written: transactional offsets become visible (or are dropped) when
        it reaches the group's ``__consumer_offsets`` partition."""
        if topic == OFFSETS_TOPIC:
            self.coordinator.replay_marker(partition, producer_id, commit, self.clock())

    # -- the operation cycle ------------------------------------------------------------------

    def _run(self, outcome: Outcome[CoordinatorRecord, Any]) -> tuple[ErrorCode, dict[_Key, Any]]:
        error = self.runtime.write(outcome.records)
        created = self._drain()
        if self._timers:
            self.runtime.schedule(self.coordinator.next_deadline(), self._tick_now)
        return error, created

    def _drain(self) -> dict[_Key, Any]:
        created: dict[_Key, Any] = {}
        for event in self.coordinator.take_outbox():
            key = (event.kind, event.group_id, event.member_id)
            if isinstance(event, Await):
                old = self._futures.get(key)
                if old is not None and not old.done():  # superseded: told to rejoin
                    old.set_result(_refused(event.kind, ErrorCode.REBALANCE_IN_PROGRESS))
                fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                self._futures[key] = created[key] = fut
            elif isinstance(event, Reply):
                fut = self._futures.pop(key, None)
                if fut is not None and not fut.done():
                    fut.set_result(event.result)
        return created

    def _respond(self, outcome: Outcome[CoordinatorRecord, Any]) -> Any:
        error, created = self._run(outcome)
        response = outcome.response
        if isinstance(response, Pending):
            return created[(response.kind, response.group_id, response.member_id)]
        if error != ErrorCode.NONE and isinstance(response, JoinResult | SyncResult):
            return type(response)(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return response

    # -- operations (what handlers call) ------------------------------------------------------

    def _tick_now(self) -> None:
        if self.runtime.loaded:  # the tick scans every group: none may be half replayed
            self._run(self.coordinator.tick(self.clock()))

    def join(self, req: JoinRequest) -> JoinResponse:
        if loading := self._enter(req.group_id):
            return JoinResult(loading)
        return self._respond(self.coordinator.join_group(req, self.clock()))  # type: ignore[no-any-return]

    def sync(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> SyncResponse:
        if loading := self._enter(group_id):
            return SyncResult(loading)
        outcome = self.coordinator.sync_group(
            group_id,
            generation,
            member_id,
            group_instance_id,
            protocol_type,
            protocol_name,
            assignments,
            self.clock(),
        )
        return self._respond(outcome)  # type: ignore[no-any-return]

    def heartbeat(
        self, group_id: str, generation: int, member_id: str, group_instance_id: str | None
    ) -> ErrorCode:
        if self._enter(group_id):
            return ErrorCode.NONE  # as Kafka: the group is loading, answer blindly
        outcome = self.coordinator.heartbeat(
            group_id, generation, member_id, group_instance_id, self.clock()
        )
        return self._respond(outcome)  # type: ignore[no-any-return]

    def leave(
        self, group_id: str, members: list[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        if loading := self._enter(group_id):
            return loading, []
        return self._respond(self.coordinator.leave_group(group_id, members, self.clock()))  # type: ignore[no-any-return]

    def commit(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[OffsetToCommit],
    ) -> dict[TopicPartition, ErrorCode]:
        if loading := self._enter(group_id):
            return {(o.topic, o.partition): loading for o in offsets}
        outcome = self.coordinator.commit_offsets(
            group_id, generation, member_id, group_instance_id, offsets, self.clock()
        )
        error, _ = self._run(outcome)
        return _commit_errors(outcome.response, error)

    def commit_transactional(
        self,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[OffsetToCommit],
    ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: written as one transactional batch of the group's partition and
        staged until the transaction's marker decides them (rule 15)."""
        tps = [(o.topic, o.partition) for o in offsets]
        if loading := self._enter(group_id):
            return dict.fromkeys(tps, loading)
        if self.verify_txn is None:
            return dict.fromkeys(tps, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        coord = self.coordinator
        partition = coord.partition_for(group_id)
        verified = self.verify_txn(
            transactional_id, producer_id, producer_epoch, (OFFSETS_TOPIC, partition)
        )
        outcome = coord.commit_transactional_offsets(
            group_id, generation, member_id, group_instance_id, offsets, verified, self.clock()
        )
        if not outcome.records:
            return outcome.response
        try:
            error = self.runtime.write_transactional(outcome.records, producer_id, producer_epoch)
        except StoreUnavailable:
            return dict.fromkeys(tps, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return _commit_errors(outcome.response, error)

    def fetch_offsets(
        self,
        group_id: str,
        topics: list[tuple[str, list[int]]] | None,
        require_stable: bool = False,
    ) -> list[FetchedOffset]:
        """The committed offsets (after :meth:`validate_fetch` answered NONE: nothing while
        the group's partition loads)."""
        if self._enter(group_id):
            return []
        return self.coordinator.fetch_offsets(group_id, topics, require_stable)

    def delete_offsets(
        self, group_id: str, topics: list[tuple[str, list[int]]]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        if loading := self._enter(group_id):
            return loading, {}
        outcome = self.coordinator.delete_offsets(group_id, topics, self.clock())
        error, _ = self._run(outcome)
        if error != ErrorCode.NONE:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, {}
        return outcome.response  # type: ignore[no-any-return]

    def delete_groups(self, group_ids: list[str]) -> dict[str, ErrorCode]:
        loading = {g: e for g in group_ids if (e := self._enter(g))}
        outcome = self.coordinator.delete_groups(
            [g for g in group_ids if g not in loading], self.clock()
        )
        error, _ = self._run(outcome)
        if error != ErrorCode.NONE:
            return {g: ErrorCode.COORDINATOR_NOT_AVAILABLE for g in outcome.response} | loading
        return outcome.response | loading  # type: ignore[no-any-return]

    def offsets_partition(self, group_id: str) -> TopicPartition | ErrorCode:
        """The ``__consumer_offsets`` partition AddOffsetsToTxn adds for ``group_id``; the
        topic is created first, so its partition count is fixed before a transaction names
        one of its partitions."""
        try:
            self.ensure_topic()
        except StoreUnavailable:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return (OFFSETS_TOPIC, self.coordinator.partition_for(group_id))

    def validate_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        """OffsetFetch's group error: COORDINATOR_LOAD_IN_PROGRESS while the group loads,
        else (v9+, KIP-848) whether the member may fetch at ``member_epoch``."""
        if loading := self._enter(group_id):
            return loading
        return self.coordinator.validate_fetch(group_id, member_id, member_epoch)

    def consumer_heartbeat(self, req: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        if loading := self._enter(req.group_id):
            return ConsumerHeartbeatResult(loading, None, req.member_id)
        outcome = self.coordinator.consumer_heartbeat(req, self.topics(), self.clock())
        error, _ = self._run(outcome)
        if error != ErrorCode.NONE:
            return ConsumerHeartbeatResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, None, req.member_id)
        return outcome.response

    def describe_consumer_group(self, group_id: str) -> ConsumerGroupDescription:
        if loading := self._enter(group_id):
            return ConsumerGroupDescription(group_id, loading)
        return self.coordinator.describe_consumer_group(group_id)

    def share_heartbeat(self, req: ShareHeartbeat) -> ShareHeartbeatResult:
        if loading := self._enter(req.group_id):
            return ShareHeartbeatResult(loading)
        outcome = self.coordinator.share_heartbeat(req, self.topics(), self.clock())
        error, _ = self._run(outcome)
        if error != ErrorCode.NONE:
            return ShareHeartbeatResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return outcome.response

    def describe_share_group(self, group_id: str) -> ShareGroupDescription:
        if loading := self._enter(group_id):
            return ShareGroupDescription(group_id, loading)
        return self.coordinator.describe_share_group(group_id)

    def list_consumer_groups(self, states: list[str]) -> list[tuple[str, str]]:
        self._tick_now()
        return self.coordinator.list_consumer_groups(states)

    def list_share_groups(self, states: list[str]) -> list[tuple[str, str]]:
        self._tick_now()
        return self.coordinator.list_share_groups(states)

    def list_groups(self, states: list[str]) -> list[tuple[str, str, str]]:
        self._tick_now()
        return self.coordinator.list_groups(states)

    def describe_group(self, group_id: str) -> GroupDescription:
        if loading := self._enter(group_id):
            return GroupDescription(group_id, loading, "", "", "")
        return self.coordinator.describe_group(group_id)


def _commit_errors(
    errors: dict[TopicPartition, ErrorCode], error: ErrorCode
) -> dict[TopicPartition, ErrorCode]:
    """The answer to a commit whose write failed with ``error``."""
    if error == ErrorCode.NONE:
        return errors
    mapped = (
        ErrorCode.INVALID_COMMIT_OFFSET_SIZE
        if error == ErrorCode.MESSAGE_TOO_LARGE
        else ErrorCode.COORDINATOR_NOT_AVAILABLE
    )
    return {tp: (mapped if e == ErrorCode.NONE else e) for tp, e in errors.items()}
