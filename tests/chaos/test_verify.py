"""``samsa verify`` end to end against samsa: clean under every fault, and able to fail.

* Transactions, subscribe mode, proxy faults (lost responses, resets, delays), a broker
  SIGKILL + restart and a SIGSTOP pause in one short run: no anomaly
  outside the allowed classes, every acknowledged value read, and every fault really
  happened. The report directory is written and its history checks the same way again.
* A broker that lies (the proxy's replayed Produce answers; Produces dropped but
  acknowledged) is caught: inconsistent offsets, lost / unseen writes.
* Plain (non-idempotent) producers retrying after lost answers write duplicates: caught.
* The CLI: a short run with --report and --json, --check of the saved history, bad options.
* Client crashes (assign and subscribe mode, transactions) are SIGKILLs of real worker
  processes: the pid is gone, the successor has a new process id, the operation in flight is
  info; every live process's final polls reach every partition's end. (Crashes stay out of
  the run above: each SIGKILLed group member stalls the group for seconds, too long for it.)
  A SIGKILLed verify leaves no worker behind.

The restart command is a tiny client of a control socket served by this test process: the
test owns the broker process, so it kills and restarts it itself and answers "ok" once the
broker is ready again; it also keeps the broker's pid in a file the pause command prints.
Nothing outlives the test.
"""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from samsa.verify.checker import DUPLICATE, INCONSISTENT, LOST_WRITE, UNSEEN, check
from samsa.verify.history import History
from samsa.verify.report import render, write_report
from samsa.verify.workload import VerifyConfig, run_verify

ROOT = Path(__file__).resolve().parents[2]


class Restarter:
    """Control socket: each connection SIGKILLs the broker, restarts it, answers ok."""

    def __init__(self, broker, pid_file: Path) -> None:  # type: ignore[no-untyped-def]
        self.broker = broker
        self.pid_file = pid_file
        self.count = 0
        self.pids: list[int] = []  # every broker process this run had
        self._write_pid()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(4)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _write_pid(self) -> None:
        self.pids.append(self.broker.proc.pid)
        self.pid_file.write_text(f"{self.broker.proc.pid}\n")

    @property
    def command(self) -> str:
        port = self._sock.getsockname()[1]
        code = (
            "import socket, sys\n"
            f"s = socket.create_connection(('127.0.0.1', {port}), timeout=60)\n"
            "sys.exit(0 if s.makefile().readline().strip() == 'ok' else 1)\n"
        )
        return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"

    @property
    def pid_command(self) -> str:
        return f"cat {shlex.quote(str(self.pid_file))}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                try:
                    self.broker.kill()
                    self.broker.start()
                    self._write_pid()
                    self.count += 1
                    conn.sendall(b"ok\n")
                except Exception as exc:
                    conn.sendall(f"failed: {exc}\n".encode())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


@pytest.fixture
def restartable(broker_factory, tmp_path: Path) -> Iterator[tuple[object, Restarter]]:  # type: ignore[no-untyped-def]
    # Short group sessions: each SIGKILLed member stalls the group until its session expires.
    b = broker_factory(overrides={"group.min.session.timeout.ms": "1000"}).start()
    r = Restarter(b, tmp_path / "broker.pid")
    try:
        yield b, r
    finally:
        r.close()


def test_verify_transactions_subscribe_every_fault(restartable, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    broker, restarter = restartable
    cfg = VerifyConfig(
        bootstrap=broker.bootstrap,
        processes=3,
        keys=3,
        rate=30,
        time_limit=16,
        transactions=True,
        subscribe=True,
        session_timeout_ms=2000,
        proxy=True,
        drop_response_rate=0.08,
        reset_rate=0.08,
        delay_ms=5,
        fault_window_s=2,
        restart_command=restarter.command,
        restarts=1,
        pause_target=restarter.pid_command,
        pauses=1,
        pause_s=1.5,
        seed=20240611,
    )
    result = run_verify(cfg, lambda m: print("SAY", m, flush=True))
    for o in result.history.ops:
        print(
            "OP", o.process, o.f, o.type, round(o.start, 2), round(o.end, 2), o.error, o.rebalance
        )
    print("ERR", result.client_errors)
    print(render(result))
    assert result.ok, render(result)
    assert result.final_complete, result.notes
    kinds = [f.kind for f in result.history.faults]
    assert kinds.count("kill") == 1 and kinds.count("pause") == 1 and "proxy" in kinds, kinds
    assert all(f.detail == "exit 0" for f in result.history.faults if f.kind == "kill")
    # the pause stopped a broker process (a pause that failed is recorded as "failed: ...")
    (paused,) = [f.detail for f in result.history.faults if f.kind == "pause"]
    assert paused in {f"pid {pid}" for pid in restarter.pids}, (paused, restarter.pids)
    check_ = result.check
    assert not check_.counts.get(UNSEEN) and not check_.counts.get(LOST_WRITE)
    stats = check_.stats
    assert stats["ok"] > 50 and stats["txns"] == stats["ops"] - _final_polls(result.history)
    assert stats["fail"] > 0  # aborted on purpose, their values never read (else G1a)
    assert stats["values_read"] >= stats["acked"] > 50
    assert restarter.count == 1
    assert result.proxy_stats is not None and result.proxy_stats["faults"] > 0
    # the report: files written, and the saved history judged the same way again
    files = {p.name for p in write_report(tmp_path / "report", result)}
    assert {"history.jsonl", "summary.json", "latency.png", "throughput.png", "index.html"} <= files
    again = check(History.load(tmp_path / "report" / "history.jsonl"), subscribe=True)
    assert again.counts == check_.counts and again.ok


def _final_polls(h: History) -> int:
    """Lone polls: in a transactions run, only the final reads are."""
    return sum(1 for o in h.ops if o.f == "poll")


def _gone(pid: int) -> bool:
    """No such process, or a zombie (dead, its parent not having reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("subscribe", [False, True], ids=["assign", "subscribe"])
def test_verify_crash_kills_the_process_and_every_process_reads_to_the_end(
    broker_factory: Any, subscribe: bool
) -> None:
    # Short group sessions: a SIGKILLed member stalls its group until its session expires.
    broker = broker_factory(overrides={"group.min.session.timeout.ms": "1000"}).start()
    cfg = VerifyConfig(
        bootstrap=broker.bootstrap,
        processes=2,
        keys=2,
        rate=40,
        time_limit=6,
        transactions=True,
        subscribe=subscribe,
        session_timeout_ms=2000,
        abort_rate=0.0,
        crash_interval=2,
        seed=11,
    )
    result = run_verify(cfg)
    print(render(result), result.workers)
    assert result.ok and result.final_complete, render(result)
    h = result.history
    killed = [w for w in result.workers if w.end == "killed"]
    assert killed, result.workers
    by_process = {w.process: w for w in result.workers}
    for w in killed:
        assert w.pid is not None and _gone(w.pid) and w.exitcode == -signal.SIGKILL
        successor = by_process[w.process + cfg.processes]  # Jepsen's numbering
        assert successor.slot == w.slot and successor.pid != w.pid
        # its operations, or (killed before issuing one) its own crash
        assert any(o.process == successor.process for o in h.ops)
        assert any(o.f == "crash" and o.process == w.process for o in h.ops)
    in_flight = [o for o in h.client_ops() if o.error == "process killed"]
    assert in_flight and all(o.type == "info" for o in in_flight)
    assert {o.process for o in in_flight} <= {w.process for w in killed}
    # every process alive at the end read each partition to the end the final phase fetched
    live = [w for w in result.workers if w.end == "exited"]
    assert sorted(w.slot for w in live) == [0, 1], result.workers
    top: dict[int, int] = {}
    for o in h.client_ops():
        for k, pairs in o.reads().items():
            top[k] = max([top.get(k, -1), *(off for off, _ in pairs)])
    # every key a committed transaction wrote to was read (in a short subscribe run with
    # crashes, a key may get no committed write at all)
    committed = {k for o in h.client_ops() if o.type == "ok" for k, _, _ in o.sends()}
    assert committed and set(result.final_ends) == {0, 1} and set(top) >= committed
    for w in live:
        assert w.final and all(w.positions[k] >= end for k, end in result.final_ends.items())
        mine: dict[int, int] = {}
        for o in h.client_ops():
            if o.process == w.process:
                for k, pairs in o.reads().items():
                    mine[k] = max([mine.get(k, -1), *(off for off, _ in pairs)])
        assert mine == top, (w.process, mine, top)
    assert all(top.get(k, -1) < end for k, end in result.final_ends.items())
    assert all(w.exitcode is not None for w in result.workers)


def test_verify_killed_leaves_no_worker_behind(broker) -> None:  # type: ignore[no-untyped-def]
    cmd = [sys.executable, "-m", "samsa", "verify", "--bootstrap-server", broker.bootstrap]
    proc = subprocess.Popen(
        [*cmd, "--time-limit", "30", "--processes", "2", "--keys", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    pids: list[int] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # bounded: the run ends by itself after 30 s
            if "client processes: pids" in line:
                pids = json.loads(line.rsplit("pids", 1)[1])
                break
        assert len(pids) == 2 and not any(_gone(p) for p in pids)
    finally:
        proc.kill()
        proc.wait(10)
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), pids


def _liar(broker, **lies: float) -> VerifyConfig:  # type: ignore[no-untyped-def]
    return VerifyConfig(
        bootstrap=broker.bootstrap,
        processes=2,
        keys=2,
        rate=60,
        time_limit=5,
        proxy=True,
        drop_response_rate=0.0,
        reset_rate=0.0,
        delay_ms=0,
        fault_window_s=1,
        seed=5,
        **lies,  # type: ignore[arg-type]
    )


def test_verify_catches_replayed_produce_answers(broker) -> None:  # type: ignore[no-untyped-def]
    result = run_verify(_liar(broker, replay_rate=0.2))
    print(render(result))
    assert result.proxy_stats is not None and result.proxy_stats["replayed_responses"] > 0
    assert not result.ok and INCONSISTENT in result.check.bad_kinds, render(result)
    case = result.check.cases[INCONSISTENT][0]
    assert len(case.data["values"]) >= 2 and case.ops


def test_verify_catches_acknowledged_but_dropped_produces(broker) -> None:  # type: ignore[no-untyped-def]
    result = run_verify(_liar(broker, fake_ack_rate=0.2))
    print(render(result))
    assert result.proxy_stats is not None and result.proxy_stats["faked_acks"] > 0
    bad = set(result.check.bad_kinds)
    assert not result.ok and bad & {LOST_WRITE, UNSEEN}, render(result)
    assert INCONSISTENT in bad  # the next real record took the offset the fake ack named


def test_verify_sees_duplicates_of_a_plain_producer(broker) -> None:  # type: ignore[no-untyped-def]
    """Without idempotence, retries after lost answers write values twice: caught."""
    cfg = VerifyConfig(
        bootstrap=broker.bootstrap,
        processes=2,
        keys=2,
        rate=60,
        time_limit=5,
        idempotence=False,
        proxy=True,
        drop_response_rate=0.2,
        reset_rate=0.0,
        fault_window_s=1,
        seed=3,
    )
    result = run_verify(cfg)
    print(render(result))
    assert not result.ok and DUPLICATE in result.check.bad_kinds, render(result)


def test_verify_cli_report_json_and_recheck(broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    report, out = tmp_path / "report", tmp_path / "verify.json"
    base = [sys.executable, "-m", "samsa", "verify"]
    cmd = [
        *base,
        "--bootstrap-server",
        broker.bootstrap,
        "--time-limit",
        "4",
        "--rate",
        "40",
        "--proxy",
        "--fault-window",
        "1",
        "--seed",
        "7",
        "--report",
        str(report),
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "result: valid" in proc.stdout and "report: " in proc.stdout
    assert "anomalies so far" in proc.stderr or "operations done" in proc.stderr
    data = json.loads(out.read_text())
    assert data["valid"] and data["summary"]["values_read"] >= data["summary"]["acked"] > 0
    page = (report / "index.html").read_text()
    assert "latency.png" in page and "throughput.png" in page
    # The saved history judged again: the same anomalies and the same verdict (strict: any
    # anomaly at all, allowed or not, makes it invalid).
    again = tmp_path / "again.json"
    for strict in (False, True):
        proc = subprocess.run(
            [*base, "--check", str(report / "history.jsonl"), "--json", str(again)]
            + (["--strict"] if strict else []),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        redo = json.loads(again.read_text())
        valid = not data["counts"] if strict else data["valid"]
        assert redo["counts"] == data["counts"] and redo["valid"] == valid, (strict, redo)
        verdict = "result: valid" if valid else "result: INVALID"
        assert proc.returncode == (0 if valid else 1) and verdict in proc.stdout, proc.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"index": 0, "process": 0}\n')
    proc = subprocess.run(
        [*base, "--check", str(bad)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 2 and "history line 1" in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--drop-response-rate", "0.1"], "--drop-response-rate need --proxy"),
        (["--fake-ack-rate", "0.1"], "--fake-ack-rate need --proxy"),
        (["--proxy", "--reset-rate", "1.5"], "reset_rate must be within [0, 1]"),
        (["--bootstrap-server", "nohost"], "expected HOST:PORT"),
        (["--restarts", "2"], "--restarts needs --restart-broker"),
        (["--pauses", "2"], "--pauses needs --pause-broker"),
        (["--time-limit", "0"], "must be > 0"),
        (["--session-timeout-ms", "0"], "must be > 0"),
        (["--transactions", "--no-idempotence"], "transactions need idempotence"),
    ],
)
def test_verify_cli_bad_options(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "samsa", "verify", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
