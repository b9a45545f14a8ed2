"""The exactly-once checker: what was sent and acknowledged against what was read.

Theory of operation
-------------------
The workload identifies every record by (producer, sequence-in-producer); a transactional
record also carries its transaction number. The checker is pure: it gets the history (every
record the workload tried to write, with the client's verdict on it, and the outcome of
every transaction) and the reads (every record a read_committed consumer returned, with
its partition and offset), and classifies each record:

* must be read exactly once: acknowledged non-transactional records, and the records of
  transactions whose commit succeeded;
* must not be read: records of transactions that were aborted (on purpose, or after a
  failure, but never after a commit was attempted: those are "unknown");
* may be read at most once: records whose send failed or timed out (the broker may have
  written them: the lost-ACK case), and records of transactions with an unknown outcome,
  which must then be read all or none.

Anomaly kinds (:data:`KINDS`): ``lost`` (must be read, never was), ``duplicated`` (read more
than once), ``reordered`` (within one partition, a producer's records out of sequence
order), ``aborted data read``, ``offset mismatch`` (read at another partition/offset than
its acknowledgement said, or two acknowledgements for one offset), ``partial transaction``
(a transaction of unknown outcome read in part), ``unexpected record`` (read but never sent,
or unreadable). The result keeps every instance; reports show a few examples per kind.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

LOST = "lost"
DUPLICATED = "duplicated"
REORDERED = "reordered"
ABORTED_READ = "aborted data read"
OFFSET_MISMATCH = "offset mismatch"
PARTIAL_TXN = "partial transaction"
UNEXPECTED = "unexpected record"
KINDS = (LOST, DUPLICATED, REORDERED, ABORTED_READ, OFFSET_MISMATCH, PARTIAL_TXN, UNEXPECTED)


class Outcome(enum.StrEnum):
    COMMITTED = "committed"
    ABORTED = "aborted"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Sent:
    """One record the workload handed to a producer, and what the client said about it."""

    producer: int
    seq: int
    txn: int = -1  # -1: not transactional
    acked: bool = False
    partition: int = -1  # from the acknowledgement
    offset: int = -1  # from the acknowledgement; -1 when it carried none


@dataclass(frozen=True, slots=True)
class Read:
    """One record a consumer returned. ``producer`` -1 marks an unreadable record."""

    partition: int
    offset: int
    producer: int
    seq: int
    txn: int = -1


@dataclass
class History:
    sent: list[Sent] = field(default_factory=list)
    txns: dict[tuple[int, int], Outcome] = field(default_factory=dict)  # (producer, txn)

    def outcome(self, s: Sent) -> Outcome | None:
        if s.txn < 0:
            return None
        return self.txns.get((s.producer, s.txn), Outcome.UNKNOWN)


@dataclass
class CheckResult:
    anomalies: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    sent: int = 0
    acked: int = 0
    acked_without_offset: int = 0  # e.g. DUPLICATE_SEQUENCE_NUMBER answers (Tansu)
    must_read: int = 0
    read: int = 0
    txns: dict[str, int] = field(default_factory=dict)  # outcome -> count

    def add(self, kind: str, detail: str) -> None:
        self.anomalies[kind].append(detail)

    @property
    def ok(self) -> bool:
        return not any(self.anomalies.values())

    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.anomalies.items() if v}


def _where(r: Read) -> str:
    return f"{r.partition}@{r.offset}"


def check(history: History, reads: Iterable[Read]) -> CheckResult:
    """Classify every sent and read record; see the module docstring."""
    result = CheckResult()
    sent: dict[tuple[int, int], Sent] = {}
    for s in history.sent:
        sent[(s.producer, s.seq)] = s
    result.sent = len(sent)
    result.acked = sum(1 for s in sent.values() if s.acked)
    result.acked_without_offset = sum(1 for s in sent.values() if s.acked and s.offset < 0)
    for o in history.txns.values():
        result.txns[o.value] = result.txns.get(o.value, 0) + 1

    seen: dict[tuple[int, int], list[Read]] = defaultdict(list)
    for r in reads:
        result.read += 1
        key = (r.producer, r.seq)
        if r.producer < 0 or key not in sent:
            result.add(UNEXPECTED, f"{_where(r)}: producer {r.producer} seq {r.seq}")
            continue
        seen[key].append(r)

    txn_read: dict[tuple[int, int], list[bool]] = defaultdict(list)
    acked_at: dict[tuple[int, int], Sent] = {}
    for key, s in sent.items():
        got = seen.get(key, [])
        outcome = history.outcome(s)
        name = f"p{s.producer}/s{s.seq}" + (f"/t{s.txn}" if s.txn >= 0 else "")
        if outcome is None:
            must = s.acked
        else:
            must = outcome is Outcome.COMMITTED
            txn_read[(s.producer, s.txn)].append(bool(got))
        result.must_read += must
        if must and not got:
            where = f" (acked at {s.partition}@{s.offset})" if s.acked else ""
            result.add(LOST, f"{name}{where}")
        if len(got) > 1:
            result.add(DUPLICATED, f"{name} at {', '.join(_where(r) for r in got)}")
        if outcome is Outcome.ABORTED and got:
            result.add(ABORTED_READ, f"{name} at {_where(got[0])}")
        if s.acked and s.offset >= 0:
            other = acked_at.get((s.partition, s.offset))
            if other is not None:
                result.add(
                    OFFSET_MISMATCH,
                    f"{name} and p{other.producer}/s{other.seq} both acked at "
                    f"{s.partition}@{s.offset}",
                )
            acked_at[(s.partition, s.offset)] = s
            if got and all((r.partition, r.offset) != (s.partition, s.offset) for r in got):
                result.add(
                    OFFSET_MISMATCH,
                    f"{name} acked at {s.partition}@{s.offset}, read at {_where(got[0])}",
                )

    for (producer, txn), flags in txn_read.items():
        if history.txns.get((producer, txn), Outcome.UNKNOWN) is Outcome.UNKNOWN:
            if any(flags) and not all(flags):
                result.add(
                    PARTIAL_TXN,
                    f"p{producer}/t{txn}: {sum(flags)} of {len(flags)} records read",
                )

    # Order: per (partition, producer), first reads sorted by offset must have rising sequences.
    chains: dict[tuple[int, int], list[Read]] = defaultdict(list)
    for rs in seen.values():
        first = min(rs, key=lambda r: (r.partition, r.offset))
        chains[(first.partition, first.producer)].append(first)
    for (partition, producer), rs in sorted(chains.items()):
        rs.sort(key=lambda r: r.offset)
        top: Read | None = None
        for r in rs:
            if top is not None and r.seq < top.seq:
                result.add(
                    REORDERED,
                    f"partition {partition} p{producer}: s{r.seq} at {r.offset} after "
                    f"s{top.seq} at {top.offset}",
                )
            elif top is None or r.seq > top.seq:
                top = r
    return result
