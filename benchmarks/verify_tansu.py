"""``samsa verify`` against samsa and Tansu, same workload and faults, anomalies side by side.

Each run is the Jepsen-style verify workload (concurrent client processes sending and
polling, client crashes) through the fault proxy (lost responses, resets, delays, in
alternate windows) with a SIGSTOP/SIGCONT pause of the broker, against each broker in turn:

(1) transactions, consumers subscribed in a group;
(2) idempotent sends, consumers assigned every partition;
(3) (1) plus two SIGKILL + restarts of the broker: samsa only, since Tansu's memory engine
    loses everything when it stops.

Each run prints verify's table and summary; the final table gives each broker's anomaly
counts per class (``*``: outside the allowed classes, i.e. a failure) for the README.

    python benchmarks/verify_tansu.py                 # 3 runs x 2 brokers, ~30 s each
    python benchmarks/verify_tansu.py --time-limit 60 --report-dir /tmp/verify-reports
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import socket
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import BrokerProcess, SamsaBroker, TansuBroker

from samsa.verify.report import render, write_report
from samsa.verify.workload import VerifyConfig, VerifyResult, run_verify


@dataclass
class Run:
    name: str
    transactions: bool
    subscribe: bool
    restarts: int = 0


RUNS = [
    Run("txn, subscribe", True, True),
    Run("idempotent, assign", False, False),
    Run("txn, subscribe, 2 kills", True, True, restarts=2),
]


class Restarter:
    """A control socket: each connection restarts the broker (SIGKILL, start), answers ok;
    the broker's pid is kept in a file for the pause command."""

    def __init__(self, broker: BrokerProcess, restart: Callable[[], None], pid_file: Path):
        self.broker, self.restart, self.pid_file = broker, restart, pid_file
        self.pid_file.write_text(f"{broker.pid}\n")
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def command(self) -> str:
        code = (
            "import socket, sys\n"
            f"s = socket.create_connection(('127.0.0.1', {self.sock.getsockname()[1]}), "
            "timeout=90)\n"
            "sys.exit(0 if s.makefile().readline().strip() == 'ok' else 1)\n"
        )
        return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    self.restart()
                    self.pid_file.write_text(f"{self.broker.pid}\n")
                    conn.sendall(b"ok\n")
                except Exception as exc:
                    conn.sendall(f"failed: {exc}\n".encode())

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


class RestartableSamsa(SamsaBroker):
    """Comes back on the same port (the proxy points at it), announcing readiness anew."""

    def command(self) -> list[str]:
        cmd = super().command()
        if self.port:
            cmd[cmd.index("--port") + 1] = str(self.port)
        return cmd

    def start(self) -> None:
        self._ready.clear()
        super().start()


def _kill_and_start(broker: BrokerProcess) -> None:
    assert broker.proc is not None
    broker.proc.kill()
    broker.proc.wait(10)
    broker.start()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=float, default=30.0, help="per run (s)")
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--report-dir", type=Path, help="a verify report per run under it")
    args = parser.parse_args()

    results: list[tuple[str, str, VerifyResult | str]] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="verify-")))
        brokers: list[tuple[str, BrokerProcess]] = [
            ("samsa", stack.enter_context(RestartableSamsa(tmp / "data"))),
            ("tansu", stack.enter_context(TansuBroker())),
        ]
        for run in RUNS:
            for name, broker in brokers:
                if run.restarts and name == "tansu":
                    continue
                restarter = Restarter(broker, lambda b=broker: _kill_and_start(b), tmp / "pid")
                cfg = VerifyConfig(
                    bootstrap=broker.bootstrap,
                    processes=args.processes,
                    rate=args.rate,
                    time_limit=args.time_limit,
                    transactions=run.transactions,
                    subscribe=run.subscribe,
                    crash_interval=args.time_limit,
                    proxy=True,
                    restart_command=restarter.command() if run.restarts else None,
                    restarts=run.restarts,
                    pause_target=f"cat {shlex.quote(str(tmp / 'pid'))}",
                    pauses=1,
                    seed=args.seed,
                )
                print(f"=== {name}: {run.name} ===", flush=True)
                try:
                    result = run_verify(cfg, lambda m: print(f"  {m}", flush=True))
                except Exception as exc:  # a broker refusing the workload is a finding too
                    print(f"  failed: {exc!r}\n", flush=True)
                    results.append((name, run.name, repr(exc)))
                    continue
                finally:
                    restarter.close()
                print(render(result) + "\n", flush=True)
                if args.report_dir is not None:
                    slug = run.name.replace(", ", "-").replace(" ", "")
                    write_report(args.report_dir / f"{name}-{slug}", result)
                results.append((name, run.name, result))

    print("=== summary (count; * outside the allowed classes) ===")
    print("| broker | run | ops ok/fail/info | acked | anomalies |\n|---|---|---|---|---|")
    for name, run_name, r in results:
        if isinstance(r, str):
            print(f"| {name} | {run_name} | - | - | failed: {r} |")
            continue
        s, c = r.summary(), r.check
        found = ", ".join(
            f"{k} {v}{'*' if k not in c.allowed else ''}" for k, v in c.counts.items()
        )
        ops = f"{s['ok']}/{s['fail']}/{s['info']}"
        print(f"| {name} | {run_name} | {ops} | {s['acked']} | {found or 'none'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
