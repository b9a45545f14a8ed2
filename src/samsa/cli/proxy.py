"""``samsa proxy``: a fault-injecting Kafka proxy in the foreground until interrupted."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from samsa.testing.proxy import FaultProxy, Faults, format_stats, parse_address


def _proxy(args: argparse.Namespace) -> int:
    try:
        upstream = parse_address(args.bootstrap_server)
        listen = parse_address(args.listen)
        faults = Faults(
            drop_response_rate=args.drop_response_rate,
            reset_rate=args.reset_rate,
            delay_ms=args.delay_ms,
            grace_requests=args.grace_requests,
        )
        proxy = FaultProxy(upstream, listen=listen, faults=faults, seed=args.seed)
    except (ValueError, OSError) as exc:
        print(f"samsa proxy: error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with proxy:
        proxy.start()
        print(f"samsa proxy ready on {proxy.address} -> {args.bootstrap_server}", flush=True)
        while not stop.wait(args.stats_interval_s or None):
            print(f"proxy stats: {format_stats(proxy.stats)}", file=sys.stderr, flush=True)
    print(f"proxy stats: {format_stats(proxy.stats)}", file=sys.stderr, flush=True)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "proxy",
        help="fault-injecting Kafka proxy (lost responses, resets, delays)",
        description="Forward Kafka connections to a broker, losing responses after the broker "
        "acted on them, resetting connections and delaying frames. Broker addresses in "
        "Metadata, FindCoordinator and DescribeCluster responses are rewritten to proxy "
        "listeners so that clients never bypass it.",
    )
    p.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT", help="the broker")
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    p.add_argument("--drop-response-rate", type=float, default=0.0, metavar="R")
    p.add_argument("--reset-rate", type=float, default=0.0, metavar="R")
    p.add_argument("--delay-ms", type=float, default=0.0, metavar="N")
    p.add_argument(
        "--grace-requests", type=int, default=1, metavar="N", help="unharmed per connection (1)"
    )
    p.add_argument("--seed", type=int, metavar="S")
    p.add_argument("--stats-interval-s", type=float, default=10.0, metavar="T", help="0: never")
    p.set_defaults(func=_proxy)
