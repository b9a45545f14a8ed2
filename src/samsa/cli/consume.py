"""``samsa consume TOPIC``: one value per line on stdout (kafka-console-consumer)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from samsa.cli._clientutil import Progress, add_bootstrap, client_config, one_line_errors
from samsa.client import Consumer, KafkaError, TopicPartition
from samsa.protocol.errors import ErrorCode


@one_line_errors
def _consume(args: argparse.Namespace) -> int:
    extra: dict[str, Any] = {
        "auto.offset.reset": "earliest" if args.from_beginning else "latest",
        "isolation.level": args.isolation_level,
    }
    if args.group:
        extra["group.id"] = args.group
    out = sys.stdout.buffer
    sep = args.key_separator.encode()
    progress = Progress("records consumed", interval=5.0, enabled=args.progress)
    with Consumer(client_config(args, **extra)) as consumer:
        if args.group and args.partition is None:
            consumer.subscribe([args.topic])
        else:
            partitions = _partitions(consumer, args)
            consumer.assign(partitions)
            if args.offset is not None:
                for tp in partitions:
                    consumer.seek(tp, args.offset)
            elif args.from_beginning:
                consumer.seek_to_beginning(*partitions)
        idle_since = time.monotonic()
        while args.max_messages is None or progress.count < args.max_messages:
            wait = 0.5
            if args.timeout_ms is not None:
                left = args.timeout_ms / 1000 - (time.monotonic() - idle_since)
                if left <= 0:
                    break
                wait = min(wait, left)
            want = None if args.max_messages is None else args.max_messages - progress.count
            records = consumer.poll(wait, want)
            if records:
                idle_since = time.monotonic()
            for r in records:
                if args.print_key:
                    out.write((r.key or b"null") + sep)
                out.write((r.value if r.value is not None else b"null") + b"\n")
            out.flush()
            progress.add(len(records))
        if args.group:
            consumer.commit()
    progress.done()
    return 0


def _partitions(consumer: Consumer, args: argparse.Namespace) -> list[TopicPartition]:
    if args.partition is not None:
        return [TopicPartition(args.topic, args.partition)]
    from samsa.client import Admin

    with Admin(client_config(args)) as admin:
        (meta,) = admin.describe_topics([args.topic])
    if meta.error:
        raise KafkaError(meta.error, args.topic)
    if not meta.partitions:
        raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, args.topic)
    return [TopicPartition(args.topic, p.partition) for p in meta.partitions]


def register(sub: Any) -> None:
    p = sub.add_parser("consume", help="print a topic's records, one value per line")
    p.add_argument("topic")
    add_bootstrap(p)
    p.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    p.add_argument("--group", help="consumer group (subscribe and commit)")
    p.add_argument("--partition", type=int, help="read only this partition (no group protocol)")
    p.add_argument("--offset", type=int, help="start offset (with or without --partition)")
    p.add_argument(
        "--isolation-level",
        default="read_uncommitted",
        choices=["read_uncommitted", "read_committed"],
    )
    p.add_argument("--max-messages", type=int, metavar="N", help="exit after N records")
    p.add_argument(
        "--timeout-ms", type=int, metavar="MS", help="exit when no record arrived for MS ms"
    )
    p.add_argument("--print-key", action="store_true", help="print KEY<sep>VALUE")
    p.add_argument("--key-separator", default="\t", help="separator for --print-key (tab)")
    p.add_argument("--progress", action="store_true", help="counts on stderr")
    p.set_defaults(func=_consume)
