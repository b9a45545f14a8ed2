"""``samsa producers TOPIC``: active producers per partition (kafka-transactions
describe-producers)."""

from __future__ import annotations

import argparse
from typing import Any

from samsa.cli._clientutil import add_bootstrap, client_config, one_line_errors
from samsa.client import Admin, TopicPartition


@one_line_errors
def _producers(args: argparse.Namespace) -> int:
    with Admin(client_config(args)) as admin:
        if args.partition is not None:
            partitions = [args.partition]
        else:
            (meta,) = admin.describe_topics([args.topic])
            partitions = [p.partition for p in meta.partitions]
        states = admin.describe_producers(TopicPartition(args.topic, p) for p in partitions)
    print("PARTITION\tPRODUCER_ID\tEPOCH\tLAST_SEQUENCE\tLAST_TIMESTAMP\tTXN_START_OFFSET")
    for tp in sorted(states):
        for s in states[tp]:
            print(
                f"{tp.partition}\t{s.producer_id}\t{s.epoch}\t{s.last_sequence}"
                f"\t{s.last_timestamp}\t{s.current_txn_start_offset}"
            )
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("producers", help="producer state (id, epoch, sequence) per partition")
    p.add_argument("topic")
    p.add_argument("--partition", type=int)
    add_bootstrap(p)
    p.set_defaults(func=_producers)
