"""``samsa features describe|upgrade|downgrade|disable`` against a real broker: kafka-features'
output, dry runs changing nothing, and refusals printing the broker's message with exit 1."""

from __future__ import annotations

import pytest

from _broker import BrokerProcess
from samsa.cli import main
from samsa.cli.features import parse_feature

TV = "transaction.version"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["features", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _levels(capsys: pytest.CaptureFixture[str], bs: list[str]) -> dict[str, tuple[str, str]]:
    """feature -> (finalized level, epoch), from ``describe``."""
    code, out, err = _run(capsys, "describe", *bs)
    assert code == 0, err
    rows = [dict(f.split(": ") for f in line.split("\t")) for line in out.splitlines()]
    return {r["Feature"]: (r["FinalizedVersionLevel"], r["Epoch"]) for r in rows}


def test_describe_upgrade_downgrade_and_dry_run(
    broker: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = ["--bootstrap-server", broker.bootstrap]
    code, out, err = _run(capsys, *bs, "describe")  # kafka-features' order of the flags
    assert code == 0, err
    assert out.splitlines() == [
        "Feature: group.version\tSupportedMinVersion: 0\tSupportedMaxVersion: 1"
        "\tFinalizedVersionLevel: 1\tEpoch: 1",
        f"Feature: {TV}\tSupportedMinVersion: 0\tSupportedMaxVersion: 2"
        "\tFinalizedVersionLevel: 2\tEpoch: 1",
    ]

    code, out, err = _run(capsys, "downgrade", "--feature", f"{TV}=1", "--dry-run", *bs)
    assert (code, out) == (0, f"{TV} can be downgraded to 1.\n"), err
    assert _levels(capsys, bs)[TV] == ("2", "1")  # the dry run changed nothing

    code, out, err = _run(capsys, "downgrade", "--feature", f"{TV}=1", *bs)
    assert (code, out) == (0, f"{TV} was downgraded to 1.\n"), err
    assert _levels(capsys, bs)[TV] == ("1", "2")

    code, out, err = _run(capsys, "upgrade", "--feature", f"{TV}=2", "--dry-run", *bs)
    assert (code, out) == (0, f"{TV} can be upgraded to 2.\n"), err
    assert _levels(capsys, bs)[TV] == ("1", "2")

    code, out, err = _run(capsys, "upgrade", "--feature", f"{TV}=2", *bs)
    assert (code, out) == (0, f"{TV} was upgraded to 2.\n"), err
    assert _levels(capsys, bs)[TV] == ("2", "3")

    code, out, err = _run(capsys, "disable", "--feature", TV, "--unsafe", *bs)
    assert (code, out) == (0, f"{TV} was disabled.\n"), err
    assert _levels(capsys, bs)[TV] == ("0", "4")


def test_refusals_print_the_broker_message_and_exit_1(
    broker: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    bs = ["--bootstrap-server", broker.bootstrap]
    code, out, err = _run(capsys, "upgrade", "--feature", f"{TV}=1", *bs)  # a downgrade
    assert code == 1
    assert out.startswith(f"Could not upgrade {TV} to 1. INVALID_UPDATE_VERSION (95): ")
    assert "without setting the upgrade type to either safe or unsafe downgrade" in out
    assert "1 out of 1 operation(s) failed." in err

    code, out, err = _run(capsys, "upgrade", "--feature", "no.such=1", "--dry-run", *bs)
    assert code == 1
    assert out.startswith("Can not upgrade no.such to 1. INVALID_UPDATE_VERSION")
    assert "does not support this feature" in out

    # all or nothing: both features are reported failed, and neither changed
    code, out, err = _run(
        capsys,
        "downgrade",
        "--feature",
        f"{TV}=1",
        "--feature",
        "group.version=0",
        "--unsafe",
        *bs,
    )
    assert code == 1
    assert out.count("cannot turn them off") == 2
    assert "2 out of 2 operation(s) failed." in err
    assert _levels(capsys, bs) == {TV: ("2", "1"), "group.version": ("1", "1")}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["upgrade"], "upgrade needs at least one --feature"),
        (["upgrade", "--feature", "a=1", "--feature", "a=2"], "a was given more than once"),
        (["downgrade", "--feature", "a"], "expected NAME=LEVEL"),
        (["upgrade", "--metadata", "3.9-IV0"], "no metadata.version"),
    ],
)
def test_bad_arguments_are_refused_before_connecting(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # port 1 has no broker: the command must fail on its arguments, not on the connection
    code, _out, err = _run(capsys, *argv, "--bootstrap-server", "127.0.0.1:1")
    assert code == 1
    assert message in err


def test_parse_feature() -> None:
    assert parse_feature(" transaction.version = 2 ") == ("transaction.version", 2)
    for bad in ("=2", "x=two", "x=40000"):
        with pytest.raises(ValueError, match="cannot parse feature=level"):
            parse_feature(bad)
