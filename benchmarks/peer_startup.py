"""Start-up with state, for peers.py: samsa and Kafka restarted on a data dir that holds

- ``partitions``: 10,000 partitions (topics of 1,000), one record in each;
- ``offsets``: 100,000 offset commits (1,000 OffsetCommits of 100 partitions, one group);
- ``log``: a large log (``log_mb`` of 1 KB records over 3 partitions), the broker SIGKILLed
  right after the last acknowledgement, so the restart recovers it;
- ``txns``: 100,000 committed transactions (AddPartitionsToTxn, one transactional batch,
  EndTxn; 32 transactional ids in parallel).

Each restart is timed from exec to the first answered ApiVersions (the port is open and
requests are read) and to the first answer that needs the state: Metadata with every
partition led, OffsetFetch with the committed offsets (the group coordinator ready), ListOffsets
with the whole log, and InitProducerId of a new transactional id. In between, the probes count
how often the broker answered COORDINATOR_LOAD_IN_PROGRESS (or NOT_AVAILABLE), which is how
Kafka (and samsa) serve while their coordinators load, and time a small Metadata request each
round: what other clients wait for meanwhile (p50 and max, in the notes). Then a SIGTERM to
exit is timed (the clean stop with that state). The state is loaded with raw requests (samsa's
``BlockingConnection``), the same for both brokers.

``python benchmarks/peer_startup.py offsets`` runs one scenario's rows alone (samsa and Kafka,
the full scale; ``--quick`` the small one; ``--commits 1000000`` a larger offsets state).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _brokers import HOST, _api_versions_ok, free_port
from _peerlib import Row, create_topic, machine, pipelined, wait_coordinator

from samsa.client._connection import BlockingConnection, ConnectionClosed
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import add_partitions_to_txn, init_producer_id, produce_request
from samsa.testing.kafka import KafkaNode

LOADING = {int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS), int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
           int(ErrorCode.NOT_COORDINATOR)}  # fmt: skip
# A loader's probe of the restarted broker: (state served, answered "still loading").
Probe = Callable[[BlockingConnection], tuple[bool, bool]]
# What a loader did: how much (in its StateScale field's unit), said how, and the probe.
Loaded = tuple[int, str, Probe]
SCENARIOS = ("partitions", "offsets", "log", "txns")


@dataclass
class StateScale:
    partitions: int = 10_000
    commits: int = 100_000
    log_mb: int = 256
    txns: int = 100_000
    max_load_s: float = 300.0  # a loader stops there and says how far it got
    together: bool = False  # all four states in one broker, one restart (a smoke run)


QUICK_STATE = StateScale(1_000, 5_000, 16, 1_000, 60.0, together=True)


@dataclass
class Restart:
    count: int = 0  # how much state the loader made (it may stop at max_load_s)
    loaded: str = ""  # the same, said in the notes
    first_answer: float = 0.0
    ready: float = 0.0
    loading_answers: int = 0
    metadata_ms: list[float] = field(default_factory=list, repr=False)  # until ready
    stop: float = 0.0
    errors: list[str] = field(default_factory=list)


class Node:
    """A broker on fixed ports of 127.0.0.1 that can be stopped, killed and started again on
    the same data dir; its output goes to a file there (a pipe nobody reads would fill)."""

    def __init__(self, name: str, data_dir: Path) -> None:
        self.name = name
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.kafka: KafkaNode | None = None
        if name == "kafka":
            self.kafka = KafkaNode(data_dir / "kafka", heap="1g")
            self.kafka.format()
            self.port = self.kafka.port
        else:
            self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.t0 = 0.0

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def command(self) -> list[str]:
        if self.kafka is not None:
            return self.kafka.command()
        return [sys.executable, "-m", "samsa", "broker", "--data-dir", str(self.data_dir / "d"),
                "--host", HOST, "--port", str(self.port)]  # fmt: skip

    def launch(self) -> None:
        with open(self.data_dir / "out.log", "ab") as out:
            self.t0 = time.perf_counter()
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT)  # fmt: skip

    def wait_answer(self, timeout: float = 300.0) -> float:
        """Seconds from exec to the first answered ApiVersions."""
        assert self.proc is not None
        while not _api_versions_ok(self.port, timeout=0.5):
            if self.proc.poll() is not None or time.perf_counter() - self.t0 > timeout:
                raise RuntimeError(f"{self.name} did not answer (see {self.data_dir}/out.log)")
            time.sleep(0.005)
        return time.perf_counter() - self.t0

    def stop(self, timeout: float = 300.0) -> float:
        """SIGTERM; seconds to exit (SIGKILL past ``timeout``)."""
        assert self.proc is not None
        t = time.perf_counter()
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        return time.perf_counter() - t

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


# --- raw requests ---------------------------------------------------------------------------


def _conn(node: Node) -> BlockingConnection:
    return BlockingConnection(HOST, node.port, client_id="bench-state", timeout=60)


def _offset_commit(group: str, topic: str, partitions: int, offset: int) -> Any:
    v = 8
    parts = tuple(
        make_request(ApiKey.OFFSET_COMMIT, v, "OffsetCommitRequestPartition", partition_index=p,
                     committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")
        for p in range(partitions)
    )  # fmt: skip
    return make_request(
        ApiKey.OFFSET_COMMIT, v, "OffsetCommitRequest", group_id=group,
        generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
        topics=(make_request(ApiKey.OFFSET_COMMIT, v, "OffsetCommitRequestTopic", name=topic,
                             partitions=parts),),
    )  # fmt: skip


def _offset_fetch(group: str) -> Any:
    v = 8
    g = make_request(ApiKey.OFFSET_FETCH, v, "OffsetFetchRequestGroup", group_id=group,
                     topics=None)  # fmt: skip
    return make_request(ApiKey.OFFSET_FETCH, v, "OffsetFetchRequest", require_stable=False,
                        groups=(g,))  # fmt: skip


def _list_offsets(topic: str, partitions: int) -> Any:
    v = 7
    parts = tuple(
        make_request(ApiKey.LIST_OFFSETS, v, "ListOffsetsPartition", partition_index=p,
                     current_leader_epoch=-1, timestamp=-1)
        for p in range(partitions)
    )  # fmt: skip
    return make_request(
        ApiKey.LIST_OFFSETS, v, "ListOffsetsRequest", replica_id=-1, isolation_level=0,
        topics=(make_request(ApiKey.LIST_OFFSETS, v, "ListOffsetsTopic", name=topic,
                             partitions=parts),),
    )  # fmt: skip


def _metadata(topics: tuple[Any, ...] | None = None) -> Any:
    """Metadata of every topic (None), or of ``()``: the brokers only, a cheap request."""
    v = 12
    return make_request(ApiKey.METADATA, v, "MetadataRequest", topics=topics,
                        allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False)  # fmt: skip


# --- loaders: each returns what it loaded, for the notes -----------------------------------


def load_partitions(node: Node, scale: StateScale) -> Loaded:
    from confluent_kafka import Producer

    per_topic = min(1_000, scale.partitions)
    topics = [f"many{i}" for i in range(scale.partitions // per_topic)]
    for t in topics:
        create_topic(node.bootstrap, t, per_topic)
    p = Producer({"bootstrap.servers": node.bootstrap, "acks": "all", "linger.ms": 20})
    for t in topics:
        for i in range(per_topic):
            p.produce(t, b"x" * 100, partition=i)
        p.poll(0)
    if (left := p.flush(max(scale.max_load_s, 300))) != 0:
        raise RuntimeError(f"{left} records left unacknowledged")
    total = len(topics) * per_topic

    def ready(conn: BlockingConnection) -> tuple[bool, bool]:
        resp = conn.request(ApiKey.METADATA, 12, _metadata())
        led = sum(1 for t in resp.topics if t.name in topics for q in t.partitions
                  if q.error_code == 0 and q.leader_id >= 0)  # fmt: skip
        return led == total, False

    return total, f"{total} partitions, 1 record each", ready


def load_offsets(node: Node, scale: StateScale) -> Loaded:
    parts = 100
    create_topic(node.bootstrap, "committed", parts)
    group = "bench-offsets"
    wait_coordinator(node.port, group, 0)
    requests = scale.commits // parts
    bad: list[int] = []

    def check(resp: Any) -> None:
        bad.extend(q.error_code for t in resp.topics for q in t.partitions if q.error_code)

    with _conn(node) as c:
        deadline = time.monotonic() + 60
        while True:  # Kafka: NOT_COORDINATOR until its new __consumer_offsets is loaded
            first = c.request(ApiKey.OFFSET_COMMIT, 8, _offset_commit(group, "committed", parts, 0))
            codes = {q.error_code for t in first.topics for q in t.partitions}
            if codes == {0} or not codes <= LOADING or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        gen = (_offset_commit(group, "committed", parts, i + 1) for i in range(requests))
        for resp in pipelined(c, ApiKey.OFFSET_COMMIT, 8, gen, window=32):
            check(resp)
    if bad:
        raise RuntimeError(f"OffsetCommit errors {sorted(set(bad))}")

    def ready(conn: BlockingConnection) -> tuple[bool, bool]:
        (g,) = conn.request(ApiKey.OFFSET_FETCH, 8, _offset_fetch(group)).groups
        if g.error_code:
            return False, int(g.error_code) in LOADING
        got = [q.committed_offset for t in g.topics for q in t.partitions]
        return got == [requests] * parts, False

    n = requests * parts
    return n, f"{n} offset commits ({requests} requests x {parts} partitions)", ready


def load_log(node: Node, scale: StateScale) -> Loaded:
    from confluent_kafka import Producer

    create_topic(node.bootstrap, "big", 3)
    p = Producer({"bootstrap.servers": node.bootstrap, "acks": "all", "linger.ms": 20,
                  "batch.size": 1_000_000, "queue.buffering.max.kbytes": 1_048_576})  # fmt: skip
    records = scale.log_mb * 1024
    value = b"L" * 1000
    failed = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed[0] += 1

    for i in range(records):
        while True:
            try:
                p.produce("big", value, partition=i % 3, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(scale.max_load_s) != 0 or failed[0]:
        raise RuntimeError(f"{failed[0]} records failed")

    def ready(conn: BlockingConnection) -> tuple[bool, bool]:
        resp = conn.request(ApiKey.LIST_OFFSETS, 7, _list_offsets("big", 3))
        ends = [q.offset for t in resp.topics for q in t.partitions if q.error_code == 0]
        return len(ends) == 3 and sum(ends) == records, False

    said = f"{records * 1000 / 2**20:.0f} MiB ({records} records of 1 KB), then SIGKILL"
    return scale.log_mb, said, ready


def _txn_worker(node: Node, txn_id: str, count: int, deadline: float, out: list[int]) -> None:
    """``count`` transactions of one batch each, on partition ``hash(txn_id) % 10``."""
    wait_coordinator(node.port, txn_id, 1)
    part = int(txn_id.rsplit("-", 1)[1]) % 10
    with _conn(node) as c:
        t0 = time.monotonic()
        while (got := init_producer_id(c, txn_id))[0] in LOADING and time.monotonic() < t0 + 60:
            time.sleep(0.1)  # Kafka: its new __transaction_state is still loading
        err, pid, epoch = got
        if err:
            raise RuntimeError(f"InitProducerId: {err}")
        for seq in range(count):
            if time.perf_counter() > deadline:
                break
            while (errs := add_partitions_to_txn(c, txn_id, pid, epoch, "txn", (part,))
                   ) != {part: 0}:  # fmt: skip
                if set(errs.values()) != {int(ErrorCode.CONCURRENT_TRANSACTIONS)}:
                    raise RuntimeError(f"AddPartitionsToTxn: {errs}")
                time.sleep(0.001)  # the last commit's markers are still being written
            batch = build_batch([NewRecord(value=b"t" * 100, timestamp=int(time.time() * 1000))],
                                producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                transactional=True)  # fmt: skip
            req = dataclasses.replace(produce_request({("txn", part): batch}),
                                      transactional_id=txn_id)  # fmt: skip
            answer = c.request(ApiKey.PRODUCE, 9, req).responses[0].partition_responses[0]
            if answer.error_code:
                raise RuntimeError(f"Produce: {answer.error_code}")
            end = make_request(ApiKey.END_TXN, 3, "EndTxnRequest", transactional_id=txn_id,
                               producer_id=pid, producer_epoch=epoch, committed=True)  # fmt: skip
            if (e := c.request(ApiKey.END_TXN, 3, end).error_code) != 0:
                raise RuntimeError(f"EndTxn: {e}")
            out.append(1)


def load_txns(node: Node, scale: StateScale) -> Loaded:
    create_topic(node.bootstrap, "txn", 10)
    workers = 32
    done: list[int] = []
    errors: list[str] = []
    deadline = time.perf_counter() + scale.max_load_s

    def run(i: int) -> None:
        try:
            _txn_worker(node, f"bench-txn-{i}", scale.txns // workers, deadline, done)
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(errors[0])
    seconds = time.perf_counter() - t0
    probes = [0]

    def ready(conn: BlockingConnection) -> tuple[bool, bool]:
        probes[0] += 1
        err, _pid, _epoch = init_producer_id(conn, f"probe-{probes[0]}")
        return err == 0, err in LOADING

    return len(done), f"{len(done)} transactions ({len(done) / seconds:.0f}/s while loading)", ready


FIELD = {"partitions": "partitions", "offsets": "commits", "log": "log_mb", "txns": "txns"}
LOADERS = {"partitions": load_partitions, "offsets": load_offsets, "log": load_log,
           "txns": load_txns}  # fmt: skip


def restart_with(name: str, scenarios: tuple[str, ...], work: Path, scale: StateScale
                 ) -> dict[str, Restart]:  # fmt: skip
    """Fill one broker with the state of ``scenarios``, stop it (SIGKILL with "log"), start
    it again and time it; one Restart per scenario (they share the first answer and stop)."""
    node = Node(name, work / f"state-{'-'.join(scenarios)}-{name}")
    out = {s: Restart() for s in scenarios}
    probes: dict[str, Probe] = {}
    try:
        node.launch()
        node.wait_answer()
        for s in scenarios:
            r = out[s]
            r.count, r.loaded, probes[s] = LOADERS[s](node, scale)
        if "log" in scenarios:
            node.kill()
        else:
            node.stop()
        node.launch()
        first = node.wait_answer()
        deadline = node.t0 + 600
        conn: BlockingConnection | None = None
        while probes:
            for s, ready in list(probes.items()):
                try:
                    conn = conn or _conn(node)
                    t = time.perf_counter()
                    conn.request(ApiKey.METADATA, 12, _metadata(()))
                    out[s].metadata_ms.append((time.perf_counter() - t) * 1000)
                    ok, loading = ready(conn)
                except (OSError, ConnectionClosed):  # refused, or closed: connect again
                    ok, loading, conn = False, False, None
                out[s].loading_answers += loading
                if ok:
                    out[s].ready = time.perf_counter() - node.t0
                    del probes[s]
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{name} not ready after 600 s")
            time.sleep(0.005)
        if conn is not None:
            conn.close()
        stop = node.stop()
        for r in out.values():
            r.first_answer, r.stop = first, stop
    finally:
        node.kill()
    return out


def state_rows(scale: StateScale, work: Path, scenarios: tuple[str, ...] = SCENARIOS) -> list[Row]:
    """Three rows per scenario (first answer, state served, clean stop), samsa and Kafka.
    With ``scale.together`` (``--quick``) one broker of each holds all four states and is
    restarted once, which saves six JVM starts."""
    what = {"partitions": "Metadata with every partition led", "offsets": "OffsetFetch",
            "log": "ListOffsets of the whole log", "txns": "InitProducerId"}  # fmt: skip
    up = {s: Row(f"start-up to first answer, {s}", "s", False) for s in SCENARIOS}
    ready = {s: Row(f"start-up to {what[s]}, {s}", "s", False) for s in SCENARIOS}
    stop = {s: Row(f"clean stop, {s}", "s", False) for s in SCENARIOS}
    batches = [scenarios] if scale.together else [(s,) for s in scenarios]
    for i, batch in enumerate(batches):
        this = scale
        for name in ("samsa", "kafka") if i % 2 == 0 else ("kafka", "samsa"):
            try:
                results = restart_with(name, batch, work, this)
            except Exception as e:  # said in the notes, not hidden
                for s in batch:
                    up[s].notes[name] = f"{type(e).__name__}: {e}"[:200]
                continue
            for s, r in results.items():
                up[s].values[name], ready[s].values[name] = r.first_answer, r.ready
                stop[s].values[name] = r.stop
                up[s].notes[name] = r.loaded
                lat = sorted(r.metadata_ms) or [float("nan")]
                ready[s].notes[name] = (
                    f"{r.loading_answers} loading answers before it; Metadata meanwhile "
                    f"p50 {lat[len(lat) // 2]:.1f} ms, max {lat[-1]:.1f} ms ({len(lat)} asked)"
                )
                print(f"  {s} / {name}: {r}", flush=True)
                # A loader cut short by max_load_s: the other broker gets the same amount.
                this = dataclasses.replace(this, **{FIELD[s]: r.count})
    return [row for s in scenarios for row in (up[s], ready[s], stop[s])]


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    from peers import print_rows

    ap = argparse.ArgumentParser(description="start-up with state, samsa and Kafka")
    ap.add_argument("scenarios", nargs="*", default=list(SCENARIOS), choices=SCENARIOS)
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    ap.add_argument("--commits", type=int, help="offset commits of the offsets state")
    args = ap.parse_args(argv)
    scale = dataclasses.replace(QUICK_STATE, together=False) if args.quick else StateScale()
    if args.commits:
        scale = dataclasses.replace(scale, commits=args.commits)
    print(f"machine: {machine()}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    with tempfile.TemporaryDirectory(prefix="samsa-startup-") as d:
        rows = state_rows(scale, Path(d), tuple(args.scenarios))
    print_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
