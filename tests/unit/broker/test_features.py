"""Finalized features and UpdateFeatures (rule 45 of docs/semantics.md): the levels ApiVersions
reports, Kafka's refusals (each INVALID_UPDATE_VERSION with its message, all or nothing),
validate_only, v0's allow_downgrade and v2's answer without results, the epoch growing with
each change, the level written before the answer and kept across SIGKILL, and a damaged
features file stopping the start. With real clients: tests/interop/test_features_admin.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _broker import BrokerProcess
from samsa.broker.broker import Broker, StartupError
from samsa.broker.config import BrokerConfig
from samsa.broker.features import (
    FEATURES_FILE,
    SAFE_DOWNGRADE,
    UNSAFE_DOWNGRADE,
    UPGRADE,
    Features,
    FeatureUpdate,
)
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode as E
from samsa.protocol.messages import ApiKey, make_request

TV, GV = "transaction.version", "group.version"


def _update(
    conn: BlockingConnection,
    *updates: tuple[str, int, int],
    v: int = 1,
    validate_only: bool = False,
) -> Any:
    keys = tuple(
        make_request(
            ApiKey.UPDATE_FEATURES,
            v,
            "FeatureUpdateKey",
            feature=name,
            max_version_level=level,
            **({"upgrade_type": kind} if v >= 1 else {"allow_downgrade": kind != UPGRADE}),
        )
        for name, level, kind in updates
    )
    extra = {"validate_only": validate_only} if v >= 1 else {}
    return conn.request(
        ApiKey.UPDATE_FEATURES,
        v,
        make_request(
            ApiKey.UPDATE_FEATURES, v, "UpdateFeaturesRequest", feature_updates=keys, **extra
        ),
    )


def _api_versions(conn: BlockingConnection, v: int = 4) -> Any:
    req = make_request(
        ApiKey.API_VERSIONS,
        v,
        "ApiVersionsRequest",
        client_software_name="t",
        client_software_version="1",
    )
    return conn.request(ApiKey.API_VERSIONS, v, req)


def _finalized(conn: BlockingConnection) -> tuple[int, dict[str, int]]:
    r = _api_versions(conn)
    levels = {f.name: int(f.max_version_level) for f in r.finalized_features}
    assert all(f.min_version_level == f.max_version_level for f in r.finalized_features)
    return int(r.finalized_features_epoch), levels


@pytest.fixture(scope="module")
def proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("features")).start()
    yield b
    b.stop()


@pytest.fixture
def conn(proc: BrokerProcess) -> Iterator[BlockingConnection]:
    with BlockingConnection("127.0.0.1", proc.port, timeout=10.0) as c:
        yield c


def test_api_versions_reports_both_features(conn: BlockingConnection) -> None:
    r = _api_versions(conn)
    assert [(f.name, f.min_version, f.max_version) for f in r.supported_features] == [
        (GV, 0, 1),
        (TV, 0, 2),
    ]
    assert _finalized(conn)[1] == {GV: 1, TV: 2}
    assert _api_versions(conn, 3).supported_features == ()  # v3 omits minimum-0 features
    versions = {int(k.api_key): (k.min_version, k.max_version) for k in r.api_keys}
    assert versions[ApiKey.UPDATE_FEATURES] == (0, 2)


REFUSALS = [
    # (update, the end of Kafka's message)
    ((TV, 1, UPGRADE), "without setting the upgrade type to either safe or unsafe downgrade."),
    ((TV, 3, UPGRADE), "Local controller 0 only supports versions 0-2"),
    ((TV, -1, SAFE_DOWNGRADE), "A feature version cannot be less than 0."),
    ((TV, 2, 0), "The controller does not support the given upgrade type."),
    ((TV, 2, 4), "The controller does not support the given upgrade type."),
    (("metadata.version", 22, UPGRADE), "Local controller 0 does not support this feature."),
    (("no.such.feature", 1, UPGRADE), "Local controller 0 does not support this feature."),
    ((GV, 2, UPGRADE), "Local controller 0 only supports versions 0-1"),
    ((GV, 0, UPGRADE), "without setting the upgrade type to either safe or unsafe downgrade."),
    ((GV, 0, UNSAFE_DOWNGRADE), "cannot turn them off."),
]


@pytest.mark.parametrize(("update", "message"), REFUSALS)
def test_each_refusal_is_invalid_update_version_and_changes_nothing(
    conn: BlockingConnection, update: tuple[str, int, int], message: str
) -> None:
    before = _finalized(conn)
    # An acceptable update beside the refused one is not applied either (all or nothing).
    r = _update(conn, (TV, 1, SAFE_DOWNGRADE), update)
    assert r.error_code == E.INVALID_UPDATE_VERSION
    name, level = update[0], update[1]
    assert r.error_message.startswith(f"Invalid update version {level} for feature {name}. ")
    assert r.error_message.endswith(message)
    assert r.results == ()  # Kafka 4: a failed request lists no feature
    assert _finalized(conn) == before


def test_upgrade_type_must_match_the_direction(conn: BlockingConnection) -> None:
    r = _update(conn, (TV, 2, SAFE_DOWNGRADE))  # same level: nothing to downgrade, accepted
    assert (r.error_code, r.error_message) == (E.NONE, None)
    epoch, levels = _finalized(conn)
    r = _update(conn, (TV, 1, SAFE_DOWNGRADE), validate_only=True)
    assert r.error_code == E.NONE
    assert [(x.feature, x.error_code, x.error_message) for x in r.results] == [(TV, 0, None)]
    assert _finalized(conn) == (epoch, levels)  # validate_only changes nothing
    assert _update(conn, (GV, 1, UPGRADE)).error_code == E.NONE  # its one level, a no-op
    assert _finalized(conn) == (epoch, levels)


def test_changes_grow_the_epoch_and_every_answer_reports_them(
    conn: BlockingConnection, proc: BrokerProcess
) -> None:
    epoch, _ = _finalized(conn)
    r = _update(conn, (TV, 1, SAFE_DOWNGRADE))
    assert (r.error_code, [x.feature for x in r.results]) == (E.NONE, [TV])
    # The level is on disk before the answer.
    doc = json.loads((proc.data_dir / FEATURES_FILE).read_text())
    assert doc["finalized"][TV] == 1 and doc["epoch"] == epoch + 1
    with BlockingConnection("127.0.0.1", proc.port, timeout=10.0) as other:
        assert _finalized(other) == (epoch + 1, {GV: 1, TV: 1})
    r = _update(conn, (TV, 0, UNSAFE_DOWNGRADE), v=2)  # v2: no results, even on success
    assert (r.error_code, r.error_message) == (E.NONE, None)
    assert _finalized(conn) == (epoch + 2, {GV: 1})  # level 0 is the feature's absence
    r = _update(conn, (TV, 2, UPGRADE), v=0)
    assert (r.error_code, [x.feature for x in r.results]) == (E.NONE, [TV])
    assert _finalized(conn) == (epoch + 3, {GV: 1, TV: 2})


def test_v0_allow_downgrade(conn: BlockingConnection) -> None:
    r = _update(conn, (TV, 1, UPGRADE), v=0)
    assert r.error_code == E.INVALID_UPDATE_VERSION
    assert _update(conn, (TV, 1, SAFE_DOWNGRADE), v=0).error_code == E.NONE
    assert _finalized(conn)[1][TV] == 1
    r = _update(conn, (TV, 2, SAFE_DOWNGRADE), v=0)  # allow_downgrade to a higher level
    assert r.error_code == E.INVALID_UPDATE_VERSION
    assert r.error_message.endswith("Can't downgrade to a newer version.")
    assert _update(conn, (TV, 2, UPGRADE), v=0).error_code == E.NONE


def test_the_level_survives_sigkill_and_beats_the_setting(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "d", {"transaction.version": "1"}).start()
    try:
        with BlockingConnection("127.0.0.1", b.port, timeout=10.0) as c:
            epoch, levels = _finalized(c)
            assert levels == {GV: 1, TV: 1}  # nothing persisted: the setting is the level
            assert _update(c, (TV, 2, UPGRADE)).error_code == E.NONE
        b.kill()
        b.start()
        with BlockingConnection("127.0.0.1", b.port, timeout=10.0) as c:
            assert _finalized(c) == (epoch + 1, {GV: 1, TV: 2})
    finally:
        b.stop()


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"version": 2, "epoch": 1, "finalized": {}}',
        '{"version": 1, "epoch": 0, "finalized": {}}',
        '{"version": 1, "epoch": 3, "finalized": {"transaction.version": 7}}',
        '{"version": 1, "epoch": 3, "finalized": {"other": 1}}',
    ],
)
def test_a_damaged_file_stops_the_start(tmp_path: Path, content: str) -> None:
    (tmp_path / FEATURES_FILE).write_text(content)
    with pytest.raises(StartupError, match="cannot read the finalized features"):
        Broker(BrokerConfig(data_dir=tmp_path))
    assert (tmp_path / FEATURES_FILE).read_text() == content  # nothing lost


def test_a_refused_update_writes_nothing(tmp_path: Path) -> None:
    f = Features(tmp_path / FEATURES_FILE, 0, 2)
    code, _ = f.update([FeatureUpdate(TV, 1, SAFE_DOWNGRADE), FeatureUpdate(GV, 0, 2)], False)
    assert code == E.INVALID_UPDATE_VERSION
    assert not (tmp_path / FEATURES_FILE).exists() and f.finalized == {TV: 2, GV: 1}
    assert f.update([FeatureUpdate(TV, 1, SAFE_DOWNGRADE)], False) == (E.NONE, None)
    assert Features(tmp_path / FEATURES_FILE, 0, 2).finalized == {TV: 1, GV: 1}
