"""``samsa groups list | describe GROUP | delete GROUP``: consumer groups and their lag
(kafka-consumer-groups), and ``reset-offsets`` / ``delete-offsets`` as that tool has them.

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
import time
from typing import Any

from samsa.broker.config import ConfigError, parse_host_port
from samsa.cli._clientutil import command_config, command_security
from samsa.cli._names import add_name
from samsa.cli._offset_reset import (
    MODES,
    Bounds,
    datetime_ms,
    duration_ms,
    new_offset,
    read_plan,
    topic_specs,
)
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
    # kafka-consumer-groups' --state takes "Stable,Empty", and alone only shows the column
    wanted = {s.strip().lower() for item in args.state or () for s in item.split(",") if s.strip()}
    print("GROUP\tSTATE\tPROTOCOL_TYPE\tTYPE")
    for g in groups:
        if not wanted or g.state.lower() in wanted:
            print(f"{g.group_id}\t{g.state}\t{g.protocol_type}\t{g.group_type}")
    return 0


def _describe(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        group = _describe_group(admin, args.group)
        if args.state:
            _print_header(group)
            return 0
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


def _reset(args: argparse.Namespace) -> int:
    """kafka-consumer-groups --reset-offsets: plan new committed offsets (printed; --dry-run
    is the default) and commit them with --execute. The group must have no members."""
    modes = [m for m in MODES if getattr(args, m) not in (None, False)]
    if len(modes) != 1:
        raise CommandError(
            "give exactly one of --" + ", --".join(m.replace("_", "-") for m in MODES)
        )
    mode = modes[0]
    if args.dry_run and args.execute:
        raise CommandError("only one of --dry-run and --execute")
    with _admin(args) as admin:
        group = admin.describe_groups([args.group])[0]
        if int(group.error) != ErrorCode.GROUP_ID_NOT_FOUND:  # a new group may be reset
            _check(group.error, f"describe {args.group}")
        if group.state not in ("Empty", "Dead") and int(group.error) == 0:
            raise CommandError(
                f"Assignments can only be reset if the group '{args.group}' is inactive, "
                f"but the current state is {group.state}."
            )
        committed = admin.list_group_offsets(args.group)
        plan: dict[TopicPartition, int] = {}
        if mode == "from_file":
            with open(args.from_file) as f:
                plan = read_plan(f.read(), args.group)
            partitions = sorted(plan)
        elif args.all_topics:
            partitions = sorted(committed)
        elif args.topic:
            partitions = _partitions_of(admin, topic_specs(args.topic))
        else:
            raise CommandError("give --topic, --all-topics or --from-file")
        if mode != "from_file" and partitions:
            earliest = admin.list_offsets(partitions, -2)
            latest = admin.list_offsets(partitions, -1)
            at_time: dict[TopicPartition, int] = {}
            if mode in ("to_datetime", "by_duration"):
                when = (
                    datetime_ms(args.to_datetime)
                    if mode == "to_datetime"
                    else int(time.time() * 1000) - duration_ms(args.by_duration)
                )
                at_time = admin.list_offsets(partitions, when)
                for tp in partitions:
                    if at_time.get(tp, -1) < 0:  # kafka-consumer-groups' words
                        print(
                            f"Warn: Partition {tp.partition} from topic {tp.topic} is empty. "
                            "Falling back to latest known offset."
                        )
            value = args.to_offset if mode == "to_offset" else args.shift_by
            for tp in partitions:
                bounds = Bounds(earliest[tp], latest[tp])
                plan[tp] = new_offset(mode, value, committed.get(tp), bounds, at_time.get(tp))
    if args.execute and plan:
        _commit(args, plan)
    if args.export:
        for tp in partitions:
            print(f"{tp.topic},{tp.partition},{plan[tp]}")
        return 0
    print("GROUP\tTOPIC\tPARTITION\tNEW-OFFSET")
    for tp in partitions:
        print(f"{args.group}\t{tp.topic}\t{tp.partition}\t{plan[tp]}")
    return 0


def _partitions_of(admin: Admin, specs: list[tuple[str, list[int] | None]]) -> list[TopicPartition]:
    out: list[TopicPartition] = []
    for topic, parts in specs:
        if parts is None:
            (meta,) = admin.describe_topics([topic])
            _check(meta.error or 0, f"topic {topic}")
            parts = [p.partition for p in meta.partitions]
        out += [TopicPartition(topic, p) for p in parts]
    return sorted(set(out))


def _commit(args: argparse.Namespace, plan: dict[TopicPartition, int]) -> None:
    """A simple commit (generation -1, no member), which a group without members takes."""
    k, v = ApiKey.OFFSET_COMMIT, 8
    topics: dict[str, list[Any]] = {}
    for tp, offset in sorted(plan.items()):
        topics.setdefault(tp.topic, []).append(
            make_request(
                k,
                v,
                "OffsetCommitRequestPartition",
                partition_index=tp.partition,
                committed_offset=offset,
                committed_leader_epoch=-1,
                committed_metadata="",
            )
        )
    req = make_request(
        k, v, "OffsetCommitRequest", group_id=args.group, generation_id_or_member_epoch=-1,
        member_id="", group_instance_id=None,
        topics=tuple(make_request(k, v, "OffsetCommitRequestTopic", name=name,
                                  partitions=tuple(parts)) for name, parts in topics.items()),
    )  # fmt: skip
    with _connect(args) as conn:
        resp = conn.request(k, v, req)
    for t in resp.topics:
        for p in t.partitions:
            _check(p.error_code, f"commit {t.name}-{p.partition_index}")


def _delete_offsets(args: argparse.Namespace) -> int:
    """kafka-consumer-groups --delete-offsets: the group's committed offsets of the topics
    (a group still consuming a topic keeps its offsets: GROUP_SUBSCRIBED_TO_TOPIC)."""
    with _admin(args) as admin:
        partitions = _partitions_of(admin, topic_specs(args.topic))
    k, v = ApiKey.OFFSET_DELETE, 0
    topics: dict[str, list[Any]] = {}
    for tp in partitions:
        topics.setdefault(tp.topic, []).append(
            make_request(k, v, "OffsetDeleteRequestPartition", partition_index=tp.partition)
        )
    req = make_request(
        k, v, "OffsetDeleteRequest", group_id=args.group,
        topics=tuple(make_request(k, v, "OffsetDeleteRequestTopic", name=name,
                                  partitions=tuple(parts)) for name, parts in topics.items()),
    )  # fmt: skip
    with _connect(args) as conn:
        resp = conn.request(k, v, req)
    _check(resp.error_code, f"delete offsets of {args.group}")
    print(f"Request succeeded for deleting offsets from group {args.group}.")
    print("TOPIC\tPARTITION\tSTATUS")
    failed = 0
    for t in resp.topics:
        for p in t.partitions:
            code = int(p.error_code)
            failed += code != 0
            status = "Successful" if code == 0 else f"Error: {ErrorCode(code).name}"
            print(f"{t.name}\t{p.partition_index}\t{status}")
    return 1 if failed else 0


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
    g = sub.add_parser(
        "groups",
        help="consumer groups: list, describe (with lag), delete",
        description="Also takes kafka-consumer-groups' flags: --list/--describe/--delete and "
        "--group NAME.",
    )
    actions = g.add_subparsers(dest="action", required=True)
    for name, func, help_text in (
        ("list", _list, "every group with its state"),
        ("describe", _describe, "members, committed offsets and lag per partition"),
        ("delete", _delete, "delete a group without members, and its offsets"),
    ):
        p = actions.add_parser(name, help=help_text)
        if name != "list":
            add_name(p, "group", "--group")
        if name == "describe":
            p.add_argument(
                "--members",
                action="store_true",
                help="one line per member: epoch, assignment and target assignment",
            )
            p.add_argument(
                "--offsets", action="store_true", help="one line per partition (the default)"
            )
            p.add_argument("--state", action="store_true", help="the group's state line only")
            p.add_argument("--verbose", action="store_true", help="accepted, as by Kafka's tool")
        elif name == "list":
            p.add_argument(
                "--state",
                action="append",
                nargs="?",
                const="",
                help="only groups in this state (kafka-consumer-groups: comma-separated)",
            )
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
    r = actions.add_parser("reset-offsets", help="set a group's committed offsets (no members)")
    add_name(r, "group", "--group")
    r.add_argument("--topic", action="append", metavar="TOPIC[:P1,P2]")
    r.add_argument("--all-topics", action="store_true", help="every partition with an offset")
    r.add_argument("--to-earliest", action="store_true")
    r.add_argument("--to-latest", action="store_true")
    r.add_argument("--to-current", action="store_true")
    r.add_argument("--to-offset", type=int, metavar="N")
    r.add_argument("--shift-by", type=int, metavar="N", help="may be negative")
    r.add_argument("--to-datetime", metavar="YYYY-MM-DDThh:mm:ss.sss")
    r.add_argument("--by-duration", metavar="PnDTnHnMnS")
    r.add_argument("--from-file", metavar="CSV", help="TOPIC,PARTITION,OFFSET lines")
    r.add_argument("--dry-run", action="store_true", help="show the plan only (the default)")
    r.add_argument("--execute", action="store_true", help="commit the plan")
    r.add_argument("--export", action="store_true", help="print the plan as --from-file CSV")
    r.set_defaults(func=_one_line_errors(_reset))
    d = actions.add_parser("delete-offsets", help="delete a group's offsets of topics")
    add_name(d, "group", "--group")
    d.add_argument("--topic", action="append", required=True, metavar="TOPIC[:P1,P2]")
    d.set_defaults(func=_one_line_errors(_delete_offsets))
    for p in (r, d):
        p.add_argument("--bootstrap-server", default=DEFAULT_BOOTSTRAP, metavar="HOST:PORT")
        p.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
        p.add_argument("--command-config", metavar="FILE", help="client properties")
