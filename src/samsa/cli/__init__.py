"""The ``samsa`` command line: one module per command group, registered in COMMANDS."""

from __future__ import annotations

import argparse
import logging
import sys

from samsa.broker.config import ConfigError
from samsa.cli import (
    acls,
    broker,
    configs,
    consume,
    demo,
    features,
    groups,
    produce,
    producers,
    proxy,
    records,
    topics,
    transactions,
    users,
    verify,
)

# Each command module has register(subparsers): it adds its sub-command(s) with a `func`.
COMMANDS = [
    broker,
    produce,
    consume,
    topics,
    configs,
    records,
    producers,
    proxy,
    verify,
    transactions,
    groups,
    users,
    acls,
    features,
    demo,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="samsa",
        description="A Kafka-compatible log broker with exactly-once delivery, and its tools.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
