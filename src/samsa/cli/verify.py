"""``samsa verify``: run producers under faults, read back, print the anomalies."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from samsa.client import ClosedError, ConfigError, KafkaError
from samsa.verify import VerifyConfig, VerifyError, render, run_verify

# Fault options that mean something only with --proxy, and their defaults there.
_FAULT_DEFAULTS = {"drop_response_rate": 0.05, "reset_rate": 0.05, "delay_ms": 5.0}


def _config(args: argparse.Namespace) -> VerifyConfig:
    given = {k: getattr(args, k) for k in _FAULT_DEFAULTS if getattr(args, k) is not None}
    if given and not args.proxy:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ValueError(f"{flags} need --proxy (faults are injected by the proxy)")
    if args.restarts is not None and not args.restart_broker:
        raise ValueError("--restarts needs --restart-broker")
    return VerifyConfig(
        bootstrap=args.bootstrap_server,
        proxy=args.proxy,
        producers=args.producers,
        records=args.records,
        partitions=args.partitions,
        transactions=args.transactions,
        idempotence=not args.no_idempotence,
        txn_size=args.txn_size,
        abort_rate=args.abort_rate,
        restart_command=args.restart_broker,
        restarts=1 if args.restarts is None else args.restarts,
        seed=args.seed,
        timeout_s=args.timeout_s,
        topic=args.topic,
        **{**_FAULT_DEFAULTS, **given},
    )


def _verify(args: argparse.Namespace) -> int:
    try:
        cfg = _config(args)
        cfg.validate()
    except ValueError as exc:
        print(f"samsa verify: error: {exc}", file=sys.stderr)
        return 2

    def say(msg: str) -> None:
        if not args.quiet:
            print(f"verify: {msg}", file=sys.stderr, flush=True)

    try:
        result = run_verify(cfg, say)
    except (VerifyError, KafkaError, ConfigError, ClosedError, OSError) as exc:
        print(f"samsa verify: error: {exc}", file=sys.stderr)
        return 2
    print(render(result), flush=True)
    if args.json:
        data: dict[str, Any] = {
            "ok": result.ok,
            "summary": result.summary(),
            "anomalies": result.check.anomalies,
            "proxy": result.proxy_stats,
            "notes": result.notes,
        }
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
    return 0 if result.ok else 1


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def register(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="check a broker's exactly-once guarantees under faults",
        description="Run idempotent (or transactional) producers, optionally through a "
        "fault-injecting proxy and with broker restarts, read everything back with "
        "read_committed consumers and report lost, duplicated, reordered, aborted-but-read "
        "and misplaced records. Exit status: 0 no anomaly, 1 anomalies, 2 bad options or "
        "setup failure.",
    )
    p.add_argument("--bootstrap-server", default="127.0.0.1:9092", metavar="HOST:PORT")
    p.add_argument("--proxy", action="store_true", help="go through a fault-injecting proxy")
    p.add_argument("--producers", type=_positive(int), default=3, metavar="N")
    p.add_argument("--records", type=_positive(int), default=3000, metavar="N", help="in all")
    p.add_argument("--partitions", type=_positive(int), default=3, metavar="N")
    p.add_argument("--transactions", action="store_true", help="transactional producers")
    p.add_argument(
        "--no-idempotence",
        action="store_true",
        help="control run: plain producers, whose retries must show up as duplicates",
    )
    p.add_argument("--txn-size", type=_positive(int), default=10, metavar="N")
    p.add_argument(
        "--abort-rate", type=float, default=0.2, metavar="R", help="transactions aborted on purpose"
    )
    p.add_argument(
        "--restart-broker",
        metavar="CMD",
        help="shell command run during the run (e.g. kill -9 the broker and start it again); "
        "it should return once the broker is back",
    )
    p.add_argument("--restarts", type=_positive(int), metavar="N", help="times to run it (1)")
    p.add_argument("--drop-response-rate", type=float, metavar="R", help="(--proxy) 0.05")
    p.add_argument("--reset-rate", type=float, metavar="R", help="(--proxy) 0.05")
    p.add_argument("--delay-ms", type=float, metavar="N", help="(--proxy) 5")
    p.add_argument("--seed", type=int, metavar="S", help="random seed (printed when not given)")
    p.add_argument("--timeout-s", type=_positive(float), default=120.0, metavar="T")
    p.add_argument("--topic", help="topic to create (default verify-<random>)")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=_verify)
