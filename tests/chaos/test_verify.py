"""``samsa verify`` against samsa with every fault on, and the checker's own self-test.

* The checker is fed synthetic histories with one anomaly of each kind planted: each must be
  reported (a checker that cannot fail proves nothing), and the legitimate uncertain cases
  (a failed send that was written anyway, a transaction of unknown outcome read whole) must
  not be.
* End to end, verify must flag the duplicates that a non-idempotent producer writes when
  responses are lost.
* verify runs against a real samsa broker through the fault proxy (lost responses, resets,
  delays) while a restart command SIGKILLs and restarts the broker: zero anomalies expected,
  and the faults, retries and restarts must really have happened. Once in-process
  (idempotent, and transactional when the client has transactions), once as the CLI.

The restart command is a tiny client of a control socket served by this test process: the
test owns the broker process, so it kills and restarts it itself and answers "ok" once the
broker is ready again. Nothing outlives the test.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from samsa.client import ConsumerRecord
from samsa.verify import (
    KINDS,
    History,
    Outcome,
    Read,
    Sent,
    VerifyConfig,
    check,
    render,
    run_verify,
)
from samsa.verify.checker import (
    ABORTED_READ,
    DUPLICATED,
    LOST,
    OFFSET_MISMATCH,
    PARTIAL_TXN,
    REORDERED,
    UNEXPECTED,
)
from samsa.verify.workload import encode_value, parse_record

ROOT = Path(__file__).resolve().parents[2]

# --- the checker, on synthetic histories ---------------------------------------------------


def _clean() -> tuple[History, list[Read]]:
    """Two producers on two partitions, one with transactions; everything read correctly."""
    h = History()
    reads: list[Read] = []
    # producer 0, idempotent: seqs 0..5 alternate partitions, offsets 0..2 on each
    for seq in range(6):
        part, off = seq % 2, seq // 2
        h.sent.append(Sent(0, seq, -1, True, part, off))
        reads.append(Read(part, off, 0, seq))
    # producer 1, transactional: t0 committed (seqs 0-1), t1 aborted (2-3), t2 unknown (4-5)
    h.txns[(1, 0)] = Outcome.COMMITTED
    h.txns[(1, 1)] = Outcome.ABORTED
    h.txns[(1, 2)] = Outcome.UNKNOWN
    for seq in range(6):
        h.sent.append(Sent(1, seq, seq // 2, True, 0, 10 + seq))
    reads += [Read(0, 10, 1, 0, 0), Read(0, 11, 1, 1, 0)]
    return h, reads


def _kinds(h: History, reads: list[Read]) -> set[str]:
    return set(check(h, reads).counts())


def test_clean_history_has_no_anomaly() -> None:
    h, reads = _clean()
    result = check(h, reads)
    assert result.ok, result.anomalies
    assert (result.sent, result.acked, result.read, result.must_read) == (12, 12, 8, 8)


def test_uncertain_records_may_or_may_not_be_read() -> None:
    h, reads = _clean()
    # a failed send that the broker wrote anyway (lost ACK), read once: fine
    h.sent.append(Sent(0, 6, -1, False))
    assert _kinds(h, reads) == set()
    assert _kinds(h, [*reads, Read(0, 3, 0, 6)]) == set()
    # the unknown transaction read whole: fine; read in part: not
    whole = [*reads, Read(0, 14, 1, 4, 2), Read(0, 15, 1, 5, 2)]
    assert _kinds(h, whole) == set()
    assert _kinds(h, [*reads, Read(0, 14, 1, 4, 2)]) == {PARTIAL_TXN}
    # an ack without offset (DUPLICATE_SEQUENCE_NUMBER) is not compared with reads
    h2, reads2 = _clean()
    h2.sent[0] = Sent(0, 0, -1, True, 0, -1)
    result = check(h2, reads2)
    assert result.ok and result.acked_without_offset == 1


@pytest.mark.parametrize("kind", KINDS)
def test_each_planted_anomaly_is_reported(kind: str) -> None:
    h, reads = _clean()
    if kind == LOST:
        reads = [r for r in reads if (r.producer, r.seq) != (0, 3)]
    elif kind == DUPLICATED:
        reads.append(Read(1, 7, 0, 3))
    elif kind == REORDERED:
        # partition 0 holds p0's seqs 0, 2, 4 at offsets 0, 1, 2: swap seqs 2 and 4
        reads = [r for r in reads if not (r.producer == 0 and r.seq in (2, 4))]
        reads += [Read(0, 1, 0, 4), Read(0, 2, 0, 2)]
        h.sent = [s for s in h.sent if not (s.producer == 0 and s.seq in (2, 4))]
        h.sent += [Sent(0, 2, -1, True, 0, 2), Sent(0, 4, -1, True, 0, 1)]
    elif kind == ABORTED_READ:
        reads.append(Read(0, 12, 1, 2, 1))
    elif kind == OFFSET_MISMATCH:
        reads = [r for r in reads if (r.producer, r.seq) != (0, 5)]
        reads.append(Read(1, 9, 0, 5))  # acked at 1@2
    elif kind == PARTIAL_TXN:
        reads.append(Read(0, 14, 1, 4, 2))
    elif kind == UNEXPECTED:
        reads.append(Read(1, 3, 7, 0))
    result = check(h, reads)
    assert set(result.counts()) == {kind}, result.anomalies
    assert len(result.anomalies[kind]) == 1


def test_two_acks_for_one_offset_and_lost_transaction_records() -> None:
    h, reads = _clean()
    h.sent.append(Sent(0, 6, -1, True, 0, 1))  # acked where p0/s2 is
    reads.append(Read(0, 3, 0, 6))
    assert OFFSET_MISMATCH in _kinds(h, reads)
    h, reads = _clean()
    assert _kinds(h, reads[:-1]) == {LOST}  # a committed transaction's record missing


def test_record_identity_round_trip() -> None:
    def rec(value: bytes | None) -> ConsumerRecord:
        return ConsumerRecord("t", 2, 40, 0, None, value)

    assert parse_record(rec(encode_value(3, 17, 5))) == Read(2, 40, 3, 17, 5)
    assert parse_record(rec(encode_value(0, 1, -1))) == Read(2, 40, 0, 1, -1)
    assert parse_record(rec(b"something else")).producer == -1
    assert parse_record(rec(None)).producer == -1


# --- against a real broker -----------------------------------------------------------------


class Restarter:
    """Control socket: each connection SIGKILLs the broker, restarts it, answers ok."""

    def __init__(self, broker) -> None:  # type: ignore[no-untyped-def]
        self.broker = broker
        self.count = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(4)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def command(self) -> str:
        port = self._sock.getsockname()[1]
        code = (
            "import socket, sys\n"
            f"s = socket.create_connection(('127.0.0.1', {port}), timeout=60)\n"
            "sys.exit(0 if s.makefile().readline().strip() == 'ok' else 1)\n"
        )
        return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"

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
                    self.count += 1
                    conn.sendall(b"ok\n")
                except Exception as exc:
                    conn.sendall(f"failed: {exc}\n".encode())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


@pytest.fixture
def restartable(broker_factory) -> Iterator[tuple[object, Restarter]]:  # type: ignore[no-untyped-def]
    b = broker_factory().start()
    r = Restarter(b)
    try:
        yield b, r
    finally:
        r.close()


def _all_faults(bootstrap: str, command: str, **kw: object) -> VerifyConfig:
    return VerifyConfig(
        bootstrap=bootstrap,
        proxy=True,
        drop_response_rate=0.08,
        reset_rate=0.08,
        delay_ms=5,
        restart_command=command,
        restarts=2,
        timeout_s=60,
        seed=20240611,
        **kw,  # type: ignore[arg-type]
    )


def test_verify_idempotent_all_faults_and_sigkill(restartable) -> None:  # type: ignore[no-untyped-def]
    broker, restarter = restartable
    cfg = _all_faults(broker.bootstrap, restarter.command, producers=3, records=3000)
    result = run_verify(cfg)
    print(render(result))
    assert result.ok, render(result)
    assert result.produce_complete and result.read_complete, result.notes
    assert result.check.acked == 3000 and result.check.read == 3000
    assert restarter.count == 2 and all(r.returncode == 0 for r in result.restarts)
    stats = result.proxy_stats
    assert stats is not None
    assert stats["dropped_responses"] > 0 and stats["resets"] > 0, stats
    assert stats["delayed_frames"] > 0 and stats["produce_retries"] > 0, stats


def test_verify_sees_duplicates_of_a_plain_producer(broker) -> None:  # type: ignore[no-untyped-def]
    """End to end, the checker can fail: without idempotence, retries after lost
    responses write records twice, and verify must say so."""
    cfg = VerifyConfig(
        bootstrap=broker.bootstrap,
        proxy=True,
        idempotence=False,
        drop_response_rate=0.15,
        reset_rate=0.0,
        producers=2,
        records=2000,
        seed=3,
        timeout_s=60,
    )
    result = run_verify(cfg)
    print(render(result))
    assert not result.ok
    assert result.check.counts().get(DUPLICATED, 0) > 0, render(result)
    assert result.check.read > result.check.acked


def test_verify_transactional_all_faults_and_sigkill(restartable) -> None:  # type: ignore[no-untyped-def]
    broker, restarter = restartable
    cfg = _all_faults(
        broker.bootstrap,
        restarter.command,
        producers=3,
        records=1500,
        transactions=True,
        txn_size=10,
        abort_rate=0.25,
    )
    result = run_verify(cfg)
    print(render(result))
    assert result.ok, render(result)
    assert result.produce_complete and result.read_complete, result.notes
    check = result.check
    assert check.sent == 1500 and sum(check.txns.values()) == 150, (check.sent, check.txns)
    assert check.txns.get("committed", 0) > 0 and check.txns.get("aborted", 0) > 0, check.txns
    # Every record of a committed transaction was read (the checker counts each once).
    assert check.must_read == 10 * check.txns["committed"] and check.read >= check.must_read
    assert restarter.count == 2 and all(r.returncode == 0 for r in result.restarts)
    stats = result.proxy_stats
    assert stats is not None
    assert stats["dropped_responses"] > 0 and stats["resets"] > 0, stats
    assert stats["delayed_frames"] > 0, stats


def test_verify_cli_all_faults_and_sigkill(restartable, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    broker, restarter = restartable
    report = tmp_path / "verify.json"
    cmd = [
        sys.executable,
        "-m",
        "samsa",
        "verify",
        "--bootstrap-server",
        broker.bootstrap,
        "--proxy",
        "--drop-response-rate",
        "0.1",
        "--reset-rate",
        "0.1",
        "--delay-ms",
        "3",
        "--producers",
        "2",
        "--records",
        "1500",
        "--restart-broker",
        restarter.command,
        "--seed",
        "7",
        "--timeout-s",
        "60",
        "--json",
        str(report),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "anomalies: none" in proc.stdout
    assert "broker restarts 1 (0 failed)" in proc.stdout, proc.stdout
    assert restarter.count == 1
    data = json.loads(report.read_text())
    assert data["ok"] and data["summary"]["read"] == 1500 and data["proxy"]["faults"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--drop-response-rate", "0.1"], "--drop-response-rate need --proxy"),
        (["--proxy", "--reset-rate", "1.5"], "reset_rate must be within [0, 1]"),
        (["--bootstrap-server", "nohost"], "expected HOST:PORT"),
        (["--restarts", "2"], "--restarts needs --restart-broker"),
        (["--records", "0"], "must be > 0"),
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
