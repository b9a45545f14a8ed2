"""``samsa produce TOPIC``: one record per stdin line, idempotent (kafka-console-producer)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from samsa.cli._clientutil import Progress, add_bootstrap, client_config, one_line_errors
from samsa.client import KafkaError, Producer


@one_line_errors
def _produce(args: argparse.Namespace) -> int:
    extra: dict[str, Any] = {
        "linger.ms": args.linger_ms,
        "compression.type": args.compression,
        "delivery.timeout.ms": args.delivery_timeout_ms,
    }
    failures: list[BaseException] = []

    def on_delivery(err: BaseException | None, _md: object) -> None:
        if err is not None:
            failures.append(err)

    progress = Progress("records produced", enabled=not args.quiet)
    sep = args.key_separator.encode() if args.key_separator else None
    with Producer(client_config(args, **extra)) as producer:
        for raw in sys.stdin.buffer:
            line = raw.rstrip(b"\r\n")
            key: bytes | None = None
            if sep is not None:
                key, found, value = line.partition(sep)
                if not found:
                    raise ValueError(f"line without key separator {args.key_separator!r}")
            else:
                value = line
            producer.produce(
                args.topic, value, key, partition=args.partition, on_delivery=on_delivery
            )
            progress.add()
            if progress.count % 1000 == 0:
                producer.poll()
                if failures:
                    break
        remaining = producer.flush(args.delivery_timeout_ms / 1000 + 5)
    if failures:
        raise (
            failures[0] if isinstance(failures[0], KafkaError) else KafkaError(-1, str(failures[0]))
        )
    if remaining:
        raise KafkaError(7, f"{remaining} records not delivered")
    progress.done()
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("produce", help="produce stdin lines to a topic (idempotent)")
    p.add_argument("topic")
    add_bootstrap(p)
    p.add_argument("--key-separator", metavar="SEP", help="split each line into KEY SEP VALUE")
    p.add_argument("--partition", type=int, help="write every record to this partition")
    p.add_argument(
        "--compression",
        default="none",
        choices=["none", "gzip", "snappy", "lz4", "zstd"],
        help="compression codec (default none)",
    )
    p.add_argument("--linger-ms", type=int, default=5, help="batching delay (default 5)")
    p.add_argument(
        "--delivery-timeout-ms", type=int, default=120_000, help="give up after (default 120000)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=_produce)
