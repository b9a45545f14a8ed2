"""``samsa demo``: delivery semantics, then the exactly-once Spark pipeline (see samsa.demo)."""

from __future__ import annotations

import argparse
from typing import Any


def _demo(args: argparse.Namespace) -> int:
    from samsa.demo import run

    return run(args.events, args.semantics_events, args.seed, args.master, args.keep)


def register(sub: Any) -> None:
    from samsa.demo import add_arguments

    p = sub.add_parser("demo", help="end-to-end demo: delivery semantics, Spark exactly once")
    add_arguments(p)
    p.set_defaults(func=_demo)
