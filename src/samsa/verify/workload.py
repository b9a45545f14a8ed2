"""The verify workload: Jepsen's queue-over-list-append shape, under faults, into a history.

Theory of operation
-------------------
:func:`run_verify` creates a fresh topic (directly on the bootstrap broker: setup is not under
test) whose partitions are the keys, optionally starts a
:class:`~samsa.testing.proxy.FaultProxy` in front of the broker, and spawns ``processes``
client processes (:mod:`samsa.verify._worker`, real OS processes, ``multiprocessing``'s
spawn context). Each owns a producer and a read_committed consumer (assigned every
partition, or subscribed in one group with ``subscribe``) and, at its share of the overall
``rate``, issues operations of 1-4 micro-operations (transactions; 1 without
``transactions``): ``send`` of a value unique in the run to a random key, or ``poll``. Each
worker streams an operation's invocation and completion over its pipe; the parent records
the completed ones (:mod:`samsa.verify.history`) with process, start and end time (seconds
since a wall-clock epoch the parent hands every worker) and outcome:

* a send is ``ok`` when acknowledged (with its offset), else ``info``: the broker may have
  written it. A poll is ``ok``; in subscribe mode its offsets are then committed (a failed
  commit makes it ``info``).
* a transaction is ``ok`` when its commit returned, ``fail`` when it was aborted (on purpose,
  ``abort_rate``, after flushing its sends, or after an error before the commit), ``info``
  when the commit failed. In subscribe mode the consumer's positions go into the transaction.
  A producer that cannot go on is replaced (same transactional id: the new one fences it).

With ``crash_interval`` the nemesis SIGKILLs a worker now and then (mean seconds between
crashes of one process), preferably while an operation is in flight; that operation is
recorded ``info`` (its outcome is unknown) and a ``crash`` op marks the kill. A new process
takes the slot with a new process id (id + ``processes``, as Jepsen numbers them) and fresh
clients (the same transactional id, so the broker fences the dead one's epoch). Faults (each
recorded as a window): the proxy's lost responses, resets and delays, switched on in
alternate windows of ``fault_window_s``; ``restarts`` runs of ``restart_command`` (e.g.
SIGKILL the broker and start it again; it returns once the broker is back); ``pauses``
SIGSTOP/SIGCONT of the broker (``pause_target``: a pid, or a shell command printing it) for
``pause_s`` each. Faults stop at ``time_limit``; the workers finish their operation in flight,
the end of every partition is fetched (last stable offsets, once open transactions are
resolved), and every live worker polls from where it is until it has read each partition to
that end (Jepsen's final reads; a group member reads by assign, from the beginning), within
``final_timeout_s``. Those polls are ordinary operations of the history, so the checker's
unseen and lost rules judge each process's final view. :func:`samsa.verify.checker.check`
then judges it all. Every process started is reaped before :func:`run_verify` returns, and
workers die with the parent however it ends.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from samsa.client import Admin, Consumer, TopicPartition
from samsa.protocol.constants import LATEST
from samsa.testing.proxy import FaultProxy, Faults, parse_address
from samsa.verify import _worker
from samsa.verify.checker import CheckResult, check
from samsa.verify.history import FAIL, INFO, OK, Fault, History, Op

log = logging.getLogger("samsa.verify")

Say = Callable[[str], None]
# Spawn, not fork: the parent runs threads (and the proxy's event loop) that a fork would copy
# in whatever state they were.
_MP = multiprocessing.get_context("spawn")
_START_TIMEOUT_S = 60.0  # a worker's interpreter start and imports, on a loaded machine


class VerifyError(Exception):
    """The run could not be carried out (broker unreachable, topic not created, ...)."""


@dataclass
class VerifyConfig:
    bootstrap: str
    processes: int = 4
    keys: int = 4  # partitions of the topic
    rate: float = 40.0  # operations per second, all processes together
    time_limit: float = 30.0  # seconds of operations (the final reads come after)
    transactions: bool = False
    subscribe: bool = False  # consumers in one group instead of assigned every partition
    idempotence: bool = True  # False: a control run, where lost ACKs must show duplicates
    abort_rate: float = 0.1  # transactions aborted on purpose
    crash_interval: float | None = None  # mean seconds between crashes of one process
    proxy: bool = False
    drop_response_rate: float = 0.05
    reset_rate: float = 0.05
    delay_ms: float = 5.0
    replay_rate: float = 0.0  # proxy lies: see samsa.testing.proxy
    fake_ack_rate: float = 0.0
    fault_window_s: float = 5.0  # proxy faults on in alternate windows this long
    restart_command: str | None = None
    restarts: int = 0
    restart_timeout_s: float = 60.0
    pause_target: str | None = None  # a pid, or a shell command printing one
    pauses: int = 0
    pause_s: float = 3.0
    strict: bool = False
    seed: int | None = None
    topic: str | None = None
    request_timeout_ms: int = 5_000
    transaction_timeout_ms: int = 10_000
    # A SIGKILLed group member holds up the group's rebalances until its session expires:
    # the broker's default minimum (group.min.session.timeout.ms), not Kafka's 45 s.
    session_timeout_ms: int = 6_000
    final_timeout_s: float = 60.0
    progress_s: float = 5.0

    def validate(self) -> None:
        """Raise ValueError with a message a user can act on."""
        parse_address(self.bootstrap)
        for name in ("processes", "keys"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("rate", "time_limit", "fault_window_s", "pause_s", "final_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.session_timeout_ms < 1:
            raise ValueError(f"session_timeout_ms must be >= 1, got {self.session_timeout_ms}")
        for name in ("restarts", "pauses"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in (
            "abort_rate",
            "drop_response_rate",
            "reset_rate",
            "replay_rate",
            "fake_ack_rate",
        ):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {getattr(self, name)}")
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {self.delay_ms}")
        if self.crash_interval is not None and not self.crash_interval > 0:
            raise ValueError(f"crash_interval must be > 0, got {self.crash_interval}")
        if self.restarts and not (self.restart_command or "").strip():
            raise ValueError("restarts need a restart command")
        if self.pauses and not (self.pause_target or "").strip():
            raise ValueError("pauses need a broker pid or a command printing it")
        if self.transactions and not self.idempotence:
            raise ValueError("transactions need idempotence")
        if self.proxy and max(self.drop_response_rate, self.reset_rate) >= 0.5:
            raise ValueError("fault rates of 0.5 or more leave too few requests through")
        if not self.proxy and (self.replay_rate or self.fake_ack_rate):
            raise ValueError("replay and fake-ack faults need the proxy")


@dataclass
class VerifyResult:
    config: VerifyConfig
    topic: str
    seed: int
    history: History
    check: CheckResult
    proxy_stats: dict[str, int] | None
    final_complete: bool
    elapsed: float
    client_errors: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    workers: list[WorkerInfo] = field(default_factory=list)  # every process started
    final_ends: dict[int, int] = field(default_factory=dict)  # key -> end the final reads met

    @property
    def ok(self) -> bool:
        return self.check.ok

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for fl in self.history.faults:
            kinds[fl.kind] = kinds.get(fl.kind, 0) + 1
        return {
            "valid": self.ok,
            "topic": self.topic,
            "seed": self.seed,
            "mode": ("transactions" if self.config.transactions else "idempotent")
            + (", subscribe" if self.config.subscribe else ", assign"),
            **self.check.stats,
            "crashes": sum(1 for o in self.history.ops if o.f == "crash"),
            "client_processes": len(self.workers),
            "final_readers": sum(1 for w in self.workers if w.final),
            "fault_windows": kinds,
            "proxy": self.proxy_stats,
            "final_reads_complete": self.final_complete,
            "client_errors": self.client_errors,
            "elapsed_s": round(self.elapsed, 1),
        }


class _Recorder:
    """The history under construction, fed by every worker's reader thread."""

    def __init__(self) -> None:
        self.epoch = time.time()  # the workers' common time base
        self.started = time.monotonic()  # for the fault schedule
        self.lock = threading.Lock()
        self.history = History()
        self._index = itertools.count()
        self.errors: dict[str, int] = {}

    def now(self) -> float:
        return time.time() - self.epoch

    def op(self, op: Op) -> None:
        with self.lock:
            op.index = next(self._index)
            self.history.ops.append(op)

    def fault(self, fault: Fault) -> None:
        with self.lock:
            self.history.faults.append(fault)

    def error(self, name: str) -> None:
        with self.lock:
            self.errors[name] = self.errors.get(name, 0) + 1

    def snapshot(self) -> History:
        with self.lock:
            return History(list(self.history.ops), list(self.history.faults))


@dataclass
class WorkerInfo:
    """What became of one client process (for the result and for tests)."""

    process: int
    slot: int
    pid: int | None
    end: str = "running"  # exited | killed (the nemesis's SIGKILL) | reaped (run ended it)
    exitcode: int | None = None
    final: bool | None = None  # its final reads reached every partition's end
    positions: dict[int, int] = field(default_factory=dict)


class _Worker:
    """The parent's handle on one client process: its pipe and the operation it has in flight."""

    def __init__(self, ctx: _Context, slot: int, process: int) -> None:
        self.ctx = ctx
        self.info = WorkerInfo(process, slot, None)
        self.pending: Op | None = None
        self.ready = threading.Event()
        self.stopped = threading.Event()
        self.finished = threading.Event()
        self.gone = threading.Event()
        self._send_lock = threading.Lock()
        cfg = ctx.cfg
        spec = {
            "slot": slot,
            "process": process,
            "seed": ctx.rng.randrange(1 << 30),
            "topic": ctx.topic,
            "bootstrap": ctx.bootstrap,
            "run_id": ctx.run_id,
            "keys": cfg.keys,
            "interval": cfg.processes / cfg.rate,
            "transactions": cfg.transactions,
            "subscribe": cfg.subscribe,
            "idempotence": cfg.idempotence,
            "abort_rate": cfg.abort_rate,
            "request_timeout_ms": cfg.request_timeout_ms,
            "transaction_timeout_ms": cfg.transaction_timeout_ms,
            "session_timeout_ms": cfg.session_timeout_ms,
        }
        self.conn, child = _MP.Pipe()
        self.proc = _MP.Process(
            target=_worker.main, args=(spec, child), name=f"verify-{process}", daemon=True
        )
        self.proc.start()
        child.close()  # the worker's death is then end-of-file here
        self.info.pid = self.proc.pid
        self._reader = threading.Thread(target=self._read, name=f"verify-{process}", daemon=True)
        self._reader.start()

    @property
    def process(self) -> int:
        return self.info.process

    def send(self, msg: tuple[Any, ...]) -> bool:
        with self._send_lock:
            try:
                self.conn.send(msg)
                return True
            except OSError:
                return False

    def _read(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                kind = msg[0]
                if kind == "invoke":
                    self.pending = Op.from_json(msg[1])
                elif kind == "complete":
                    self.pending = None
                    self.ctx.rec.op(Op.from_json(msg[1]))
                elif kind == "error":
                    self.ctx.rec.error(msg[1])
                elif kind == "ready":
                    self.ready.set()
                elif kind == "stopped":
                    self.stopped.set()
                elif kind == "final":
                    self.info.final, self.info.positions = msg[1], msg[2]
                    self.finished.set()
                elif kind == "failed":
                    self.ctx.failures.append(msg[1])
        except (EOFError, OSError, ValueError, TypeError, IndexError, KeyError):
            pass  # the process ended (or died while writing): nothing more comes
        finally:
            op, self.pending = self.pending, None
            if op is not None:  # in flight when the process died: its outcome is unknown
                op.type, op.end = INFO, self.ctx.rec.now()
                op.error = "process killed" if self.info.end == "killed" else "process ended"
                self.ctx.rec.op(op)
            for ev in (self.ready, self.stopped, self.finished, self.gone):
                ev.set()

    def alive(self) -> bool:
        return not self.gone.is_set() and self.proc.is_alive()

    def kill(self, end: str) -> None:
        """SIGKILL (if still running), reap, and wait until the pipe's last word is recorded."""
        if self.proc.exitcode is None:
            self.info.end = end
            with contextlib.suppress(OSError):
                os.kill(self.proc.pid or 0, signal.SIGKILL)
        self.reap()

    def reap(self, timeout: float = 10.0) -> None:
        self.proc.join(timeout)
        if self.proc.exitcode is None:  # still there: no process survives the run
            with contextlib.suppress(OSError):
                os.kill(self.proc.pid or 0, signal.SIGKILL)
            self.proc.join(timeout)
            self.info.end = "reaped"
        if self.info.end == "running":
            self.info.end = "exited"
        self.info.exitcode = self.proc.exitcode
        self.conn.close()  # wakes the reader if the process left a grandchild holding the pipe
        self._reader.join(timeout)


@dataclass
class _Context:
    cfg: VerifyConfig
    topic: str
    bootstrap: str
    run_id: str
    rec: _Recorder
    rng: random.Random
    say: Say
    workers: list[_Worker] = field(default_factory=list)  # the live one of each slot
    every: list[_Worker] = field(default_factory=list)  # all ever started
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    final_ends: dict[int, int] = field(default_factory=dict)

    def spawn(self, slot: int, process: int) -> _Worker:
        with self.lock:
            w = _Worker(self, slot, process)
            self.every.append(w)
            return w

    def go(self, workers: list[_Worker]) -> list[_Worker]:
        """Wait until each has started; let the ready ones go; the others are reaped."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        out = []
        for w in workers:
            w.ready.wait(max(0.0, deadline - time.monotonic()))
            if w.alive() and w.send(("go", self.rec.epoch)):
                out.append(w)
            else:
                self.failures.append(f"process {w.process} did not start")
                w.kill("reaped")
        return out

    def crash(self, slot: int) -> None:
        """Jepsen's client crash: SIGKILL the slot's process, preferably mid-operation."""
        w = self.workers[slot]
        deadline = time.monotonic() + 1.0
        while w.pending is None and time.monotonic() < deadline and w.alive():
            time.sleep(0.005)
        t = self.rec.now()
        w.kill("killed")
        self.rec.op(Op(0, w.process, "crash", INFO, t, self.rec.now(), error="SIGKILL"))
        self.say(f"crash: process {w.process} (pid {w.info.pid}) killed")
        successor = self.spawn(slot, w.process + self.cfg.processes)
        started = self.go([successor])
        if started:
            self.workers[slot] = started[0]


def _pid(target: str) -> int:
    if target.strip().isdigit():
        return int(target)
    out = subprocess.run(target, shell=True, capture_output=True, text=True, timeout=30)
    words = out.stdout.split()
    if out.returncode != 0 or not words or not words[0].isdigit():
        raise VerifyError(f"pause target {target!r} printed no pid: {out.stdout}{out.stderr}")
    return int(words[0])


def _nemesis(cfg: VerifyConfig, ctx: _Context, done: threading.Event, say: Say) -> None:
    """Broker kills and pauses at even intervals through the run, one at a time."""
    events = [((i + 1) / (cfg.restarts + 1), "kill") for i in range(cfg.restarts)]
    events += [((i + 0.5) / (cfg.pauses + 0.5), "pause") for i in range(cfg.pauses)]
    for at, kind in sorted(events):
        if done.wait(max(0.0, ctx.rec.started + at * cfg.time_limit - time.monotonic())):
            return
        t0 = ctx.rec.now()
        if kind == "kill":
            assert cfg.restart_command is not None
            say(f"fault: restart ({cfg.restart_command})")
            try:
                proc = subprocess.run(
                    cfg.restart_command,
                    shell=True,
                    capture_output=True,
                    text=True,
                    timeout=cfg.restart_timeout_s,
                )
                detail = f"exit {proc.returncode}" + (
                    f": {(proc.stdout + proc.stderr).strip()[-200:]}" if proc.returncode else ""
                )
            except subprocess.TimeoutExpired:
                detail = "timed out"
            ctx.rec.fault(Fault("kill", t0, ctx.rec.now(), detail))
            if detail != "exit 0":
                say(f"restart command failed: {detail}")
        else:
            assert cfg.pause_target is not None
            try:
                pid = _pid(cfg.pause_target)
                say(f"fault: pause broker pid {pid} for {cfg.pause_s}s")
                os.kill(pid, signal.SIGSTOP)
                try:
                    done.wait(cfg.pause_s)
                finally:
                    os.kill(pid, signal.SIGCONT)
                ctx.rec.fault(Fault("pause", t0, ctx.rec.now(), f"pid {pid}"))
            except (OSError, VerifyError, subprocess.SubprocessError) as exc:
                say(f"pause failed: {exc}")
                ctx.rec.fault(Fault("pause", t0, ctx.rec.now(), f"failed: {exc}"))


def _proxy_windows(
    cfg: VerifyConfig, proxy: FaultProxy, ctx: _Context, done: threading.Event
) -> None:
    """Proxy faults on in alternate windows, starting after the first quiet one."""
    on = False
    t0 = 0.0
    try:
        while not done.wait(cfg.fault_window_s):
            on = not on
            if on:
                t0 = ctx.rec.now()
                proxy.set_faults(
                    drop_response_rate=cfg.drop_response_rate,
                    reset_rate=cfg.reset_rate,
                    delay_ms=cfg.delay_ms,
                    replay_rate=cfg.replay_rate,
                    fake_ack_rate=cfg.fake_ack_rate,
                )
            else:
                proxy.set_faults(delay_ms=0)
                ctx.rec.fault(Fault("proxy", t0, ctx.rec.now(), str(proxy.faults)))
    finally:
        proxy.set_faults(delay_ms=0)
        if on:
            ctx.rec.fault(Fault("proxy", t0, ctx.rec.now(), str(proxy.faults)))


def _progress(
    cfg: VerifyConfig, ctx: _Context, proxy: FaultProxy | None, done: threading.Event, say: Say
) -> None:
    while not done.wait(cfg.progress_s):
        h = ctx.rec.snapshot()
        r = check(h, final=False, subscribe=cfg.subscribe, strict=cfg.strict, cycles=False)
        types: dict[str, int] = {}
        for o in h.client_ops():
            types[o.type] = types.get(o.type, 0) + 1
        faults = len([f for f in h.faults if f.kind != "proxy"])
        faults += proxy.stats.faults if proxy is not None else 0
        bad = {k: v for k, v in r.counts.items() if k not in r.allowed}
        say(
            f"{ctx.rec.now():5.1f}s ops {sum(types.values())} "
            f"(ok {types.get(OK, 0)}, fail {types.get(FAIL, 0)}, info {types.get(INFO, 0)}); "
            f"faults {faults}; anomalies so far: "
            + (", ".join(f"{k} {v}" for k, v in bad.items()) or "none")
        )


def _crasher(cfg: VerifyConfig, ctx: _Context, done: threading.Event) -> None:
    """Client crashes: each process is killed every ``crash_interval`` seconds on average."""
    assert cfg.crash_interval is not None
    rng = random.Random(ctx.rng.randrange(1 << 30))
    while not done.wait(rng.expovariate(cfg.processes / cfg.crash_interval)):
        ctx.crash(rng.randrange(cfg.processes))


def _final_ends(cfg: VerifyConfig, topic: str, deadline: float, say: Say) -> dict[int, int] | None:
    """Every partition's end for read_committed readers, once open transactions resolved."""
    tps = [TopicPartition(topic, k) for k in range(cfg.keys)]
    base = {
        "bootstrap.servers": cfg.bootstrap,  # directly: the faults are over, this is setup
        "request.timeout.ms": 5_000,
        "socket.connection.setup.timeout.ms": 3_000,
    }
    while time.monotonic() < deadline:
        try:
            with (
                Consumer({**base, "isolation.level": "read_committed"}) as stable,
                Consumer(base) as raw,
            ):
                # A crashed client's open transaction hides what follows it until its
                # successor fences it (or it times out): wait for the LSO to reach the HW.
                ends = stable.list_offsets(tps, LATEST)
                while ends != raw.list_offsets(tps, LATEST):
                    if time.monotonic() > deadline - cfg.final_timeout_s / 2:
                        say("open transactions remain: reading up to the last stable offsets")
                        break
                    time.sleep(0.5)
                    ends = stable.list_offsets(tps, LATEST)
                return {tp.partition: off for tp, off in ends.items()}
        except Exception as exc:
            log.debug("final ends: %s", exc)
            time.sleep(0.5)
    return None


def _final_reads(cfg: VerifyConfig, ctx: _Context, notes: list[str]) -> bool:
    """Every live worker stops, then polls until it has read every partition to its end."""
    deadline = time.monotonic() + cfg.final_timeout_s
    live = [w for w in ctx.workers if w.alive()]
    for w in live:
        w.send(("stop",))
    for w in live:
        # An operation in flight may take its clients' timeouts (a commit: 15 s and more).
        if not w.stopped.wait(60) or not w.alive():
            notes.append(f"process {w.process} did not stop in time: killed")
            w.kill("reaped")
    live = [w for w in live if w.alive()]
    ends = _final_ends(cfg, ctx.topic, deadline, ctx.say)
    if ends is None or not live:
        notes.append("no end offsets to read to" if ends is None else "no live process left")
        return False
    ctx.say(f"final reads by processes {[w.process for w in live]} up to {ends}")
    for w in live:
        w.send(("final", ends, max(1.0, deadline - time.monotonic())))
    complete = True
    for w in live:
        w.finished.wait(max(0.0, deadline - time.monotonic()) + 10)
        if not w.info.final:
            complete = False
            notes.append(
                f"process {w.process}'s final reads did not reach every partition's end in "
                f"time (positions {w.info.positions}, ends {ends})"
            )
    ctx.final_ends = ends
    return complete


def run_verify(cfg: VerifyConfig, say: Say | None = None) -> VerifyResult:
    """Run the workload and the checker; see the module docstring."""
    cfg.validate()
    out: Say = say or (lambda _msg: None)
    seed = cfg.seed if cfg.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    run_id = uuid.uuid4().hex[:8]  # not from the seed: names must differ between runs
    topic = cfg.topic or f"verify-{run_id}"
    notes = [f"seed {seed}"]
    try:
        with Admin({"bootstrap.servers": cfg.bootstrap, "request.timeout.ms": 10_000}) as admin:
            admin.create_topic(topic, cfg.keys)
    except Exception as exc:
        raise VerifyError(f"cannot create topic {topic} on {cfg.bootstrap}: {exc}") from exc
    out(f"topic {topic}: {cfg.keys} partitions (keys); seed {seed}")

    proxy: FaultProxy | None = None
    bootstrap = cfg.bootstrap
    if cfg.proxy:
        # ApiVersions passes: every connection gets somewhere. Faults start with a window.
        faults = Faults(grace_requests=1)
        # One bootstrap broker is enough: the proxy puts a listener in front of every broker
        # that Metadata names (a cluster's bootstrap list has several).
        upstream = cfg.bootstrap.split(",")[0].strip()
        proxy = FaultProxy(upstream, faults=faults, seed=rng.randrange(1 << 30)).start()
        bootstrap = proxy.address
        out(f"proxy {proxy.address} -> {cfg.bootstrap}")

    ctx = _Context(cfg, topic, bootstrap, run_id, _Recorder(), rng, out)
    done = threading.Event()
    final_complete = False
    try:
        starting = [ctx.spawn(i, i) for i in range(cfg.processes)]
        for w in starting:
            w.ready.wait(_START_TIMEOUT_S)
        ctx.rec = _Recorder()  # time 0 once every interpreter is up, not while they start
        ctx.workers = ctx.go(starting)
        if len(ctx.workers) < cfg.processes:
            raise VerifyError("client processes did not start: " + "; ".join(ctx.failures))
        out(f"{cfg.processes} client processes: pids {[w.info.pid for w in ctx.workers]}")
        helpers = [threading.Thread(target=_nemesis, args=(cfg, ctx, done, out), daemon=True)]
        if proxy is not None:
            helpers.append(
                threading.Thread(target=_proxy_windows, args=(cfg, proxy, ctx, done), daemon=True)
            )
        if cfg.crash_interval:
            helpers.append(threading.Thread(target=_crasher, args=(cfg, ctx, done), daemon=True))
        helpers.append(
            threading.Thread(target=_progress, args=(cfg, ctx, proxy, done, out), daemon=True)
        )
        for t in helpers:
            t.start()
        time.sleep(cfg.time_limit)
        done.set()  # faults end (a running restart command or crash is waited for)
        for t in helpers:
            t.join(cfg.restart_timeout_s + cfg.pause_s + _START_TIMEOUT_S)
        out("operations done; final reads by every process")
        final_complete = _final_reads(cfg, ctx, notes)
    finally:
        done.set()
        for w in ctx.every:
            w.send(("exit",))
        for w in ctx.every:
            w.reap(5.0)
        if proxy is not None:
            proxy.stop()
    notes.extend(ctx.failures)
    history = ctx.rec.snapshot()
    result = check(history, final=final_complete, subscribe=cfg.subscribe, strict=cfg.strict)
    return VerifyResult(
        config=cfg,
        topic=topic,
        seed=seed,
        history=history,
        check=result,
        proxy_stats=proxy.stats.as_dict() if proxy is not None else None,
        final_complete=final_complete,
        elapsed=time.monotonic() - ctx.rec.started,
        client_errors=dict(ctx.rec.errors),
        notes=notes,
        workers=[w.info for w in ctx.every],
        final_ends=ctx.final_ends,
    )
