"""The checker: every anomaly class of Jepsen's Kafka checker, over a history (pure).

Theory of operation
-------------------
Input: a :class:`~samsa.verify.history.History` of send/poll/txn operations (see there).
Values are unique, so a (key, value) pair names one write.

*Version orders.* For each key, every offset gets the set of values anybody claimed to be
there: polls of any operation (a read is an observation whatever became of the reader), and
sends of operations that must have committed (``ok``, or ``info`` with one of their writes
read by someone). Offsets holding nothing known are dropped, so an index counts the values
before a value in the log (transaction markers and aborted records leave offset gaps).

Classes (``KINDS``), each reported with the operations that show it:

* ``inconsistent-offsets``: two values at one offset; ``duplicate``: one value at two offsets.
* ``lost-write``: a value that must have committed, placed in the log below the highest
  index someone read, never read by anyone. ``unseen``: acknowledged (its operation ok) and
  never read by the end (only for the final check, when every partition was read to its end).
* ``G1a``: a value whose writing operation failed (aborted) was read.
* ``precommitted-read``: an operation read a value it wrote itself (read_committed
  consumers must never see an open transaction, their own included).
* ``G1b``: a transaction (ok or info) whose writes were read in part by the end.
* ``poll-skip`` / ``nonmonotonic-poll``: per process, an operation's first read of a key is
  not right after (skips values) or not after (goes back) where the previous one stopped.
  Keys whose assignment changed in between (``rebalance``) are excused.
  ``nonmonotonic-send``: per process, a send lands at or before the previous send to its key.
* ``int-poll-skip`` / ``int-nonmonotonic-poll`` / ``int-send-skip`` /
  ``int-nonmonotonic-send``: the same, between micro-operations of one operation.
* ``unknown-value``: a read value nobody wrote.
* Cycles (Elle's method): a graph over ok/info operations with edges ``ww`` (the writer of a
  value to the writer of the next value in the key's version order), ``wr`` (the writer of a
  value to each reader of it), ``rw`` (a reader whose last read of a key was v to the writer
  of the value after v), and for the variants ``process`` (consecutive operations of a
  process) and ``realtime`` (a completed before b began; a transitive reduction). For each
  edge set, strongly connected components are found and a shortest cycle through the class's
  characteristic edge is reported with its edges: ``G0`` (ww only), ``G1c`` (ww/wr, one wr
  at least), ``G-single`` (exactly one rw), each also ``-process`` and ``-realtime``.

Allowed by default (:func:`allowed_kinds`), after Jepsen's list for Kafka: ``int-send-skip``
(transactions interleave writes), ``G0`` and, since ww edges come from offsets, ``G1c``
(writes are not isolated); ``G-single`` too (Jepsen draws no rw edges; Kafka polls are no
snapshots, so a reader not yet caught up on one key closes such a cycle); and, in subscribe
mode, ``poll-skip`` and ``nonmonotonic-poll`` (a rebalance moves positions). ``strict``
counts them all.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from samsa.verify.history import FAIL, INFO, OK, History, Op

LOST_WRITE = "lost-write"
UNSEEN = "unseen"
DUPLICATE = "duplicate"
INCONSISTENT = "inconsistent-offsets"
G1A = "G1a"
PRECOMMITTED = "precommitted-read"
G1B = "G1b"
POLL_SKIP = "poll-skip"
NONMONOTONIC_POLL = "nonmonotonic-poll"
NONMONOTONIC_SEND = "nonmonotonic-send"
INT_POLL_SKIP = "int-poll-skip"
INT_NONMONOTONIC_POLL = "int-nonmonotonic-poll"
INT_SEND_SKIP = "int-send-skip"
INT_NONMONOTONIC_SEND = "int-nonmonotonic-send"
UNKNOWN_VALUE = "unknown-value"
CYCLE_KINDS = tuple(
    f"{base}{suffix}"
    for base in ("G0", "G1c", "G-single")
    for suffix in ("", "-process", "-realtime")
)
KINDS = (
    LOST_WRITE,
    UNSEEN,
    DUPLICATE,
    INCONSISTENT,
    G1A,
    PRECOMMITTED,
    G1B,
    POLL_SKIP,
    NONMONOTONIC_POLL,
    NONMONOTONIC_SEND,
    INT_POLL_SKIP,
    INT_NONMONOTONIC_POLL,
    INT_SEND_SKIP,
    INT_NONMONOTONIC_SEND,
    UNKNOWN_VALUE,
    *CYCLE_KINDS,
)
MAX_CASES = 200  # per class: the count stays exact, the examples kept are bounded
MAX_CYCLE_STARTS = 64  # characteristic edges tried per strongly connected component


def allowed_kinds(subscribe: bool = False, strict: bool = False) -> frozenset[str]:
    if strict:
        return frozenset()
    allowed = {INT_SEND_SKIP, *CYCLE_KINDS}
    if subscribe:
        allowed |= {POLL_SKIP, NONMONOTONIC_POLL}
    return frozenset(allowed)


@dataclass
class Anomaly:
    kind: str
    ops: list[int]  # indices of the operations that show it
    explanation: str
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "ops": self.ops, "explanation": self.explanation, **self.data}


@dataclass
class CheckResult:
    cases: dict[str, list[Anomaly]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    allowed: frozenset[str] = frozenset()
    stats: dict[str, Any] = field(default_factory=dict)

    def add(self, a: Anomaly) -> None:
        self.counts[a.kind] = self.counts.get(a.kind, 0) + 1
        found = self.cases.setdefault(a.kind, [])
        if len(found) < MAX_CASES:
            found.append(a)

    @property
    def bad_kinds(self) -> list[str]:
        return [k for k in KINDS if self.counts.get(k) and k not in self.allowed]

    @property
    def ok(self) -> bool:
        return not self.bad_kinds

    def shortest_cycle(self) -> Anomaly | None:
        cycles = [a for k in CYCLE_KINDS for a in self.cases.get(k, [])]
        return min(cycles, key=lambda a: len(a.data["steps"]), default=None)

    def to_json(self) -> dict[str, Any]:
        return {
            "valid": self.ok,
            "bad_kinds": self.bad_kinds,
            "counts": {k: self.counts[k] for k in KINDS if self.counts.get(k)},
            "allowed": sorted(self.allowed),
            "stats": self.stats,
            "cases": {k: [a.to_json() for a in v] for k, v in self.cases.items()},
        }


@dataclass
class _Order:
    log: dict[int, set[int]] = field(default_factory=dict)  # offset -> values
    index_of: dict[int, int] = field(default_factory=dict)  # value -> first dense index
    last_index: dict[int, int] = field(default_factory=dict)  # value -> last dense index
    by_index: list[int] = field(default_factory=list)  # dense index -> a value

    def build(self) -> None:
        for i, off in enumerate(sorted(self.log)):
            values = sorted(self.log[off])
            self.by_index.append(values[0])
            for v in values:
                self.index_of.setdefault(v, i)
                self.last_index[v] = i


class _Analysis:
    def __init__(self, history: History) -> None:
        self.ops = [o for o in history.client_ops() if o.type in (OK, FAIL, INFO)]
        self.by_index = {o.index: o for o in self.ops}
        self.reads = {o.index: o.reads() for o in self.ops}
        self.writer: dict[tuple[int, int], Op] = {}
        self.readers: dict[tuple[int, int], list[Op]] = defaultdict(list)
        for o in self.ops:
            for k, v, _ in o.sends():
                self.writer[(k, v)] = o
            for k, pairs in self.reads[o.index].items():
                for _, v in pairs:
                    rs = self.readers[(k, v)]
                    if not rs or rs[-1] is not o:
                        rs.append(o)
        self.orders: dict[int, _Order] = defaultdict(_Order)
        for o in self.ops:
            for k, pairs in self.reads[o.index].items():
                for off, v in pairs:
                    self.orders[k].log.setdefault(off, set()).add(v)
            if self.must_have_committed(o):
                for k, v, off in o.sends():
                    if off is not None and off >= 0:
                        self.orders[k].log.setdefault(off, set()).add(v)
        for order in self.orders.values():
            order.build()

    def must_have_committed(self, o: Op) -> bool:
        if o.type == OK:
            return True
        return o.type == INFO and any((k, v) in self.readers for k, v, _ in o.sends())

    def idx(self, k: int, v: int) -> int | None:
        order = self.orders.get(k)
        return None if order is None else order.index_of.get(v)


def _name(o: Op) -> str:
    return f"op {o.index} (process {o.process}, {o.type}, {o.start:.2f}-{o.end:.2f}s)"


def check(
    history: History,
    *,
    final: bool = True,
    subscribe: bool = False,
    strict: bool = False,
    cycles: bool = True,
) -> CheckResult:
    """Analyse ``history``; ``final``: every partition was read to its end (else no unseen)."""
    a = _Analysis(history)
    result = CheckResult(allowed=allowed_kinds(subscribe, strict))
    _stats(a, result)
    _orders(a, result)
    _unknown_values(a, result)
    _lost_and_unseen(a, result, final)
    _aborted_and_precommitted(a, result)
    if final:
        _torn(a, result)
    _per_process(a, result)
    _internal(a, result)
    if cycles:
        _cycles(a, result)
    return result


def _stats(a: _Analysis, result: CheckResult) -> None:
    types = Counter(o.type for o in a.ops)
    sends = [(o, s) for o in a.ops for s in o.sends()]
    result.stats = {
        "ops": len(a.ops),
        "ok": types[OK],
        "fail": types[FAIL],
        "info": types[INFO],
        "txns": sum(1 for o in a.ops if o.f == "txn"),
        "sent": len(sends),
        "acked": sum(1 for o, s in sends if o.type == OK and s[2] is not None),
        "values_read": len(a.readers),
        "reads": sum(len(p) for r in a.reads.values() for p in r.values()),
    }


def _orders(a: _Analysis, result: CheckResult) -> None:
    seen_at: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k, order in sorted(a.orders.items()):
        for off in sorted(order.log):
            values = order.log[off]
            for v in values:
                seen_at[(k, v)].append(off)
            if len(values) > 1:
                ops = sorted(
                    {w.index for v in values if (w := a.writer.get((k, v))) is not None}
                    | {r.index for v in values for r in a.readers.get((k, v), [])}
                )
                result.add(
                    Anomaly(
                        INCONSISTENT,
                        ops[:12],
                        f"key {k} offset {off} holds values {sorted(values)} "
                        "(acknowledged or read there by different operations)",
                        {"key": k, "offset": off, "values": sorted(values)},
                    )
                )
    for (k, v), offsets in sorted(seen_at.items()):
        if len(offsets) > 1:
            ops = [r.index for r in a.readers.get((k, v), [])][:12]
            result.add(
                Anomaly(
                    DUPLICATE,
                    ops,
                    f"value {v} of key {k} appears at offsets {offsets}",
                    {"key": k, "value": v, "offsets": offsets},
                )
            )


def _unknown_values(a: _Analysis, result: CheckResult) -> None:
    for (k, v), readers in sorted(a.readers.items()):
        if (k, v) not in a.writer:
            result.add(
                Anomaly(
                    UNKNOWN_VALUE,
                    [r.index for r in readers][:12],
                    f"value {v} read from key {k} was never sent",
                    {"key": k, "value": v},
                )
            )


def _lost_and_unseen(a: _Analysis, result: CheckResult, final: bool) -> None:
    lost: set[tuple[int, int]] = set()
    for k, order in sorted(a.orders.items()):
        read_idx = [order.index_of[v] for (kk, v) in a.readers if kk == k and v in order.index_of]
        bound = max(read_idx, default=-1)
        if bound < 0:
            continue
        top_value = order.by_index[bound]
        top_reader = next(iter(a.readers.get((k, top_value), [])), None)
        for v, last in order.last_index.items():
            if last > bound or (k, v) in a.readers:
                continue
            w = a.writer.get((k, v))
            if w is None or not a.must_have_committed(w):
                continue
            lost.add((k, v))
            ops = [w.index] + ([top_reader.index] if top_reader is not None else [])
            result.add(
                Anomaly(
                    LOST_WRITE,
                    ops,
                    f"value {v} of key {k} at index {order.index_of[v]}, written by {_name(w)}, "
                    f"was never read, though index {bound} (value {top_value}) was"
                    + (f" by {_name(top_reader)}" if top_reader is not None else ""),
                    {"key": k, "value": v, "index": order.index_of[v], "max_read_index": bound},
                )
            )
    if not final:
        return
    for o in a.ops:
        if o.type != OK:
            continue
        for k, v, off in o.sends():
            if (k, v) not in a.readers and (k, v) not in lost:
                result.add(
                    Anomaly(
                        UNSEEN,
                        [o.index],
                        f"value {v} of key {k}, acknowledged"
                        + (f" at offset {off}" if off is not None else "")
                        + f" to {_name(o)}, was never read",
                        {"key": k, "value": v, "offset": off},
                    )
                )


def _aborted_and_precommitted(a: _Analysis, result: CheckResult) -> None:
    for (k, v), readers in sorted(a.readers.items()):
        w = a.writer.get((k, v))
        if w is None:
            continue
        if w.type == FAIL:
            for r in readers:
                result.add(
                    Anomaly(
                        G1A,
                        [w.index, r.index],
                        f"{_name(r)} read value {v} of key {k}, written by the aborted {_name(w)}",
                        {"key": k, "value": v, "writer": w.index, "reader": r.index},
                    )
                )
        if any(r is w for r in readers):
            result.add(
                Anomaly(
                    PRECOMMITTED,
                    [w.index],
                    f"{_name(w)} read value {v} of key {k}, which it had sent itself "
                    "in its still open transaction",
                    {"key": k, "value": v},
                )
            )


def _torn(a: _Analysis, result: CheckResult) -> None:
    for o in a.ops:
        sends = o.sends()
        if o.f != "txn" or o.type == FAIL or len(sends) < 2:
            continue
        seen = [(k, v) for k, v, _ in sends if (k, v) in a.readers]
        if seen and len(seen) < len(sends):
            missing = [(k, v) for k, v, _ in sends if (k, v) not in a.readers]
            readers = sorted({r.index for kv in seen for r in a.readers[kv]})[:8]
            result.add(
                Anomaly(
                    G1B,
                    [o.index, *readers],
                    f"transaction {_name(o)} was seen in part: read {seen}, never read {missing}",
                    {"read": seen, "missing": missing},
                )
            )


def _delta(a: _Analysis, k: int, v1: int, v2: int) -> tuple[int, int | None, int | None]:
    i1, i2 = a.idx(k, v1), a.idx(k, v2)
    return (i2 - i1 if i1 is not None and i2 is not None else 1), i1, i2


def _skipped(a: _Analysis, k: int, i1: int | None, i2: int | None) -> list[int]:
    if i1 is None or i2 is None:
        return []
    return a.orders[k].by_index[i1 + 1 : min(i2, i1 + 9)]


def _per_process(a: _Analysis, result: CheckResult) -> None:
    by_process: dict[int, list[Op]] = defaultdict(list)
    for o in a.ops:
        by_process[o.process].append(o)
    for ops in by_process.values():
        ops.sort(key=lambda o: (o.start, o.index))
        last_read: dict[int, tuple[Op, int]] = {}
        last_send: dict[int, tuple[Op, int]] = {}
        for o in ops:
            for k in o.rebalance:
                last_read.pop(k, None)
            for k, pairs in a.reads[o.index].items():
                if not pairs:
                    continue
                if k in last_read:
                    prev, v1 = last_read[k]
                    v2 = pairs[0][1]
                    d, i1, i2 = _delta(a, k, v1, v2)
                    if d != 1:
                        kind = POLL_SKIP if d > 1 else NONMONOTONIC_POLL
                        what = (
                            f"skipped {d - 1} value(s) {_skipped(a, k, i1, i2)}"
                            if d > 1
                            else "went back"
                            if d < 0
                            else "read it again"
                        )
                        result.add(
                            Anomaly(
                                kind,
                                [prev.index, o.index],
                                f"process {o.process} read key {k} up to value {v1} (index {i1}) "
                                f"in op {prev.index}, then began at value {v2} (index {i2}) "
                                f"in op {o.index}: {what}",
                                {"key": k, "values": [v1, v2], "delta": d},
                            )
                        )
                last_read[k] = (o, pairs[-1][1])
            if o.type not in (OK, INFO):
                continue
            sent: dict[int, list[int]] = defaultdict(list)
            for k, v, _ in o.sends():
                sent[k].append(v)
            for k, vs in sent.items():
                if k in last_send:
                    prev, v1 = last_send[k]
                    d, i1, i2 = _delta(a, k, v1, vs[0])
                    if d < 1:
                        result.add(
                            Anomaly(
                                NONMONOTONIC_SEND,
                                [prev.index, o.index],
                                f"process {o.process} sent value {v1} to key {k} (index {i1}) "
                                f"in op {prev.index}, then value {vs[0]} which landed at index "
                                f"{i2}, not after it, in op {o.index}",
                                {"key": k, "values": [v1, vs[0]], "delta": d},
                            )
                        )
                last_send[k] = (o, vs[-1])


def _internal(a: _Analysis, result: CheckResult) -> None:
    for o in a.ops:
        excused = set(o.rebalance)
        for k, pairs in a.reads[o.index].items():
            if k in excused:
                continue
            for (_, v1), (_, v2) in pairwise(pairs):
                d, i1, i2 = _delta(a, k, v1, v2)
                if d != 1:
                    kind = INT_POLL_SKIP if d > 1 else INT_NONMONOTONIC_POLL
                    result.add(
                        Anomaly(
                            kind,
                            [o.index],
                            f"within {_name(o)}, key {k}: value {v1} (index {i1}) then {v2} "
                            f"(index {i2})"
                            + (f", skipping {_skipped(a, k, i1, i2)}" if d > 1 else ""),
                            {"key": k, "values": [v1, v2], "delta": d},
                        )
                    )
        if o.type == FAIL:
            continue
        sent: dict[int, list[int]] = defaultdict(list)
        for k, v, _ in o.sends():
            sent[k].append(v)
        for k, vs in sent.items():
            for v1, v2 in pairwise(vs):
                d, i1, i2 = _delta(a, k, v1, v2)
                if d != 1:
                    kind = INT_SEND_SKIP if d > 1 else INT_NONMONOTONIC_SEND
                    result.add(
                        Anomaly(
                            kind,
                            [o.index],
                            f"within {_name(o)}, key {k}: sent {v1} (index {i1}) then {v2} "
                            f"(index {i2})",
                            {"key": k, "values": [v1, v2], "delta": d},
                        )
                    )


# --- cycles ----------------------------------------------------------------------------------

Edges = dict[int, dict[int, set[str]]]  # a -> b -> edge types


def _link(g: Edges, x: int, y: int, rel: str) -> None:
    if x != y:
        g.setdefault(x, {}).setdefault(y, set()).add(rel)


def _graph(a: _Analysis) -> tuple[Edges, dict[tuple[int, int, str], str]]:
    """Every edge over ok/info operations, and why it exists (first reason per edge)."""
    g: Edges = {}
    why: dict[tuple[int, int, str], str] = {}

    def link(x: Op, y: Op, rel: str, reason: str) -> None:
        if x is y or x.type == FAIL or y.type == FAIL:
            return
        _link(g, x.index, y.index, rel)
        why.setdefault((x.index, y.index, rel), reason)

    for k, order in a.orders.items():
        prev: Op | None = None
        prev_v = -1
        for v in order.by_index:
            w = a.writer.get((k, v))
            if w is not None and prev is not None:
                link(prev, w, "ww", f"sent {prev_v} to key {k} before {v} was")
            if w is not None:
                prev, prev_v = w, v
    for (k, v), readers in a.readers.items():
        w = a.writer.get((k, v))
        if w is None:
            continue
        for r in readers:
            link(w, r, "wr", f"sent {v} to key {k}, which was read")
    for o in a.ops:
        for k, pairs in a.reads[o.index].items():
            if not pairs:
                continue
            v = pairs[-1][1]
            i = a.idx(k, v)
            order = a.orders[k]
            if i is None or i + 1 >= len(order.by_index):
                continue
            nxt = order.by_index[i + 1]
            w = a.writer.get((k, nxt))
            if w is not None:
                link(o, w, "rw", f"read key {k} up to {v}, not {nxt}, which was sent")
    by_process: dict[int, list[Op]] = defaultdict(list)
    for o in a.ops:
        by_process[o.process].append(o)
    for ops in by_process.values():
        ops.sort(key=lambda o: (o.start, o.index))
        for x, y in pairwise(ops):
            link(x, y, "process", "came next in the same process")
    # Realtime order, reduced: each op follows the ops completed before it began that no
    # other such op follows (Elle's frontier), instead of all of them.
    events = sorted(
        [(o.start, 1, o.index) for o in a.ops if o.type == OK]
        + [(o.end, 0, o.index) for o in a.ops if o.type == OK]
    )
    frontier: set[int] = set()
    preds: dict[int, set[int]] = {}
    for _, kind, idx in events:
        if kind == 1:
            preds[idx] = set(frontier)
            for p in frontier:
                link(a.by_index[p], a.by_index[idx], "realtime", "completed before it began")
        else:
            frontier -= preds.get(idx, set())
            frontier.add(idx)
    return g, why


def _sccs(nodes: Iterable[int], succ: dict[int, list[int]]) -> list[list[int]]:
    """Tarjan's strongly connected components, iteratively; only those of 2+ nodes."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on.add(v)
            succs = succ.get(v, [])
            if i < len(succs):
                work.append((v, i + 1))
                w = succs[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def _bfs(
    start: int, goal: int, succ: dict[int, list[tuple[int, str]]], rw_budget: int
) -> list[tuple[int, str, int]] | None:
    """Shortest path start -> goal using exactly ``rw_budget`` rw edges."""
    seen = {(start, rw_budget)}
    parent: dict[tuple[int, int], tuple[tuple[int, int], str]] = {}
    queue = deque([(start, rw_budget)])
    while queue:
        state = queue.popleft()
        node, budget = state
        if node == goal and budget == 0:
            path = []
            while state in parent:
                prev, rel = parent[state]
                path.append((prev[0], rel, state[0]))
                state = prev
            return path[::-1]
        for nxt, rel in succ.get(node, []):
            b = budget - (rel == "rw")
            if b < 0 or (nxt, b) in seen:
                continue
            seen.add((nxt, b))
            parent[(nxt, b)] = (state, rel)
            queue.append((nxt, b))
    return None


# (class, edge types, characteristic edge the cycle goes through, rw edges in the rest)
_CYCLE_SEARCHES = (
    ("G0", {"ww"}, "ww", 0),
    ("G1c", {"ww", "wr"}, "wr", 0),
    ("G-single", {"ww", "wr", "rw"}, "rw", 0),
    ("G0-process", {"ww", "process"}, "process", 0),
    ("G1c-process", {"ww", "wr", "process"}, "process", 0),
    ("G-single-process", {"ww", "wr", "rw", "process"}, "process", 1),
    ("G0-realtime", {"ww", "realtime"}, "realtime", 0),
    ("G1c-realtime", {"ww", "wr", "realtime"}, "realtime", 0),
    ("G-single-realtime", {"ww", "wr", "rw", "realtime"}, "realtime", 1),
)


def _classify(steps: list[tuple[int, str, int]]) -> str:
    rels = {r for _, r, _ in steps}
    base = "G-single" if "rw" in rels else "G1c" if "wr" in rels else "G0"
    if "realtime" in rels:
        return base + "-realtime"
    if "process" in rels:
        return base + "-process"
    return base


def find_cycles(g: Edges) -> list[tuple[str, list[tuple[int, str, int]], int]]:
    """(class, shortest cycle as (from, relation, to) steps, component size), at most one
    per class and strongly connected component."""
    found = []
    for kind, rels, key_rel, rw_rest in _CYCLE_SEARCHES:
        typed: dict[int, list[tuple[int, str]]] = {}
        for x, ys in g.items():
            for y, rs in ys.items():
                for r in sorted(rs & rels):
                    typed.setdefault(x, []).append((y, r))
        succ = {x: sorted({y for y, _ in ys}) for x, ys in typed.items()}
        for comp in _sccs(sorted(succ), succ):
            members = set(comp)
            sub = {x: [(y, r) for y, r in typed.get(x, []) if y in members] for x in members}
            best: list[tuple[int, str, int]] | None = None
            tried = 0
            for x in sorted(members):
                for y, r in sub[x]:
                    if r != key_rel or tried >= MAX_CYCLE_STARTS:
                        continue
                    tried += 1
                    rest = _bfs(y, x, sub, rw_rest)
                    if rest is None:
                        continue
                    cyc = [(x, r, y), *rest]
                    if _classify(cyc) == kind and (best is None or len(cyc) < len(best)):
                        best = cyc
            if best is not None:
                found.append((kind, best, len(comp)))
    return found


def _cycles(a: _Analysis, result: CheckResult) -> None:
    g, why = _graph(a)
    for kind, cyc, size in find_cycles(g):
        steps = [{"from": x, "rel": r, "to": y, "why": why.get((x, y, r), "")} for x, r, y in cyc]
        text = "; ".join(f"op {s['from']} -{s['rel']}-> op {s['to']} ({s['why']})" for s in steps)
        result.add(
            Anomaly(
                kind,
                [s["from"] for s in steps],
                f"cycle of {len(steps)} operations: {text}",
                {"steps": steps, "scc_size": size},
            )
        )
