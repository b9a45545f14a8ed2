"""Differential scenarios of ListOffsets and Fetch: special timestamps and lookups by time,
offsets out of range, byte limits (a whole first batch always, KIP-74; a cut last batch),
min_bytes long polls (whether the broker waited, not how long) and incremental fetch sessions
(KIP-227)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from _scenario import TS, topic

from samsa.client._fetch_session import FetchPlan
from samsa.client._fetch_session import fetch_request as session_fetch_request
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import FETCH_VERSION
from samsa.testing.oracle import Outcome, Side

Run = Callable[..., Outcome]

EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED, PENDING_UPLOAD = (
    -2,
    -1,
    -3,
    -4,
    -5,
    -6,
)


def plain(*stamps: int, size: int = 1, value: bytes = b"v") -> bytes:
    """A non-idempotent batch, one record per timestamp offset from :data:`TS`."""
    return build_batch(
        [NewRecord(value=value * size, timestamp=TS + d) for d in stamps],
    )


def list_offsets(
    s: Side, label: str, parts: dict[tuple[str, int], int], v: int = 8, isolation: int = 0
) -> Any:
    by_topic: dict[str, list[tuple[int, int]]] = {}
    for (t, p), ts in parts.items():
        by_topic.setdefault(t, []).append((p, ts))
    req = make_request(
        ApiKey.LIST_OFFSETS, v, "ListOffsetsRequest", replica_id=-1, isolation_level=isolation,
        topics=tuple(
            make_request(
                ApiKey.LIST_OFFSETS, v, "ListOffsetsTopic", name=t,
                partitions=tuple(
                    make_request(ApiKey.LIST_OFFSETS, v, "ListOffsetsPartition",
                                 partition_index=p, current_leader_epoch=-1, timestamp=ts)
                    for p, ts in ps
                ),
            )
            for t, ps in by_topic.items()
        ),
    )  # fmt: skip
    return s.call(label, ApiKey.LIST_OFFSETS, v, req)


def test_list_offsets_special_timestamps_and_lookup_by_time(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = topic(s, 2)
        list_offsets(s, "empty", {(t, 0): EARLIEST, (t, 1): LATEST})
        list_offsets(s, "empty-max-ts", {(t, 0): MAX_TIMESTAMP})
        list_offsets(s, "empty-by-time", {(t, 0): TS})
        s.produce("b0", {(t, 0): plain(0, 10, 5)})  # offsets 0-2, max timestamp at 1
        s.produce("b1", {(t, 0): plain(20, 30)})  # offsets 3-4
        s.produce("b2", {(t, 0): plain(25)})  # offset 5, older than offset 4
        for name, ts in [
            ("earliest", EARLIEST), ("latest", LATEST), ("max-ts", MAX_TIMESTAMP),
            ("earliest-local", EARLIEST_LOCAL), ("at-first", TS), ("between", TS + 7),
            ("exact-later", TS + 20), ("in-batch", TS + 26), ("after-last", TS + 31),
            ("long-ago", 1),
        ]:  # fmt: skip
            list_offsets(s, name, {(t, 0): ts})
        list_offsets(s, "v1-max-ts-unsupported", {(t, 0): MAX_TIMESTAMP}, v=1)
        list_offsets(s, "v7-max-ts", {(t, 0): MAX_TIMESTAMP}, v=7)
        list_offsets(s, "v7-earliest-local-unsupported", {(t, 0): EARLIEST_LOCAL}, v=7)
        list_offsets(s, "v8-latest-tiered-unsupported", {(t, 0): LATEST_TIERED}, v=8)
        list_offsets(s, "v9-latest-tiered", {(t, 0): LATEST_TIERED}, v=9)
        list_offsets(s, "v9-pending-upload-unsupported", {(t, 0): PENDING_UPLOAD}, v=9)
        list_offsets(s, "unknown-partition", {(t, 0): LATEST, (t, 7): LATEST})
        list_offsets(s, "unknown-topic", {(s.unique("missing"), 0): LATEST})

    differential(scenario)


def test_fetch_offsets_out_of_range_and_at_the_end(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = topic(s, 2)
        s.produce("b0", {(t, 0): plain(0, 1, 2)})
        s.fetch("from-0", {(t, 0): 0})
        s.fetch("mid-batch", {(t, 0): 1})
        s.fetch("at-end", {(t, 0): 3})
        s.fetch("past-end", {(t, 0): 4, (t, 1): 0})
        s.fetch("negative", {(t, 0): -1})
        s.fetch("unknown-partition", {(t, 0): 0, (t, 9): 0})
        s.fetch("unknown-topic", {(s.unique("missing"), 0): 0})

    differential(scenario)


def test_fetch_byte_limits(differential: Run) -> None:
    """A partition's first batch comes whole even over the limits (KIP-74); after it only
    whole batches within partition_max_bytes and max_bytes."""

    def scenario(s: Side) -> None:
        t = topic(s, 2)
        for i in range(3):
            s.produce(f"p0-b{i}", {(t, 0): plain(i, size=400, value=b"a")})
            s.produce(f"p1-b{i}", {(t, 1): plain(i, size=400, value=b"b")})
        both = {(t, 0): 0, (t, 1): 0}
        s.fetch("tiny-partition-limit", both, partition_max_bytes=10)
        s.fetch("tiny-max-bytes", both, max_bytes=10)
        s.fetch("two-batches-per-partition", both, partition_max_bytes=1000)
        s.fetch("three-batches-in-all", both, max_bytes=1400)
        s.fetch("everything", both)

    differential(scenario)


def _timed_fetch(s: Side, label: str, parts: dict[tuple[str, int], int], **options: Any) -> float:
    start = time.monotonic()
    s.fetch(label, parts, **options)
    return time.monotonic() - start


def test_min_bytes_long_poll_waits_and_wakes(differential: Run) -> None:
    """Whether the broker waited, not for how long: with nothing to return it holds the
    fetch for max_wait; an append wakes it; min_bytes more than is there waits too."""

    def scenario(s: Side) -> None:
        t = topic(s)
        s.produce("b0", {(t, 0): plain(0, size=100)})
        waited = _timed_fetch(s, "empty-waits", {(t, 0): 1}, max_wait_ms=600, min_bytes=1)
        s.note("empty-waited", waited >= 0.5)
        # Generous bounds: the machine may be busy; only "waited or not" is compared.
        waited = _timed_fetch(s, "has-data", {(t, 0): 0}, max_wait_ms=10_000, min_bytes=1)
        s.note("has-data-returned-at-once", waited < 5)
        waited = _timed_fetch(s, "min-bytes-more", {(t, 0): 0}, max_wait_ms=600, min_bytes=10**6)
        s.note("min-bytes-more-waited", waited >= 0.5)

        other = s.connect()
        timer = threading.Timer(0.5, lambda: other.request(
            ApiKey.PRODUCE, 9, _produce_req(t, plain(1, size=100))))  # fmt: skip
        timer.start()
        try:
            waited = _timed_fetch(s, "woken", {(t, 0): 1}, max_wait_ms=15_000, min_bytes=1)
        finally:
            timer.join()
        s.note("woken-before-max-wait", 0.4 <= waited < 10)

    differential(scenario)


def test_cut_batches_and_delayed_fetch(differential: Run) -> None:
    """A partition's bytes are cut at the limits inside a batch, and the cut counts toward
    min_bytes and against max_bytes; min_bytes is measured up to partition_max_bytes, not
    max_bytes, before the broker parks a fetch (its raw record sizes are compared: the
    records themselves are compared without a cut last batch)."""

    def sizes(resp: Any) -> dict[int, int]:
        return {int(p.partition_index): len(p.records or b"")
                for t in resp.responses for p in t.partitions}  # fmt: skip

    def scenario(s: Side) -> None:
        t = topic(s, 2)
        for i in range(3):
            s.produce(f"big-{i}", {(t, 0): plain(i, size=400, value=b"a")})
        s.produce("small", {(t, 1): plain(0)})
        both = {(t, 0): 0, (t, 1): 0}
        s.note("cut-at-partition-limit",
               sizes(s.fetch("cut", both, partition_max_bytes=1000)))  # fmt: skip
        s.note("cut-counts-against-max-bytes",
               sizes(s.fetch("budget", both, max_bytes=700)))  # fmt: skip
        start = time.monotonic()
        resp = s.fetch("min-bytes-by-cut", {(t, 0): 0}, partition_max_bytes=700, min_bytes=700,
                       max_wait_ms=10_000)  # fmt: skip
        s.note("min-bytes-by-cut", (sizes(resp), time.monotonic() - start < 5))
        start = time.monotonic()
        resp = s.fetch("min-bytes-over-max-bytes", {(t, 0): 0}, max_bytes=500, min_bytes=1000,
                       max_wait_ms=10_000)  # fmt: skip
        s.note("min-bytes-over-max-bytes", (sizes(resp), time.monotonic() - start < 5))

    differential(scenario)


def _produce_req(t: str, records: bytes) -> Any:
    from samsa.testing import produce_request

    return produce_request({(t, 0): records})


def session_fetch(
    s: Side,
    label: str,
    session_id: int,
    epoch: int,
    parts: dict[tuple[str, int], int],
    forgotten: list[tuple[str, int]] | None = None,
) -> Any:
    plan = FetchPlan(session_id, epoch, {tp: (o, 1 << 20, -1) for tp, o in parts.items()},
                     forgotten or [])  # fmt: skip
    req = session_fetch_request(
        FETCH_VERSION, plan, max_wait_ms=0, min_bytes=1, max_bytes=1 << 24, isolation_level=0
    )
    return s.call(label, ApiKey.FETCH, FETCH_VERSION, req)


def test_incremental_fetch_sessions(differential: Run) -> None:
    """KIP-227: a full fetch at epoch 0 opens a session; incremental fetches name only the
    partitions that changed and get only the partitions with news; a wrong epoch or unknown
    session is refused; epoch -1 closes it."""

    def scenario(s: Side) -> None:
        t = topic(s, 2)
        s.produce("b0", {(t, 0): plain(0), (t, 1): plain(0)})
        full = session_fetch(s, "open", 0, 0, {(t, 0): 0, (t, 1): 0})
        sid = int(full.session_id)
        session_fetch(s, "no-news", sid, 1, {})
        s.produce("b1", {(t, 1): plain(1)})
        session_fetch(s, "news-on-1", sid, 2, {})
        session_fetch(s, "move-0", sid, 3, {(t, 0): 1})
        session_fetch(s, "forget-1", sid, 4, {}, forgotten=[(t, 1)])
        s.produce("b2", {(t, 1): plain(2)})
        session_fetch(s, "forgotten-stays-quiet", sid, 5, {})
        session_fetch(s, "wrong-epoch", sid, 9, {})
        session_fetch(s, "unknown-session", sid + 12345, 1, {})
        session_fetch(s, "sessionless", 0, -1, {(t, 1): 0})
        session_fetch(s, "close", sid, -1, {(t, 0): 0})
        session_fetch(s, "after-close", sid, 6, {})

    differential(scenario)
