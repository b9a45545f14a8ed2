"""What a confluent-kafka consumer's stall is on the wire, samsa beside Kafka (issue 23).

fetch_stalls.py counts reads with a ~450 ms gap; this script records why. Each broker
advertises the port of a capturing relay (a separate process, so that it does not share the
consumer's interpreter), and the relay logs every Fetch request (time, session id/epoch,
max_wait, min_bytes, max_bytes, partitions with their offsets and size limits) and response
(time, per partition: error, high watermark, bytes, the offsets of its whole batches and the
bytes of a trailing partial batch). The reads alternate between the brokers as in
fetch_stalls.py; for each read it prints the Fetch counts, how many requests left a partition
out and how many were parked (answered after 300 ms or more), and for a stalled read the
Fetches around its longest gap.

    python benchmarks/fetch_wire.py --records 1200000 --reads 6 [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _brokers import HOST, KafkaBroker, SamsaBroker, free_port
from _peerlib import PARTITIONS, machine

STALL_S = 0.3
FETCH = 1
_SIZE = struct.Struct(">i")
_BATCH_HEAD = struct.Struct(">qi")  # base offset, batch length (after these 12 bytes)
_LAST_DELTA_AT = 23


# -- the relay (its own process) --------------------------------------------------------------


def _batches(records: bytes | None) -> tuple[int, int, int, int]:
    """(first offset, offset after the last whole batch, whole batches, trailing partial
    bytes) of a partition's record bytes; (-1, -1, 0, 0) when empty."""
    if not records:
        return -1, -1, 0, 0
    pos, first, after, count = 0, -1, -1, 0
    view = memoryview(records)
    while pos + 12 <= len(view):
        base, length = _BATCH_HEAD.unpack_from(view, pos)
        if pos + 12 + length > len(view):
            break
        (delta,) = struct.unpack_from(">i", view, pos + _LAST_DELTA_AT)
        first = base if first < 0 else first
        after = base + delta + 1
        count += 1
        pos += 12 + length
    return first, after, count, len(view) - pos


def _request_record(frame: bytes) -> tuple[int, dict[str, Any]]:
    from samsa.protocol.framing import parse_request_header
    from samsa.protocol.messages import decode_request, is_flexible

    api_key, version = struct.unpack_from(">hh", frame, 0)
    header = parse_request_header(frame, is_flexible(api_key, version))
    req = decode_request(api_key, version, frame, header.body_offset)
    parts = [
        [
            str(getattr(t, "topic", None) or t.topic_id),
            int(p.partition),
            int(p.fetch_offset),
            int(p.partition_max_bytes),
        ]
        for t in req.topics
        for p in t.partitions
    ]
    return header.correlation_id, {
        "v": version,
        "session": [int(req.session_id), int(req.session_epoch)] if version >= 7 else None,
        "max_wait_ms": int(req.max_wait.total_seconds() * 1000),
        "min_bytes": int(req.min_bytes),
        "max_bytes": int(getattr(req, "max_bytes", -1)),
        "isolation": int(getattr(req, "isolation_level", 0)),
        "parts": parts,
        "forgotten": len(getattr(req, "forgotten_topics_data", ()) or ()),
    }


def _response_record(version: int, frame: bytes) -> dict[str, Any]:
    from samsa.protocol.framing import split_response
    from samsa.protocol.messages import decode_response, is_flexible

    _cid, body = split_response(frame, is_flexible(FETCH, version))
    resp = decode_response(FETCH, version, frame, body)
    parts = []
    for t in resp.responses:
        for p in t.partitions:
            first, after, batches, partial = _batches(p.records)
            parts.append(
                [
                    int(p.partition_index),
                    int(p.error_code),
                    int(p.high_watermark),
                    len(p.records or b""),
                    first,
                    after,
                    batches,
                    partial,
                ]
            )
    return {
        "error": int(getattr(resp, "error_code", 0)),
        "session_id": int(getattr(resp, "session_id", 0)),
        "throttle_ms": int(resp.throttle_time.total_seconds() * 1000),
        "parts": parts,
    }


async def _serve(listen: int, upstream: int, out: Any) -> None:
    conn_ids = iter(range(1, 1 << 30))

    def log(entry: dict[str, Any]) -> None:
        out.write(json.dumps(entry) + "\n")

    async def frames(reader: asyncio.StreamReader) -> Any:
        while True:
            try:
                (size,) = _SIZE.unpack(await reader.readexactly(4))
                yield await reader.readexactly(size)
            except (asyncio.IncompleteReadError, ConnectionError):
                return

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        conn = next(conn_ids)
        ur, uw = await asyncio.open_connection(HOST, upstream)
        fetches: dict[int, int] = {}  # correlation id -> version of the Fetch it answers

        async def up() -> None:
            async for frame in frames(cr):
                t = time.monotonic()
                uw.write(_SIZE.pack(len(frame)) + frame)
                if struct.unpack_from(">h", frame, 0)[0] == FETCH:
                    cid, entry = _request_record(frame)
                    fetches[cid] = entry["v"]
                    log({"t": t, "conn": conn, "cid": cid, "req": entry})
                await uw.drain()

        async def down() -> None:
            async for frame in frames(ur):
                t = time.monotonic()
                cw.write(_SIZE.pack(len(frame)) + frame)
                cid = struct.unpack_from(">i", frame, 0)[0]
                version = fetches.pop(cid, None)
                if version is not None:
                    try:
                        entry = _response_record(version, frame)
                    except Exception as exc:  # a capture that cannot decode still relays
                        entry = {"undecoded": repr(exc), "parts": []}
                    log({"t": t, "conn": conn, "cid": cid, "resp": entry})
                await cw.drain()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        cw.close()
        uw.close()

    server = await asyncio.start_server(handle, HOST, listen)
    async with server:
        await server.serve_forever()


def relay_main(listen: int, upstream: int, path: str) -> None:
    with open(path, "a", buffering=1) as out:
        asyncio.run(_serve(listen, upstream, out))


# -- the reads --------------------------------------------------------------------------------


def fill(bootstrap: str, topic: str, records: int) -> None:
    from fetch_stalls import fill as fill_topic

    fill_topic(bootstrap, topic, records)


def read(bootstrap: str, topic: str, records: int) -> list[tuple[float, int]]:
    """The (time, messages) of each non-empty consume() batch of one read, as fetch_stalls.py
    reads (its loop, with the times kept)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "stalls",
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": 0,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got, batches = 0, []
    deadline = time.monotonic() + 300
    try:
        while got < records and time.monotonic() < deadline:
            n = sum(1 for m in c.consume(10_000, 0.5) if m.error() is None)
            if n:
                batches.append((time.monotonic(), n))
                got += n
    finally:
        c.close()
    if got < records:
        raise RuntimeError(f"read {got} of {records} records from {bootstrap}")
    return batches


def _load(path: Path, start: float, end: float) -> list[dict[str, Any]]:
    with path.open() as f:
        entries = [json.loads(line) for line in f]
    return [e for e in entries if start <= e["t"] <= end]


def _left_behind(fetches: list[tuple[dict, dict]]) -> list[list[int]]:
    """For each Fetch, the partitions it left out that still had records (as far as the
    answers before it told: the next offset below the high watermark)."""
    next_offset: dict[int, int] = {}
    high_watermark: dict[int, int] = {}
    out = []
    for q, r in fetches:
        asked = {x[1] for x in q["req"]["parts"]}
        out.append([p for p in range(PARTITIONS) if p not in asked
                    and next_offset.get(p, 0) < high_watermark.get(p, 1)])  # fmt: skip
        for x in q["req"]["parts"]:
            next_offset[x[1]] = x[2]
        for x in r["resp"]["parts"]:
            high_watermark[x[0]] = x[2]
            if x[5] >= 0:
                next_offset[x[0]] = x[5]
    return out


def _stall_kind(gap: float, g0: float, g1: float, fetches: list[tuple[dict, dict]]) -> str:
    """What the client waited on in its longest gap: "parked" (the broker held a Fetch for
    most of it, a Fetch that left out a partition with records left), "parked, all at the
    end" (held, with nothing left out), "no Fetch" (none in flight for most of it: the client
    did not ask) or "slow answers"."""
    in_flight = 0.0
    for (q, r), left in zip(fetches, _left_behind(fetches), strict=True):
        overlap = min(r["t"], g1) - max(q["t"], g0)
        if overlap >= gap / 2:
            return f"parked, p{left[0]} left out" if left else "parked, all at the end"
        in_flight += max(0.0, overlap)
    return "no Fetch" if in_flight < gap / 2 else "slow answers"


def summarize(name: str, batches: list[tuple[float, int]], log: list[dict[str, Any]]) -> dict:
    """A read's Fetch figures and, when it stalled, the Fetches around its longest gap."""
    gaps = [(b[0] - a[0], a[0], b[0]) for a, b in itertools.pairwise(batches)]
    gap, g0, g1 = max(gaps) if gaps else (0.0, 0.0, 0.0)
    reqs = {(e["conn"], e["cid"]): e for e in log if "req" in e}
    pairs = [
        (reqs[(e["conn"], e["cid"])], e)
        for e in log
        if "resp" in e and (e["conn"], e["cid"]) in reqs
    ]
    record_fetches = [(q, r) for q, r in pairs if q["req"]["parts"]]
    left_out = sum(len(q["req"]["parts"]) < PARTITIONS for q, _ in record_fetches)
    # The Fetch after the last records waits at the end of every read: not a stall.
    last = batches[-1][0] if batches else 0.0
    parked = [(q, r) for q, r in record_fetches if r["t"] - q["t"] >= STALL_S and q["t"] < last]
    # The broker's side of the stall: a Fetch it held while a partition left out had records.
    parked_left_out = sum(
        1
        for (q, r), left in zip(record_fetches, _left_behind(record_fetches), strict=True)
        if left and r["t"] - q["t"] >= STALL_S
    )
    per_part = {
        p: sum(1 for q, _ in record_fetches if any(x[1] == p for x in q["req"]["parts"]))
        for p in range(PARTITIONS)
    }
    partial = sum(x[7] > 0 for _, r in record_fetches for x in r["resp"]["parts"])
    first = record_fetches[0][0]["req"] if record_fetches else {}
    figures = {
        "broker": name,
        "rate": sum(n for _, n in batches) / (batches[-1][0] - batches[0][0]),
        "gap_ms": gap * 1000,
        "fetches": len(record_fetches),
        "left_out": left_out,
        "parked": len(parked),
        "parked_left_out": parked_left_out,
        "stall": _stall_kind(gap, g0, g1, record_fetches) if gap >= STALL_S else "",
        "per_partition": per_part,
        "partial_batches": partial,
        "request": {
            k: first.get(k)
            for k in ("v", "session", "max_wait_ms", "min_bytes", "max_bytes", "isolation")
        },
    }
    if gap >= STALL_S:
        t0 = batches[0][0]
        lines = []
        for q, r in record_fetches:
            if g0 - 0.3 <= r["t"] and q["t"] <= g1 + 0.05:
                asked = " ".join(f"p{x[1]}@{x[2]}" for x in q["req"]["parts"])
                got = " ".join(
                    f"p{x[0]}:hw{x[2]},{x[3]}B,{x[4]}-{x[5]}"
                    + (f",+{x[7]}B partial" if x[7] else "")
                    for x in r["resp"]["parts"]
                )
                lines.append(
                    f"    {1000 * (q['t'] - t0):8.1f} ms ask [{asked}]"
                    f" -> {1000 * (r['t'] - q['t']):6.1f} ms later [{got}]"
                )
        figures["around_gap"] = [
            f"    gap {1000 * (g0 - t0):.1f} -> {1000 * (g1 - t0):.1f} ms",
            *lines,
        ]
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_200_000)
    ap.add_argument("--reads", type=int, default=6, help="reads per broker")
    ap.add_argument("--keep", type=Path, help="keep the relay logs in this directory")
    ap.add_argument(
        "--relay", nargs=3, metavar=("LISTEN", "UPSTREAM", "LOG"), help=argparse.SUPPRESS
    )
    args = ap.parse_args(argv)
    if args.relay:
        relay_main(int(args.relay[0]), int(args.relay[1]), args.relay[2])
        return 0
    print(f"machine: {machine()}")
    print(
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory(prefix="samsa-wire-") as d:
        logs = args.keep or Path(d)
        logs.mkdir(parents=True, exist_ok=True)
        relays: dict[str, tuple[int, Path]] = {}
        brokers: dict[str, Any] = {}
        for name in ("samsa", "kafka"):
            port = free_port()
            relays[name] = (port, logs / f"{name}.jsonl")
            over = {"advertised.listeners": f"PLAINTEXT://{HOST}:{port}"}
            brokers[name] = (
                SamsaBroker(Path(d) / "samsa", over)
                if name == "samsa"
                else KafkaBroker(Path(d) / "k", over)
            )
        procs = []
        try:
            for name, b in brokers.items():
                b.start()
                port, path = relays[name]
                procs.append(
                    subprocess.Popen(
                        [sys.executable, __file__, "--relay", str(port), str(b.port), str(path)]
                    )
                )
            time.sleep(1.0)
            for name in brokers:
                fill(f"{HOST}:{relays[name][0]}", "t", args.records)
            results: dict[str, list[dict]] = {name: [] for name in brokers}
            for i in range(args.reads):
                order = list(brokers) if i % 2 == 0 else list(reversed(brokers))
                for name in order:
                    port, path = relays[name]
                    start = time.monotonic()
                    batches = read(f"{HOST}:{port}", "t", args.records)
                    time.sleep(0.2)  # the relay's last lines
                    fig = summarize(name, batches, _load(path, start, time.monotonic()))
                    with (logs / f"{name}.reads.jsonl").open("a") as f:
                        f.write(json.dumps({"batches": batches, **fig}) + "\n")
                    results[name].append(fig)
                    print(
                        f"read {i + 1} {name}: {fig['rate']:,.0f} rec/s, longest gap "
                        f"{fig['gap_ms']:.0f} ms {fig['stall']}, {fig['fetches']} Fetches, "
                        f"{fig['left_out']} left a partition out, {fig['parked']} parked "
                        f"({fig['parked_left_out']} with a partition left out), "
                        f"per partition {fig['per_partition']}, "
                        f"{fig['partial_batches']} partial batches; {fig['request']}"
                    )
                    for line in fig.get("around_gap", []):
                        print(line)
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)
            for b in brokers.values():
                b.stop()
    print("\n| broker | reads | longest gap >= 300 ms: a parked Fetch / other | Fetches |"
          " leaving a partition out | parked (held >= 300 ms) | parked, a partition with"
          " records left out |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, figs in results.items():
        stalls = [f["stall"] for f in figs if f["stall"]]
        held = sum(k.startswith("parked") for k in stalls)
        total = {k: sum(f[k] for f in figs) for k in ("fetches", "left_out", "parked",
                                                       "parked_left_out")}  # fmt: skip
        print(f"| {name} | {len(figs)} | {held} / {len(stalls) - held} | {total['fetches']} |"
              f" {total['left_out']} | {total['parked']} |"
              f" {total['parked_left_out']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
