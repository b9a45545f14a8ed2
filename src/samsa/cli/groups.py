"""``samsa groups list | describe GROUP | delete GROUP``: consumer groups and their lag
(kafka-consumer-groups).

Speaks raw protocol through :class:`BlockingConnection` to the one broker, which is every
group's coordinator: ListGroups, DescribeGroups, OffsetFetch, ListOffsets, DeleteGroups.
``describe`` prints one line per partition the group has a committed offset for or a member
is assigned: committed offset, log end offset, lag, and the owning member and client id.
"""

from __future__ import annotations

import argparse
import struct
import sys
from typing import Any

from samsa.broker.config import ConfigError, parse_host_port
from samsa.cli._clientutil import command_security
from samsa.client._connection import BlockingConnection, ConnectionClosed
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
LATEST = -1


def _connect(args: argparse.Namespace) -> BlockingConnection:
    host, port = parse_host_port(args.bootstrap_server)
    return BlockingConnection(
        host,
        port,
        client_id="samsa-cli",
        timeout=args.timeout,
        security=command_security(args),
    )


def _list(args: argparse.Namespace) -> int:
    v = 4
    with _connect(args) as conn:
        req = make_request(
            ApiKey.LIST_GROUPS, v, "ListGroupsRequest", states_filter=tuple(args.state or ())
        )
        resp = conn.request(ApiKey.LIST_GROUPS, v, req)
    _check(resp.error_code, "list groups")
    print("GROUP\tSTATE\tPROTOCOL_TYPE")
    for g in sorted(resp.groups, key=lambda g: g.group_id):
        print(f"{g.group_id}\t{g.group_state}\t{g.protocol_type}")
    return 0


def _describe(args: argparse.Namespace) -> int:
    with _connect(args) as conn:
        group = _describe_group(conn, args.group)
        _check(group.error_code, f"describe {args.group}")
        owners: dict[tuple[str, int], tuple[str, str]] = {}
        for m in group.members:
            for topic, partitions in parse_assignment(bytes(m.member_assignment)):
                for p in partitions:
                    owners[(topic, p)] = (m.member_id, m.client_id)
        committed = _committed(conn, args.group)
        partitions = sorted(set(committed) | set(owners))
        ends = _log_end_offsets(conn, partitions)
    print(f"GROUP {args.group}  STATE {group.group_state}  MEMBERS {len(group.members)}")
    print("TOPIC\tPARTITION\tCOMMITTED_OFFSET\tLOG_END_OFFSET\tLAG\tMEMBER_ID\tCLIENT_ID")
    for tp in partitions:
        offset = committed.get(tp, -1)
        end = ends.get(tp, -1)
        lag = "-" if end < 0 else str(end - max(offset, 0))
        member, client = owners.get(tp, ("-", "-"))
        shown = "-" if offset < 0 else str(offset)
        print(f"{tp[0]}\t{tp[1]}\t{shown}\t{end if end >= 0 else '-'}\t{lag}\t{member}\t{client}")
    return 0


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


# --- requests -----------------------------------------------------------------------------------


def _describe_group(conn: BlockingConnection, group_id: str) -> Any:
    v = 5
    req = make_request(
        ApiKey.DESCRIBE_GROUPS,
        v,
        "DescribeGroupsRequest",
        groups=(group_id,),
        include_authorized_operations=False,
    )
    group = conn.request(ApiKey.DESCRIBE_GROUPS, v, req).groups[0]
    if group.group_state == "Dead":
        raise CommandError(f"group {group_id} does not exist")
    return group


def _committed(conn: BlockingConnection, group_id: str) -> dict[tuple[str, int], int]:
    v = 7
    req = make_request(
        ApiKey.OFFSET_FETCH,
        v,
        "OffsetFetchRequest",
        group_id=group_id,
        topics=None,  # all of the group's offsets
        require_stable=False,
    )
    resp = conn.request(ApiKey.OFFSET_FETCH, v, req)
    _check(resp.error_code, f"fetch offsets of {group_id}")
    return {
        (t.name, p.partition_index): int(p.committed_offset)
        for t in resp.topics
        for p in t.partitions
        if p.error_code == 0
    }


def _log_end_offsets(
    conn: BlockingConnection, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    if not partitions:
        return {}
    v = 5
    by_topic: dict[str, list[int]] = {}
    for topic, p in partitions:
        by_topic.setdefault(topic, []).append(p)
    req = make_request(
        ApiKey.LIST_OFFSETS,
        v,
        "ListOffsetsRequest",
        replica_id=-1,
        isolation_level=0,
        topics=tuple(
            make_request(
                ApiKey.LIST_OFFSETS,
                v,
                "ListOffsetsTopic",
                name=topic,
                partitions=tuple(
                    make_request(
                        ApiKey.LIST_OFFSETS,
                        v,
                        "ListOffsetsPartition",
                        partition_index=p,
                        current_leader_epoch=-1,
                        timestamp=LATEST,
                    )
                    for p in ps
                ),
            )
            for topic, ps in by_topic.items()
        ),
    )
    resp = conn.request(ApiKey.LIST_OFFSETS, v, req)
    return {
        (t.name, p.partition_index): int(p.offset)
        for t in resp.topics
        for p in t.partitions
        if p.error_code == 0
    }


def parse_assignment(data: bytes) -> list[tuple[str, list[int]]]:
    """Topics and partitions of a ``consumer`` protocol assignment (any version: they come
    first); empty for anything else."""
    try:
        pos = 2  # version
        (n_topics,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out = []
        for _ in range(max(n_topics, 0)):
            (length,) = struct.unpack_from(">h", data, pos)
            pos += 2
            topic = data[pos : pos + length].decode()
            pos += length
            (n,) = struct.unpack_from(">i", data, pos)
            pos += 4
            parts = list(struct.unpack_from(f">{max(n, 0)}i", data, pos))
            pos += 4 * max(n, 0)
            out.append((topic, parts))
        return out
    except (struct.error, UnicodeDecodeError):
        return []


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
        except (CommandError, ConfigError) as exc:
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
