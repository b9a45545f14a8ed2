"""``samsa transactions list|describe|abort|find-hanging``: the transaction coordinator's
view (kafka-transactions list / describe, over raw ListTransactions / DescribeTransactions),
and the tool's hanging-transaction pair through the admin client: ``find-hanging`` lists
open transactions on partitions that their coordinator no longer completes, ``abort``
writes the ABORT marker that closes one (KIP-664).

The broker addressed is asked directly: a samsa broker coordinates every transactional id.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from samsa.broker.config import parse_host_port
from samsa.cli import producers
from samsa.cli._clientutil import (
    add_bootstrap,
    client_config,
    command_security,
    one_line_errors,
)
from samsa.cli._names import add_name
from samsa.client import Admin, TopicPartition
from samsa.client._connection import BlockingConnection, ConnectionClosed
from samsa.protocol.errors import ErrorCode
from samsa.protocol.framing import split_response
from samsa.protocol.messages import ApiKey, make_request


def _connect(args: argparse.Namespace) -> BlockingConnection:
    host, port = parse_host_port(args.bootstrap_server.split(",")[0])
    return BlockingConnection(
        host,
        port,
        client_id="samsa-cli",
        timeout=args.command_timeout_ms / 1000,
        security=command_security(args),
    )


def _list(args: argparse.Namespace) -> int:
    v = 1
    req = make_request(
        ApiKey.LIST_TRANSACTIONS,
        v,
        "ListTransactionsRequest",
        state_filters=tuple(args.state or ()),
        producer_id_filters=tuple(args.producer_id or ()),
        duration_filter=args.duration_ms,
    )
    with _connect(args) as conn:
        resp = conn.request(ApiKey.LIST_TRANSACTIONS, v, req)
    if resp.error_code != ErrorCode.NONE:
        print(f"samsa transactions list: error: {ErrorCode(resp.error_code).name}", file=sys.stderr)
        return 1
    for s in resp.unknown_state_filters:
        print(f"samsa transactions list: unknown state {s!r}", file=sys.stderr)
    print("TRANSACTIONAL_ID\tPRODUCER_ID\tSTATE")
    for t in resp.transaction_states:
        print(f"{t.transactional_id}\t{t.producer_id}\t{t.transaction_state}")
    return 0


def _describe(args: argparse.Namespace) -> int:
    v = 0
    req = make_request(
        ApiKey.DESCRIBE_TRANSACTIONS,
        v,
        "DescribeTransactionsRequest",
        transactional_ids=(args.transactional_id,),
    )
    with _connect(args) as conn:
        cid = conn.send(ApiKey.DESCRIBE_TRANSACTIONS, v, req)
        frame = conn.receive_frame()
    got, pos = split_response(frame, True)
    if got != cid:
        raise ValueError(f"correlation id {got} does not match {cid}")
    (s,) = _parse_describe(frame, pos)
    if s.error != ErrorCode.NONE:
        name = ErrorCode(s.error).name
        print(f"samsa transactions describe: {args.transactional_id}: {name}", file=sys.stderr)
        return 1
    started = (
        "-"
        if s.start_ms < 0
        else datetime.fromtimestamp(s.start_ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    )
    partitions = ",".join(f"{t}-{p}" for t, p in s.partitions) or "-"
    print("TRANSACTIONAL_ID\tPRODUCER_ID\tEPOCH\tSTATE\tTIMEOUT_MS\tSTARTED\tPARTITIONS")
    print(
        f"{s.transactional_id}\t{s.producer_id}\t{s.epoch}\t{s.state}"
        f"\t{s.timeout_ms}\t{started}\t{partitions}"
    )
    return 0


@dataclass(frozen=True, slots=True)
class _Described:
    error: int
    transactional_id: str
    state: str
    timeout_ms: int
    start_ms: int
    producer_id: int
    epoch: int
    partitions: list[tuple[str, int]]


def _parse_describe(buf: bytes, pos: int) -> list[_Described]:
    """DescribeTransactions v0 by hand: kio refuses the -1 start time Kafka sends for a
    transactional id between transactions."""

    def uvarint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7

    def fixed(fmt: str) -> int:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return int(value)

    def string() -> str:
        nonlocal pos
        n = uvarint() - 1
        out = buf[pos : pos + max(n, 0)].decode()
        pos += max(n, 0)
        return out

    def skip_tags() -> None:
        nonlocal pos
        for _ in range(uvarint()):
            uvarint()
            pos += uvarint()

    fixed(">i")  # throttle time
    states = []
    for _ in range(uvarint() - 1):
        error = fixed(">h")
        tid, state = string(), string()
        timeout, start, pid, epoch = fixed(">i"), fixed(">q"), fixed(">q"), fixed(">h")
        parts = []
        for _t in range(uvarint() - 1):
            topic = string()
            parts += [(topic, fixed(">i")) for _p in range(uvarint() - 1)]
            skip_tags()
        skip_tags()
        states.append(_Described(error, tid, state, timeout, start, pid, epoch, parts))
    return states


@one_line_errors
def _abort(args: argparse.Namespace) -> int:
    """kafka-transactions abort: an ABORT marker for one producer's open transaction on one
    partition, named by where it started (DescribeProducers finds the producer) or by the
    producer's ids."""
    tp = TopicPartition(args.topic, args.partition)
    with Admin(client_config(args)) as admin:
        if args.start_offset is not None:
            found = [
                p
                for p in admin.describe_producers([tp]).get(tp, [])
                if p.current_txn_start_offset == args.start_offset
            ]
            if not found:
                print(
                    f"Could not find any open transactions starting at offset "
                    f"{args.start_offset} on partition {tp.topic}-{tp.partition}",
                    file=sys.stderr,
                )
                return 1
            pid, epoch, coordinator_epoch = (
                found[0].producer_id, found[0].epoch, max(found[0].coordinator_epoch, 0)
            )  # fmt: skip
        else:
            missing = [
                f"--{n.replace('_', '-')}"
                for n in ("producer_id", "producer_epoch", "coordinator_epoch")
                if getattr(args, n) is None
            ]
            if missing:
                print(f"samsa transactions abort: give --start-offset or {', '.join(missing)}",
                      file=sys.stderr)  # fmt: skip
                return 2
            pid, epoch, coordinator_epoch = (
                args.producer_id, args.producer_epoch, args.coordinator_epoch
            )  # fmt: skip
        admin.abort_transaction(tp, pid, epoch, coordinator_epoch)
    return 0


@one_line_errors
def _find_hanging(args: argparse.Namespace) -> int:
    """kafka-transactions find-hanging: open transactions on the partitions asked for (a
    topic's, or those a broker leads) that ran longer than the longest transaction timeout
    and that their coordinator does not hold as ongoing with that partition: their markers
    were lost, and read_committed consumers of the partition are stuck behind them."""
    limit_ms = args.max_transaction_timeout * 60_000
    now_ms = int(time.time() * 1000)
    with Admin(client_config(args)) as admin:
        if args.topic is not None:
            (meta,) = admin.describe_topics([args.topic])
            tps = [
                TopicPartition(args.topic, p.partition)
                for p in meta.partitions
                if args.partition is None or p.partition == args.partition
            ]
        else:
            tps = [
                TopicPartition(t.name, p.partition)
                for t in admin.describe_topics(None)
                for p in t.partitions
                if p.leader == args.broker_id
            ]
        open_txns = [
            (tp, p)
            for tp, producers in admin.describe_producers(tps).items()
            for p in producers
            if p.current_txn_start_offset >= 0 and now_ms - p.last_timestamp > limit_ms
        ]
        pids = sorted({p.producer_id for _, p in open_txns})
        ids = {t.producer_id: t.transactional_id for t in admin.list_transactions(
            producer_ids=pids)} if pids else {}  # fmt: skip
        described = admin.describe_transactions(sorted(set(ids.values()))) if ids else {}
    print("Topic\tPartition\tProducerId\tProducerEpoch\tCoordinatorEpoch\tStartOffset"
          "\tLastTimestamp\tDuration(min)\t")  # fmt: skip
    for tp, p in sorted(open_txns, key=lambda x: (x[0], x[1].producer_id)):
        d = described.get(ids.get(p.producer_id, ""))
        ongoing = (
            d is not None
            and d.producer_id == p.producer_id
            and d.state.lower() == "ongoing"
            and tp in d.partitions
        )
        if not ongoing:
            minutes = (now_ms - p.last_timestamp) // 60_000
            print(f"{tp.topic}\t{tp.partition}\t{p.producer_id}\t{p.epoch}"
                  f"\t{p.coordinator_epoch}\t{p.current_txn_start_offset}"
                  f"\t{p.last_timestamp}\t{minutes}\t")  # fmt: skip
    return 0


def _guarded(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except (OSError, ConnectionClosed, ValueError) as exc:
            print(f"samsa transactions: error: {exc}", file=sys.stderr)
            return 1

    return run


def register(sub: Any) -> None:
    p = sub.add_parser("transactions", help="list or describe transactions")
    tsub = p.add_subparsers(dest="action", required=True)
    lp = tsub.add_parser("list", help="transactional ids, producer ids and states")
    lp.add_argument("--state", action="append", help="keep this state (repeatable)")
    lp.add_argument("--producer-id", type=int, action="append", help="keep this producer id")
    lp.add_argument(
        "--duration-ms", type=int, default=-1, help="keep transactions running longer than this"
    )
    add_bootstrap(lp)
    lp.set_defaults(func=_guarded(_list))
    dp = tsub.add_parser("describe", help="one transactional id in detail")
    add_name(dp, "transactional_id", "--transactional-id")
    add_bootstrap(dp)
    dp.set_defaults(func=_guarded(_describe))
    ap = tsub.add_parser(
        "abort", help="abort one producer's open (hanging) transaction on one partition"
    )
    add_name(ap, "topic", "--topic")
    ap.add_argument("--partition", type=int, required=True)
    ap.add_argument("--start-offset", type=int, help="where the transaction to abort began")
    ap.add_argument("--producer-id", type=int)
    ap.add_argument("--producer-epoch", type=int)
    ap.add_argument("--coordinator-epoch", type=int)
    add_bootstrap(ap)
    ap.set_defaults(func=_abort)
    fp = tsub.add_parser(
        "find-hanging", help="open transactions their coordinator no longer completes"
    )
    where = fp.add_mutually_exclusive_group(required=True)
    where.add_argument("--broker-id", type=int, help="the partitions this broker leads")
    where.add_argument("--topic")
    fp.add_argument("--partition", type=int, help="with --topic: only this partition")
    fp.add_argument(
        "--max-transaction-timeout", type=int, default=15,
        help="minutes: the longest transaction.timeout.ms of the producers (default 15)",
    )  # fmt: skip
    add_bootstrap(fp)
    fp.set_defaults(func=_find_hanging)
    # kafka-transactions' name for what `samsa producers` shows
    pp = tsub.add_parser("describe-producers", help="active producers per partition")
    add_name(pp, "topic", "--topic")
    pp.add_argument("--partition", type=int)
    add_bootstrap(pp)
    pp.set_defaults(func=producers.describe)
