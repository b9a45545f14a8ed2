"""The verify history: every operation a client issued, and every fault, as JSON lines.

An operation (:class:`Op`) is what one client process did between two instants: a
transaction (``f = "txn"``) of micro-operations, or a lone ``send`` / ``poll``; or a client
``crash`` (the SIGKILL of its process: the operation it had in flight is then ``info`` with
error ``process killed``, and its successor has a new process id). The final reads of each
process are lone ``poll`` operations. Its ``type`` is ``ok`` (it took effect), ``fail`` (it
certainly did not: an aborted transaction) or ``info`` (unknown: a send whose acknowledgement
never came, a commit that failed). Micro-operations, after completion:

* ``["send", key, value, offset]``: ``value`` (an int, unique in the run) appended to
  ``key`` (a partition of the topic); ``offset`` from the acknowledgement, ``None`` unknown;
* ``["poll", {key: [[offset, value], ...]}]``: what one consumer poll returned, in order.

``rebalance`` lists the keys whose assignment changed while the operation ran (subscribe
mode): a consumer may then legitimately jump. A :class:`Fault` is a window during which a
fault was active (``kill``: broker SIGKILLed until it was back; ``pause``: SIGSTOPped;
``proxy``: lost responses, resets, delays on). Times are seconds since the run started.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

OK, FAIL, INFO = "ok", "fail", "info"
CLIENT_FS = frozenset({"txn", "send", "poll"})


@dataclass
class Op:
    index: int
    process: int
    f: str
    type: str
    start: float
    end: float
    value: list[Any] = field(default_factory=list)
    error: str | None = None
    rebalance: list[int] = field(default_factory=list)

    def sends(self) -> list[tuple[int, int, int | None]]:
        """(key, value, offset) of every send, in order."""
        return [(m[1], m[2], m[3]) for m in self.value if m[0] == "send"]

    def reads(self) -> dict[int, list[tuple[int, int]]]:
        """key -> [(offset, value), ...] over every poll of the operation, in order."""
        out: dict[int, list[tuple[int, int]]] = {}
        for m in self.value:
            if m[0] == "poll":
                for k, pairs in m[1].items():
                    out.setdefault(k, []).extend((o, v) for o, v in pairs)
        return out

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "index": self.index,
            "process": self.process,
            "f": self.f,
            "type": self.type,
            "start": round(self.start, 6),
            "end": round(self.end, 6),
            "value": self.value,
        }
        if self.error:
            d["error"] = self.error
        if self.rebalance:
            d["rebalance"] = self.rebalance
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Op:
        value: list[Any] = []
        for m in d.get("value", []):
            if m[0] == "send":
                value.append(["send", int(m[1]), int(m[2]), None if m[3] is None else int(m[3])])
            elif m[0] == "poll":
                polled = {int(k): [[int(o), int(v)] for o, v in pairs] for k, pairs in m[1].items()}
                value.append(["poll", polled])
            else:
                raise ValueError(f"unknown micro-operation {m!r}")
        return cls(
            index=int(d["index"]),
            process=int(d["process"]),
            f=str(d["f"]),
            type=str(d["type"]),
            start=float(d["start"]),
            end=float(d["end"]),
            value=value,
            error=d.get("error"),
            rebalance=[int(k) for k in d.get("rebalance", [])],
        )


@dataclass
class Fault:
    kind: str  # kill | pause | proxy
    start: float
    end: float
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "f": "fault",
            "kind": self.kind,
            "start": round(self.start, 6),
            "end": round(self.end, 6),
            "detail": self.detail,
        }


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)

    def client_ops(self) -> Iterator[Op]:
        return (o for o in self.ops if o.f in CLIENT_FS)

    def write(self, out: TextIO) -> None:
        for o in self.ops:
            out.write(json.dumps(o.to_json(), separators=(",", ":")) + "\n")
        for fl in self.faults:
            out.write(json.dumps(fl.to_json(), separators=(",", ":")) + "\n")

    def save(self, path: str | Path) -> None:
        with open(path, "w") as f:
            self.write(f)

    @classmethod
    def parse(cls, lines: Iterable[str]) -> History:
        """Read JSON lines; a clear ValueError names the first bad line."""
        h = cls()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                if d.get("f") == "fault":
                    h.faults.append(
                        Fault(d["kind"], float(d["start"]), float(d["end"]), d.get("detail", ""))
                    )
                else:
                    h.ops.append(Op.from_json(d))
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                raise ValueError(f"history line {n}: {exc}") from exc
        return h

    @classmethod
    def load(cls, path: str | Path) -> History:
        with open(path) as f:
            return cls.parse(f)
