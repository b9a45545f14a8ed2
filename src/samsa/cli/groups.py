"""``samsa groups list | describe GROUP | delete GROUP``: consumer groups and their lag
(kafka-consumer-groups).

``list`` and ``describe`` go through the samsa :class:`Admin`, which describes classic groups
with DescribeGroups and consumer (KIP-848) groups with ConsumerGroupDescribe, as Java's
AdminClient does. ``describe`` prints one line per partition the group has a committed offset
for or a member is assigned: committed offset, log end offset, lag, the owning member, its
client id and (consumer groups) its member epoch; ``describe --members`` prints one line per
member instead, with its epoch, assignment and target assignment. ``delete`` speaks raw
DeleteGroups through :class:`BlockingConnection`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from samsa.broker.config import ConfigError, parse_host_port
from samsa.cli._clientutil import command_config, command_security
from samsa.client import Admin, ClosedError, KafkaError, TopicPartition
from samsa.client import ConfigError as ClientConfigError
from samsa.client._admin import GroupDescription
from samsa.client._connection import BlockingConnection, ConnectionClosed
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def _connect(args: argparse.Namespace) -> BlockingConnection:
    host, port = parse_host_port(args.bootstrap_server)
    return BlockingConnection(
        host,
        port,
        client_id="samsa-cli",
        timeout=args.timeout,
        security=command_security(args),
    )


def _admin(args: argparse.Namespace) -> Admin:
    millis = int(args.timeout * 1000)
    return Admin(
        {
            "bootstrap.servers": args.bootstrap_server,
            "client.id": "samsa-cli",
            "request.timeout.ms": millis,
            "default.api.timeout.ms": millis,
            **command_config(args),
        }
    )


def _list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        groups = admin.list_groups()
    wanted = {s.lower() for s in args.state or ()}
    print("GROUP\tSTATE\tPROTOCOL_TYPE\tTYPE")
    for g in groups:
        if not wanted or g.state.lower() in wanted:
            print(f"{g.group_id}\t{g.state}\t{g.protocol_type}\t{g.group_type}")
    return 0


def _describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        group = _describe_group(admin, args.group)
        if args.members:
            _print_members(group)
            return 0
        owners: dict[TopicPartition, tuple[str, str, int]] = {}
        for m in group.members:
            for tp in m.assignment:
                owners[tp] = (m.member_id, m.client_id, m.member_epoch)
        committed = admin.list_group_offsets(args.group)
        partitions = sorted(set(committed) | set(owners))
        ends = admin.list_offsets(partitions) if partitions else {}
    _print_header(group)
    print(
        "TOPIC\tPARTITION\tCOMMITTED_OFFSET\tLOG_END_OFFSET\tLAG\tMEMBER_ID\tCLIENT_ID"
        "\tMEMBER_EPOCH"
    )
    for tp in partitions:
        offset = committed.get(tp, -1)
        end = ends.get(tp, -1)
        lag = "-" if end < 0 else str(end - max(offset, 0))
        member, client, epoch = owners.get(tp, ("-", "-", -1))
        shown = "-" if offset < 0 else str(offset)
        print(
            f"{tp.topic}\t{tp.partition}\t{shown}\t{end if end >= 0 else '-'}\t{lag}"
            f"\t{member}\t{client}\t{epoch if epoch >= 0 else '-'}"
        )
    return 0


def _print_header(group: GroupDescription) -> None:
    line = f"GROUP {group.group_id}  STATE {group.state}  MEMBERS {len(group.members)}"
    line += f"  TYPE {group.group_type}"
    if group.group_type == "consumer":
        line += f"  GROUP_EPOCH {group.group_epoch}  ASSIGNOR {group.protocol}"
    print(line)


def _print_members(group: GroupDescription) -> None:
    _print_header(group)
    print("MEMBER_ID\tCLIENT_ID\tHOST\tMEMBER_EPOCH\tASSIGNMENT\tTARGET_ASSIGNMENT")

    def shown(tps: tuple[TopicPartition, ...]) -> str:
        return ",".join(f"{tp.topic}-{tp.partition}" for tp in tps) or "-"

    for m in sorted(group.members, key=lambda m: m.member_id):
        epoch = str(m.member_epoch) if m.member_epoch >= 0 else "-"
        # a classic member has no target: it owns what the leader assigned it
        target = shown(m.target_assignment) if group.group_type == "consumer" else "-"
        print(
            f"{m.member_id}\t{m.client_id}\t{m.client_host}\t{epoch}"
            f"\t{shown(m.assignment)}\t{target}"
        )


def _describe_group(admin: Admin, group_id: str) -> GroupDescription:
    group = admin.describe_groups([group_id])[0]
    _check(group.error, f"describe {group_id}")
    if group.state == "Dead":
        raise CommandError(f"group {group_id} does not exist")
    return group


def _delete(args: argparse.Namespace) -> int:
    v = 2
    with _connect(args) as conn:
        req = make_request(
            ApiKey.DELETE_GROUPS, v, "DeleteGroupsRequest", groups_names=(args.group,)
        )
        resp = conn.request(ApiKey.DELETE_GROUPS, v, req)
    _check(resp.results[0].error_code, f"delete {args.group}")
    print(f"deleted group {args.group}")
    return 0


# --- errors and registration --------------------------------------------------------------------


class CommandError(Exception):
    pass


def _check(code: Any, what: str) -> None:
    if int(code) != 0:
        raise CommandError(f"{what}: {ErrorCode(int(code)).name}")


def _one_line_errors(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except (CommandError, ConfigError, ClientConfigError, KafkaError, ClosedError) as exc:
            print(f"samsa groups: {exc}", file=sys.stderr)
            return 1
        except (OSError, ConnectionClosed) as exc:
            print(f"samsa groups: cannot talk to {args.bootstrap_server}: {exc}", file=sys.stderr)
            return 1

    return run


def register(sub: Any) -> None:
    g = sub.add_parser("groups", help="consumer groups: list, describe (with lag), delete")
    actions = g.add_subparsers(dest="action", required=True)
    for name, func, help_text in (
        ("list", _list, "every group with its state"),
        ("describe", _describe, "members, committed offsets and lag per partition"),
        ("delete", _delete, "delete a group without members, and its offsets"),
    ):
        p = actions.add_parser(name, help=help_text)
        if name != "list":
            p.add_argument("group")
        if name == "describe":
            p.add_argument(
                "--members",
                action="store_true",
                help="one line per member: epoch, assignment and target assignment",
            )
        else:
            p.add_argument("--state", action="append", help="only groups in this state")
        p.add_argument(
            "--bootstrap-server",
            default=DEFAULT_BOOTSTRAP,
            metavar="HOST:PORT",
            help=f"broker to connect to (default {DEFAULT_BOOTSTRAP})",
        )
        p.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
        p.add_argument(
            "--command-config",
            metavar="FILE",
            help="client properties, e.g. security.protocol, sasl.*, ssl.* (as Kafka's tools)",
        )
        p.set_defaults(func=_one_line_errors(func))
