"""broker/quotas.py: entity resolution, sampled rates and throttle times, with a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from samsa.broker.connection import ConnectionCore, RequestMemory
from samsa.broker.metrics import MAX_QUOTA_SERIES, BrokerMetrics
from samsa.broker.quotas import (
    FETCH,
    PRODUCE,
    REQUEST,
    ClientQuotas,
    Muting,
    QuotaError,
    check_value,
    entity_of,
)
from samsa.protocol.framing import FrameDecoder


def _user(name: str | None) -> tuple[str, str | None]:
    return ("user", name)


def _client(name: str | None) -> tuple[str, str | None]:
    return ("client-id", name)


def test_resolution_follows_kafkas_order() -> None:
    q = ClientQuotas(None)
    levels = [
        (entity_of([_user("u"), _client("c")]), 1.0, ("u", "c")),
        (entity_of([_user("u"), _client(None)]), 2.0, ("u", "c")),
        (entity_of([_user("u")]), 3.0, ("u", "")),
        (entity_of([_user(None), _client("c")]), 4.0, ("u", "c")),
        (entity_of([_user(None), _client(None)]), 5.0, ("u", "c")),
        (entity_of([_user(None)]), 6.0, ("u", "")),
        (entity_of([_client("c")]), 7.0, ("", "c")),
        (entity_of([_client(None)]), 8.0, ("", "c")),
    ]
    q.alter([(entity, {PRODUCE: bound}) for entity, bound, _tags in levels])
    # Remove the most specific level one at a time: the next one in Kafka's order applies.
    for entity, bound, tags in levels:
        charge = q.quota_for(PRODUCE, "u", "c")
        assert charge is not None
        assert (charge.bound, charge.user, charge.client_id) == (bound, *tags)
        q.alter([(entity, {PRODUCE: None})])
    assert q.quota_for(PRODUCE, "u", "c") is None
    # Quotas are per key: a consumer quota does not make a producer one.
    q.alter([(entity_of([_user("u")]), {FETCH: 10.0})])
    assert q.quota_for(PRODUCE, "u", "c") is None
    assert q.quota_for(FETCH, "other", "c") is None


def test_throttle_time_is_kafkas() -> None:
    q = ClientQuotas(None, window_num=11, window_s=1.0)
    q.alter([(entity_of([_client("c")]), {PRODUCE: 1000.0})])
    charge = q.quota_for(PRODUCE, "ANONYMOUS", "c")
    assert charge is not None
    # A first burst is judged over the 10 whole windows a rate always spans: 10,000 bytes
    # are exactly the bound, one more byte is over it.
    assert q.record(charge, 10_000, now=100.0) == 0
    # 22,000 bytes over 10 s: 2,200 B/s, 1.2 times over, for the 10 s window: 12 s.
    assert q.record(charge, 12_000, now=100.0) == 12_000
    # Once the windows have passed, the rate is measured afresh.
    assert q.record(charge, 100, now=200.0) == 0


def test_a_throttle_fits_the_protocols_int32() -> None:
    q = ClientQuotas(None)
    q.alter([(entity_of([_client("c")]), {PRODUCE: 1.0})])
    charge = q.quota_for(PRODUCE, "u", "c")
    assert charge is not None
    assert q.record(charge, 1e12, now=0.0) == 2**31 - 1  # Kafka's formula: ~3,000 years


def test_request_throttle_is_bounded_by_one_window() -> None:
    q = ClientQuotas(None, window_num=11, window_s=1.0)
    q.alter([(entity_of([_user(None)]), {REQUEST: 1.0})])
    charge = q.quota_for(REQUEST, "anyone", "x")
    assert charge is not None and (charge.user, charge.client_id) == ("anyone", "")
    # 50 percent-seconds against a 1 % quota: far over, but at most one window of throttle.
    assert q.record(charge, 50.0, now=0.0) == 1000


def test_clients_of_a_shared_entity_share_its_rate() -> None:
    q = ClientQuotas(None)
    q.alter([(entity_of([_user("u")]), {PRODUCE: 1000.0})])
    a, b = q.quota_for(PRODUCE, "u", "a"), q.quota_for(PRODUCE, "u", "b")
    assert a == b and a is not None
    assert q.record(a, 10_000, now=0.0) == 0
    assert q.record(b, 1_000, now=0.0) > 0  # b pays for a's bytes: one user, one rate


def test_rates_tracked_are_bounded() -> None:
    q = ClientQuotas(None, max_sensors=3)
    q.alter([(entity_of([_client(None)]), {PRODUCE: 1000.0})])
    for i in range(50):  # client ids are the clients' to choose
        charge = q.quota_for(PRODUCE, "u", f"client-{i}")
        assert charge is not None
        q.record(charge, 1, now=0.0)
    assert q.tracked == 3


def test_stored_entities_are_bounded(tmp_path: Path) -> None:
    q = ClientQuotas(tmp_path / "q.json", max_entities=2)
    q.alter([(entity_of([_user(f"u{i}")]), {PRODUCE: 1.0}) for i in range(2)])
    with pytest.raises(QuotaError, match="at most 2"):
        q.alter([(entity_of([_user("u3")]), {PRODUCE: 1.0})])
    assert len(_loaded(tmp_path / "q.json")) == 2


def _loaded(path: Path) -> dict[object, object]:
    q = ClientQuotas(path)
    q.load()
    return dict(q.quotas)


def test_quotas_survive_a_restart_and_a_damaged_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "client-quotas.json"
    q = ClientQuotas(path)
    alice_c = entity_of([_user("alice"), _client(None)])
    q.alter(
        [
            (alice_c, {PRODUCE: 1024.0, REQUEST: 12.5}),
            (entity_of([("ip", "10.0.0.1")]), {"connection_creation_rate": 5.0}),
        ]
    )
    q.alter([(alice_c, {REQUEST: None})], validate_only=False)
    q.alter([(alice_c, {FETCH: 1.0})], validate_only=True)  # stores nothing
    again = ClientQuotas(path)
    again.load()
    assert again.quotas == q.quotas
    assert again.quotas[alice_c] == {PRODUCE: 1024.0}
    path.write_text("{not json")
    with pytest.raises(ValueError, match=str(path)):
        ClientQuotas(path).load()


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([], "Invalid empty client quota entity"),
        ([_user("a"), _user("b")], "duplicate entity entry user"),
        ([("group", "g")], "Unhandled client quota entity type: group"),
        ([_user("")], "Empty user not supported"),
        ([_user("a"), ("ip", "10.0.0.1")], "IP entity shouldnot be combined"),
        ([("ip", "not an ip")], "not a valid IP"),
    ],
)
def test_bad_entities_are_refused(pairs: list[tuple[str, str | None]], message: str) -> None:
    with pytest.raises(QuotaError, match=message):
        entity_of(pairs)


def test_bad_values_are_refused() -> None:
    user = entity_of([_user("a")])
    with pytest.raises(QuotaError, match="producer_byte_rate cannot be a fractional value"):
        check_value(user, PRODUCE, 1.5)
    with pytest.raises(QuotaError, match="Invalid configuration key connection_creation_rate"):
        check_value(user, "connection_creation_rate", 1.0)
    with pytest.raises(QuotaError, match="Invalid configuration key producer_byte_rate"):
        check_value(entity_of([("ip", "::1")]), PRODUCE, 1.0)
    for odd in (float("nan"), float("inf")):
        with pytest.raises(QuotaError, match="must be a finite number"):
            check_value(user, REQUEST, odd)
    check_value(user, REQUEST, 0.5)


def test_describe_filters() -> None:
    q = ClientQuotas(None)
    q.alter(
        [
            (entity_of([_user("a")]), {PRODUCE: 1.0}),
            (entity_of([_user(None)]), {PRODUCE: 2.0}),
            (entity_of([_user("a"), _client("c")]), {FETCH: 3.0}),
        ]
    )
    names = lambda found: sorted(str(e) for e, _v in found)  # noqa: E731
    assert len(q.describe([], strict=False)) == 3
    assert names(q.describe([("user", 0, "a")], strict=True)) == [str(entity_of([_user("a")]))]
    assert len(q.describe([("user", 0, "a")], strict=False)) == 2
    assert q.describe([("user", 1, None)], strict=False) == [
        (entity_of([_user(None)]), {PRODUCE: 2.0})
    ]
    assert len(q.describe([("user", 2, None)], strict=False)) == 2
    with pytest.raises(QuotaError, match="IP filter component"):
        q.describe([("ip", 1, None), ("user", 1, None)], strict=False)


def test_a_muted_connection_takes_no_frames() -> None:
    core = ConnectionCore(FrameDecoder(1 << 20), RequestMemory(0), lambda: None, 0.0)
    core.receive(b"\x00\x00\x00\x01x", 0.0)
    assert core.has_work
    core.muted = True
    assert not core.has_work
    assert core.update_reading(0.0) is True  # reading pauses while muted
    core.muted = False
    assert core.has_work
    m = Muting()
    m.owe(5)
    m.owe(3)
    assert m.take() == 5 and m.take() == 0


def test_connection_rate_of_an_address_else_the_default_ip() -> None:
    q = ClientQuotas(None, window_num=11, window_s=1.0)
    assert q.connection_quota("10.0.0.1") is None
    q.alter(
        [
            (entity_of([("ip", None)]), {"connection_creation_rate": 100.0}),
            (entity_of([("ip", "10.0.0.2")]), {"connection_creation_rate": 1.0}),
        ]
    )
    default, own = q.connection_quota("10.0.0.1"), q.connection_quota("10.0.0.2")
    assert default is not None and default.bound == 100.0 and default.user == "10.0.0.1"
    assert own is not None and own.bound == 1.0
    # 10 connections in the first 10 s are the bound; the 11th is over, throttled one window
    # at most.
    assert [q.record(own, 1, now=0.0) for _ in range(10)] == [0] * 10
    assert q.record(own, 1, now=0.0) == 1000


def test_throttle_metrics_are_capped_per_entity() -> None:
    metrics = BrokerMetrics(None)  # type: ignore[arg-type]  # throttled() reads no broker
    for i in range(MAX_QUOTA_SERIES + 5):  # client ids are the clients' to choose
        metrics.throttled("Produce", "", f"client-{i}", 10)
    metrics.throttled("Produce", "", "client-0", 20)
    assert len(metrics.throttles) == MAX_QUOTA_SERIES and metrics.throttles_omitted == 5
    assert metrics.throttles[("Produce", "", "client-0")] == [pytest.approx(0.03), 2]
