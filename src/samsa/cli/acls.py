"""``samsa acls add|list|remove``: a broker's ACLs, through CreateAcls, DescribeAcls and
DeleteAcls, with kafka-acls' flags (``--allow-principal``, ``--operation``, ``--topic``,
``--group``, ``--transactional-id``, ``--cluster``, ``--resource-pattern-type``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from samsa.broker.authorizer import (
    CLUSTER_NAME,
    WILDCARD,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from samsa.cli._clientutil import add_bootstrap, command_security, one_line_errors
from samsa.client import KafkaError
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

V = 3  # CreateAcls / DescribeAcls / DeleteAcls v3 (flexible), Kafka 2.8+

# kafka-acls' operation names (CamelCase) -> Kafka's codes.
OPERATIONS = {
    "All": Operation.ALL,
    "Read": Operation.READ,
    "Write": Operation.WRITE,
    "Create": Operation.CREATE,
    "Delete": Operation.DELETE,
    "Alter": Operation.ALTER,
    "Describe": Operation.DESCRIBE,
    "ClusterAction": Operation.CLUSTER_ACTION,
    "DescribeConfigs": Operation.DESCRIBE_CONFIGS,
    "AlterConfigs": Operation.ALTER_CONFIGS,
    "IdempotentWrite": Operation.IDEMPOTENT_WRITE,
    "TwoPhaseCommit": Operation.TWO_PHASE_COMMIT,
}
_OP_NAMES = {code: name for name, code in OPERATIONS.items()}
PATTERNS = {
    "literal": PatternType.LITERAL,
    "prefixed": PatternType.PREFIXED,
    "any": PatternType.ANY,
    "match": PatternType.MATCH,
}


def _operation(value: str) -> Operation:
    for name, code in OPERATIONS.items():
        if name.lower() == value.lower():
            return code
    raise argparse.ArgumentTypeError(
        f"unknown operation {value!r} (one of {', '.join(OPERATIONS)})"
    )


def _resources(args: argparse.Namespace) -> list[tuple[ResourceType, str | None]]:
    out: list[tuple[ResourceType, str | None]] = []
    out += [(ResourceType.TOPIC, t) for t in args.topic or ()]
    out += [(ResourceType.GROUP, g) for g in args.group or ()]
    out += [(ResourceType.TRANSACTIONAL_ID, t) for t in args.transactional_id or ()]
    if args.cluster:
        out.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return out


def _targets(
    args: argparse.Namespace, resources: list[tuple[ResourceType, str | None]], ops: list[Operation]
) -> list[tuple[ResourceType, str | None, Operation]]:
    """(resource, operation) pairs: every resource with every --operation, or what
    kafka-acls' --producer / --consumer shortcuts grant."""
    if not (args.producer or args.consumer):
        return [(rtype, name, op) for rtype, name in resources for op in ops]
    out: list[tuple[ResourceType, str | None, Operation]] = []
    for rtype, name in resources:
        if args.producer and rtype == ResourceType.TOPIC:
            out += [
                (rtype, name, op) for op in (Operation.WRITE, Operation.DESCRIBE, Operation.CREATE)
            ]
        if args.producer and rtype == ResourceType.TRANSACTIONAL_ID:
            out += [(rtype, name, op) for op in (Operation.WRITE, Operation.DESCRIBE)]
        if args.consumer and rtype == ResourceType.TOPIC:
            out += [(rtype, name, op) for op in (Operation.READ, Operation.DESCRIBE)]
        if args.consumer and rtype == ResourceType.GROUP:
            out.append((rtype, name, Operation.READ))
    if args.producer and args.idempotent:
        out.append((ResourceType.CLUSTER, CLUSTER_NAME, Operation.IDEMPOTENT_WRITE))
    return out


def _entries(args: argparse.Namespace) -> list[tuple[str, str, Permission]]:
    """(principal, host, permission) of every --allow-principal/--deny-principal."""
    allow_hosts = args.allow_host or [WILDCARD]
    deny_hosts = args.deny_host or [WILDCARD]
    out = [(p, h, Permission.ALLOW) for p in args.allow_principal or () for h in allow_hosts]
    out += [(p, h, Permission.DENY) for p in args.deny_principal or () for h in deny_hosts]
    return out


def _check(code: int, message: str | None) -> None:
    if code != ErrorCode.NONE:
        raise KafkaError(ErrorCode(code), message or ErrorCode(code).name)


def _connect(args: argparse.Namespace) -> BlockingConnection:
    first = args.bootstrap_server.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    return BlockingConnection(
        host.strip("[]"),
        int(port),
        client_id="samsa-acls",
        timeout=args.command_timeout_ms / 1000,
        security=command_security(args),
    )


def _describe_line(rtype: int, name: str, pattern: int, acl: Any) -> str:
    return (
        f"{ResourceType(rtype).name}\t{name}\t{PatternType(pattern).name}\t{acl.principal}"
        f"\t{acl.host}\t{_OP_NAMES.get(acl.operation, acl.operation)}"
        f"\t{Permission(acl.permission_type).name}"
    )


@one_line_errors
def _acls(args: argparse.Namespace) -> int:
    resources = _resources(args)
    pattern = PATTERNS[args.resource_pattern_type]
    ops = args.operation or ([] if args.action == "add" else [Operation.ANY])
    if args.producer or args.consumer:
        if args.operation:
            return _error("--producer/--consumer choose the operations; leave out --operation")
        if args.consumer and not args.group:
            return _error("--consumer needs --group")
    targets = _targets(args, resources, ops)
    with _connect(args) as conn:
        if args.action == "add":
            entries = _entries(args)
            if not targets or not entries:
                return _error(
                    "add needs a resource, --allow-principal/--deny-principal and --operation "
                    "(or --producer/--consumer)"
                )
            if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
                return _error("add needs --resource-pattern-type literal or prefixed")
            creations = [
                make_request(
                    ApiKey.CREATE_ACLS,
                    V,
                    "AclCreation",
                    resource_type=rtype,
                    resource_name=name,
                    resource_pattern_type=pattern,
                    principal=principal,
                    host=host,
                    operation=op,
                    permission_type=perm,
                )
                for rtype, name, op in targets
                for principal, host, perm in entries
            ]
            resp = conn.request(
                ApiKey.CREATE_ACLS,
                V,
                make_request(
                    ApiKey.CREATE_ACLS, V, "CreateAclsRequest", creations=tuple(creations)
                ),
            )
            for c, r in zip(creations, resp.results, strict=True):
                _check(r.error_code, r.error_message)
                print(
                    f"added {Permission(c.permission_type).name} {c.principal} from {c.host}: "
                    f"{_OP_NAMES[Operation(c.operation)]} on {ResourceType(c.resource_type).name} "
                    f"{c.resource_name} ({PatternType(c.resource_pattern_type).name})"
                )
            return 0
        if not resources:
            targets = [(ResourceType.ANY, None, op) for op in ops]
        filters = _filters(args, targets, pattern)
        if args.action == "list":
            print("RESOURCE_TYPE\tNAME\tPATTERN\tPRINCIPAL\tHOST\tOPERATION\tPERMISSION")
            for f in filters:
                resp = conn.request(ApiKey.DESCRIBE_ACLS, V, f)
                _check(resp.error_code, resp.error_message)
                for res in resp.resources:
                    for acl in res.acls:
                        print(
                            _describe_line(
                                res.resource_type, res.resource_name, res.pattern_type, acl
                            )
                        )
            return 0
        if not resources and not args.force:
            return _error("remove without a resource removes every ACL; add --force to do so")
        delete_filters = [
            make_request(
                ApiKey.DELETE_ACLS,
                V,
                "DeleteAclsFilter",
                **{k: getattr(f, k) for k in _FILTER_FIELDS},
            )
            for f in filters
        ]
        resp = conn.request(
            ApiKey.DELETE_ACLS,
            V,
            make_request(ApiKey.DELETE_ACLS, V, "DeleteAclsRequest", filters=tuple(delete_filters)),
        )
        removed = 0
        for r in resp.filter_results:
            _check(r.error_code, r.error_message)
            for m in r.matching_acls:
                removed += 1
                print(
                    "removed " + _describe_line(m.resource_type, m.resource_name, m.pattern_type, m)
                )
        print(f"{removed} ACL(s) removed")
        return 0


_FILTER_FIELDS = (
    "resource_type_filter",
    "resource_name_filter",
    "pattern_type_filter",
    "principal_filter",
    "host_filter",
    "operation",
    "permission_type",
)


def _filters(
    args: argparse.Namespace,
    targets: list[tuple[ResourceType, str | None, Operation]],
    pattern: PatternType,
) -> list[Any]:
    principals: list[tuple[str | None, Permission]] = [
        (p, Permission.ALLOW) for p in args.allow_principal or ()
    ] + [(p, Permission.DENY) for p in args.deny_principal or ()]
    if args.principal:
        principals += [(p, Permission.ANY) for p in args.principal]
    if not principals:
        principals = [(None, Permission.ANY)]
    return [
        make_request(
            ApiKey.DESCRIBE_ACLS,
            V,
            "DescribeAclsRequest",
            resource_type_filter=rtype,
            resource_name_filter=name,
            pattern_type_filter=pattern,
            principal_filter=principal,
            host_filter=None,
            operation=op,
            permission_type=perm,
        )
        for rtype, name, op in targets
        for principal, perm in principals
    ]


def _error(message: str) -> int:
    print(f"samsa acls: error: {message}", file=sys.stderr)
    return 1


def register(sub: Any) -> None:
    p = sub.add_parser(
        "acls", help="a broker's ACLs (kafka-acls): add, list, remove, through the Kafka APIs"
    )
    p.add_argument("action", choices=["add", "list", "remove"])
    add_bootstrap(p)
    p.add_argument("--allow-principal", action="append", metavar="TYPE:NAME")
    p.add_argument("--deny-principal", action="append", metavar="TYPE:NAME")
    p.add_argument("--allow-host", action="append", metavar="HOST", help="default: *")
    p.add_argument("--deny-host", action="append", metavar="HOST", help="default: *")
    p.add_argument("--principal", action="append", metavar="TYPE:NAME", help="list: filter")
    p.add_argument("--operation", action="append", type=_operation, help=", ".join(OPERATIONS))
    p.add_argument("--topic", action="append", metavar="NAME")
    p.add_argument("--group", action="append", metavar="NAME")
    p.add_argument("--transactional-id", action="append", metavar="ID")
    p.add_argument("--cluster", action="store_true", help="the Cluster resource")
    p.add_argument(
        "--resource-pattern-type",
        choices=list(PATTERNS),
        default=None,
        help="add: literal (default) or prefixed; list/remove also any or match "
        "(default: literal, any for list)",
    )
    p.add_argument("--force", action="store_true", help="remove: allow removing every ACL")
    p.add_argument(
        "--producer",
        action="store_true",
        help="kafka-acls' shortcut: Write, Describe, Create on --topic; Write, Describe on "
        "--transactional-id",
    )
    p.add_argument(
        "--idempotent", action="store_true", help="with --producer: IdempotentWrite on the cluster"
    )
    p.add_argument(
        "--consumer",
        action="store_true",
        help="kafka-acls' shortcut: Read, Describe on --topic; Read on --group",
    )
    p.set_defaults(func=_acls_main)


def _acls_main(args: argparse.Namespace) -> int:
    if args.resource_pattern_type is None:
        args.resource_pattern_type = "any" if args.action == "list" else "literal"
    return _acls(args)
