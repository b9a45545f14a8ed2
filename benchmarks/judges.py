"""Kafka's system-test tools as judges, on longer runs than tests/oracle/test_judges.py makes:
more records, more SIGKILLs of the broker and of the transactional copiers.

    .venv/bin/python benchmarks/judges.py [--messages 20000] [--throughput 2000] [--bounces 4]
        [--copy 15000] [--copier-kills 4] [--broker-kills 2] [--group-mode]
        [--brokers samsa,kafka]

Runs against samsa and, with ``--brokers`` naming it, a Kafka node (the reference: the same
checks, the same faults; a Kafka restart is a JVM start, given up to five minutes). Printed per
broker: records acknowledged, consumed and redelivered per group protocol, failed commits, the
problems found (none expected); for the copy, input and output records, missing and duplicated
ones, kills and restarts; and the seconds each run took.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _brokers import SamsaBroker, free_port

from samsa.client import Admin
from samsa.testing.judges import (
    check_copy,
    check_delivery,
    copier_run,
    produce_consume_run,
    read_committed,
    seed,
)
from samsa.testing.kafka import KafkaNode


class RestartableSamsa(SamsaBroker):
    """A samsa broker that keeps its port across SIGKILL and restart, as clients expect."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, {"group.initial.rebalance.delay.ms": "0"})
        self.fixed_port = free_port()

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("--port") + 1] = str(self.fixed_port)
        return cmd

    def bounce(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)
        self._ready.clear()
        self.start()


def judge(name: str, bootstrap: str, bounce: Callable[[], None], args: argparse.Namespace,
          work: Path) -> None:  # fmt: skip
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        for topic in ("judged", "copy-in", "copy-out"):
            admin.create_topic(topic, 3)
    t0 = time.monotonic()
    produced, consumed = produce_consume_run(
        bootstrap, "judged", work / "pc", bounce=bounce, bounces=args.bounces,
        messages=args.messages, throughput=args.throughput, timeout=args.timeout,
    )  # fmt: skip
    took = time.monotonic() - t0
    for group, events in consumed.items():
        r = check_delivery(produced, events, group)
        print(
            f"{name} {group}: acked {r.acked}, consumed {r.consumed}, redelivered "
            f"{r.redelivered}, send errors {r.send_errors}, failed commits {r.failed_commits}, "
            f"{args.bounces} broker kills, {took:.1f} s; problems: {r.problems or 'none'}"
        )
    inputs = seed(bootstrap, "copy-in", args.copy, work / "copy", timeout=args.timeout)
    t0 = time.monotonic()
    stats = copier_run(
        bootstrap, "copy-in", "copy-out", 3, work / "copy", bounce=bounce,
        copier_kills=args.copier_kills, broker_kills=args.broker_kills,
        group_mode=args.group_mode, timeout=args.timeout,
    )  # fmt: skip
    took = time.monotonic() - t0
    outputs = read_committed(bootstrap, "copy-out", len(inputs), work / "copy", args.timeout)
    c = check_copy(inputs, outputs)
    print(
        f"{name} copy: inputs {c.inputs}, outputs {c.outputs}, missing {c.missing}, "
        f"duplicated {c.duplicated}, copier kills {stats.copier_kills}, copier error exits "
        f"{stats.copier_exits}, broker kills {stats.broker_kills}, {took:.1f} s; "
        f"problems: {c.problems or 'none'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--throughput", type=int, default=2000)
    parser.add_argument("--bounces", type=int, default=4)
    parser.add_argument("--copy", type=int, default=15000)
    parser.add_argument("--copier-kills", type=int, default=4)
    parser.add_argument("--broker-kills", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--group-mode", action="store_true", help="copiers share the input as one group"
    )
    parser.add_argument("--brokers", default="samsa", help="samsa, kafka or samsa,kafka")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="samsa-judges-") as tmp:
        work = Path(tmp)
        brokers = args.brokers.split(",")
        if "samsa" in brokers:
            with RestartableSamsa(work / "samsa-data") as broker:
                judge("samsa", broker.bootstrap, broker.bounce, args, work / "samsa")
        if "kafka" in brokers:
            node = KafkaNode(work / "kafka").start(300)
            try:
                judge("kafka", node.bootstrap, lambda: node.restart(300) and None, args,
                      work / "kafka")  # fmt: skip
            finally:
                node.stop()


if __name__ == "__main__":
    main()
