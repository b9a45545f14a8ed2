"""``samsa configs``: describe and alter topic configs, dynamic broker configs (rule 44) and
client quotas, with kafka-configs' flags (``--entity-default`` names the cluster-wide broker
defaults, or the default user / client id).

``--describe`` prints the topic's own (dynamic) configs, or with ``--all`` every config with
its source and synonyms; ``--alter`` sends one IncrementalAlterConfigs with ``--add-config``
as SET and ``--delete-config`` as DELETE (as kafka-configs does since Kafka 2.3). Both go
through the samsa :class:`Admin`. Quotas (``--entity-type users``, ``clients``, ``ips``; users
with clients for a user's client id) go through DescribeClientQuotas / AlterClientQuotas.
"""

from __future__ import annotations

import argparse
from typing import Any

from samsa.broker.topic_config import ConfigSource
from samsa.cli._clientutil import add_bootstrap, client_config, one_line_errors
from samsa.client import (
    Admin,
    AlterConfigOp,
    ClientQuotaEntity,
    ClientQuotaFilterComponent,
    ConfigResource,
)

RESOURCE_TYPES = {"topics": ConfigResource.TOPIC, "brokers": ConfigResource.BROKER}
QUOTA_TYPES = {"users": "user", "clients": "client-id", "ips": "ip"}
_SINGULAR = {
    "topics": "topic",
    "brokers": "broker",
    "users": "user",
    "clients": "client",
    "ips": "ip",
}
_DESCRIBED = {"user": "user-principal", "client-id": "client-id", "ip": "ip"}
_DEFAULT = "<default>"  # --entity-default in the list of names


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
    types, names = args.entity_type, args.names or []
    if any(t in QUOTA_TYPES for t in types):
        return _quotas(args, types, names)
    if len(types) > 1 or len(names) > 1:
        raise ValueError("one --entity-type and one entity name for topics and brokers")
    rtype = RESOURCE_TYPES[types[0]]
    name = names[0] if names else None
    if name == _DEFAULT:
        if rtype == RESOURCE_TYPES["topics"]:
            raise ValueError("--entity-default is only for --entity-type brokers, users, clients")
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
        what = f"{_SINGULAR[args.entity_type[0]]} {resource.name}"
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
        print(f"Completed updating config for {_SINGULAR[args.entity_type[0]]} {resource.name}.")
    else:
        print("Completed updating default config for brokers in the cluster.")
    return 0


def _quotas(args: argparse.Namespace, types: list[str], names: list[str]) -> int:
    """Client quotas: the entity types in order, each with its name (or default) if given."""
    if any(t not in QUOTA_TYPES for t in types) or len(names) > len(types):
        raise ValueError("quotas: --entity-type users, clients (with users) or ips, a name each")
    if args.alter and len(names) != len(types):
        raise ValueError("--entity-name or --entity-default is needed for each --entity-type")
    pairs = [
        (QUOTA_TYPES[t], None if i >= len(names) or names[i] == _DEFAULT else names[i])
        for i, t in enumerate(types)
    ]
    with Admin(client_config(args)) as admin:
        if args.describe:
            return _describe_quotas(admin, pairs, len(names))
        _alter_quotas(admin, args, pairs)
    head, name = types[0], pairs[0][1]
    if name is None:
        print(f"Completed updating default config for {head} in the cluster.")
    else:
        print(f"Completed updating config for {_SINGULAR[head]} {name}.")
    return 0


def _describe_quotas(admin: Admin, pairs: list[tuple[str, str | None]], named: int) -> int:
    """The entities of exactly these types: the names given, the default for
    --entity-default, any name for a type without one."""
    components = [
        ClientQuotaFilterComponent(etype, name, _match_type(i < named, name))
        for i, (etype, name) in enumerate(pairs)
    ]
    found = admin.describe_client_quotas(components, strict=True)
    for entity, quotas in sorted(found.items(), key=lambda kv: str(kv[0])):
        who = ", ".join(
            f"{_DESCRIBED[t]} {_DEFAULT if n is None else repr(n)}" for t, n in entity.entries
        )
        shown = ", ".join(f"{k}={v}" for k, v in sorted(quotas.items()))
        print(f"Quota configs for {who} are {shown}")
    return 0


def _match_type(named: bool, name: str | None) -> int:
    if not named:
        return ClientQuotaFilterComponent.SPECIFIED
    return ClientQuotaFilterComponent.DEFAULT if name is None else ClientQuotaFilterComponent.EXACT


def _alter_quotas(
    admin: Admin, args: argparse.Namespace, pairs: list[tuple[str, str | None]]
) -> None:
    ops: dict[str, float | None] = {}
    for item in args.add_config or []:
        for key, value in parse_add_config(item):
            try:
                ops[key] = float(value)
            except ValueError:
                raise ValueError(f"{key}: {value!r} is not a number") from None
    for item in args.delete_config or []:
        ops.update((k.strip(), None) for k in item.split(",") if k.strip())
    if not ops:
        raise ValueError("--alter needs --add-config or --delete-config")
    entity = ClientQuotaEntity.of(dict(pairs))
    for err in admin.alter_client_quotas({entity: ops}).values():
        if err is not None:
            raise err


def register(sub: Any) -> None:
    p = sub.add_parser("configs", help="describe and alter topic, broker and quota configs")
    p.add_argument(
        "--entity-type",
        action="append",
        choices=sorted({*RESOURCE_TYPES, *QUOTA_TYPES}),
        required=True,
        help="users and clients together: a user's client id",
    )
    p.add_argument(
        "--entity-name",
        action="append",
        dest="names",
        help="the topic name, broker id, user, client id or IP, one per --entity-type",
    )
    p.add_argument(
        "--entity-default",
        action="append_const",
        const=_DEFAULT,
        dest="names",
        help="brokers: the cluster-wide default configs (rule 44); users, clients: the default",
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
