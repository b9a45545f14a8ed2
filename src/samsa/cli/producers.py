"""``samsa producers TOPIC``: active producers per partition (kafka-transactions
describe-producers)."""

from __future__ import annotations

import argparse
from typing import Any

from samsa.cli._clientutil import (
    add_bootstrap,
    client_config,
    command_security,
    one_line_errors,
)
from samsa.cli._names import add_name
from samsa.client import Admin, Consumer, TopicPartition
from samsa.client._connection import BlockingConnection
from samsa.protocol.constants import EARLIEST, LATEST
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import iter_batches
from samsa.testing import fetch_request


@one_line_errors
def describe(args: argparse.Namespace) -> int:
    with Admin(client_config(args)) as admin:
        if args.partition is not None:
            partitions = [args.partition]
        else:
            (meta,) = admin.describe_topics([args.topic])
            partitions = [p.partition for p in meta.partitions]
        states = admin.describe_producers(TopicPartition(args.topic, p) for p in partitions)
    last_offsets: dict[TopicPartition, dict[int, int]] = {}
    if any(states.values()):
        with Consumer(client_config(args, **{"isolation.level": "read_uncommitted"})) as c:
            for tp, producers in states.items():
                if producers:
                    pids = {s.producer_id for s in producers}
                    last_offsets[tp] = _last_offsets(c, args, tp, pids)
    print(
        "PARTITION\tPRODUCER_ID\tEPOCH\tLAST_SEQUENCE\tLAST_OFFSET\tLAST_TIMESTAMP"
        "\tTXN_START_OFFSET"
    )
    for tp in sorted(states):
        for s in states[tp]:
            last = last_offsets.get(tp, {}).get(s.producer_id, -1)
            print(
                f"{tp.partition}\t{s.producer_id}\t{s.epoch}\t{s.last_sequence}\t{last}"
                f"\t{s.last_timestamp}\t{s.current_txn_start_offset}"
            )
    return 0


def _last_offsets(
    consumer: Consumer, args: argparse.Namespace, tp: TopicPartition, producer_ids: set[int]
) -> dict[int, int]:
    """Offset of each producer's last record, found by reading the partition's tail in
    windows that double backwards. DescribeProducers (KIP-664) carries no offsets, and the
    records carry no producer ids, so the batches' headers are read raw."""
    start = consumer.list_offsets([tp], EARLIEST)[tp]
    end = consumer.list_offsets([tp], LATEST)[tp]
    found: dict[int, int] = {}
    window = 1000
    upper = end
    host, _, port = args.bootstrap_server.split(",")[0].strip().rpartition(":")
    # One broker answers for every partition in samsa; on a cluster the partition's leader
    # would be needed, and a refusal just leaves the offset unknown (-1).
    with BlockingConnection(host, int(port), security=command_security(args)) as conn:
        while upper > start and len(found) < len(producer_ids):
            lower = max(start, upper - window)
            for batch in _batches(conn, tp, lower, upper):
                if batch.producer_id in producer_ids and not batch.is_control:
                    found[batch.producer_id] = max(
                        found.get(batch.producer_id, -1), batch.last_offset
                    )
            upper, window = lower, window * 2
    return found


def _batches(conn: BlockingConnection, tp: TopicPartition, lower: int, upper: int) -> list[Any]:
    out = []
    offset = lower
    while offset < upper:
        resp = conn.request(ApiKey.FETCH, 12, fetch_request({(tp.topic, tp.partition): offset}))
        part = resp.responses[0].partitions[0]
        if int(part.error_code):
            break
        records = part.records or b""
        batches = [b for b in iter_batches(records) if b.last_offset >= offset]
        if not batches:
            break
        out.extend(b for b in batches if b.base_offset < upper)
        offset = batches[-1].next_offset
    return out


def register(sub: Any) -> None:
    p = sub.add_parser("producers", help="producer state (id, epoch, sequence) per partition")
    add_name(p, "topic", "--topic")
    p.add_argument("--partition", type=int)
    add_bootstrap(p)
    p.set_defaults(func=describe)
