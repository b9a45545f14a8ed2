"""The arithmetic of ``samsa groups reset-offsets`` (kafka-consumer-groups --reset-offsets):
which partitions, and the new offset of each, by the modes Kafka's tool has. No I/O here:
the command fetches the offsets it needs and commits the plan."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from samsa.client import TopicPartition

MODES = (
    "to_earliest",
    "to_latest",
    "to_current",
    "to_offset",
    "shift_by",
    "to_datetime",
    "by_duration",
    "from_file",
)

_DURATION = re.compile(
    r"^P(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


def duration_ms(text: str) -> int:
    """An ISO-8601 duration as kafka-consumer-groups takes it (``PnDTnHnMnS``), in ms."""
    m = _DURATION.match(text.strip().upper())
    if m is None or text.strip().upper() in ("P", "PT"):
        raise ValueError(f"--by-duration expects PnDTnHnMnS (e.g. PT1H, P1D), got {text!r}")
    d, h, mi, s = (float(m.group(g) or 0) for g in "dhms")
    return int((((d * 24 + h) * 60 + mi) * 60 + s) * 1000)


def datetime_ms(text: str) -> int:
    """``YYYY-MM-DDThh:mm:ss[.sss][zone]`` as epoch ms; without a zone, local time, as
    kafka-consumer-groups reads it."""
    raw = text.strip()
    if raw.endswith("Z"):
        raw = raw[:-1] + "+00:00"
    try:
        return int(datetime.fromisoformat(raw).timestamp() * 1000)
    except ValueError:
        raise ValueError(f"--to-datetime expects YYYY-MM-DDThh:mm:ss.sss, got {text!r}") from None


def topic_specs(items: list[str]) -> list[tuple[str, list[int] | None]]:
    """``--topic orders`` (every partition) or ``--topic orders:0,2`` (those)."""
    out: list[tuple[str, list[int] | None]] = []
    for item in items:
        topic, sep, parts = item.partition(":")
        if not topic:
            raise ValueError(f"--topic expects TOPIC or TOPIC:P1,P2, got {item!r}")
        try:
            out.append((topic, [int(p) for p in parts.split(",")] if sep else None))
        except ValueError:
            raise ValueError(f"--topic expects TOPIC or TOPIC:P1,P2, got {item!r}") from None
    return out


def read_plan(text: str, group: str) -> dict[TopicPartition, int]:
    """kafka-consumer-groups' CSV: ``topic,partition,offset`` lines, or
    ``group,topic,partition,offset`` (only this group's are kept)."""
    plan: dict[TopicPartition, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        cells = [c.strip() for c in line.split(",")]
        if cells == [""]:
            continue
        if len(cells) == 4:
            if cells[0] != group:
                continue
            cells = cells[1:]
        if len(cells) != 3:
            raise ValueError(f"line {number}: expected TOPIC,PARTITION,OFFSET, got {line!r}")
        try:
            plan[TopicPartition(cells[0], int(cells[1]))] = int(cells[2])
        except ValueError:
            raise ValueError(f"line {number}: expected TOPIC,PARTITION,OFFSET") from None
    return plan


@dataclass(frozen=True, slots=True)
class Bounds:
    earliest: int
    latest: int

    def clamp(self, offset: int) -> int:
        return min(max(offset, self.earliest), self.latest)


def new_offset(
    mode: str,
    value: int | None,
    current: int | None,
    bounds: Bounds,
    at_time: int | None = None,
) -> int:
    """The offset a partition is reset to. ``value`` is the mode's number (--to-offset,
    --shift-by); ``current`` the committed offset (None: none, which counts as the latest,
    as Kafka's tool has it); ``at_time`` the first offset at the mode's time (None: no
    record that late, so the latest)."""
    if mode == "to_earliest":
        return bounds.earliest
    if mode == "to_latest":
        return bounds.latest
    if mode == "to_current":
        return bounds.latest if current is None else current
    if mode == "to_offset":
        assert value is not None
        return bounds.clamp(value)
    if mode == "shift_by":
        assert value is not None
        return bounds.clamp((bounds.latest if current is None else current) + value)
    if mode in ("to_datetime", "by_duration"):
        return bounds.latest if at_time is None or at_time < 0 else at_time
    raise ValueError(f"unknown reset mode {mode}")
