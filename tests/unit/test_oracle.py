"""The differential framework's comparison (samsa.testing.oracle), without brokers: what it
normalises, what it reports, and that declared deviations must match exactly."""

from __future__ import annotations

from dataclasses import dataclass

from samsa.protocol.messages import ApiKey, make
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing.oracle import (
    USER_PROPERTY,
    Deviation,
    Outcome,
    Rule,
    Step,
    compare,
    normalise,
    run_scenario,
    summary_lines,
    to_tree,
)


def test_kio_entity_becomes_a_plain_tree_with_error_names_and_decoded_records() -> None:
    batch = build_batch([NewRecord(value=b"a", timestamp=5)], producer_id=7, producer_epoch=1,
                        base_sequence=3)  # fmt: skip
    part = make(
        ApiKey.FETCH, 12, "PartitionData", partition_index=0, error_code=1, high_watermark=1,
        last_stable_offset=1, log_start_offset=0, aborted_transactions=None,
        preferred_read_replica=-1, records=batch,
    )  # fmt: skip
    tree = to_tree(part)
    assert tree["error_code"] == "OFFSET_OUT_OF_RANGE"
    (b,) = tree["records"]
    assert (b["producer_id"], b["producer_epoch"], b["base_sequence"]) == (7, 1, 3)
    assert b["records"] == [
        {"offset": 0, "timestamp": 5, "key": None, "value": b"a", "headers": []}
    ]


def test_normalise_keeps_identity_relations_and_sentinels() -> None:
    a = {"x": [{"producer_id": 900}, {"producer_id": 900}, {"producer_id": 5}, {"producer_id": -1}]}
    b = {"x": [{"producer_id": 1}, {"producer_id": 1}, {"producer_id": 2}, {"producer_id": -1}]}
    assert normalise(a) == normalise(b)
    assert [x["producer_id"] for x in normalise(a)["x"]] == ["pid#0", "pid#0", "pid#1", -1]
    c = {"x": [{"producer_id": 1}, {"producer_id": 2}, {"producer_id": 2}, {"producer_id": -1}]}
    assert compare(normalise(c), normalise(b)) != []  # a new producer is not the same one


def test_normalise_drops_throttle_and_messages_and_sorts_partitions() -> None:
    a = {
        "throttle_time": 5,
        "error_message": "x",
        "p": [{"partition_index": 1, "v": 1}, {"partition_index": 0, "v": 0}],
    }
    b = {
        "throttle_time": 0,
        "error_message": None,
        "p": [{"partition_index": 0, "v": 0}, {"partition_index": 1, "v": 1}],
    }
    assert compare(normalise(a), normalise(b)) == []


def test_normalise_sorts_group_members_by_their_identity() -> None:
    """Kafka lists a classic group's members in HashMap order: the same members in another
    order compare equal, by the identities their first appearance gave them."""
    rules = {"member_id": Rule.NODE, "leader": Rule.NODE}
    a = {"leader": "zz", "members": [{"member_id": "aa", "v": 2}, {"member_id": "zz", "v": 1}]}
    b = {"leader": "m1", "members": [{"member_id": "m1", "v": 1}, {"member_id": "m2", "v": 2}]}
    assert compare(normalise(a, rules), normalise(b, rules)) == []
    c = {"leader": "m1", "members": [{"member_id": "m1", "v": 2}, {"member_id": "m2", "v": 1}]}
    assert compare(normalise(a, rules), normalise(c, rules)) != []


def test_compare_names_the_path_and_both_values() -> None:
    (m,) = compare({"r": [{"error_code": "NONE"}]}, {"r": [{"error_code": "INVALID_REQUEST"}]})
    assert (m.path, m.samsa, m.kafka) == ("r[0].error_code", "NONE", "INVALID_REQUEST")
    (m,) = compare({"r": [1, 2]}, {"r": [1]})
    assert (m.path, m.samsa, m.kafka) == ("r.len", 2, 1)


def _outcome(samsa: object, kafka: object, deviations: tuple[Deviation, ...]) -> Outcome:
    mismatches = compare({"a": samsa}, {"a": kafka})
    return Outcome("s", [Step("a", samsa)], [Step("a", kafka)], mismatches, deviations)


def test_a_deviation_must_match_exactly_and_be_the_only_difference() -> None:
    dev = Deviation("a.code", "X", "Y", "D-TEST-1")
    assert _outcome({"code": "X"}, {"code": "Y"}, (dev,)).ok
    assert not _outcome({"code": "X"}, {"code": "Z"}, (dev,)).ok  # another kafka value
    assert not _outcome({"code": "X"}, {"code": "X"}, (dev,)).ok  # the deviation vanished
    extra = _outcome({"code": "X", "n": 1}, {"code": "Y", "n": 2}, (dev,))
    assert not extra.ok and [m.path for m in extra.unexpected] == ["a.n"]


@dataclass
class Report:
    user_properties: list[tuple[str, object]]
    when: str = "call"


def test_run_scenario_compares_step_labels_and_summary_counts() -> None:
    class Fake:
        def __init__(self, name: str) -> None:
            self.name, self.bootstrap, self.restart = name, "127.0.0.1:1", None

    def scenario(side: object) -> None:
        side.note("one", {"value": 1})  # type: ignore[attr-defined]
        if side.name == "kafka":  # type: ignore[attr-defined]
            side.note("two", {"value": 2})  # type: ignore[attr-defined]

    out = run_scenario("s", scenario, Fake("samsa"), Fake("kafka"))  # type: ignore[arg-type]
    assert not out.ok and any(m.path == "steps.len" for m in out.unexpected)
    other = {"scenario": "t", "identical": True, "ok": True, "deviations": []}
    reports = [Report([(USER_PROPERTY, out.summary())]), Report([(USER_PROPERTY, other)])]
    lines = summary_lines(reports)
    assert lines[0] == (
        "differential scenarios run: 2, identical to Kafka: 1, "
        "with documented deviations only: 0, failing: 1"
    )
