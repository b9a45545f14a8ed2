"""``samsa verify`` on a 3-node Apache Kafka cluster whose leaders die (``make cluster-check``).

One KRaft cluster on 127.0.0.1 (replication factor 3, min.insync.replicas=2, unclean
election off, 1.5 s broker sessions), then the Jepsen-style verify workload (samsa's client
in concurrent OS processes, read_committed consumers) once per fault, then with every fault
together:

* ``kill``: the leader of partition 0 SIGKILLed and restarted (``--restart-broker``);
* ``zombie``: the leader of partition 1 SIGSTOPped for 4 s, past its 1.5 s session, then
  resumed (``--pause-broker`` with the pid of the leader of the moment);
* ``coordinators``: the node leading ``__transaction_state-0`` SIGKILLed (it coordinates
  about a third of the transactional ids and groups) and restarted;
* ``proxy``: lost answers and connection resets through samsa's fault proxy;
* ``all``: all of the above in one run.

Each fault runs with transactions (consumers subscribed in a group) and without
(idempotent sends, consumers assigned). Every run checks that its faults happened: a
leader kill must move the leader and its epoch. The final table is for the README.

    python benchmarks/cluster_check.py                      # 10 runs, ~20 s each
    python benchmarks/cluster_check.py --time-limit 40 --runs kill,all
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from samsa.testing.kafka import FAST_FAILOVER, KafkaCluster
from samsa.verify.report import render
from samsa.verify.workload import VerifyConfig, VerifyResult, run_verify

FAULTS = ("kill", "zombie", "coordinators", "proxy", "all")


@contextlib.contextmanager
def faults(
    cluster: KafkaCluster, topic: str, kinds: set[str], moves: list[str]
) -> Iterator[dict[str, object]]:
    """verify options injecting ``kinds``; ``moves`` collects what each fault did."""
    opts: dict[str, object] = {}
    with contextlib.ExitStack() as stack:
        kills: list[str] = []
        if "kill" in kinds:
            kills.append("leader")
        if "coordinators" in kinds:
            kills.append("coordinator")
        turn = iter(kills * 4)

        def kill() -> None:
            what = next(turn, "leader")
            cluster.wait_all()  # the node killed last time serves again
            if what == "leader":
                # returns once another node leads; the killed one restarts meanwhile
                old, old_epoch, new, new_epoch = cluster.kill_leader(topic, 0, wait=False)
                assert new != old and new_epoch > old_epoch, (old, new)
                moves.append(f"leader {old}->{new} epoch {old_epoch}->{new_epoch}")
            else:
                # the node leading __transaction_state-0: it coordinates transactional ids
                node, epoch = cluster.leader("__transaction_state", 0)
                cluster.node(node).kill()
                new, new_epoch = cluster.wait_leader("__transaction_state", 0, (node, epoch))
                cluster.node(node).launch()
                moves.append(f"coordinator node {node} killed, txn partition 0 now on {new}")

        if kills:
            opts["restart_command"] = stack.enter_context(cluster.fault_command(kill))
            opts["restarts"] = len(kills)

        if "zombie" in kinds:

            def leader_pid() -> int:
                before = cluster.leader(topic, 1)
                moves.append(f"zombie: paused leader {before[0]} (epoch {before[1]})")
                pid = cluster.node(before[0]).pid
                assert pid is not None
                return pid

            opts["pause_target"] = stack.enter_context(cluster.fault_command(leader_pid))
            opts["pauses"] = 1
            opts["pause_s"] = 4.0
        if "proxy" in kinds:
            opts |= {"proxy": True, "drop_response_rate": 0.05, "reset_rate": 0.05}
        yield opts


def run(cluster: KafkaCluster, fault: str, transactions: bool, time_limit: float) -> VerifyResult:
    topic = f"check-{fault}-{'txn' if transactions else 'idem'}-{int(time.time())}"
    kinds = {"kill", "zombie", "coordinators", "proxy"} if fault == "all" else {fault}
    moves: list[str] = []
    cluster.wait_all()
    with faults(cluster, topic, kinds, moves) as opts:
        cfg = VerifyConfig(
            bootstrap=cluster.bootstrap,
            processes=3,
            keys=3,
            rate=40,
            time_limit=time_limit,
            transactions=transactions,
            subscribe=transactions,
            session_timeout_ms=6000,
            topic=topic,
            **opts,  # type: ignore[arg-type]
        )
        result = run_verify(cfg, lambda m: print(f"  {m}", flush=True))
    if "zombie" in kinds:
        after = cluster.leader(topic, 1)
        moves.append(f"partition 1 now led by {after[0]} (epoch {after[1]})")
    print(render(result))
    print("  faults: " + "; ".join(moves))
    failed = [
        f.detail
        for f in result.history.faults
        if (f.kind == "kill" and f.detail != "exit 0") or f.detail.startswith("failed")
    ]
    if failed:
        print(f"  FAULT COMMANDS FAILED: {failed}")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--runs", default=",".join(FAULTS), help=f"subset of {','.join(FAULTS)}")
    args = ap.parse_args()
    wanted = [f for f in args.runs.split(",") if f]
    bad = [f for f in wanted if f not in FAULTS]
    if bad:
        ap.error(f"unknown runs {bad}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cluster = KafkaCluster(
            Path(tmp),
            overrides=FAST_FAILOVER,
        )
        with cluster:
            for fault in wanted:
                for txn in (True, False):
                    name = f"{fault}, {'txn+subscribe' if txn else 'idempotent+assign'}"
                    print(f"== {name}", flush=True)
                    r = run(cluster, fault, txn, args.time_limit)
                    s = r.check.stats
                    rows.append(
                        (name, r.ok and r.final_complete, s.get("ok", 0), dict(r.check.counts))
                    )
    print("\n| run | valid | ok ops | anomalies |\n|---|---|---|---|")
    for name, ok, n, counts in rows:
        print(f"| {name} | {'yes' if ok else 'NO'} | {n} | {counts or '-'} |")
    return 0 if all(ok for _, ok, _, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
