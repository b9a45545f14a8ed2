"""The judgements of samsa.testing.judges on made-up tool events: each kind of broker fault the
oracle runs look for is reported, and an at-least-once redelivery from an acknowledged commit
is counted, not reported."""

from __future__ import annotations

from samsa.testing.judges import Event, check_copy, check_delivery


def sent(*records: tuple[int, int, str]) -> list[Event]:
    return [
        {"name": "producer_send_success", "partition": p, "offset": o, "value": v}
        for p, o, v in records
    ]


def read(p: int, o: int, v: str) -> Event:
    return {"name": "record_data", "partition": p, "offset": o, "value": v}


def commit(p: int, o: int, success: bool = True) -> Event:
    return {"name": "offsets_committed", "success": success,
            "offsets": [{"topic": "t", "partition": p, "offset": o}]}  # fmt: skip


PRODUCED = sent((0, 0, "a"), (0, 1, "b"), (0, 2, "c"))


def test_a_clean_run_has_no_problems() -> None:
    r = check_delivery(PRODUCED, [read(0, 0, "a"), read(0, 1, "b"), commit(0, 2),
                                  read(0, 2, "c"), commit(0, 3)])  # fmt: skip
    assert (r.problems, r.consumed, r.redelivered, r.last_commits) == ([], 3, 0, {0: 3})


def test_rereading_from_an_acknowledged_commit_is_counted_not_reported() -> None:
    events = [read(0, 0, "a"), commit(0, 1), read(0, 1, "b"), commit(0, 2, success=False),
              read(0, 1, "b"), read(0, 2, "c"), commit(0, 3)]  # fmt: skip
    r = check_delivery(PRODUCED, events)
    assert (r.problems, r.redelivered, r.failed_commits) == ([], 1, 1)


def test_rereading_from_before_an_acknowledged_commit_is_reported() -> None:
    events = [read(0, 0, "a"), read(0, 1, "b"), commit(0, 2), read(0, 0, "a"),
              read(0, 1, "b"), read(0, 2, "c"), commit(0, 3)]  # fmt: skip
    (problem,) = check_delivery(PRODUCED, events).problems
    assert "reset to 0" in problem and "acknowledged commit was 2" in problem


def test_lost_skipped_and_twice_written_records_are_reported() -> None:
    lost = check_delivery(PRODUCED, [read(0, 0, "a"), read(0, 1, "b"), commit(0, 2)])
    assert lost.problems == ["1 acknowledged records never consumed: [(0, 2)]"]
    skipped = check_delivery(PRODUCED[:1], [read(0, 1, "b"), commit(0, 2)])
    assert any("skipped offsets 0..0" in p for p in skipped.problems)
    twice = check_delivery(PRODUCED, [read(0, 0, "a"), read(0, 1, "b"), read(0, 2, "c"),
                                      read(0, 3, "c"), commit(0, 4)])  # fmt: skip
    assert twice.problems == ["1 values written twice: [('c', [(0, 2), (0, 3)])]"]


def test_a_commit_that_moves_back_or_is_not_the_end_is_reported() -> None:
    events = [read(0, 0, "a"), read(0, 1, "b"), read(0, 2, "c"), commit(0, 3), commit(0, 2)]
    problems = check_delivery(PRODUCED, events).problems
    assert problems == ["partition 0: acknowledged commit moved back 3 -> 2",
                        "partition 0: read to 3, last commit 2"]  # fmt: skip


def test_copy_counts_missing_duplicated_and_unexpected_records() -> None:
    r = check_copy(["1", "2", "3"], ["1", "1", "3", "9"])
    assert (r.missing, r.duplicated, r.unexpected, len(r.problems)) == (1, 1, 1, 3)
    assert check_copy(["1", "2"], ["2", "1"]).problems == []
