"""The group coordinator's runtime: the log, the clock, futures and timers around the pure
state machine of ``group_coordinator.py``.

Theory of operation
-------------------
Every operation runs the same way on the event-loop thread, start to finish with no await in
between, so operations never interleave:

1. the state machine computes an :class:`Outcome` (records + response) at ``clock()``;
2. the records are appended to their group's partition of ``__consumer_offsets`` through
   :mod:`samsa.coordinator.internal_topic` (the partition's own :class:`~samsa.log.log.Log`,
   origin ``COORDINATOR``: one batch per partition, in the kernel before the append returns, so
   it survives ``kill -9``);
3. only if the append succeeded are the records replayed into the state machine (the only
   way durable state changes); if it failed, the state machine is told (``store_failed``)
   and the response carries a coordinator error;
4. the outbox is drained: ``Await`` creates a future for an owed JoinGroup/SyncGroup
   response, ``Reply`` resolves one. A handler gets a value, or the future to await.

Start-up (``load``) replays every partition of ``__consumer_offsets`` from its log start:
that *is* the coordinator's recovery. The topic is created with
``offsets.topic.num.partitions`` partitions the first time something is written to it (or
FindCoordinator asks), not at every broker start. A task calls ``tick`` every
:data:`TICK_SECONDS` for session timeouts, rebalance deadlines and offsets retention.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from samsa.broker.topics import TopicError, TopicManager
from samsa.coordinator.group_coordinator import (
    Await,
    CoordinatorRecord,
    GroupConfig,
    GroupCoordinator,
    GroupDescription,
    JoinRequest,
    JoinResult,
    OffsetToCommit,
    Outcome,
    Pending,
    Reply,
    SyncResult,
)
from samsa.coordinator.internal_topic import append_records, ensure_topic
from samsa.coordinator.offsets_records import encode_key, encode_value
from samsa.coordinator.txn_offsets import OFFSETS_TOPIC, PendingTxnOffsets, replay_partition
from samsa.protocol.errors import ErrorCode

log = logging.getLogger("samsa.coordinator")

TICK_SECONDS = 0.05

JoinResponse = JoinResult | asyncio.Future[JoinResult]
SyncResponse = SyncResult | asyncio.Future[SyncResult]


class GroupCoordinatorRuntime:
    def __init__(self, topics: TopicManager, config: GroupConfig, clock: Callable[[], int]) -> None:
        self.topics = topics
        self.clock = clock
        self.coordinator = GroupCoordinator(config)
        self._futures: dict[tuple[str, str, str], asyncio.Future[Any]] = {}
        self._timer: asyncio.Task[None] | None = None
        # Transactional offsets staged until their marker (issue 5, txn_offsets.py).
        self.txn_offsets = PendingTxnOffsets(log_end=self._log_end)

    # -- lifecycle ----------------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild the coordinator by replaying ``__consumer_offsets``."""
        topic = self.topics.topics.get(OFFSETS_TOPIC)
        if topic is None:
            return
        config = self.coordinator.config
        if len(topic.partitions) != config.num_partitions:
            # The partition count is fixed when the topic is created; placement follows it.
            log.warning(
                "%s has %d partitions, offsets.topic.num.partitions says %d: using %d",
                OFFSETS_TOPIC,
                len(topic.partitions),
                config.num_partitions,
                len(topic.partitions),
            )
            self.coordinator.config = replace(config, num_partitions=len(topic.partitions))
        now = self.clock()
        count = 0
        self.coordinator.begin_load()
        try:
            for partition in topic.partitions:
                for offset, record in replay_partition(
                    partition.log, partition.index, self.txn_offsets
                ):
                    self._replay(record, now, offset)
                    count += 1
        finally:
            self.coordinator.end_load()
        log.info(
            "group coordinator loaded %d records: %d groups",
            count,
            len(self.coordinator.groups),
        )

    def start(self) -> None:
        self._timer = asyncio.get_running_loop().create_task(self._tick_forever())

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            try:
                self._run(self.coordinator.tick(self.clock()))
            except Exception:
                log.exception("group coordinator tick failed")

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Owed responses are answered so no connection waits on a broker that is leaving.
        for (kind, _g, _m), fut in list(self._futures.items()):
            if not fut.done():
                err = ErrorCode.COORDINATOR_NOT_AVAILABLE
                fut.set_result(JoinResult(err) if kind == "join" else SyncResult(err))
        self._futures.clear()

    def ensure_topic(self) -> None:
        num_partitions = self.coordinator.config.num_partitions
        ensure_topic(self.topics, OFFSETS_TOPIC, num_partitions, self.clock())

    # -- the operation cycle ------------------------------------------------------------------

    def _run(self, outcome: Outcome) -> tuple[Any, ErrorCode, dict[tuple[str, str, str], Any]]:
        error = self._write(outcome.records) if outcome.records else ErrorCode.NONE
        return outcome.response, error, self._drain()

    def _write(self, records: list[CoordinatorRecord]) -> ErrorCode:
        by_partition: dict[int, list[CoordinatorRecord]] = {}
        for rec in records:
            by_partition.setdefault(self.coordinator.partition_for(rec.group_id), []).append(rec)
        try:
            self.ensure_topic()
        except TopicError as exc:  # e.g. a full disk: created whole on a later try
            log.error("cannot create %s: %s", OFFSETS_TOPIC, exc)
            self.coordinator.store_failed(records, ErrorCode.COORDINATOR_NOT_AVAILABLE)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        worst = ErrorCode.NONE
        now = self.clock()
        for index, recs in by_partition.items():
            kvs = [(encode_key(r.key), encode_value(r.value)) for r in recs]
            error = append_records(self.topics, OFFSETS_TOPIC, index, kvs, now)
            if error != ErrorCode.NONE:
                self.coordinator.store_failed(recs, ErrorCode.COORDINATOR_NOT_AVAILABLE)
                worst = error
                continue
            # The batch was just appended (no await in between): it ends at the log end.
            base = self._log_end(index) - len(recs)
            for i, r in enumerate(recs):
                self._replay(r, now, base + i)
        return worst

    def _replay(self, record: CoordinatorRecord, now: int, offset: int) -> None:
        self.coordinator.replay(record, now, offset)
        self.txn_offsets.drop(record)  # a tombstone also drops pending transactional offsets

    def _log_end(self, index: int) -> int:
        """The log end offset of partition ``index`` of ``__consumer_offsets``."""
        p = self.topics.get_partition(OFFSETS_TOPIC, index)
        if p is None:
            raise LookupError(f"{OFFSETS_TOPIC}-{index} does not exist")
        return int(p.log.log_end_offset)

    def _drain(self) -> dict[tuple[str, str, str], Any]:
        created: dict[tuple[str, str, str], Any] = {}
        for event in self.coordinator.take_outbox():
            key = (event.kind, event.group_id, event.member_id)
            if isinstance(event, Await):
                old = self._futures.get(key)
                if old is not None and not old.done():  # superseded: told to rejoin
                    err = ErrorCode.REBALANCE_IN_PROGRESS
                    old.set_result(JoinResult(err) if event.kind == "join" else SyncResult(err))
                fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                self._futures[key] = created[key] = fut
            elif isinstance(event, Reply):
                fut = self._futures.pop(key, None)
                if fut is not None and not fut.done():
                    fut.set_result(event.result)
        return created

    def _respond(self, outcome: Outcome) -> Any:
        response, error, created = self._run(outcome)
        if isinstance(response, Pending):
            return created[(response.kind, response.group_id, response.member_id)]
        if error != ErrorCode.NONE and isinstance(response, JoinResult | SyncResult):
            return type(response)(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return response

    # -- operations (what handlers call) ------------------------------------------------------

    def join(self, req: JoinRequest) -> JoinResponse:
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
        outcome = self.coordinator.heartbeat(
            group_id, generation, member_id, group_instance_id, self.clock()
        )
        return self._respond(outcome)  # type: ignore[no-any-return]

    def leave(
        self, group_id: str, members: list[tuple[str, str | None]]
    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        return self._respond(self.coordinator.leave_group(group_id, members, self.clock()))  # type: ignore[no-any-return]

    def commit(
        self,
        group_id: str,
        generation: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: list[OffsetToCommit],
    ) -> dict[tuple[str, int], ErrorCode]:
        outcome = self.coordinator.commit_offsets(
            group_id, generation, member_id, group_instance_id, offsets, self.clock()
        )
        errors, error, _ = self._run(outcome)
        if error != ErrorCode.NONE:
            mapped = (
                ErrorCode.INVALID_COMMIT_OFFSET_SIZE
                if error == ErrorCode.MESSAGE_TOO_LARGE
                else ErrorCode.COORDINATOR_NOT_AVAILABLE
            )
            errors = {tp: (mapped if e == ErrorCode.NONE else e) for tp, e in errors.items()}
        return errors  # type: ignore[no-any-return]

    def fetch_offsets(self, group_id: str, topics: list[tuple[str, list[int]]] | None) -> Any:
        return self.coordinator.fetch_offsets(group_id, topics)

    def delete_offsets(
        self, group_id: str, topics: list[tuple[str, list[int]]]
    ) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        outcome = self.coordinator.delete_offsets(group_id, topics, self.clock())
        (top, errors), error, _ = self._run(outcome)
        if error != ErrorCode.NONE:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, {}
        return top, errors

    def delete_groups(self, group_ids: list[str]) -> dict[str, ErrorCode]:
        outcome = self.coordinator.delete_groups(group_ids, self.clock())
        errors, error, _ = self._run(outcome)
        if error != ErrorCode.NONE:
            return {g: ErrorCode.COORDINATOR_NOT_AVAILABLE for g in errors}
        return errors  # type: ignore[no-any-return]

    def list_groups(self, states: list[str]) -> list[tuple[str, str, str]]:
        return self.coordinator.list_groups(states)

    def describe_group(self, group_id: str) -> GroupDescription:
        return self.coordinator.describe_group(group_id)
