"""The arithmetic of ``samsa groups reset-offsets``: Kafka's modes, bounds and file format."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from samsa.cli._offset_reset import (
    Bounds,
    datetime_ms,
    duration_ms,
    new_offset,
    read_plan,
    topic_specs,
)
from samsa.client import TopicPartition


def test_new_offsets_by_mode_stay_within_the_log() -> None:
    b = Bounds(earliest=10, latest=20)
    assert new_offset("to_earliest", None, 15, b) == 10
    assert new_offset("to_latest", None, 15, b) == 20
    assert new_offset("to_current", None, 15, b) == 15
    assert new_offset("to_current", None, None, b) == 20  # no offset yet: the latest
    assert [new_offset("to_offset", n, 15, b) for n in (5, 12, 99)] == [10, 12, 20]
    assert [new_offset("shift_by", n, 15, b) for n in (-1, -9, 3, 9)] == [14, 10, 18, 20]
    assert new_offset("to_datetime", None, 15, b, at_time=13) == 13
    assert new_offset("by_duration", None, 15, b, at_time=-1) == 20  # nothing that late


def test_durations_datetimes_topics_and_plans() -> None:
    assert duration_ms("PT1H") == 3_600_000
    assert duration_ms("P1DT2M3.5S") == 86_400_000 + 120_000 + 3_500
    for bad in ("1h", "P", "PT", "PT1X"):
        with pytest.raises(ValueError, match="PnDTnHnMnS"):
            duration_ms(bad)
    epoch = int(datetime(2020, 1, 1, tzinfo=UTC).timestamp() * 1000)
    assert datetime_ms("2020-01-01T00:00:00.000Z") == epoch
    assert datetime_ms("2020-01-01T01:00:00+01:00") == epoch
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        datetime_ms("yesterday")
    assert topic_specs(["a", "b:0,2"]) == [("a", None), ("b", [0, 2])]
    with pytest.raises(ValueError, match="TOPIC:P1,P2"):
        topic_specs(["b:x"])
    plan = read_plan("t,0,5\n\ng,t,1,6\nother,t,1,7\n", "g")
    assert plan == {TopicPartition("t", 0): 5, TopicPartition("t", 1): 6}
    with pytest.raises(ValueError, match="line 1"):
        read_plan("t,0\n", "g")
