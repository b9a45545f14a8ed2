"""``samsa configs``: describe and alter topic configs and dynamic broker configs (rule 44),
with kafka-configs' flags (``--entity-default`` names the cluster-wide broker defaults).

``--describe`` prints the topic's own (dynamic) configs, or with ``--all`` every config with
its source and synonyms; ``--alter`` sends one IncrementalAlterConfigs with ``--add-config``
as SET and ``--delete-config`` as DELETE (as kafka-configs does since Kafka 2.3). Both go
through the samsa :class:`Admin`.
"""

from __future__ import annotations

import argparse
from typing import Any

from samsa.broker.topic_config import ConfigSource
from samsa.cli._clientutil import add_bootstrap, client_config, one_line_errors
from samsa.client import Admin, AlterConfigOp, ConfigResource

RESOURCE_TYPES = {"topics": ConfigResource.TOPIC, "brokers": ConfigResource.BROKER}
_SINGULAR = {"topics": "topic", "brokers": "broker"}


def parse_add_config(text: str) -> list[tuple[str, str]]:
    """kafka-configs' ``k1=v1,k2=[a,b]``: commas split pairs except inside brackets, which
    hold a list value."""
    pairs, depth, current = [], 0, ""
    for ch in text + ",":
        if ch == "," and depth == 0:
            if current.strip():
                key, sep, value = current.partition("=")
                if not sep or not key.strip():
                    raise ValueError(f"--add-config expects KEY=VALUE pairs, got {current!r}")
                value = value.strip()
                if value.startswith("[") and value.endswith("]"):
                    value = value[1:-1]
                pairs.append((key.strip(), value))
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(ch, 0)
        current += ch
    return pairs


def _shown(value: str | None) -> str:
    return "null" if value is None else value  # as Kafka's tools print a hidden value


def _source_name(source: int) -> str:
    try:
        return ConfigSource(source).name
    except ValueError:
        return "UNKNOWN"


@one_line_errors
def _configs(args: argparse.Namespace) -> int:
    if args.describe == args.alter:
        raise ValueError("exactly one of --describe and --alter is needed")
    rtype = RESOURCE_TYPES[args.entity_type]
    name = args.entity_name
    if args.entity_default:
        if rtype == RESOURCE_TYPES["topics"]:
            raise ValueError("--entity-default is only for --entity-type brokers")
        if name is not None:
            raise ValueError("only one of --entity-name and --entity-default")
        name = ""  # the cluster-wide broker defaults (rule 44)
    if name is None:
        if rtype == RESOURCE_TYPES["topics"] or args.alter:
            raise ValueError("--entity-name or --entity-default is needed")
        name = ""
    resource = ConfigResource(rtype, name)
    with Admin(client_config(args)) as admin:
        return _describe(admin, args, resource) if args.describe else _alter(admin, args, resource)


def _describe(admin: Admin, args: argparse.Namespace, resource: ConfigResource) -> int:
    configs = admin.describe_configs([resource])[resource]
    dynamic = {
        ConfigSource.DYNAMIC_TOPIC_CONFIG,
        ConfigSource.DYNAMIC_BROKER_CONFIG,
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
    }
    if resource.name:
        what = f"{_SINGULAR[args.entity_type]} {resource.name}"
        print(f"{'All' if args.all else 'Dynamic'} configs for {what} are:")
    else:  # as kafka-configs says it
        print("Default configs for brokers in the cluster are:")
    for c in sorted(configs.values(), key=lambda c: c.name):
        if not args.all and c.source not in dynamic:
            continue
        synonyms = ", ".join(
            f"{_source_name(s.source)}:{s.name}={_shown(s.value)}" for s in c.synonyms
        )
        sensitive = str(c.sensitive).lower()
        print(f"  {c.name}={_shown(c.value)} sensitive={sensitive} synonyms={{{synonyms}}}")
    return 0


def _alter(admin: Admin, args: argparse.Namespace, resource: ConfigResource) -> int:
    ops: list[AlterConfigOp] = []
    for item in args.add_config or []:
        ops += [AlterConfigOp(k, value, AlterConfigOp.SET) for k, value in parse_add_config(item)]
    for item in args.delete_config or []:
        ops += [
            AlterConfigOp(k.strip(), None, AlterConfigOp.DELETE)
            for k in item.split(",")
            if k.strip()
        ]
    if not ops:
        raise ValueError("--alter needs --add-config or --delete-config")
    for err in admin.incremental_alter_configs({resource: ops}).values():
        if err is not None:
            raise err
    if resource.name:
        print(f"Completed updating config for {_SINGULAR[args.entity_type]} {resource.name}.")
    else:
        print("Completed updating default config for brokers in the cluster.")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("configs", help="describe and alter topic and broker configs")
    p.add_argument("--entity-type", choices=sorted(RESOURCE_TYPES), required=True)
    p.add_argument("--entity-name", help="the topic name or broker id")
    p.add_argument(
        "--entity-default",
        action="store_true",
        help="brokers: the cluster-wide default configs (rule 44)",
    )
    p.add_argument("--describe", action="store_true", help="show the configs")
    p.add_argument("--alter", action="store_true", help="change the configs")
    p.add_argument("--all", action="store_true", help="describe: every config, not only dynamic")
    p.add_argument(
        "--add-config",
        action="append",
        metavar="K=V,K2=V2",
        help="configs to set; a list value goes in brackets: cleanup.policy=[compact,delete]",
    )
    p.add_argument("--delete-config", action="append", metavar="K,K2", help="configs to remove")
    add_bootstrap(p)
    p.set_defaults(func=_configs)
