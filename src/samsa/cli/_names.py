"""Names a command takes either positionally or by the flag Kafka's tools spell them with:
pure argparse, so the ``samsa`` entry point checks them without importing a command's
dependencies."""

from __future__ import annotations

import argparse
from typing import Any


class _Positional(argparse.Action):
    """A positional that fills the same ``dest`` as its Kafka-style flag, without erasing
    the flag's value when left out."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        if isinstance(values, list):
            setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), *values])
        elif values is not None:
            setattr(namespace, self.dest, values)


def add_name(
    parser: argparse.ArgumentParser,
    dest: str,
    flag: str,
    *,
    many: bool = False,
    required: bool = True,
    help: str | None = None,
) -> None:
    """An argument given either positionally (``samsa topics create orders``) or by the flag
    Kafka's tools spell it with (``--topic orders``): a Kafka user's command line works too."""
    parser.add_argument(
        dest,
        nargs="*" if many else "?",
        action=_Positional,
        default=argparse.SUPPRESS,
        metavar=dest.upper(),
        help=help,
    )
    parser.add_argument(
        flag,
        dest=dest,
        action="append" if many else "store",
        default=[] if many else None,
        metavar=dest.upper(),
        help=f"the same as {dest.upper()}, as Kafka's tools spell it",
    )
    if required:
        needs = parser.get_default("needs") or ()
        parser.set_defaults(needs=(*needs, (dest, flag)))


def missing_names(args: argparse.Namespace) -> list[str]:
    """The required names (see :func:`add_name`) given neither way."""
    return [
        f"{dest.upper()} (or {flag})"
        for dest, flag in getattr(args, "needs", ())
        if getattr(args, dest, None) in (None, [])
    ]
