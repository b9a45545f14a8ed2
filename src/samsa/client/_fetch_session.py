"""The consumer's side of fetch sessions (KIP-227), sans-IO: one handler per broker.

The first Fetch to a broker is full (epoch 0) and names every partition; its response opens
a session. Later requests carry the session id and the next epoch and name only partitions
added or whose fetch offset or size changed since the session last heard of them, and list
the partitions no longer wanted as forgotten; the broker answers only partitions with news,
so a partition missing from an incremental response has nothing new. A session error
(FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, ...) or a request that failed
sends the next request full: nothing is lost, the consumer's positions did not move.

A session allows one request in flight: ``build`` may not be called again until the
previous request's outcome was given to ``handle_response`` or ``handle_error``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1

Key = tuple[str, int]  # (topic, partition)
# (fetch offset, partition max bytes, current leader epoch): a change of any resends the
# partition in an incremental request, as Java's session builder compares them all.
Wanted = tuple[int, int, int]


def next_epoch(epoch: int) -> int:
    return 1 if epoch == 0x7FFFFFFF else epoch + 1


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """The session fields and partitions of one Fetch request."""

    session_id: int
    epoch: int
    to_send: dict[Key, Wanted]  # all partitions (full) or the added and altered ones
    forgotten: list[Key] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)


class FetchSessionHandler:
    def __init__(self) -> None:
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH  # of the next request: 0 means a full one
        # What the broker's session holds for each partition, as it was last told.
        self.session: dict[Key, Wanted] = {}
        self._pending: dict[Key, Wanted] | None = None  # the request in flight's partitions
        # Counters (tests, benchmarks): requests built full / incremental, errors recovered.
        self.full_requests = 0
        self.incremental_requests = 0
        self.session_errors = 0

    @property
    def in_flight(self) -> bool:
        return self._pending is not None

    def build(self, wanted: Mapping[Key, Wanted]) -> FetchPlan:
        """The next request for ``wanted`` (every partition to fetch from this broker)."""
        if self._pending is not None:
            raise RuntimeError("a fetch session allows one request in flight")
        self._pending = dict(wanted)
        if self.epoch == INITIAL_EPOCH:
            self.full_requests += 1
            return FetchPlan(self.session_id, INITIAL_EPOCH, dict(wanted))
        self.incremental_requests += 1
        to_send = {k: w for k, w in wanted.items() if self.session.get(k) != w}
        forgotten = [k for k in self.session if k not in wanted]
        return FetchPlan(self.session_id, self.epoch, to_send, forgotten)

    def handle_response(self, error_code: int, session_id: int) -> bool:
        """Apply the response's top-level fields; False when its partitions are not to be
        used (a session error: the next request is full)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return False  # closed or reset while the request was out: not this session's
        full = self.epoch == INITIAL_EPOCH
        if error_code:
            self.session_errors += 1
            if error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND:
                self._reset(INVALID_SESSION_ID)
            else:
                # Ask for a new session, closing this one (Kafka's handler does the same).
                self._reset(self.session_id)
            return False
        if session_id == INVALID_SESSION_ID:
            # The broker made no session (full) or closed it (incremental): go on full.
            self._reset(INVALID_SESSION_ID)
            return True
        if not full and session_id != self.session_id:
            self.session_errors += 1
            self._reset(self.session_id)
            return False
        self.session_id = session_id
        self.epoch = next_epoch(self.epoch)
        self.session = pending
        return True

    def handle_error(self) -> None:
        """The request failed or was given up (no response): its effect on the session is
        unknown, so the next one is full and replaces the session."""
        self._pending = None
        self._reset(self.session_id)

    def close(self) -> FetchPlan | None:
        """A request closing the session (epoch -1 with its id, no partitions), if any is
        open; afterwards the handler starts over."""
        if self.session_id == INVALID_SESSION_ID:
            return None
        plan = FetchPlan(self.session_id, FINAL_EPOCH, {})
        self._pending = None
        self._reset(INVALID_SESSION_ID)
        return plan

    def _reset(self, session_id: int) -> None:
        self.session_id = session_id
        self.epoch = INITIAL_EPOCH
        self.session = {}


def fetch_request(
    version: int,
    plan: FetchPlan,
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    isolation_level: int,
) -> Any:
    """The Fetch request of ``plan`` (a consumer's: no replica id). Each partition carries
    the leader epoch the consumer's metadata knows (KIP-320; -1: unknown), so a leader that
    lost its leadership, or one the metadata is ahead of, refuses the fetch
    (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH) instead of serving from a stale log."""
    topics: dict[str, list[Any]] = {}
    for (topic, partition), (offset, part_max, epoch) in plan.to_send.items():
        topics.setdefault(topic, []).append(
            make_request(
                ApiKey.FETCH,
                version,
                "FetchPartition",
                partition=partition,
                current_leader_epoch=epoch,
                fetch_offset=offset,
                last_fetched_epoch=-1,
                log_start_offset=-1,
                partition_max_bytes=part_max,
            )
        )
    forgotten: dict[str, list[int]] = {}
    for topic, partition in plan.forgotten:
        forgotten.setdefault(topic, []).append(partition)
    return make_request(
        ApiKey.FETCH,
        version,
        "FetchRequest",
        cluster_id=None,
        replica_id=-1,
        max_wait=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        session_id=plan.session_id,
        session_epoch=plan.epoch,
        topics=tuple(
            make_request(ApiKey.FETCH, version, "FetchTopic", topic=t, partitions=tuple(p))
            for t, p in topics.items()
        ),
        forgotten_topics_data=tuple(
            make_request(ApiKey.FETCH, version, "ForgottenTopic", topic=t, partitions=tuple(p))
            for t, p in forgotten.items()
        ),
        rack_id="",
    )
