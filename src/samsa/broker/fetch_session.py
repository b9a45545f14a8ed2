"""Fetch sessions (KIP-227): incremental Fetch requests and responses.

A client opens a session with a full Fetch of epoch 0 (``INITIAL_EPOCH``); the response
carries a session id. Its next requests name the session and the epoch it expects (1, 2,
...) and list only the partitions whose fetch offset or size changed, plus partitions to
forget; the broker fetches every partition of the session and answers only those with news:
records, an error, or a high watermark or log start offset that moved since the session last
told the client. Epoch -1 (``FINAL_EPOCH``) with session id 0 is a sessionless fetch (what
librdkafka sends); a full fetch naming a session closes it.

Bounds, as Kafka's ``FetchSessionCache``: at most ``max.incremental.fetch.session.cache.slots``
sessions. A full fetch that finds no free slot may evict, in this order: the least recently
used session if unused for ``EVICTION_MS``; else the smallest session (fewest partitions, then
lowest id) among those older than ``EVICTION_MS``, when the new one has more partitions; else
no session is made (session id 0 in the response, the client goes on with full fetches).
samsa's own bound: all sessions together hold at most ``MAX_CACHED_PARTITIONS`` partitions
(Kafka has none, and partitions named in requests need not exist: 1000 sessions of 100,000
made-up partitions each would be gigabytes). A full fetch whose session would not fit (after
evicting stale sessions) gets none; an incremental one that would grow its session past the
bound closes it and is answered FETCH_SESSION_ID_NOT_FOUND, on which clients start over with
a full fetch.

Sans-IO: the cache is told the time (milliseconds); the handler does the reading.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from samsa.protocol.errors import ErrorCode

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
# Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS: how long a session is safe from eviction
# after creation, and unused for how long it is stale.
EVICTION_MS = 120_000
MAX_CACHED_PARTITIONS = 100_000  # ~100 bytes each

TopicKey = str | uuid.UUID  # a name up to Fetch v12, a topic id from v13 (KIP-516)


def next_epoch(epoch: int) -> int:
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == 0x7FFFFFFF else epoch + 1


@dataclass(slots=True)
class CachedPartition:
    """One partition of a session: what the client asks for and what it was last told. Its
    attribute names match the Fetch request's partition entries, so the handler reads
    either the same way."""

    partition: int
    fetch_offset: int
    partition_max_bytes: int
    high_watermark: int = -1
    log_start_offset: int = -1

    def must_respond(self, error_code: int, high_watermark: int, log_start_offset: int,
                     records_size: int) -> bool:  # fmt: skip
        """Whether the response must carry this partition; remembers what it tells."""
        respond = records_size > 0
        if self.high_watermark != high_watermark:
            self.high_watermark = high_watermark
            respond = True
        if self.log_start_offset != log_start_offset:
            self.log_start_offset = log_start_offset
            respond = True
        if error_code:
            # Re-sent once the error is gone: the next high watermark will differ.
            self.high_watermark = -1
            respond = True
        return respond


@dataclass(slots=True)
class FetchSession:
    id: int
    uses_topic_ids: bool
    created_ms: int
    last_used_ms: int
    epoch: int  # the epoch the next incremental request must carry
    # Fetch order: partitions answered move to the end, so that each gets its turn at the
    # front when the response size limit bites.
    partitions: dict[tuple[TopicKey, int], CachedPartition] = field(default_factory=dict)

    def fetch_list(self) -> list[tuple[TopicKey, list[CachedPartition]]]:
        """The session's partitions grouped by topic, in fetch order (a topic whose
        partitions are not adjacent appears more than once, as Kafka allows)."""
        out: list[tuple[TopicKey, list[CachedPartition]]] = []
        for (topic, _p), cached in self.partitions.items():
            if out and out[-1][0] == topic:
                out[-1][1].append(cached)
            else:
                out.append((topic, [cached]))
        return out


@dataclass(slots=True)
class SessionContext:
    """How one Fetch request relates to sessions.

    ``error``: answer with this top-level error and no partitions. Otherwise fetch
    ``topics``; ``session`` is the incremental session (None: a full fetch) and
    ``create`` says whether a full fetch should try to open a session.
    """

    topics: list[tuple[TopicKey, Sequence[Any]]]
    session: FetchSession | None = None
    create: bool = False
    error: int = ErrorCode.NONE
    expected_epoch: int = 0  # the session's epoch once this request is applied


class FetchSessionCache:
    def __init__(self, max_entries: int = 1000, eviction_ms: int = EVICTION_MS,
                 max_partitions: int = MAX_CACHED_PARTITIONS,
                 rng: random.Random | None = None) -> None:  # fmt: skip
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self.max_partitions = max_partitions
        self._rng = rng or random.Random()
        self.sessions: dict[int, FetchSession] = {}
        self._cached = 0  # partitions held by all sessions
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.sessions)

    @property
    def total_partitions(self) -> int:
        return self._cached

    def _remove(self, session_id: int) -> None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self._cached -= len(session.partitions)

    # -- requests -----------------------------------------------------------------------------

    def new_context(self, version: int, request: Any, now_ms: int) -> SessionContext:
        """Apply the request's session fields (Kafka's FetchManager.newContext)."""
        uses_ids = version >= 13
        topics = [(_topic_key(t, uses_ids), t.partitions) for t in request.topics]
        if version < 7:
            return SessionContext(topics)
        session_id, epoch = request.session_id, request.session_epoch
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):  # a full fetch
            if session_id != INVALID_SESSION_ID:
                self._remove(session_id)  # a full fetch closes the session it names
            return SessionContext(topics, create=epoch == INITIAL_EPOCH)
        session = self.sessions.get(session_id)
        if session is None:
            return SessionContext([], error=ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != epoch:
            return SessionContext([], error=ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        if session.uses_topic_ids != uses_ids:
            return SessionContext([], error=ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR)
        parts = session.partitions
        before = len(parts)
        for topic, requested in topics:
            for req in requested:
                cached = parts.get((topic, req.partition))
                if cached is None:
                    parts[(topic, req.partition)] = CachedPartition(
                        req.partition, req.fetch_offset, req.partition_max_bytes
                    )
                else:
                    cached.fetch_offset = req.fetch_offset
                    cached.partition_max_bytes = req.partition_max_bytes
        for forgotten in request.forgotten_topics_data:
            topic = _topic_key(forgotten, uses_ids)
            for p in forgotten.partitions:
                parts.pop((topic, p), None)
        self._cached += len(parts) - before
        if self._cached > self.max_partitions:
            self._remove(session.id)
            return SessionContext([], error=ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if not parts:
            # Nothing left to fetch: Kafka closes the session and answers sessionless.
            self._remove(session.id)
            return SessionContext(topics)
        session.last_used_ms = now_ms
        session.epoch = next_epoch(session.epoch)
        return SessionContext(session.fetch_list(), session, expected_epoch=session.epoch)

    def still_current(self, ctx: SessionContext) -> bool:
        """False when another request moved the session on (or closed it) while this one
        waited: Kafka answers such a request INVALID_FETCH_SESSION_EPOCH."""
        s = ctx.session
        return s is None or (self.sessions.get(s.id) is s and s.epoch == ctx.expected_epoch)

    # -- responses ----------------------------------------------------------------------------

    def respond_incremental(
        self, ctx: SessionContext, results: list[tuple[TopicKey, list[Any]]]
    ) -> list[tuple[TopicKey, list[Any]]]:
        """Keep the partitions with news, move them to the end of the fetch order."""
        session = ctx.session
        assert session is not None
        parts = session.partitions
        out: list[tuple[TopicKey, list[Any]]] = []
        for topic, answered in results:
            kept = []
            for r in answered:
                cached = parts.get((topic, r.index))
                if cached is None or cached.must_respond(
                    r.error_code, r.high_watermark, r.log_start_offset, r.records_size
                ):
                    kept.append(r)
                    if cached is not None:
                        del parts[(topic, r.index)]
                        parts[(topic, r.index)] = cached
            if kept:
                if out and out[-1][0] == topic:
                    out[-1][1].extend(kept)
                else:
                    out.append((topic, kept))
        return out

    def maybe_create(
        self,
        version: int,
        requested: Iterable[tuple[TopicKey, Sequence[Any]]],
        results: list[tuple[TopicKey, list[Any]]],
        now_ms: int,
    ) -> int:
        """A session for a full fetch of epoch 0, remembering what the response tells;
        its id, or 0 when there is no room (Kafka's maybeCreateSession)."""
        offsets = {(t, r.partition): r for t, reqs in requested for r in reqs}
        size = len(offsets)
        while self._cached + size > self.max_partitions:
            if not self._evict_stale(now_ms):
                return INVALID_SESSION_ID
        if len(self.sessions) >= self.max_entries and not self._try_evict(size, now_ms):
            return INVALID_SESSION_ID
        session_id = self._new_id()
        session = FetchSession(session_id, version >= 13, now_ms, now_ms, next_epoch(INITIAL_EPOCH))
        for topic, answered in results:
            for r in answered:
                req = offsets.get((topic, r.index))
                if req is None:
                    continue
                cached = CachedPartition(r.index, req.fetch_offset, req.partition_max_bytes)
                cached.must_respond(r.error_code, r.high_watermark, r.log_start_offset, 0)
                session.partitions[(topic, r.index)] = cached
        self.sessions[session_id] = session
        self._cached += len(session.partitions)
        return session_id

    def _try_evict(self, size: int, now_ms: int) -> bool:
        # Consumers' sessions are all unprivileged (samsa has no followers), so Kafka's two
        # evictable sets are one: sessions created more than eviction_ms ago.
        if not self.sessions:
            return False
        if self._evict_stale(now_ms):
            return True
        old = [s for s in self.sessions.values() if now_ms - s.created_ms > self.eviction_ms]
        if not old:
            return False
        victim = min(old, key=lambda s: (len(s.partitions), s.id))
        if (size, 0) < (len(victim.partitions), victim.id):
            return False
        self._remove(victim.id)
        self.evictions += 1
        return True

    def _evict_stale(self, now_ms: int) -> bool:
        """Evict the least recently used session if unused for more than eviction_ms."""
        if not self.sessions:
            return False
        lru = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now_ms - lru.last_used_ms <= self.eviction_ms:
            return False
        self._remove(lru.id)
        self.evictions += 1
        return True

    def _new_id(self) -> int:
        while True:
            session_id = self._rng.randint(1, 0x7FFFFFFE)
            if session_id not in self.sessions:
                return session_id


def _topic_key(topic: Any, uses_ids: bool) -> TopicKey:
    return topic.topic_id if uses_ids else topic.topic
