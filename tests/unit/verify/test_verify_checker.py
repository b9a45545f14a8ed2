"""The verify checker's self-tests: each anomaly class planted in a small history is found and
explained with the operations that show it; a clean history shows none, even with --strict.

Histories are written by hand with :class:`B`: each operation gets the next index, and by
default runs alone (start = end - 1 = previous end + 1), so realtime order is index order
unless an operation is given ``at=(start, end)``.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest

from samsa.verify.checker import (
    CYCLE_KINDS,
    G1A,
    INT_SEND_SKIP,
    KINDS,
    LOST_WRITE,
    NONMONOTONIC_POLL,
    POLL_SKIP,
    UNSEEN,
    allowed_kinds,
    check,
)
from samsa.verify.history import Fault, History, Op


def send(k: int, v: int, off: int | None) -> list[Any]:
    return ["send", k, v, off]


def poll(**keys: list[tuple[int, int]]) -> list[Any]:
    """poll(k0=[(offset, value), ...]) -> a poll micro-operation on key 0."""
    return ["poll", {int(k[1:]): [list(p) for p in pairs] for k, pairs in keys.items()}]


class B:
    def __init__(self) -> None:
        self.h = History()
        self.t = 0.0

    def op(
        self,
        process: int,
        *mops: list[Any],
        type: str = "ok",
        f: str | None = None,
        at: tuple[float, float] | None = None,
        rebalance: tuple[int, ...] = (),
    ) -> int:
        if at is None:
            at = (self.t + 1, self.t + 2)
            self.t += 2
        if f is None:
            f = "txn" if len(mops) > 1 else mops[0][0]
        idx = len(self.h.ops)
        self.h.ops.append(Op(idx, process, f, type, at[0], at[1], list(mops), None, [*rebalance]))
        return idx


def clean() -> B:
    """Two writers, two keys, a transaction, and a reader that reads both keys to the end."""
    b = B()
    b.op(0, send(0, 1, 0))
    b.op(0, send(0, 2, 1))
    b.op(1, send(1, 3, 0), send(0, 4, 3))  # a transaction; offset 2 of key 0 is its marker
    b.op(1, send(1, 5, 2), type="fail")  # aborted: never read
    b.op(2, poll(k0=[(0, 1), (1, 2)]), poll(k0=[(3, 4)]), f="poll")  # to the end: no rw edge
    b.op(2, poll(k1=[(0, 3)]))
    b.op(5, poll(k0=[(0, 1), (1, 2), (3, 4)], k1=[(0, 3)]))
    return b


def test_clean_history_has_no_anomaly_even_strict() -> None:
    result = check(clean().h, strict=True)
    assert result.counts == {}, result.cases
    assert result.ok
    assert result.stats["ops"] == 7 and result.stats["sent"] == 5 and result.stats["fail"] == 1


# --- each class, planted ------------------------------------------------------------------


def lost_write(b: B) -> tuple[int, ...]:
    w = b.op(0, send(0, 10, 4))
    b.op(0, send(0, 11, 5))
    r = b.op(3, poll(k0=[(0, 1), (1, 2), (3, 4), (5, 11)]))
    return w, r


def unseen(b: B) -> tuple[int, ...]:
    return (b.op(0, send(1, 10, 7)),)


def duplicate(b: B) -> tuple[int, ...]:
    return (b.op(3, poll(k0=[(0, 1), (1, 2), (3, 4), (4, 2)])),)


def inconsistent_offsets(b: B) -> tuple[int, ...]:
    w = b.op(0, send(0, 10, None), type="info")  # never acked, read where 2 is
    r = b.op(3, poll(k0=[(0, 1), (1, 10), (3, 4)]))
    return w, r


def g1a(b: B) -> tuple[int, ...]:
    return 3, b.op(3, poll(k1=[(0, 3), (2, 5)]))


def precommitted(b: B) -> tuple[int, ...]:
    return (b.op(3, send(1, 10, 3), poll(k1=[(0, 3), (3, 10)])),)


def torn(b: B) -> tuple[int, ...]:
    w = b.op(0, send(0, 10, 4), send(1, 11, 3), type="info")
    r = b.op(3, poll(k0=[(4, 10)]))
    return w, r


def poll_skip(b: B) -> tuple[int, ...]:
    return b.op(3, poll(k0=[(0, 1)])), b.op(3, poll(k0=[(3, 4)]))


def nonmonotonic_poll(b: B) -> tuple[int, ...]:
    return b.op(3, poll(k0=[(0, 1), (1, 2)])), b.op(3, poll(k0=[(1, 2)]))


def nonmonotonic_send(b: B) -> tuple[int, ...]:
    x = b.op(3, send(1, 10, 5))
    y = b.op(3, send(1, 11, 4))
    b.op(2, poll(k1=[(4, 11), (5, 10)]))
    return x, y


def int_poll_skip(b: B) -> tuple[int, ...]:
    return (b.op(3, poll(k0=[(0, 1)]), poll(k0=[(3, 4)])),)


def int_nonmonotonic_poll(b: B) -> tuple[int, ...]:
    return (b.op(3, poll(k0=[(1, 2)]), poll(k0=[(0, 1)])),)


def int_send_skip(b: B) -> tuple[int, ...]:
    t = b.op(3, send(1, 10, 3), send(1, 11, 5), at=(20, 30))
    b.op(4, send(1, 12, 4), at=(21, 22))
    b.op(2, poll(k1=[(3, 10), (4, 12), (5, 11)]), at=(40, 41))
    return (t,)


def int_nonmonotonic_send(b: B) -> tuple[int, ...]:
    t = b.op(3, send(1, 10, 4), send(1, 11, 3))
    b.op(2, poll(k1=[(3, 11), (4, 10)]))
    return (t,)


def unknown_value(b: B) -> tuple[int, ...]:
    return (b.op(3, poll(k1=[(9, 99)])),)


def g0(b: B) -> tuple[int, ...]:
    # Two concurrent transactions interleave their writes on two keys in opposite orders.
    t1 = b.op(3, send(0, 10, 4), send(1, 11, 4), at=(20, 30))
    t2 = b.op(4, send(0, 12, 5), send(1, 13, 3), at=(21, 31))
    b.op(2, poll(k0=[(4, 10), (5, 12)], k1=[(3, 13), (4, 11)]), at=(40, 41))
    return t1, t2


def g1c(b: B) -> tuple[int, ...]:
    # Each transaction read what the other wrote: possible only if one read uncommitted data.
    t1 = b.op(3, send(0, 10, 4), poll(k1=[(0, 3), (3, 11)]), at=(20, 30))
    t2 = b.op(4, send(1, 11, 3), poll(k0=[(3, 4), (4, 10)]), at=(21, 31))
    return t1, t2


def g_single(b: B) -> tuple[int, ...]:
    # t1 read key 0 up to 4, but t2's 10 comes next; t2's 11 precedes t1's 12 on key 1.
    t1 = b.op(3, poll(k0=[(3, 4)]), send(1, 12, 4), at=(20, 30))
    t2 = b.op(4, send(0, 10, 4), send(1, 11, 3), at=(21, 31))
    b.op(2, poll(k0=[(4, 10)], k1=[(3, 11), (4, 12)]), at=(40, 41))
    return t1, t2


def g0_process(b: B) -> tuple[int, ...]:
    x = b.op(3, send(1, 10, 4))
    y = b.op(3, send(1, 11, 3))  # the same process, later, but earlier in the log
    b.op(2, poll(k1=[(3, 11), (4, 10)]))
    return x, y


def g0_realtime(b: B) -> tuple[int, ...]:
    x = b.op(3, send(1, 10, 4))
    y = b.op(4, send(1, 11, 3))  # began after x completed, yet earlier in the log
    b.op(2, poll(k1=[(3, 11), (4, 10)]))
    return x, y


def g1c_process(b: B) -> tuple[int, ...]:
    r = b.op(3, poll(k1=[(0, 3), (3, 10)]))  # reads what its own process sends next
    w = b.op(3, send(1, 10, 3))
    return r, w


def g1c_realtime(b: B) -> tuple[int, ...]:
    r = b.op(3, poll(k1=[(0, 3), (3, 10)]))  # reads a value sent after it completed
    w = b.op(4, send(1, 10, 3))
    return r, w


def g_single_process(b: B) -> tuple[int, ...]:
    w = b.op(3, send(1, 10, 3))
    r = b.op(3, poll(k1=[(0, 3)]))  # its own process's earlier write is missing
    b.op(2, poll(k1=[(3, 10)]))
    return w, r


def g_single_realtime(b: B) -> tuple[int, ...]:
    w = b.op(4, send(1, 10, 3))
    r = b.op(3, poll(k1=[(0, 3)]))  # began after w completed, does not see it
    b.op(2, poll(k1=[(3, 10)]))
    return w, r


PLANTS: dict[str, Callable[[B], tuple[int, ...]]] = {
    "lost-write": lost_write,
    "unseen": unseen,
    "duplicate": duplicate,
    "inconsistent-offsets": inconsistent_offsets,
    "G1a": g1a,
    "precommitted-read": precommitted,
    "G1b": torn,
    "poll-skip": poll_skip,
    "nonmonotonic-poll": nonmonotonic_poll,
    "nonmonotonic-send": nonmonotonic_send,
    "int-poll-skip": int_poll_skip,
    "int-nonmonotonic-poll": int_nonmonotonic_poll,
    "int-send-skip": int_send_skip,
    "int-nonmonotonic-send": int_nonmonotonic_send,
    "unknown-value": unknown_value,
    "G0": g0,
    "G1c": g1c,
    "G-single": g_single,
    "G0-process": g0_process,
    "G0-realtime": g0_realtime,
    "G1c-process": g1c_process,
    "G1c-realtime": g1c_realtime,
    "G-single-process": g_single_process,
    "G-single-realtime": g_single_realtime,
}


def test_every_class_has_a_planted_case() -> None:
    assert set(PLANTS) == set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_planted_anomaly_is_found_and_explained(kind: str) -> None:
    b = clean()
    culprits = PLANTS[kind](b)
    result = check(b.h, strict=True)
    assert result.counts.get(kind, 0) >= 1, (kind, result.counts)
    case = result.cases[kind][0]
    assert set(culprits) <= set(case.ops), (case.ops, case.explanation)
    assert case.explanation
    assert not result.ok and kind in result.bad_kinds
    if kind in CYCLE_KINDS:
        steps = case.data["steps"]
        assert steps[0]["from"] == steps[-1]["to"]  # a closed cycle
        assert all(s["why"] for s in steps), steps
        assert {s["from"] for s in steps} == set(culprits)
    # The culprit operations alone explain it: without them the history is clean again.
    b.h.ops = [o for o in b.h.ops if o.index not in culprits]
    assert kind not in check(b.h, strict=True).counts


def test_cycle_edges_name_their_relations() -> None:
    b = clean()
    t1, t2 = g_single(b)
    case = check(b.h).cases["G-single"][0]
    rels = sorted(s["rel"] for s in case.data["steps"])
    assert rels == ["rw", "ww"], case.explanation
    assert f"op {t1} -rw-> op {t2}" in case.explanation


def test_defaults_follow_jepsen_allowed_list() -> None:
    assert allowed_kinds(strict=True) == frozenset()
    assert INT_SEND_SKIP in allowed_kinds() and "G0" in allowed_kinds()
    assert POLL_SKIP not in allowed_kinds() and POLL_SKIP in allowed_kinds(subscribe=True)
    assert G1A not in allowed_kinds(subscribe=True) and LOST_WRITE not in allowed_kinds()
    b = clean()
    g0(b)
    assert check(b.h).ok and not check(b.h, strict=True).ok
    b = clean()
    poll_skip(b)
    assert not check(b.h).ok and check(b.h, subscribe=True).ok


def test_rebalance_excuses_a_jump() -> None:
    b = clean()
    b.op(3, poll(k0=[(0, 1), (1, 2)]))
    b.op(3, poll(k0=[(0, 1)]), rebalance=(0,))  # repositioned to the committed offset
    b.op(3, poll(k0=[(0, 1)], k1=[(0, 3)]), rebalance=(1,))  # key 0 not excused
    result = check(b.h, strict=True, cycles=False)
    assert result.counts == {NONMONOTONIC_POLL: 1}, result.cases
    assert result.cases[NONMONOTONIC_POLL][0].ops == [len(b.h.ops) - 2, len(b.h.ops) - 1]


def test_unseen_only_in_the_final_check() -> None:
    b = clean()
    unseen(b)
    assert UNSEEN in check(b.h).counts
    assert UNSEEN not in check(b.h, final=False).counts


def test_history_round_trip_and_bad_lines() -> None:
    b = clean()
    g_single(b)
    b.h.faults.append(Fault("kill", 3.0, 4.5, "kill -9"))
    buf = io.StringIO()
    b.h.write(buf)
    again = History.parse(buf.getvalue().splitlines())
    assert again.ops == b.h.ops and again.faults == b.h.faults
    with pytest.raises(ValueError, match="history line 2"):
        History.parse([buf.getvalue().splitlines()[0], '{"index": 1}'])
