"""``samsa produce TOPIC``: one record per stdin line, idempotent (kafka-console-producer).

kafka-console-producer's spellings work too: ``--topic``, ``--property`` (or
``--reader-property``) ``parse.key``, ``key.separator``, ``parse.headers``,
``headers.delimiter``, ``headers.separator``, ``headers.key.separator``, ``null.marker``,
and ``--producer-property k=v`` for any client setting.
"""

from __future__ import annotations

import argparse
import sys
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
from samsa.client import KafkaError, Producer


class LineReader:
    """Splits a stdin line as kafka-console-producer's LineMessageReader does: headers
    (``h1:v1,h2:v2``) before ``headers.delimiter``, then the key before ``key.separator``."""

    def __init__(self, props: dict[str, str], key_separator: str | None) -> None:
        self.parse_key = key_separator is not None or _true(props.get("parse.key"))
        self.key_sep = (key_separator or props.get("key.separator", "\t")).encode()
        self.parse_headers = _true(props.get("parse.headers"))
        self.headers_delim = props.get("headers.delimiter", "\t").encode()
        self.headers_sep = props.get("headers.separator", ",").encode()
        self.header_key_sep = props.get("headers.key.separator", ":").encode()
        marker = props.get("null.marker")
        self.null_marker = marker.encode() if marker is not None else None

    def parse(
        self, line: bytes, number: int
    ) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
        headers: list[tuple[str, bytes | None]] = []
        rest = line
        if self.parse_headers:
            raw, found, rest = rest.partition(self.headers_delim)
            if not found:
                raise ValueError(f"No headers delimiter found on line number {number}: {line!r}")
            if raw != self.null_marker:  # the null marker: no headers
                for pair in raw.split(self.headers_sep):
                    name, has_value, value = pair.partition(self.header_key_sep)
                    if not has_value:
                        raise ValueError(
                            f"No header key separator found in pair {pair!r} on line number "
                            f"{number}"
                        )
                    if name == self.null_marker:
                        raise ValueError("Header keys should not be equal to the null marker")
                    headers.append((name.decode(), self._null(value)))
        key: bytes | None = None
        if self.parse_key:
            key, found, rest = rest.partition(self.key_sep)
            if not found:
                raise ValueError(f"No key separator found on line number {number}: {line!r}")
            key = self._null(key)
        return key, self._null(rest), headers

    def _null(self, value: bytes) -> bytes | None:
        return None if self.null_marker is not None and value == self.null_marker else value


def _true(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "true"


@one_line_errors
def _produce(args: argparse.Namespace) -> int:
    extra: dict[str, Any] = {
        "linger.ms": args.linger_ms,
        "compression.type": args.compression,
        "delivery.timeout.ms": args.delivery_timeout_ms,
        **parse_properties(args.producer_property, "--producer-property"),
    }
    failures: list[BaseException] = []

    def on_delivery(err: BaseException | None, _md: object) -> None:
        if err is not None:
            failures.append(err)

    progress = Progress("records produced", enabled=not args.quiet)
    reader = LineReader(parse_properties(args.property, "--property"), args.key_separator)
    with Producer(client_config(args, **extra)) as producer:
        for number, raw in enumerate(sys.stdin.buffer, 1):
            key, value, headers = reader.parse(raw.rstrip(b"\r\n"), number)
            producer.produce(
                args.topic,
                value,
                key,
                partition=args.partition,
                headers=headers or None,
                on_delivery=on_delivery,
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
    add_name(p, "topic", "--topic")
    add_bootstrap(p)
    add_properties(p, "reader", "producer", "parse.key, key.separator, parse.headers")
    p.add_argument(
        "--key-separator",
        metavar="SEP",
        help="split each line into KEY SEP VALUE (as --property parse.key=true)",
    )
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
