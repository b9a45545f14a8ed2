"""The asyncio consumer: assignment, positions, polling, offsets and group membership.

Theory of operation
-------------------
The consumer owns a set of partitions, given by :meth:`AsyncConsumer.assign` or by the
group coordinator after :meth:`AsyncConsumer.subscribe`, and a *position* per partition:
the offset of the next record to hand out. A position is initialised from the group's
committed offset, else from ``auto.offset.reset`` (ListOffsets earliest / latest).

It is cut as Kafka's refactored consumer and aiokafka are:

* :mod:`samsa.client._subscription`: the subscribed topics and the assignment with its
  positions; an assignment is replaced, never edited, and the old one marked inactive, so
  a position lookup answered after a rebalance is dropped;
* :mod:`samsa.client._fetcher`: Fetch rounds (fetch sessions, fetch ahead), the buffer of
  completed fetches, decoding and handing records out, corrupt batches;
* :mod:`samsa.client._membership`: the group membership, classic (JoinGroup/SyncGroup,
  eager) or KIP-848's consumer protocol (ConsumerGroupHeartbeat), behind one interface,
  each with its state enum;
* here: the public API, the poll loop, position lookups and the offset calls (OffsetCommit,
  OffsetFetch, ListOffsets).

``getmany()`` / ``poll()`` / ``consume_arrow()`` return records already buffered, else wait
for a Fetch round (see the fetcher). ``close()`` commits (auto-commit) and leaves the group.

With ``isolation.level=read_committed`` the broker returns data only below the last stable
offset together with the aborted transactions of the range, which the fetcher skips
(:class:`samsa.protocol.fetched.KeptBatches`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from samsa.client._assignors import ASSIGNORS
from samsa.client._cluster import Cluster
from samsa.client._config import CONSUMER, Config
from samsa.client._errors import ClosedError, ConfigError, KafkaError
from samsa.client._fetcher import Fetcher
from samsa.client._membership import (
    REJOIN_ERRORS,
    ClassicMembership,
    ConsumerProtocolMembership,
    GroupChannel,
    Membership,
)
from samsa.client._subscription import FetchState, OffsetAndEpoch, SubscriptionState
from samsa.client._types import ConsumerGroupMetadata, ConsumerRecord, TopicPartition
from samsa.protocol.constants import EARLIEST, LATEST, READ_COMMITTED, READ_UNCOMMITTED
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("samsa.client.consumer")

# Per-request answers retried after a backoff (besides a lost connection and the
# coordinator moving, which every coordinator request retries), as Java's consumer does.
COMMIT_RETRY = frozenset(
    {
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.REQUEST_TIMED_OUT,
    }
)
# UNSTABLE_OFFSET_COMMIT (offsets of an open transaction pending) is not waited out here:
# committed() reports it, and poll() retries it (it is retriable) while initialising.
OFFSET_FETCH_RETRY = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})


class AsyncConsumer:
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        # Fetched data is decoded with it (and pyarrow, numpy): loaded with the consumer
        # (~0.2 s once per process), not in the first poll, nor by producer-only programs.
        import samsa.protocol.columnar  # noqa: F401

        self.config = c = Config(CONSUMER, config)
        self.group_id: str | None = c["group.id"]
        iso = str(c["isolation.level"]).lower()
        if iso not in ("read_uncommitted", "read_committed"):
            raise ConfigError("isolation.level must be read_uncommitted or read_committed")
        self.isolation_level = READ_COMMITTED if iso == "read_committed" else READ_UNCOMMITTED
        reset = str(c["auto.offset.reset"]).lower()
        if reset not in ("earliest", "latest", "none", "smallest", "largest"):
            raise ConfigError("auto.offset.reset must be earliest, latest or none")
        self.reset_policy = {"smallest": "earliest", "largest": "latest"}.get(reset, reset)
        self.auto_commit = c.bool("enable.auto.commit") and self.group_id is not None
        self.auto_commit_interval = c.seconds("auto.commit.interval.ms")
        self.check_crcs = c.bool("check.crcs")
        self.max_poll_records = c.int("max.poll.records")
        self.request_timeout = c.seconds("request.timeout.ms")
        self.retry_backoff = c.seconds("retry.backoff.ms")
        self.api_timeout = c.seconds("default.api.timeout.ms")
        strategy = str(c["partition.assignment.strategy"]).lower().split(",")[0].strip()
        if strategy not in ASSIGNORS:
            raise ConfigError("partition.assignment.strategy must be range or roundrobin")
        self.assignor = strategy
        protocol = str(c["group.protocol"]).lower()
        if protocol not in ("classic", "consumer"):
            raise ConfigError("group.protocol must be classic or consumer")
        self.kip848 = protocol == "consumer"
        self.max_partition_fetch_bytes = c.int("max.partition.fetch.bytes")
        self.fetch_max_bytes = c.int("fetch.max.bytes")
        self.cluster = Cluster.from_config(c, api_timeout=self.api_timeout)
        self.subscriptions = SubscriptionState()
        self.fetcher = Fetcher(
            self.cluster,
            c,
            self.subscriptions,
            self.isolation_level,
            self._init_positions,
            can_reset=self.reset_policy != "none",
        )
        self.membership: Membership | None = None
        if self.group_id is not None:
            group = GroupChannel(self.cluster, self.group_id)
            commit = self._auto_commit if self.auto_commit else None
            parts = (c, group, self.subscriptions, self._assign, commit)
            self.membership = (
                ConsumerProtocolMembership(*parts)
                if self.kip848
                else ClassicMembership(*parts, assignor=self.assignor)
            )
        self._commit_lock = asyncio.Lock()  # commits in call order: offsets never go back
        self._last_commit = 0.0
        self._closed = False
        self._started = False

    async def start(self) -> None:
        if not self._started:
            self._started = True
            await self.cluster.refresh([])

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _membership(self) -> Membership:
        assert self.membership is not None  # (the callers checked group.id)
        return self.membership

    async def _auto_commit(self, offsets: dict[TopicPartition, int] | None) -> None:
        """Auto-commit, and the positions of partitions given up: with their epochs, as
        Java's consumer commits what it consumed."""
        if offsets is not None:
            known = self.subscriptions.committable()
            offsets = {
                tp: at if (at := known.get(tp)) is not None and at.offset == off else off
                for tp, off in offsets.items()
            }
        await self.commit(offsets)

    # --- assignment ------------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        if self.subscriptions.topics:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "consumer is subscribed; cannot assign")
        self._assign([TopicPartition(*tp) for tp in partitions])

    def _assign(self, tps: list[TopicPartition], keep_positions: bool = True) -> None:
        """A new assignment; what was fetched for partitions it drops is dropped too (and
        everything fetched, when the positions start afresh)."""
        self.subscriptions.assign(tps, keep_positions=keep_positions)
        self.fetcher.buffer.retain(tps, fetched=keep_positions)

    def assignment(self) -> list[TopicPartition]:
        return self.subscriptions.partitions()

    def subscribe(self, topics: Iterable[str]) -> None:
        if self.group_id is None:
            raise ConfigError("subscribe() needs group.id")
        self.subscriptions.topics = sorted(set(topics))
        self._membership().request_rejoin()

    async def unsubscribe(self) -> None:
        await self._leave()
        self.subscriptions.topics = []
        self._assign([])
        # Nothing is left to fetch: the fetch sessions' slots are freed on the brokers now.
        await self.fetcher.stop()
        await self.fetcher.close_sessions()

    def seek(self, tp: TopicPartition | tuple[str, int], offset: int) -> None:
        tp = TopicPartition(*tp)
        self.subscriptions.seek(tp, offset)
        self.fetcher.buffer.drop(tp)

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        await self._seek_to(list(tps) or self.subscriptions.partitions(), EARLIEST)

    async def seek_to_end(self, *tps: TopicPartition) -> None:
        await self._seek_to(list(tps) or self.subscriptions.partitions(), LATEST)

    async def _seek_to(self, tps: list[TopicPartition], which: int) -> None:
        offsets = await self.list_offsets(tps, which)
        for tp, off in offsets.items():
            self.seek(tp, off)

    async def position(self, tp: TopicPartition) -> int:
        tp = TopicPartition(*tp)
        while True:
            if not self.subscriptions.is_assigned(tp):  # as Java's: only an assigned one's
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp} is not assigned")
            pos = self.subscriptions.position(tp)
            if pos is None:
                await self._init_positions([tp])  # (a rebalance meanwhile: looked up again)
            elif self.subscriptions.fetching(tp):
                return pos
            else:
                # as Java's: a position awaiting validation is not yet one to report (a
                # truncation may move it, or raise LogTruncationError)
                self.fetcher.check_leaders()
                await self.fetcher.validate()
                if not self.subscriptions.fetching(tp):
                    await asyncio.sleep(self.retry_backoff)

    # --- offsets ---------------------------------------------------------------------------

    async def list_offsets(
        self, tps: Iterable[TopicPartition], timestamp: int, *, timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """ListOffsets: EARLIEST (-2), LATEST (-1) or the first offset at a timestamp.

        Sent to each partition's leader; lost connections and stale leaders (metadata
        refreshed) are retried until ``timeout`` (default ``default.api.timeout.ms``)."""
        todo = list(dict.fromkeys(TopicPartition(*tp) for tp in tps))
        return await self.cluster.list_offsets(
            todo, timestamp, isolation_level=self.isolation_level, timeout=timeout
        )

    async def _init_positions(
        self, tps: list[TopicPartition], timeout: float | None = None
    ) -> None:
        # An answer applies only to the assignment it was asked for: a rebalance while it is
        # in flight (a lost response waits request.timeout.ms) replaces the assignment, and
        # a stale committed/earliest offset written into the new one would fetch again what
        # another member consumed and committed meanwhile. A seek meanwhile also wins.
        subs = self.subscriptions
        assignment = subs.assignment
        states = assignment.states

        def unknown(tp: TopicPartition, *which: FetchState) -> bool:
            s = states.get(tp)
            return assignment.active and s is not None and s.offset is None and s.state in which

        init, reset = FetchState.INITIALIZING, FetchState.AWAIT_RESET
        if self.group_id is not None and any(unknown(tp, init) for tp in tps):
            # only a position never set starts from the committed offset: one to be reset
            # (out of range, truncated) resets by the policy, as Java's consumer
            committed = await self._fetch_committed(
                [tp for tp in tps if unknown(tp, init)], timeout=timeout
            )
            for tp, c in committed.items():
                if c is not None and unknown(tp, init):
                    # validated with the leader before fetching, if it carries its epoch
                    subs.seek_unvalidated(tp, c.offset, c.leader_epoch)
        if not assignment.active:
            return  # the next fetch round looks the new assignment's positions up
        missing = [tp for tp in tps if unknown(tp, init, reset)]
        if not missing:
            return
        if self.reset_policy == "none":
            raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE, f"no offset for {missing}")
        offsets = await self.list_offsets(
            missing, EARLIEST if self.reset_policy == "earliest" else LATEST, timeout=timeout
        )
        for tp, off in offsets.items():
            if unknown(tp, init, reset):
                subs.reset(tp, off)

    # --- polling ---------------------------------------------------------------------------

    async def getmany(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records grouped by partition; waits up to ``timeout_ms`` for the first."""
        limit = max_records or self.max_poll_records
        return await self._poll(timeout_ms, lambda: self.fetcher.take_records(limit)) or {}

    async def poll(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        batches = await self.getmany(timeout_ms, max_records)
        return [r for recs in batches.values() for r in recs]

    async def consume_arrow(
        self,
        max_records: int | None = None,
        timeout_ms: int = 0,
        *,
        include_headers: bool = False,
    ) -> pa.RecordBatch:
        """Up to ``max_records`` records as one Arrow batch in the columns of Spark's Kafka
        source (``headers`` last when ``include_headers``), decoded column-wise from the
        fetched batches without a Python object per record. Positions, commits, seeks,
        isolation and corrupt batches behave as in :meth:`poll` (the two may be mixed); rows
        of a partition are in offset order, partitions one after another."""
        import pyarrow as pa

        from samsa.protocol.columnar import ARROW_SCHEMA, ARROW_SCHEMA_HEADERS, empty_batch

        limit = max_records or self.max_poll_records
        parts = await self._poll(
            timeout_ms, lambda: self.fetcher.take_arrow(limit, include_headers)
        )
        if not parts:
            return empty_batch(ARROW_SCHEMA_HEADERS if include_headers else ARROW_SCHEMA)
        if len(parts) == 1:
            return parts[0]
        if hasattr(pa, "concat_batches"):  # pyarrow >= 19
            return pa.concat_batches(parts)
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]

    async def _poll(self, timeout_ms: int, take: Callable[[], Any]) -> Any:
        """``take()``'s first non-empty answer within ``timeout_ms`` (else its empty one)."""
        if self._closed:
            raise ClosedError("consumer is closed")
        if not self._started:
            await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        failures = 0
        while True:
            try:
                # As Java's poll: group membership, positions and fetches that fail on a
                # lost connection or a retriable error are tried again within the poll's
                # time (and in the next poll); other errors reach the caller.
                await self._maybe_group_work()
                self.fetcher.check_leaders()  # before handing out what an old leader sent
                out = take()
                if out:
                    self.fetcher.prefetch()
                    return out
                self.fetcher.raise_corrupt()
                await self.fetcher.wait(deadline)
                failures = 0
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                failures += 1
                log.debug("poll: %s", exc)
                wait = self.cluster.backoff.delay(failures)
                await asyncio.sleep(min(wait, max(0.0, deadline - loop.time())))
            out = take()
            if out:
                self.fetcher.prefetch()
                return out
            if loop.time() >= deadline:
                return out

    async def _maybe_group_work(self) -> None:
        m = self.membership
        if m is None:
            return
        if self.subscriptions.topics and m.needs_join:
            await m.join()
        if self.auto_commit and self.subscriptions.partitions():
            now = asyncio.get_running_loop().time()
            if now - self._last_commit >= self.auto_commit_interval:
                self._last_commit = now
                with contextlib.suppress(KafkaError):
                    await self.commit()

    async def _leave(self) -> None:
        if self.membership is not None:
            await self.membership.leave()

    # --- offsets of the group --------------------------------------------------------------

    async def commit(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndEpoch] | None = None,
        *,
        timeout: float | None = None,
    ) -> None:
        """OffsetCommit of ``offsets`` (next offset to read), default the positions.

        The positions are committed with the leader epoch of the last record consumed, as
        Java's consumer commits them (KIP-320); an offset given carries the epoch given with
        it in an :class:`OffsetAndEpoch` (``record.leader_epoch`` of the record before it),
        none (-1) as a bare int, as Java's ``OffsetAndMetadata``. A consumer resuming from
        an offset with an epoch validates it with the leader before fetching.

        A lost connection, a moved coordinator and COORDINATOR_LOAD_IN_PROGRESS /
        UNKNOWN_TOPIC_OR_PARTITION / REQUEST_TIMED_OUT are retried until ``timeout``
        (default ``default.api.timeout.ms``) with the same generation, which the coordinator
        checks: once the group rebalanced, the resent commit is refused (ILLEGAL_GENERATION,
        UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS), never applied late. Those are not retried:
        they raise, and the consumer rejoins. Commits run one at a time in call order, so a
        retried commit cannot land after a later one."""
        if self.group_id is None:
            raise ConfigError("commit() needs group.id")
        async with self._commit_lock:
            if offsets is None:
                with_epochs = self.subscriptions.committable()
            else:
                with_epochs = {
                    TopicPartition(*tp): off if isinstance(off, tuple) else OffsetAndEpoch(off)
                    for tp, off in offsets.items()
                }
            if not with_epochs:
                return
            await self._commit(with_epochs, timeout)

    async def _commit(
        self, offsets: dict[TopicPartition, OffsetAndEpoch], timeout: float | None
    ) -> None:
        topics: dict[str, list[tuple[int, OffsetAndEpoch]]] = {}
        for tp, off in offsets.items():
            topics.setdefault(tp.topic, []).append((tp.partition, off))

        def topic_entities(v: int) -> tuple[Any, ...]:
            return tuple(
                make_request(
                    ApiKey.OFFSET_COMMIT,
                    v,
                    "OffsetCommitRequestTopic",
                    name=t,
                    partitions=tuple(
                        make_request(
                            ApiKey.OFFSET_COMMIT,
                            v,
                            "OffsetCommitRequestPartition",
                            partition_index=p,
                            committed_offset=o.offset,
                            committed_leader_epoch=o.leader_epoch,
                            committed_metadata="",
                        )
                        for p, o in ps
                    ),
                )
                for t, ps in topics.items()
            )

        m = self._membership()
        resp = await m.group.request(
            ApiKey.OFFSET_COMMIT,
            2,
            m.commit_version,
            "OffsetCommitRequest",
            codes=lambda r: [int(p.error_code) for t in r.topics for p in t.partitions],
            retry_codes=COMMIT_RETRY,
            timeout=timeout,
            group_id=self.group_id,
            generation_id_or_member_epoch=m.generation,
            generation_id=m.generation,
            member_id=m.member_id,
            group_instance_id=self.config["group.instance.id"],
            retention_time=-1,
            topics=topic_entities,
        )
        for t in resp.topics:
            for p in t.partitions:
                code = int(p.error_code)
                what = f"OffsetCommit {t.name}-{p.partition_index}"
                if code in REJOIN_ERRORS:
                    m.request_rejoin()
                    what += (
                        ": the group rebalanced (or is rebalancing) since these records were "
                        "polled; the offsets were not committed"
                    )
                if code:
                    raise KafkaError(code, what)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The membership a transactional producer's offset commit is checked against."""
        if self.group_id is None:
            raise ConfigError("group_metadata() needs group.id")
        m = self._membership()
        return ConsumerGroupMetadata(
            self.group_id, m.generation, m.member_id, self.config["group.instance.id"]
        )

    def commit_async(self, offsets: dict[TopicPartition, int] | None = None) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self.commit(offsets))

    async def committed(
        self, tps: Iterable[TopicPartition], *, timeout: float | None = None
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where nothing is committed); retried like
        :meth:`commit`. While offsets of an open transaction are pending it raises
        UNSTABLE_OFFSET_COMMIT (retriable: poll() asks again until they are stable)."""
        if self.group_id is None:
            raise ConfigError("committed() needs group.id")
        found = await self._fetch_committed([TopicPartition(*tp) for tp in tps], timeout=timeout)
        return {tp: None if c is None else c.offset for tp, c in found.items()}

    async def _fetch_committed(
        self, tps: list[TopicPartition], *, timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndEpoch | None]:
        """OffsetFetch: the committed offsets with their leader epochs (-1: none recorded)."""
        topics: dict[str, list[int]] = {}
        for tp in tps:
            topics.setdefault(tp.topic, []).append(tp.partition)

        def topic_entities(v: int, cls: str) -> tuple[Any, ...]:
            return tuple(
                make_request(ApiKey.OFFSET_FETCH, v, cls, name=t, partition_indexes=tuple(ps))
                for t, ps in topics.items()
            )

        def group_of(resp: Any) -> Any:
            return resp.groups[0] if hasattr(resp, "groups") else resp

        def codes(resp: Any) -> list[int]:
            g = group_of(resp)
            return [int(g.error_code)] + [int(p.error_code) for t in g.topics for p in t.partitions]

        resp = await self._membership().group.request(
            ApiKey.OFFSET_FETCH,
            1,
            8,
            "OffsetFetchRequest",
            codes=codes,
            retry_codes=OFFSET_FETCH_RETRY,
            timeout=timeout,
            group_id=self.group_id,
            topics=lambda v: topic_entities(v, "OffsetFetchRequestTopic") if v < 8 else (),
            groups=lambda v: (
                (
                    make_request(
                        ApiKey.OFFSET_FETCH,
                        v,
                        "OffsetFetchRequestGroup",
                        group_id=self.group_id,
                        topics=topic_entities(v, "OffsetFetchRequestTopics"),
                    ),
                )
                if v >= 8
                else ()
            ),
            require_stable=True,
        )
        out: dict[TopicPartition, OffsetAndEpoch | None] = dict.fromkeys(tps)
        group = group_of(resp)
        if group.error_code:
            raise KafkaError(int(group.error_code), "OffsetFetch")
        for t in group.topics:
            for p in t.partitions:
                if p.error_code:
                    raise KafkaError(int(p.error_code), f"OffsetFetch {t.name}-{p.partition_index}")
                off = int(p.committed_offset)
                epoch = int(getattr(p, "committed_leader_epoch", -1))  # OffsetFetch v5+
                out[TopicPartition(t.name, int(p.partition_index))] = (
                    OffsetAndEpoch(off, epoch) if off >= 0 else None
                )
        return out

    async def close(self) -> None:
        if self._closed:
            return
        m = self.membership
        try:
            if self.auto_commit and self.subscriptions.partitions() and m and m.generation >= 0:
                with contextlib.suppress(KafkaError, OSError):
                    await self.commit(timeout=min(self.api_timeout, 20.0))
            await self._leave()
        finally:
            self._closed = self.fetcher.closed = True
            await self.fetcher.stop()
            if m is not None:
                await m.stop()
            await self.fetcher.close_sessions()
            await self.cluster.close()
