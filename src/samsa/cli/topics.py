"""``samsa topics create|list|describe|alter|delete`` (kafka-topics)."""

from __future__ import annotations

import argparse
from typing import Any

from samsa.cli._clientutil import add_bootstrap, client_config, one_line_errors
from samsa.cli._names import add_name
from samsa.client import Admin, KafkaError, NewTopic


@one_line_errors
def _create(args: argparse.Namespace) -> int:
    config = dict(_kv(item) for item in args.config or [])
    with Admin(client_config(args)) as admin:
        err = admin.create_topics(
            [NewTopic(args.topic, args.partitions, args.replication_factor, config)]
        )[args.topic]
        if err is not None:
            if args.if_not_exists and err.name == "TOPIC_ALREADY_EXISTS":
                return 0
            raise err
    print(f"Created topic {args.topic}.")
    return 0


def _kv(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep:
        raise ValueError(f"--config expects KEY=VALUE, got {item!r}")
    return key, value


@one_line_errors
def _list(args: argparse.Namespace) -> int:
    with Admin(client_config(args)) as admin:
        for name in admin.list_topics(internal=args.internal):
            print(name)
    return 0


@one_line_errors
def _describe(args: argparse.Namespace) -> int:
    with Admin(client_config(args)) as admin:
        topics = admin.describe_topics(args.topic or None)
    for t in topics:
        print(
            f"Topic: {t.name}\tTopicId: {t.topic_id}\tPartitionCount: {len(t.partitions)}"
            f"\tReplicationFactor: {len(t.partitions[0].replicas) if t.partitions else 0}"
        )
        for p in t.partitions:
            print(
                f"\tTopic: {t.name}\tPartition: {p.partition}\tLeader: {p.leader}"
                f"\tReplicas: {','.join(map(str, p.replicas))}\tIsr: {','.join(map(str, p.isr))}"
            )
    return 0


@one_line_errors
def _alter(args: argparse.Namespace) -> int:
    with Admin(client_config(args)) as admin:
        err = admin.create_partitions({args.topic: args.partitions})[args.topic]
    if err is not None:
        raise err
    print(f"Topic {args.topic} now has {args.partitions} partitions.")
    return 0


@one_line_errors
def _delete(args: argparse.Namespace) -> int:
    with Admin(client_config(args)) as admin:
        errors = admin.delete_topics(args.topic)
    failed: KafkaError | None = None
    for name, err in errors.items():
        if err is None:
            print(f"Deleted topic {name}.")
        elif not (args.if_exists and err.name == "UNKNOWN_TOPIC_OR_PARTITION"):
            failed = failed or err
    if failed is not None:
        raise failed
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "topics",
        help="create, list, describe and delete topics",
        description="Also takes kafka-topics' flags: --create/--list/--describe/--alter/"
        "--delete and --topic NAME.",
    )
    actions = p.add_subparsers(dest="action", required=True)
    c = actions.add_parser("create", help="create a topic")
    add_name(c, "topic", "--topic")
    c.add_argument("--partitions", type=int, default=1)
    c.add_argument(
        "--replication-factor", type=int, default=1, help="the broker refuses more than it has"
    )
    c.add_argument("--config", action="append", metavar="KEY=VALUE", help="topic config")
    c.add_argument("--if-not-exists", action="store_true")
    c.set_defaults(func=_create)
    ls = actions.add_parser("list", help="list topic names")
    ls.add_argument("--internal", action="store_true", help="include internal topics")
    ls.add_argument("--exclude-internal", action="store_false", dest="internal", help="the default")
    ls.set_defaults(func=_list)
    d = actions.add_parser("describe", help="partitions and leaders")
    add_name(d, "topic", "--topic", many=True, required=False, help="default: every topic")
    d.set_defaults(func=_describe)
    al = actions.add_parser("alter", help="add partitions (the count only grows)")
    add_name(al, "topic", "--topic")
    al.add_argument("--partitions", type=int, required=True, help="the new partition count")
    al.set_defaults(func=_alter)
    rm = actions.add_parser("delete", help="delete topics")
    add_name(rm, "topic", "--topic", many=True)
    rm.add_argument("--if-exists", action="store_true")
    rm.set_defaults(func=_delete)
    for a in (c, ls, d, al, rm):
        add_bootstrap(a)
