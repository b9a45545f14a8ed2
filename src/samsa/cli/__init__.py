"""The ``samsa`` command line: one module per command group, registered in COMMANDS."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from samsa.broker.config import ConfigError
from samsa.cli._names import missing_names

# One module per command, named as the command; each has register(subparsers), adding its
# sub-command(s) with a `func`. A command line imports only the module of its command:
# `samsa broker` starts without the client, Arrow or Spark modules the tools need.
COMMANDS = (
    "broker",
    "produce",
    "consume",
    "topics",
    "configs",
    "records",
    "producers",
    "proxy",
    "verify",
    "transactions",
    "groups",
    "users",
    "acls",
    "features",
    "demo",
)


# Kafka's kafka-topics, kafka-consumer-groups and kafka-acls name their action by a flag
# (``--create``); samsa by a word after the command (``topics create``). Either works.
KAFKA_ACTIONS = {
    "topics": ("create", "list", "describe", "alter", "delete"),
    "groups": ("list", "describe", "delete", "reset-offsets", "delete-offsets"),
    "acls": ("add", "list", "remove"),
}


def kafka_style(argv: list[str]) -> list[str]:
    """``samsa topics --create --topic t`` as ``samsa topics create --topic t``: the one
    action flag moves to where samsa's action word goes; anything else is left as it is."""
    command = next((i for i, word in enumerate(argv) if not word.startswith("-")), None)
    if command is None or argv[command] not in KAFKA_ACTIONS:
        return argv
    actions = KAFKA_ACTIONS[argv[command]]
    rest = argv[command + 1 :]
    if rest and rest[0] in actions:
        return argv
    flags = [i for i, word in enumerate(rest) if word.startswith("--") and word[2:] in actions]
    if len(flags) != 1:
        return argv  # none or several: argparse says what is wrong
    action = rest.pop(flags[0])[2:]
    return [*argv[: command + 1], action, *rest]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``command`` alone when it is one of ours, else of them all (for --help
    and for argparse's error naming the choices)."""
    parser = argparse.ArgumentParser(
        prog="samsa",
        description="A Kafka-compatible log broker with exactly-once delivery, and its tools.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in [command] if command in COMMANDS else COMMANDS:
        importlib.import_module(f"samsa.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = kafka_style(list(sys.argv[1:] if argv is None else argv))
    command = next((w for w in words if not w.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(words)
    missing = missing_names(args)
    if missing:
        parser.error(f"{args.command}: the following arguments are required: {', '.join(missing)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"samsa: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
