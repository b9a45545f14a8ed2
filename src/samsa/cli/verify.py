"""``samsa verify``: a Jepsen-style run under faults and its checked history."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from samsa.client import ClosedError, ConfigError, KafkaError
from samsa.verify.checker import check
from samsa.verify.history import History
from samsa.verify.report import anomaly_table, render, write_report
from samsa.verify.workload import VerifyConfig, VerifyError, run_verify

# Fault options that mean something only with --proxy, and their defaults there.
_FAULT_DEFAULTS = {"drop_response_rate": 0.05, "reset_rate": 0.05, "delay_ms": 5.0}
_LIES = ("replay_rate", "fake_ack_rate")


def _config(args: argparse.Namespace) -> VerifyConfig:
    given = {k: getattr(args, k) for k in _FAULT_DEFAULTS if getattr(args, k) is not None}
    lies = {k: getattr(args, k) for k in _LIES if getattr(args, k) is not None}
    if (given or lies) and not args.proxy:
        flags = ", ".join("--" + k.replace("_", "-") for k in [*given, *lies])
        raise ValueError(f"{flags} need --proxy (faults are injected by the proxy)")
    if args.restarts is not None and not args.restart_broker:
        raise ValueError("--restarts needs --restart-broker")
    if args.pauses is not None and not args.pause_broker:
        raise ValueError("--pauses needs --pause-broker")
    return VerifyConfig(
        bootstrap=args.bootstrap_server,
        processes=args.processes,
        keys=args.keys,
        rate=args.rate,
        time_limit=args.time_limit,
        transactions=args.transactions,
        subscribe=args.subscribe,
        idempotence=not args.no_idempotence,
        abort_rate=args.abort_rate,
        crash_interval=args.crash_clients,
        proxy=args.proxy,
        fault_window_s=args.fault_window,
        restart_command=args.restart_broker,
        restarts=(1 if args.restart_broker else 0) if args.restarts is None else args.restarts,
        pause_target=args.pause_broker,
        pauses=(1 if args.pause_broker else 0) if args.pauses is None else args.pauses,
        pause_s=args.pause_s,
        session_timeout_ms=args.session_timeout_ms,
        strict=args.strict,
        seed=args.seed,
        topic=args.topic,
        **{**_FAULT_DEFAULTS, **given, **lies},
    )


def _recheck(args: argparse.Namespace) -> int:
    try:
        history = History.load(args.check)
    except (OSError, ValueError) as exc:
        print(f"samsa verify: error: {exc}", file=sys.stderr)
        return 2
    result = check(history, subscribe=args.subscribe, strict=args.strict)
    print(anomaly_table(result))
    print("result: " + ("valid" if result.ok else "INVALID: " + ", ".join(result.bad_kinds)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.to_json(), f, indent=2, default=str)
    return 0 if result.ok else 1


def _verify(args: argparse.Namespace) -> int:
    if args.check:
        return _recheck(args)
    try:
        cfg = _config(args)
        cfg.validate()
    except ValueError as exc:
        print(f"samsa verify: error: {exc}", file=sys.stderr)
        return 2
    if args.report:
        try:
            import matplotlib  # noqa: F401  (fail now, not after the run)
        except ImportError:
            print(
                "samsa verify: error: --report needs matplotlib (pip install 'samsa[verify]')",
                file=sys.stderr,
            )
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
    if args.report:
        files = write_report(args.report, result)
        print(f"report: {files[-1]}", flush=True)
    if args.json:
        data: dict[str, Any] = {
            "summary": result.summary(),
            "notes": result.notes,
            **result.check.to_json(),
        }
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2, default=str)
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
        help="check a broker's guarantees under faults, at Jepsen's depth",
        description="Run concurrent client processes (OS processes, each a producer and a "
        "read_committed consumer) issuing sends and polls, in transactions or not, at a fixed "
        "rate, while faults are injected (a proxy's lost responses, resets and delays; broker "
        "restarts; broker pauses; client processes SIGKILLed and replaced); have every live "
        "process read every partition to its end; then check the "
        "history for every anomaly Jepsen's Kafka checker knows (lost writes, duplicates, "
        "inconsistent offsets, skipped or non-monotonic polls and sends, aborted and "
        "precommitted reads, torn transactions, dependency cycles). Exit status: 0 valid, "
        "1 anomalies outside the allowed classes, 2 bad options or setup failure.",
    )
    p.add_argument("--bootstrap-server", default="127.0.0.1:9092", metavar="HOST:PORT")
    p.add_argument("--processes", type=_positive(int), default=4, metavar="N", help="(4)")
    p.add_argument("--keys", type=_positive(int), default=4, metavar="N", help="partitions (4)")
    p.add_argument("--rate", type=_positive(float), default=40.0, metavar="R", help="ops/s (40)")
    p.add_argument("--time-limit", type=_positive(float), default=30.0, metavar="S", help="(30)")
    p.add_argument("--transactions", action="store_true", help="1-4 operations per transaction")
    p.add_argument("--subscribe", action="store_true", help="consumers in a group (else assign)")
    p.add_argument(
        "--no-idempotence",
        action="store_true",
        help="control run: plain producers, whose retries must show up as duplicates",
    )
    p.add_argument("--abort-rate", type=float, default=0.1, metavar="R", help="(0.1)")
    p.add_argument(
        "--crash-clients",
        type=_positive(float),
        metavar="S",
        help="SIGKILL each client process every S seconds on average (a new one replaces it)",
    )
    p.add_argument("--proxy", action="store_true", help="go through a fault-injecting proxy")
    p.add_argument("--drop-response-rate", type=float, metavar="R", help="(--proxy) 0.05")
    p.add_argument("--reset-rate", type=float, metavar="R", help="(--proxy) 0.05")
    p.add_argument("--delay-ms", type=float, metavar="N", help="(--proxy) 5")
    p.add_argument(
        "--fault-window",
        type=_positive(float),
        default=5.0,
        metavar="S",
        help="proxy faults on in alternate windows this long (5)",
    )
    p.add_argument("--replay-rate", type=float, metavar="R", help="(--proxy) lie: old answers")
    p.add_argument("--fake-ack-rate", type=float, metavar="R", help="(--proxy) lie: fake acks")
    p.add_argument(
        "--restart-broker",
        metavar="CMD",
        help="shell command that kills the broker (e.g. SIGKILL) and starts it again, "
        "returning once it is back",
    )
    p.add_argument("--restarts", type=_positive(int), metavar="N", help="times to run it (1)")
    p.add_argument(
        "--pause-broker",
        metavar="PID|CMD",
        help="the broker's pid, or a shell command printing it: SIGSTOP, then SIGCONT",
    )
    p.add_argument("--pauses", type=_positive(int), metavar="N", help="(1)")
    p.add_argument("--pause-s", type=_positive(float), default=3.0, metavar="S", help="(3)")
    p.add_argument(
        "--session-timeout-ms",
        type=_positive(int),
        default=6000,
        metavar="MS",
        help="group members' session.timeout.ms (6000): a crashed member stalls the group "
        "this long",
    )
    p.add_argument("--strict", action="store_true", help="count the allowed classes too")
    p.add_argument("--seed", type=int, metavar="S", help="random seed (printed)")
    p.add_argument("--topic", help="topic to create (default verify-<random>)")
    p.add_argument("--report", metavar="DIR", help="write history, summary, pictures, HTML")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    p.add_argument("--check", metavar="HISTORY", help="only check a saved history.jsonl")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=_verify)
