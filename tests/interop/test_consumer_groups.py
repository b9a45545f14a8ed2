"""Consumer groups of three real client libraries against samsa's group coordinator.

Each scenario runs group consumers of one library and one assignor as subprocesses
(``_group_worker.py``) over a 6-partition topic:

1. three members consume what is produced; everything gets committed;
2. a fourth member joins (the group rebalances to four members) and gets partitions;
3. one member leaves cleanly (LeaveGroup): once it has exited the group no longer counts it;
4. one member is SIGKILLed: the group still counts it right after, and its partitions move on
   to the others, but not before its session could have timed out.

After each step more records are produced and the test waits until the group's committed
offsets (read with OffsetFetch) reach the end of every partition. Then, from the workers'
logs: every record was delivered, and no record was delivered after a commit past its
offset had succeeded (a committed record is never redelivered after a rebalance).

Assignors: confluent-kafka and kafka-python run range, roundrobin and cooperative-sticky
(incremental rebalancing); aiokafka has no cooperative protocol, so it runs range,
roundrobin and its eager sticky assignor. The scenarios of one library run concurrently.
"""

from __future__ import annotations

import bisect
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _group_worker import HEARTBEAT_MS, SESSION_TIMEOUT_MS
from confluent_kafka import Producer

from _broker import BrokerProcess
from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey, make_request
from samsa.testing import create_topic

WORKER = Path(__file__).with_name("_group_worker.py")
PARTITIONS = 6
BATCH = 120
PHASE_TIMEOUT = 40.0
ASSIGNORS = {
    "confluent": ("range", "roundrobin", "cooperative-sticky"),
    "kafka-python": ("range", "roundrobin", "cooperative-sticky"),
    "aiokafka": ("range", "roundrobin", "sticky"),
}


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        tmp_path_factory.mktemp("groups"),
        {
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "500",
            "offsets.topic.num.partitions": "5",
        },
    ).start()
    yield b
    b.stop()
    assert not b.log_contains("Traceback"), "\n".join(b.log[-60:])


# --- raw protocol views of the group ---------------------------------------------------------


def committed(conn: BlockingConnection, group: str, topic: str) -> dict[int, int]:
    v = 8
    req = make_request(
        ApiKey.OFFSET_FETCH,
        v,
        "OffsetFetchRequest",
        groups=(
            make_request(
                ApiKey.OFFSET_FETCH,
                v,
                "OffsetFetchRequestGroup",
                group_id=group,
                topics=(
                    make_request(
                        ApiKey.OFFSET_FETCH,
                        v,
                        "OffsetFetchRequestTopics",
                        name=topic,
                        partition_indexes=tuple(range(PARTITIONS)),
                    ),
                ),
            ),
        ),
        require_stable=True,
    )
    resp = conn.request(ApiKey.OFFSET_FETCH, v, req)
    return {
        p.partition_index: int(p.committed_offset)
        for t in resp.groups[0].topics
        for p in t.partitions
    }


def describe(conn: BlockingConnection, group: str) -> tuple[str, int]:
    v = 5
    req = make_request(
        ApiKey.DESCRIBE_GROUPS,
        v,
        "DescribeGroupsRequest",
        groups=(group,),
        include_authorized_operations=False,
    )
    g = conn.request(ApiKey.DESCRIBE_GROUPS, v, req).groups[0]
    return g.group_state, len(g.members)


# --- one scenario ----------------------------------------------------------------------------


class Scenario:
    def __init__(self, broker: BrokerProcess, tmp: Path, lib: str, assignor: str) -> None:
        self.broker = broker
        self.lib = lib
        self.assignor = assignor
        self.topic = f"cg-{lib}-{assignor}"
        self.group = f"group-{lib}-{assignor}"
        self.tmp = tmp
        self.workers: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.produced = [0] * PARTITIONS
        self.conn = BlockingConnection("127.0.0.1", broker.port, timeout=10)
        self.producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2})

    def spawn(self) -> int:
        index = len(self.workers)
        log = self.tmp / f"{self.topic}-worker{index}.log"
        self.logs.append(log)
        self.workers.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(WORKER),
                    self.lib,
                    self.assignor,
                    self.broker.bootstrap,
                    self.topic,
                    self.group,
                    str(log),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        return index

    def produce(self, n: int) -> None:
        for i in range(n):
            p = i % PARTITIONS
            self.producer.produce(self.topic, value=b"v%d" % i, partition=p)
            self.produced[p] += 1
        assert self.producer.flush(20) == 0

    def wait_members(self, n: int) -> None:
        deadline = time.monotonic() + PHASE_TIMEOUT
        while True:
            state = describe(self.conn, self.group)
            if state == ("Stable", n):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.group}: wanted Stable with {n} members, got {state}")
            time.sleep(0.1)

    def wait_all_committed(self) -> None:
        want = dict(enumerate(self.produced))
        deadline = time.monotonic() + PHASE_TIMEOUT
        while True:
            got = committed(self.conn, self.group, self.topic)
            if got == want:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.group}: committed {got}, produced {want}")
            time.sleep(0.1)

    def run(self) -> None:
        assert create_topic(self.conn, self.topic, PARTITIONS) == 0
        for _ in range(3):
            self.spawn()
        self.wait_members(3)
        self.produce(BATCH)
        self.wait_all_committed()

        joiner = self.spawn()  # a member joins
        self.wait_members(4)
        joined_at = time.monotonic_ns()
        self.produce(BATCH)
        self.wait_all_committed()

        self.workers[0].send_signal(signal.SIGTERM)  # one leaves cleanly
        assert self.workers[0].wait(20) == 0
        # It said so (LeaveGroup): the group is not still stable with it, as after a crash.
        assert describe(self.conn, self.group) != ("Stable", 4)
        self.wait_members(3)
        left_at = time.monotonic_ns()
        self.produce(BATCH)
        self.wait_all_committed()

        killed_at = time.monotonic_ns()
        self.workers[1].send_signal(signal.SIGKILL)  # one dies: only its session times out
        self.workers[1].wait(10)
        # Nobody told the coordinator: the dead member is still in the stable group, until
        # its session expires.
        assert describe(self.conn, self.group) == ("Stable", 3)
        expired_at = self.wait_until(lambda: describe(self.conn, self.group) != ("Stable", 3))
        self.produce(BATCH)
        self.wait_all_committed()
        self.wait_members(2)
        self.stop()
        self.verify(joiner, joined_at)
        self.verify_session_timeout(left_at, killed_at, expired_at)

    def stop(self) -> None:
        for w in self.workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.wait(20)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait(10)
        self.conn.close()

    def verify(self, joiner: int, joined_at: int) -> None:
        deliveries = self._deliveries()
        commits: dict[int, list[tuple[int, int]]] = defaultdict(list)  # p -> [(time, offset)]
        for path in self.logs:
            for line in path.read_text().splitlines():
                f = line.split()
                if len(f) == 4 and f[0] == "C":
                    commits[int(f[2])].append((int(f[1]), int(f[3])))
        seen = {(p, o) for _, p, o, _ in deliveries}
        missing = [
            (p, o) for p in range(PARTITIONS) for o in range(self.produced[p]) if (p, o) not in seen
        ]
        assert not missing, f"{self.group}: never delivered: {missing[:20]}"
        # A record is never delivered after a commit past it succeeded.
        for p, cs in commits.items():
            cs.sort()
            times = [t for t, _ in cs]
            high = []
            best = -1
            for _, c in cs:
                best = max(best, c)
                high.append(best)
            for t, dp, o, w in deliveries:
                if dp != p:
                    continue
                i = bisect.bisect_left(times, t) - 1
                if i >= 0:
                    assert o >= high[i], (
                        f"{self.group}: worker {w} got {p}@{o} after offset {high[i]} was committed"
                    )
        assert any(w == joiner and t >= joined_at for t, _, _, w in deliveries), (
            f"{self.group}: the member that joined never got a partition"
        )

    def wait_until(self, changed: Callable[[], bool]) -> int:
        """Poll the coordinator until ``changed``; when (monotonic ns) it was first seen."""
        deadline = time.monotonic() + PHASE_TIMEOUT
        while not changed():
            assert time.monotonic() < deadline, f"{self.group}: the dead member never expired"
            time.sleep(0.02)
        return time.monotonic_ns()

    def verify_session_timeout(self, left_at: int, killed_at: int, expired_at: int) -> None:
        """The killed member's partitions moved on, and not before its session could expire:
        the coordinator dropped it (``expired_at``, polled) a whole session after its last
        heartbeat."""
        dead = 1
        deliveries = self._deliveries()
        owned = {p for t, p, _, w in deliveries if w == dead and left_at <= t < killed_at}
        assert owned, f"{self.group}: worker {dead} owned nothing when it was killed"
        moved = [
            (t, p, w) for t, p, _, w in deliveries if p in owned and t >= killed_at and w != dead
        ]
        assert {p for _, p, _ in moved} == owned, f"{self.group}: {owned} did not move on"
        # Its last heartbeat was at most a heartbeat interval before the kill (the session
        # expires at least SESSION_TIMEOUT_MS - HEARTBEAT_MS after it); one more interval of
        # slack for a heartbeat sent late, which brings the expiry closer. A timer running at
        # half length (expiry at most 1000 ms after the kill) fails this.
        waited_ms = (expired_at - killed_at) / 1e6
        assert waited_ms >= SESSION_TIMEOUT_MS - 2 * HEARTBEAT_MS, (
            f"{self.group}: the dead member was dropped {waited_ms:.0f} ms after the kill, "
            f"before its {SESSION_TIMEOUT_MS} ms session could time out"
        )

    def _deliveries(self) -> list[tuple[int, int, int, int]]:
        """(time, partition, offset, worker) of every delivery in the workers' logs."""
        out = []
        for worker, path in enumerate(self.logs):
            for line in path.read_text().splitlines():
                f = line.split()
                if len(f) == 4 and f[0] == "D":
                    out.append((int(f[1]), int(f[2]), int(f[3]), worker))
        return out

    def kill_all(self) -> None:
        for w in self.workers:
            if w.poll() is None:
                w.kill()
                w.wait(10)


def _run(broker: BrokerProcess, tmp: Path, lib: str, assignor: str) -> None:
    scenario = Scenario(broker, tmp, lib, assignor)
    try:
        scenario.run()
    finally:
        scenario.kill_all()


@pytest.mark.parametrize("lib", list(ASSIGNORS))
def test_group_rebalances_lose_nothing(
    group_broker: BrokerProcess, tmp_path: Path, lib: str
) -> None:
    with ThreadPoolExecutor(len(ASSIGNORS[lib])) as pool:
        futures = [pool.submit(_run, group_broker, tmp_path, lib, a) for a in ASSIGNORS[lib]]
        for f in futures:
            f.result(timeout=300)
