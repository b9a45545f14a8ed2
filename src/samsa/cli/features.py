"""``samsa features describe|upgrade|downgrade|disable``: the cluster's finalized feature
levels (rule 45), with Kafka 4 kafka-features' sub-commands, flags and output.

``describe`` prints each feature the broker supports with its range, finalized level (0 when
not finalized) and the features epoch. ``upgrade`` / ``downgrade`` take ``--feature
NAME=LEVEL`` (repeatable), ``disable`` takes ``--feature NAME`` (level 0); ``--dry-run``
validates without changing anything and ``--unsafe`` asks for an unsafe downgrade. All go
through the samsa :class:`Admin`. The broker applies all updates or none, so a refusal fails
every feature: each is printed with the broker's message, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import sys

from samsa.cli._clientutil import add_bootstrap, client_config, one_line_errors
from samsa.client import Admin, FeatureUpdate, KafkaError, UpgradeType

# Kafka's ``metadata.version`` names levels like 3.3-IV3; samsa has no metadata log (rule 45).
_METADATA_HELP = "not served: samsa has no KRaft metadata log, so no metadata.version"


def parse_feature(text: str) -> tuple[str, int]:
    """kafka-features' ``NAME=LEVEL``, the level a 16-bit integer."""
    name, sep, level = text.partition("=")
    name, level = name.strip(), level.strip()
    if not sep or not name:
        raise ValueError(f"cannot parse feature=level {text!r}: expected NAME=LEVEL")
    try:
        value = int(level)
    except ValueError:
        raise ValueError(f"cannot parse feature=level {text!r}: {level!r} is no integer") from None
    if not -(2**15) <= value < 2**15:
        raise ValueError(f"cannot parse feature=level {text!r}: {value} is out of range")
    return name, value


def _updates(args: argparse.Namespace) -> dict[str, FeatureUpdate]:
    if args.action == "upgrade":
        kind = UpgradeType.UPGRADE
    else:
        kind = UpgradeType.UNSAFE_DOWNGRADE if args.unsafe else UpgradeType.SAFE_DOWNGRADE
    pairs = (
        [(name.strip(), 0) for name in args.feature or ()]
        if args.action == "disable"
        else [parse_feature(f) for f in args.feature or ()]
    )
    out: dict[str, FeatureUpdate] = {}
    for name, level in pairs:
        if name in out:
            raise ValueError(f"feature {name} was given more than once")
        out[name] = FeatureUpdate(level, kind)
    if not out:
        raise ValueError(f"{args.action} needs at least one --feature")
    return out


@one_line_errors
def _features(args: argparse.Namespace) -> int:
    if getattr(args, "metadata", None) is not None:
        raise ValueError(f"--metadata is {_METADATA_HELP}")
    updates = _updates(args) if args.action != "describe" else {}
    with Admin(client_config(args)) as admin:
        if args.action == "describe":
            return _describe(admin)
        return _update(admin, args, updates)


def _describe(admin: Admin) -> int:
    meta = admin.describe_features()
    epoch = "-" if meta.finalized_epoch is None else str(meta.finalized_epoch)
    for name in sorted(meta.supported):
        lo, hi = meta.supported[name]
        print(
            f"Feature: {name}\tSupportedMinVersion: {lo}\tSupportedMaxVersion: {hi}"
            f"\tFinalizedVersionLevel: {meta.finalized.get(name, 0)}\tEpoch: {epoch}"
        )
    return 0


def _update(admin: Admin, args: argparse.Namespace, updates: dict[str, FeatureUpdate]) -> int:
    op = args.action
    try:
        admin.update_features(updates, validate_only=args.dry_run)
    except KafkaError as exc:
        # all or nothing: the refusal is every feature's answer
        for name in sorted(updates):
            what = f"disable {name}" if op == "disable" else f"{op} {name} to {updates[name].level}"
            print(f"{'Can not' if args.dry_run else 'Could not'} {what}. {exc}")
        print(
            f"samsa features: error: {len(updates)} out of {len(updates)} operation(s) failed.",
            file=sys.stderr,
        )
        return 1
    for name in sorted(updates):
        done = "disabled" if op == "disable" else f"{op}d to {updates[name].level}"
        print(f"{name} {'can be' if args.dry_run else 'was'} {done}.")
    return 0


def _add_bootstrap_after(parser: argparse.ArgumentParser) -> None:
    """The bootstrap flags after the sub-command too, as samsa's other tools take them; with
    no default there, so that they do not undo the same flags given before it."""
    add_bootstrap(parser)
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            action.default = argparse.SUPPRESS


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "features",
        help="describe and change the cluster's feature levels (as kafka-features)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_bootstrap(p)  # kafka-features takes them before the sub-command
    actions = p.add_subparsers(dest="action", required=True)
    describe = actions.add_parser("describe", help="the supported and finalized feature levels")
    _add_bootstrap_after(describe)
    changes = {
        "upgrade": "raise feature levels",
        "downgrade": "lower feature levels",
        "disable": "lower feature levels to 0",
    }
    for action, help_text in changes.items():
        a = actions.add_parser(action, help=help_text)
        _add_bootstrap_after(a)
        a.add_argument(
            "--feature",
            action="append",
            metavar="NAME" if action == "disable" else "NAME=LEVEL",
            help="a feature to change (repeatable)",
        )
        if action != "disable":
            a.add_argument("--metadata", metavar="VERSION", help=_METADATA_HELP)
        if action != "upgrade":
            a.add_argument(
                "--unsafe", action="store_true", help="an unsafe downgrade (may lose metadata)"
            )
        a.add_argument("--dry-run", action="store_true", help="validate only, change nothing")
    for parser in (describe, *(actions.choices[a] for a in changes)):
        parser.set_defaults(func=_features)
