"""The verify workload: producers under faults, then read_committed consumers, then the checker.

Theory of operation
-------------------
:func:`run_verify` creates a fresh topic (directly on the bootstrap broker: setup is not
under test), optionally starts a :class:`~samsa.testing.proxy.FaultProxy` in front of the
broker with faults on, and runs ``producers`` threads, each with its own samsa producer:

* idempotent mode: a producer sends its share of the records in chunks and flushes after
  each chunk, so the run is spread over time and a restart lands while requests are in
  flight. Each record's future gives the client's verdict: acknowledged (partition, offset)
  or failed, which only means "unknown": the broker may have written it.
* transactional mode (``transactions``): each chunk is one transaction, committed or,
  with probability ``abort_rate``, aborted on purpose after its records were flushed to
  the log (so that read_committed consumers must skip them). A transaction is COMMITTED only if
  commit returned success, ABORTED if the producer never asked to commit it (an intended
  abort, or a failure before the commit), UNKNOWN if a commit was attempted and failed. A
  producer that cannot go on (fenced, fatal error) is replaced by a new instance with the
  same transactional id, whose InitProducerId aborts whatever its predecessor left open.

Every record's value is ``samsa-verify|producer|seq|txn`` (also in headers), so reads map
back to what was sent whatever the broker did. A monitor thread runs the user's restart
command (``restart_command``, a shell command, e.g. one that SIGKILLs and restarts the
broker) when the acknowledged fraction crosses ``i / (restarts + 1)``.

When producers are done (or the produce budget, 60% of ``timeout_s``, is spent), a
read_committed consumer reads every partition from the beginning up to its last stable
offset, through the proxy when there is one (faults still on). It first waits until no
transaction is open (last stable offset = high watermark), since an open one would hide
committed data after it. Then :func:`samsa.verify.checker.check` judges the run.
"""

from __future__ import annotations

import contextlib
import logging
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from samsa.client import Admin, Consumer, ConsumerRecord, Producer, RecordMetadata, TopicPartition
from samsa.testing.proxy import FaultProxy, Faults, parse_address
from samsa.verify.checker import CheckResult, History, Outcome, Read, Sent, check

log = logging.getLogger("samsa.verify")

T = TypeVar("T")
MAGIC = b"samsa-verify"
EARLIEST, LATEST = -2, -1


class VerifyError(Exception):
    """The run could not be carried out (broker unreachable, topic not created, ...)."""


@dataclass
class VerifyConfig:
    bootstrap: str
    proxy: bool = False
    producers: int = 3
    records: int = 3000  # in all, split between producers
    partitions: int = 3
    transactions: bool = False
    idempotence: bool = True  # False: a control run, where lost ACKs must show duplicates
    txn_size: int = 10
    abort_rate: float = 0.2
    chunk: int = 50  # records per flush (idempotent mode)
    restart_command: str | None = None
    restarts: int = 1
    restart_timeout_s: float = 60.0
    drop_response_rate: float = 0.05
    reset_rate: float = 0.05
    delay_ms: float = 5.0
    seed: int | None = None
    timeout_s: float = 120.0
    topic: str | None = None
    request_timeout_ms: int = 5_000
    transaction_timeout_ms: int = 10_000

    def validate(self) -> None:
        """Raise ValueError with a message a user can act on."""
        parse_address(self.bootstrap)
        for name in ("producers", "records", "partitions", "txn_size", "chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.restarts < 0:
            raise ValueError(f"restarts must be >= 0, got {self.restarts}")
        for name in ("abort_rate", "drop_response_rate", "reset_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {getattr(self, name)}")
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {self.delay_ms}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.restart_command is not None and not self.restart_command.strip():
            raise ValueError("the restart command is empty")
        if self.transactions and not self.idempotence:
            raise ValueError("transactions need idempotence")
        if self.proxy and max(self.drop_response_rate, self.reset_rate) >= 0.5:
            raise ValueError("fault rates of 0.5 or more leave too few requests through")


@dataclass
class RestartRecord:
    at: float  # seconds since the start of the run
    returncode: int | None  # None: timed out
    seconds: float
    output: str = ""


@dataclass
class VerifyResult:
    config: VerifyConfig
    topic: str
    history: History
    reads: list[Read]
    check: CheckResult
    proxy_stats: dict[str, int] | None
    restarts: list[RestartRecord]
    send_errors: dict[str, int]  # error type -> count
    producer_restarts: int
    produce_complete: bool
    read_complete: bool
    elapsed: float
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.check.ok

    def summary(self) -> dict[str, Any]:
        c = self.check
        out: dict[str, Any] = {
            "topic": self.topic,
            "sent": c.sent,
            "acked": c.acked,
            "acked_without_offset": c.acked_without_offset,
            "must_read": c.must_read,
            "read": c.read,
            "retries": None if self.proxy_stats is None else self.proxy_stats["produce_retries"],
            "faults": None if self.proxy_stats is None else self.proxy_stats["faults"],
            "send_errors": sum(self.send_errors.values()),
            "restarts": len(self.restarts),
            "restart_failures": sum(1 for r in self.restarts if r.returncode != 0),
            "producer_restarts": self.producer_restarts,
            "produce_complete": self.produce_complete,
            "read_complete": self.read_complete,
            "elapsed_s": round(self.elapsed, 1),
        }
        if self.config.transactions:
            out["txns"] = dict(c.txns)
        return out


def encode_value(producer: int, seq: int, txn: int) -> bytes:
    return b"%s|%d|%d|%d" % (MAGIC, producer, seq, txn)


def parse_record(r: ConsumerRecord) -> Read:
    """The record's identity; producer -1 when it is not a verify record."""
    try:
        assert r.value is not None
        magic, producer, seq, txn = r.value.split(b"|")
        if magic != MAGIC:
            raise ValueError(magic)
        return Read(r.partition, r.offset, int(producer), int(seq), int(txn))
    except (AssertionError, ValueError):
        return Read(r.partition, r.offset, -1, -1)


class _Progress:
    """Records resolved so far (acknowledged or failed), shared by the threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.resolved = 0
        self.producers_done = 0

    def add(self, n: int) -> None:
        with self.lock:
            self.resolved += n


class _ProducerRun:
    """One logical producer: its thread, its slice of the history."""

    def __init__(
        self,
        index: int,
        cfg: VerifyConfig,
        topic: str,
        bootstrap: str,
        run_id: str,
        count: int,
        deadline: float,
        progress: _Progress,
        rng: random.Random,
        stop: threading.Event,
    ) -> None:
        self.index = index
        self.cfg = cfg
        self.topic = topic
        self.bootstrap = bootstrap
        self.run_id = run_id
        self.count = count
        self.deadline = deadline
        self.progress = progress
        self.rng = rng
        self.stop = stop
        self.sent: list[Sent] = []
        self.txns: dict[tuple[int, int], Outcome] = {}
        self.errors: dict[str, int] = {}
        self.restarts = 0
        self.complete = False
        self.failure: BaseException | None = None
        self._futures: list[tuple[int, int, Future[RecordMetadata]]] = []

    def config(self) -> dict[str, Any]:
        remaining_ms = max(1000, int((self.deadline - time.monotonic()) * 1000))
        c: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "client.id": f"verify-{self.index}",
            "linger.ms": 2,
            "batch.size": 1200,  # several batches per chunk: several requests in flight
            "request.timeout.ms": self.cfg.request_timeout_ms,
            "retry.backoff.ms": 20,
            "retry.backoff.max.ms": 500,
            "socket.connection.setup.timeout.ms": 3000,
            "delivery.timeout.ms": remaining_ms,
            "max.block.ms": remaining_ms,
        }
        if not self.cfg.idempotence:
            c["enable.idempotence"] = False
        if self.cfg.transactions:
            c["transactional.id"] = f"verify-{self.run_id}-{self.index}"
            c["transaction.timeout.ms"] = self.cfg.transaction_timeout_ms
        return c

    def _error(self, exc: BaseException) -> None:
        name = type(exc).__name__
        code = getattr(exc, "code", None)
        if code is not None:
            name = f"{name}({getattr(exc, 'name', code)})"
        self.errors[name] = self.errors.get(name, 0) + 1

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    def _new_producer(self) -> Producer | None:
        """A producer (transactions initialised); retried while the broker is away."""
        while self._left() > 0 and not self.stop.is_set():
            p: Producer | None = None
            try:
                p = Producer(self.config())
                if self.cfg.transactions:
                    p.init_transactions(max(1.0, self._left()))
                return p
            except Exception as exc:
                self._error(exc)
                if p is not None:
                    with contextlib.suppress(Exception):
                        p.close(1)
                time.sleep(0.2)
        return None

    def _produce(self, p: Producer, seq: int, txn: int) -> None:
        fut = p.send(
            self.topic,
            encode_value(self.index, seq, txn),
            b"p%d-%d" % (self.index, seq),
            headers=[
                ("verify.producer", b"%d" % self.index),
                ("verify.seq", b"%d" % seq),
                ("verify.txn", b"%d" % txn),
            ],
        )
        self._futures.append((seq, txn, fut))

    def run(self) -> None:
        try:
            if self.cfg.transactions:
                self._run_transactional()
            else:
                self._run_idempotent()
        except BaseException as exc:  # reported, never silently lost with the thread
            self.failure = exc
            log.exception("producer %d failed", self.index)
        finally:
            self._collect()
            with self.progress.lock:
                self.progress.producers_done += 1

    def _run_idempotent(self) -> None:
        p = self._new_producer()
        if p is None:
            return
        try:
            seq = 0
            while seq < self.count and self._left() > 0 and not self.stop.is_set():
                n = min(self.cfg.chunk, self.count - seq)
                for s in range(seq, seq + n):
                    self._produce(p, s, -1)
                seq += n
                p.flush(max(0.1, self._left()))
                self.progress.add(n)
            self.complete = seq == self.count
            p.flush(max(0.1, self._left()))
        finally:
            with contextlib.suppress(Exception):
                p.close(max(0.1, min(5.0, self._left())))

    def _run_transactional(self) -> None:
        p = self._new_producer()
        seq = txn = 0
        try:
            while seq < self.count and p is not None and self._left() > 0:
                if self.stop.is_set():
                    break
                n = min(self.cfg.txn_size, self.count - seq)
                intended_abort = self.rng.random() < self.cfg.abort_rate
                outcome, healthy = self._one_transaction(p, seq, n, txn, intended_abort)
                self.txns[(self.index, txn)] = outcome
                seq += n
                txn += 1
                self.progress.add(n)
                if not healthy:
                    with contextlib.suppress(Exception):
                        p.close(1)
                    self.restarts += 1
                    p = self._new_producer()
            self.complete = seq == self.count
        finally:
            if p is not None:
                with contextlib.suppress(Exception):
                    p.close(max(0.1, min(5.0, self._left())))

    def _one_transaction(
        self, p: Any, seq: int, n: int, txn: int, intended_abort: bool
    ) -> tuple[Outcome, bool]:
        """(outcome, whether the producer can go on)."""
        timeout = max(1.0, self._left())
        try:
            p.begin_transaction()
            for s in range(seq, seq + n):
                self._produce(p, s, txn)
        except Exception as exc:
            self._error(exc)
            return self._abort(p, timeout)  # nothing was committed
        if intended_abort:
            # Flush first: the records are then in the log and the abort marker must hide
            # them (aborting right away would mostly drop them unsent, testing nothing).
            p.flush(timeout)
            return self._abort(p, timeout)
        try:
            p.commit_transaction(timeout)
            return Outcome.COMMITTED, True
        except Exception as exc:
            self._error(exc)
            # The commit may have reached the coordinator: whatever the abort below says,
            # the outcome is unknown.
            _, healthy = self._abort(p, timeout)
            return Outcome.UNKNOWN, healthy

    def _abort(self, p: Any, timeout: float) -> tuple[Outcome, bool]:
        # No commit was asked for: the coordinator can only abort this transaction (now or
        # at its timeout), so the outcome is ABORTED even if the call fails.
        try:
            p.abort_transaction(timeout)
            return Outcome.ABORTED, True
        except Exception as exc:
            self._error(exc)
            return Outcome.ABORTED, False

    def _collect(self) -> None:
        for seq, txn, fut in self._futures:
            md: RecordMetadata | None = None
            if fut.done() and fut.exception() is None:
                md = fut.result()
            elif fut.done() and self.txns.get((self.index, txn)) is not Outcome.ABORTED:
                exc = fut.exception()  # records of aborted transactions fail: not news
                assert exc is not None
                self._error(exc)
            if md is not None:
                self.sent.append(Sent(self.index, seq, txn, True, md.partition, md.offset))
            else:
                self.sent.append(Sent(self.index, seq, txn))
        self._futures.clear()


def _restarter(
    cfg: VerifyConfig,
    progress: _Progress,
    total: int,
    started: float,
    done: threading.Event,
    out: list[RestartRecord],
    say: Callable[[str], None],
) -> None:
    assert cfg.restart_command is not None
    points = [total * i / (cfg.restarts + 1) for i in range(1, cfg.restarts + 1)]
    for point in points:
        while progress.resolved < point and not done.is_set():
            time.sleep(0.02)
        if done.is_set():
            return
        say(f"restart at {progress.resolved}/{total} records: {cfg.restart_command}")
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                cfg.restart_command,
                shell=True,
                capture_output=True,
                text=True,
                timeout=cfg.restart_timeout_s,
            )
            code: int | None = proc.returncode
            output = (proc.stdout + proc.stderr).strip()
        except subprocess.TimeoutExpired:
            code, output = None, "timed out"
        out.append(RestartRecord(t0 - started, code, time.monotonic() - t0, output[-500:]))
        if code != 0:
            say(f"restart command failed ({code}): {output[-200:]}")


def _retrying(make: Callable[[], T], deadline: float) -> T:
    """``make()`` retried until the deadline: connecting through the proxy may be reset."""
    while True:
        try:
            return make()
        except Exception as exc:
            if time.monotonic() > deadline:
                raise
            log.debug("retrying: %s", exc)
            time.sleep(0.2)


def _read_all(
    bootstrap: str, topic: str, partitions: int, deadline: float, say: Callable[[str], None]
) -> tuple[list[Read], bool]:
    """Every committed record of the topic, in partition and offset order; and whether
    every partition was read up to its end before the deadline."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    base = {
        "bootstrap.servers": bootstrap,
        "request.timeout.ms": 5_000,
        "socket.connection.setup.timeout.ms": 3_000,
        "auto.offset.reset": "earliest",
        "fetch.max.wait.ms": 200,
    }
    reads: list[Read] = []
    with contextlib.ExitStack() as stack:
        committed = stack.enter_context(
            _retrying(lambda: Consumer({**base, "isolation.level": "read_committed"}), deadline)
        )
        uncommitted = stack.enter_context(_retrying(lambda: Consumer(base), deadline))
        committed.assign(tps)
        uncommitted.assign(tps)
        # Wait for open transactions to end (commit or coordinator timeout): an open one
        # hides everything after its first record from read_committed consumers.
        ends: dict[TopicPartition, int] = {}
        while time.monotonic() < deadline:
            try:
                hw = uncommitted.list_offsets(tps, LATEST)
                ends = committed.list_offsets(tps, LATEST)
            except Exception as exc:
                log.debug("list offsets: %s", exc)
                time.sleep(0.2)
                continue
            if ends == hw:
                break
            time.sleep(0.2)
        else:
            say("open transactions remain: reading up to the last stable offsets")
        remaining = dict(ends)
        while remaining and time.monotonic() < deadline:
            try:
                for r in committed.poll(0.5):
                    reads.append(parse_record(r))
                for tp in list(remaining):
                    if committed.position(tp) >= remaining[tp]:
                        del remaining[tp]
            except Exception as exc:  # faults: the consumer retries from its position
                log.debug("read: %s", exc)
                time.sleep(0.1)
        return reads, bool(ends) and not remaining


def run_verify(cfg: VerifyConfig, say: Callable[[str], None] | None = None) -> VerifyResult:
    """Run the workload and the checker; see the module docstring."""
    cfg.validate()
    out = say or (lambda _msg: None)
    started = time.monotonic()
    produce_deadline = started + cfg.timeout_s * 0.6
    read_deadline = started + cfg.timeout_s
    seed = cfg.seed if cfg.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    run_id = uuid.uuid4().hex[:8]  # not from the seed: names must differ between runs
    topic = cfg.topic or f"verify-{run_id}"
    notes: list[str] = [f"seed {seed}"]

    admin_config = {"bootstrap.servers": cfg.bootstrap, "request.timeout.ms": 10_000}
    try:
        with Admin(admin_config) as admin:
            admin.create_topic(topic, cfg.partitions)
    except Exception as exc:
        raise VerifyError(f"cannot create topic {topic} on {cfg.bootstrap}: {exc}") from exc
    out(f"topic {topic}: {cfg.partitions} partitions")

    proxy: FaultProxy | None = None
    bootstrap = cfg.bootstrap
    if cfg.proxy:
        faults = Faults(
            drop_response_rate=cfg.drop_response_rate,
            reset_rate=cfg.reset_rate,
            delay_ms=cfg.delay_ms,
            grace_requests=1,  # ApiVersions: every connection gets somewhere
        )
        proxy = FaultProxy(cfg.bootstrap, faults=faults, seed=rng.randrange(1 << 30)).start()
        bootstrap = proxy.address
        out(f"proxy {proxy.address} -> {cfg.bootstrap}: {faults}")

    try:
        progress = _Progress()
        stop = threading.Event()
        shares = [cfg.records // cfg.producers] * cfg.producers
        for i in range(cfg.records % cfg.producers):
            shares[i] += 1
        runs = [
            _ProducerRun(
                i,
                cfg,
                topic,
                bootstrap,
                run_id,
                n,
                produce_deadline,
                progress,
                random.Random(rng.randrange(1 << 30)),
                stop,
            )
            for i, n in enumerate(shares)
        ]
        threads = [
            threading.Thread(target=r.run, name=f"verify-producer-{r.index}", daemon=True)
            for r in runs
        ]
        restarts: list[RestartRecord] = []
        all_done = threading.Event()
        monitor: threading.Thread | None = None
        if cfg.restart_command and cfg.restarts:
            monitor = threading.Thread(
                target=_restarter,
                args=(cfg, progress, cfg.records, started, all_done, restarts, out),
                name="verify-restarter",
                daemon=True,
            )
            monitor.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.0, produce_deadline - time.monotonic()) + 15)
        if any(t.is_alive() for t in threads):
            stop.set()
            notes.append("some producers did not stop in time")
        all_done.set()
        if monitor is not None:
            monitor.join(cfg.restart_timeout_s + 5)
        if len(restarts) < cfg.restarts and cfg.restart_command:
            notes.append(f"{len(restarts)} of {cfg.restarts} restarts ran before the end")
        for r in runs:
            if r.failure is not None:
                notes.append(f"producer {r.index} stopped: {r.failure!r}")
        out(f"produced: {progress.resolved} of {cfg.records} records resolved")

        try:
            reads, read_complete = _read_all(bootstrap, topic, cfg.partitions, read_deadline, out)
        except Exception as exc:
            raise VerifyError(f"cannot read {topic} back from {bootstrap}: {exc}") from exc
        if not read_complete:
            notes.append("reading did not reach the end of every partition in time")
        history = History()
        send_errors: dict[str, int] = {}
        for r in runs:
            history.sent.extend(r.sent)
            history.txns.update(r.txns)
            for k, v in r.errors.items():
                send_errors[k] = send_errors.get(k, 0) + v
        result = check(history, reads)
    finally:
        if proxy is not None:
            proxy.stop()
    return VerifyResult(
        config=cfg,
        topic=topic,
        history=history,
        reads=reads,
        check=result,
        proxy_stats=proxy.stats.as_dict() if proxy is not None else None,
        restarts=restarts,
        send_errors=send_errors,
        producer_restarts=sum(r.restarts for r in runs),
        produce_complete=all(r.complete for r in runs),
        read_complete=read_complete,
        elapsed=time.monotonic() - started,
        notes=notes,
    )
