"""``samsa records delete`` (kafka-delete-records): move partitions' log start offsets up.

The partitions come from ``--topic/--partition/--offset`` or, as with kafka-delete-records,
an ``--offset-json-file`` of ``{"partitions": [{"topic": T, "partition": P, "offset": O}]}``;
offset -1 means the high watermark.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from samsa.cli._clientutil import add_bootstrap, client_config, one_line_errors
from samsa.client import Admin, TopicPartition


def offsets_from_json(text: str) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of kafka-delete-records' JSON; ValueError if malformed."""
    try:
        doc = json.loads(text)
        out = [(str(p["topic"]), int(p["partition"]), int(p["offset"])) for p in doc["partitions"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f'offset JSON file: expected {{"partitions": [...]}}: {exc}') from None
    if len({(t, p) for t, p, _ in out}) != len(out):
        raise ValueError("offset JSON file names a partition twice")
    return out


@one_line_errors
def _delete(args: argparse.Namespace) -> int:
    if args.offset_json_file is not None:
        targets = offsets_from_json(Path(args.offset_json_file).read_text())
    elif args.topic is not None and args.partition is not None and args.offset is not None:
        targets = [(args.topic, args.partition, args.offset)]
    else:
        raise ValueError("give --offset-json-file, or --topic, --partition and --offset")
    with Admin(client_config(args)) as admin:
        deleted = admin.delete_records({TopicPartition(t, p): o for t, p, o in targets})
    print("Records delete operation completed:")
    failed = 0
    for tp, result in sorted(deleted.items()):
        if result.error is None:
            print(f"partition: {tp.topic}-{tp.partition}\tlow_watermark: {result.low_watermark}")
        else:
            failed += 1
            print(f"partition: {tp.topic}-{tp.partition}\terror: {result.error.name}")
    return 1 if failed else 0


def register(sub: Any) -> None:
    p = sub.add_parser("records", help="delete records below an offset (kafka-delete-records)")
    actions = p.add_subparsers(dest="action", required=True)
    d = actions.add_parser("delete", help="move partitions' log start offsets up")
    d.add_argument("--topic")
    d.add_argument("--partition", type=int)
    d.add_argument("--offset", type=int, help="first offset kept; -1: the high watermark")
    d.add_argument("--offset-json-file", metavar="FILE", help="kafka-delete-records' JSON")
    add_bootstrap(d)
    d.set_defaults(func=_delete)
