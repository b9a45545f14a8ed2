"""``samsa consume TOPIC``: one value per line on stdout (kafka-console-consumer).

kafka-console-consumer's spellings work too: ``--topic``, ``--offset earliest|latest|N``,
``--property`` (or ``--formatter-property``) ``print.key``, ``print.value``,
``print.headers``, ``print.partition``, ``print.offset``, ``print.timestamp``,
``key.separator``, ``line.separator``, ``headers.separator``, ``headers.key.separator``,
``null.literal``, and ``--consumer-property k=v`` for any client setting; a record prints
as Kafka's DefaultMessageFormatter prints it.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from samsa.cli._clientutil import (
    Progress,
    add_bootstrap,
    add_properties,
    client_config,
    one_line_errors,
    parse_properties,
)
from samsa.cli._names import add_name
from samsa.client import Consumer, ConsumerRecord, KafkaError, TopicPartition
from samsa.protocol.errors import ErrorCode


class Formatter:
    """A record as kafka-console-consumer's DefaultMessageFormatter prints it."""

    def __init__(self, props: dict[str, str], args: argparse.Namespace) -> None:
        def flag(name: str, default: bool = False) -> bool:
            value = props.get(name)
            return default if value is None else value.strip().lower() == "true"

        self.timestamp = flag("print.timestamp")
        self.partition = flag("print.partition")
        self.offset = flag("print.offset")
        self.headers = flag("print.headers")
        self.key = args.print_key or flag("print.key")
        self.value = flag("print.value", True)
        sep = args.key_separator if args.key_separator is not None else "\t"
        self.sep = props.get("key.separator", sep).encode()
        self.line = props.get("line.separator", "\n").encode()
        self.headers_sep = props.get("headers.separator", ",").encode()
        self.header_key_sep = props.get("headers.key.separator", ":").encode()
        self.null = props.get("null.literal", "null").encode()

    def format(self, r: ConsumerRecord) -> bytes:
        fields: list[bytes] = []
        if self.timestamp:
            kind = "LogAppendTime" if r.timestamp_type == 1 else "CreateTime"
            fields.append(f"{kind}:{r.timestamp}".encode())
        if self.partition:
            fields.append(f"Partition:{r.partition}".encode())
        if self.offset:
            fields.append(f"Offset:{r.offset}".encode())
        if self.headers:
            shown = [
                k.encode() + self.header_key_sep + (self.null if v is None else v)
                for k, v in r.headers
            ]
            fields.append(self.headers_sep.join(shown) if shown else b"NO_HEADERS")
        if self.key:
            fields.append(self.null if r.key is None else r.key)
        if self.value:
            fields.append(self.null if r.value is None else r.value)
        return self.sep.join(fields) + self.line


@one_line_errors
def _consume(args: argparse.Namespace) -> int:
    start = args.offset
    earliest = args.from_beginning or start == "earliest"
    extra: dict[str, Any] = {
        "auto.offset.reset": "earliest" if earliest else "latest",
        "isolation.level": args.isolation_level,
        **parse_properties(args.consumer_property, "--consumer-property"),
    }
    if args.group:
        extra["group.id"] = args.group
    out = sys.stdout.buffer
    formatter = Formatter(parse_properties(args.property, "--property"), args)
    progress = Progress("records consumed", interval=5.0, enabled=args.progress)
    with Consumer(client_config(args, **extra)) as consumer:
        if args.group and args.partition is None:
            consumer.subscribe([args.topic])
        else:
            partitions = _partitions(consumer, args)
            consumer.assign(partitions)
            if start == "latest":
                consumer.seek_to_end(*partitions)
            elif start is not None and start != "earliest":
                for tp in partitions:
                    consumer.seek(tp, int(start))
            elif earliest:
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
                out.write(formatter.format(r))
            out.flush()
            progress.add(len(records))
        if args.group:
            consumer.commit()
    progress.done()
    return 0


def _offset(text: str) -> str:
    if text in ("earliest", "latest") or text.lstrip("-").isdigit():
        return text
    raise argparse.ArgumentTypeError("expected earliest, latest or an offset")


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
    add_name(p, "topic", "--topic")
    add_bootstrap(p)
    p.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    p.add_argument("--group", help="consumer group (subscribe and commit)")
    p.add_argument("--partition", type=int, help="read only this partition (no group protocol)")
    p.add_argument(
        "--offset",
        type=_offset,
        help="start: an offset, earliest or latest (with or without --partition)",
    )
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
    p.add_argument("--key-separator", help="separator for --print-key (tab)")
    add_properties(p, "formatter", "consumer", "print.key, print.headers, key.separator")
    p.add_argument("--progress", action="store_true", help="counts on stderr")
    p.set_defaults(func=_consume)
