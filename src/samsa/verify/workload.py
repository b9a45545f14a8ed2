"""The verify workload: Jepsen's queue-over-list-append shape, under faults, into a history.

Theory of operation
-------------------
:func:`run_verify` creates a fresh topic (directly on the bootstrap broker: setup is not under
test) whose partitions are the keys, optionally starts a
:class:`~samsa.testing.proxy.FaultProxy` in front of the broker, and runs ``processes``
client threads. Each owns a producer and a read_committed consumer (assigned every partition,
or subscribed in one group with ``subscribe``) and, at a fixed overall ``rate``, issues
operations of 1-4 micro-operations (transactions; 1 without ``transactions``): ``send`` of a
value unique in the run to a random key, or ``poll``. Each operation is recorded
(:mod:`samsa.verify.history`) with its process, start and end time and its outcome:

* a send is ``ok`` when acknowledged (with its offset), else ``info``: the broker may have
  written it. A poll is ``ok``; in subscribe mode its offsets are then committed (a failed
  commit makes it ``info``).
* a transaction is ``ok`` when its commit returned, ``fail`` when it was aborted (on purpose,
  ``abort_rate``, after flushing its sends, or after an error before the commit), ``info``
  when the commit failed. In subscribe mode the consumer's positions go into the transaction.
  A producer that cannot go on is replaced (same transactional id: the new one fences it).

With ``crash_interval`` a process now and then "crashes": its clients are closed without
committing anything and it comes back as a new process (id + ``processes``) with fresh
clients. Faults (each recorded as a window): the proxy's lost responses, resets and delays,
switched on in alternate windows of ``fault_window_s``; ``restarts`` runs of
``restart_command`` (e.g. SIGKILL the broker and start it again; it returns once the broker is
back); ``pauses`` SIGSTOP/SIGCONT of the broker (``pause_target``: a pid, or a shell command
printing it) for ``pause_s`` each. Faults stop at ``time_limit``; the processes stop, and a
final reader (a fresh process, assigned every partition from the beginning) reads each
partition to its last stable offset. :func:`samsa.verify.checker.check` then judges it all.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
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

from samsa.client import Admin, Consumer, ConsumerRecord, Producer, TopicPartition
from samsa.testing.proxy import FaultProxy, Faults, parse_address
from samsa.verify.checker import CheckResult, check
from samsa.verify.history import FAIL, INFO, OK, Fault, History, Op

log = logging.getLogger("samsa.verify")

LATEST = -1
Say = Callable[[str], None]


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
            "fault_windows": kinds,
            "proxy": self.proxy_stats,
            "final_reads_complete": self.final_complete,
            "client_errors": self.client_errors,
            "elapsed_s": round(self.elapsed, 1),
        }


class _Recorder:
    """The history under construction, shared by every thread."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.lock = threading.Lock()
        self.history = History()
        self._index = itertools.count()
        self._values = itertools.count(1)
        self.errors: dict[str, int] = {}

    def now(self) -> float:
        return time.monotonic() - self.started

    def value(self) -> int:
        with self.lock:
            return next(self._values)

    def op(self, op: Op) -> None:
        with self.lock:
            op.index = next(self._index)
            self.history.ops.append(op)

    def fault(self, fault: Fault) -> None:
        with self.lock:
            self.history.faults.append(fault)

    def error(self, exc: BaseException) -> str:
        name = type(exc).__name__
        code = getattr(exc, "name", None) or getattr(exc, "code", None)
        if code is not None:
            name = f"{name}({code})"
        with self.lock:
            self.errors[name] = self.errors.get(name, 0) + 1
        return name

    def snapshot(self) -> History:
        with self.lock:
            return History(list(self.history.ops), list(self.history.faults))


def _polled(records: list[ConsumerRecord]) -> dict[int, list[list[int]]]:
    out: dict[int, list[list[int]]] = {}
    for r in records:
        try:
            v = int(r.value or b"")
        except ValueError:
            v = -1  # not ours: the checker reports it as a value nobody sent
        out.setdefault(r.partition, []).append([r.offset, v])
    return out


class _Client:
    """One client process: a producer and a consumer, issuing operations until stopped."""

    def __init__(self, slot: int, cfg: VerifyConfig, ctx: _Context, rng: random.Random) -> None:
        self.slot = slot
        self.process = slot
        self.cfg = cfg
        self.ctx = ctx
        self.rng = rng
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None

    # --- clients -------------------------------------------------------------------------

    def _producer_config(self) -> dict[str, Any]:
        c: dict[str, Any] = {
            "bootstrap.servers": self.ctx.bootstrap,
            "client.id": f"verify-{self.slot}",
            "linger.ms": 0,
            "request.timeout.ms": self.cfg.request_timeout_ms,
            "retry.backoff.ms": 20,
            "retry.backoff.max.ms": 500,
            "socket.connection.setup.timeout.ms": 3000,
            "delivery.timeout.ms": 15_000,
            "max.block.ms": 15_000,
        }
        if not self.cfg.idempotence:
            c["enable.idempotence"] = False
        if self.cfg.transactions:
            c["transactional.id"] = f"verify-{self.ctx.run_id}-{self.slot}"
            c["transaction.timeout.ms"] = self.cfg.transaction_timeout_ms
        return c

    def _consumer_config(self) -> dict[str, Any]:
        c: dict[str, Any] = {
            "bootstrap.servers": self.ctx.bootstrap,
            "client.id": f"verify-{self.slot}-consumer",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.max.wait.ms": 100,
            "request.timeout.ms": self.cfg.request_timeout_ms,
            "socket.connection.setup.timeout.ms": 3000,
        }
        if self.cfg.subscribe:
            c["group.id"] = f"verify-{self.ctx.run_id}"
            c["session.timeout.ms"] = 10_000
            c["heartbeat.interval.ms"] = 1_000
        return c

    def _ensure_clients(self) -> bool:
        try:
            if self.producer is None:
                p = Producer(self._producer_config())
                try:
                    if self.cfg.transactions:
                        p.init_transactions(15)
                except BaseException:
                    with contextlib.suppress(Exception):
                        p.close(0)
                    raise
                self.producer = p
            if self.consumer is None:
                c = Consumer(self._consumer_config())
                if self.cfg.subscribe:
                    c.subscribe([self.ctx.topic])
                else:
                    c.assign([TopicPartition(self.ctx.topic, k) for k in range(self.cfg.keys)])
                self.consumer = c
            return True
        except Exception as exc:
            self.ctx.rec.error(exc)
            return False

    def _drop_producer(self) -> None:
        if self.producer is not None:
            with contextlib.suppress(Exception):
                self.producer.close(0)
            self.producer = None

    def close(self) -> None:
        self._drop_producer()
        if self.consumer is not None:
            with contextlib.suppress(Exception):
                self.consumer.close()
            self.consumer = None

    # --- the loop ------------------------------------------------------------------------

    def run(self) -> None:
        interval = self.cfg.processes / self.cfg.rate
        due = time.monotonic() + self.rng.uniform(0, interval)
        try:
            while not self.ctx.stop.is_set():
                wait = due - time.monotonic()
                if wait > 0 and self.ctx.stop.wait(wait):
                    break
                due = max(due + interval, time.monotonic() - interval)
                if (
                    self.cfg.crash_interval
                    and self.rng.random() < interval / self.cfg.crash_interval
                ):
                    self._crash()
                    continue
                if not self._ensure_clients():
                    self.ctx.stop.wait(0.2)
                    continue
                self._one_op()
        except BaseException as exc:  # reported, never silently lost with the thread
            log.exception("verify process %d failed", self.process)
            self.ctx.failures.append(f"process {self.process}: {exc!r}")
        finally:
            self.close()

    def _crash(self) -> None:
        t = self.ctx.rec.now()
        self.close()
        self.ctx.rec.op(Op(0, self.process, "crash", INFO, t, self.ctx.rec.now()))
        self.process += self.cfg.processes

    def _mops(self) -> list[list[Any]]:
        n = self.rng.randint(1, 4) if self.cfg.transactions else 1
        out: list[list[Any]] = []
        for _ in range(n):
            if self.rng.random() < 0.5:
                out.append(["send", self.rng.randrange(self.cfg.keys), self.ctx.rec.value(), None])
            else:
                out.append(["poll", {}])
        return out

    def _poll(self) -> tuple[dict[int, list[list[int]]], set[int]]:
        """One consumer poll, and the keys whose assignment changed meanwhile."""
        c = self.consumer
        assert c is not None
        before = self._membership()
        records = c.poll(0.1)
        after = self._membership()
        moved: set[int] = set()
        if before != after:
            moved = {tp.partition for tp in before[1] ^ after[1]}
            if before[0] != after[0]:  # a new generation: positions may all have moved
                moved |= {tp.partition for tp in before[1] | after[1]}
        return _polled(records), moved

    def _membership(self) -> tuple[int, frozenset[TopicPartition]]:
        c = self.consumer
        assert c is not None
        if not self.cfg.subscribe:
            return -1, frozenset()
        return c.group_metadata().generation_id, frozenset(c.assignment())

    def _one_op(self) -> None:
        mops = self._mops()
        start = self.ctx.rec.now()
        if self.cfg.transactions:
            kind, error, moved = self._txn(mops)
            f = "txn"
        else:
            kind, error, moved = self._single(mops[0])
            f = mops[0][0]
        self.ctx.rec.op(
            Op(0, self.process, f, kind, start, self.ctx.rec.now(), mops, error, sorted(moved))
        )

    def _single(self, mop: list[Any]) -> tuple[str, str | None, set[int]]:
        p, c = self.producer, self.consumer
        assert p is not None and c is not None
        if mop[0] == "send":
            try:
                fut = p.send(self.ctx.topic, b"%d" % mop[2], partition=mop[1])
                md = fut.result(30)
                mop[3] = md.offset
                return OK, None, set()
            except Exception as exc:
                return INFO, self.ctx.rec.error(exc), set()
        try:
            mop[1], moved = self._poll()
        except Exception as exc:
            return FAIL, self.ctx.rec.error(exc), set()
        if self.cfg.subscribe and mop[1]:
            try:
                c.commit()
            except Exception as exc:
                return INFO, self.ctx.rec.error(exc), moved
        return OK, None, moved

    def _txn(self, mops: list[list[Any]]) -> tuple[str, str | None, set[int]]:
        p, c = self.producer, self.consumer
        assert p is not None and c is not None
        futures = []
        moved: set[int] = set()
        try:
            p.begin_transaction()
            for m in mops:
                if m[0] == "send":
                    futures.append((m, p.send(self.ctx.topic, b"%d" % m[2], partition=m[1])))
                else:
                    m[1], more = self._poll()
                    moved |= more
            if self.rng.random() < self.cfg.abort_rate:
                # Flushed first, so that the log holds them and the abort must hide them.
                p.flush(10)
                return self._abort("aborted on purpose"), "aborted on purpose", moved
            if self.cfg.subscribe:
                offsets = {tp: c.position(tp) for tp in c.assignment()}
                if offsets:
                    p.send_offsets_to_transaction(offsets, c.group_metadata(), 10)
        except Exception as exc:
            err = self.ctx.rec.error(exc)
            return self._abort(err), err, moved  # no commit asked for: it cannot commit
        finally:
            self._offsets(futures)
        try:
            p.commit_transaction(15)
            self._offsets(futures)
            return OK, None, moved
        except Exception as exc:
            err = self.ctx.rec.error(exc)
            self._abort(err)
            self._offsets(futures)
            return INFO, err, moved  # the commit may have reached the coordinator

    def _offsets(self, futures: list[tuple[list[Any], Any]]) -> None:
        for m, fut in futures:
            if fut.done() and fut.exception() is None:
                m[3] = fut.result().offset

    def _abort(self, why: str) -> str:
        p = self.producer
        assert p is not None
        try:
            p.abort_transaction(15)
        except Exception as exc:
            self.ctx.rec.error(exc)
            self._drop_producer()  # the next one fences it and aborts what it left open
        return FAIL


@dataclass
class _Context:
    topic: str
    bootstrap: str
    run_id: str
    rec: _Recorder
    stop: threading.Event = field(default_factory=threading.Event)
    failures: list[str] = field(default_factory=list)


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


def _final_reads(cfg: VerifyConfig, ctx: _Context, process: int, say: Say) -> bool:
    """A fresh reader reads every partition from the beginning to its end; recorded."""
    deadline = time.monotonic() + cfg.final_timeout_s
    tps = [TopicPartition(ctx.topic, k) for k in range(cfg.keys)]
    base = {
        "bootstrap.servers": ctx.bootstrap,
        "request.timeout.ms": 5_000,
        "socket.connection.setup.timeout.ms": 3_000,
        "auto.offset.reset": "earliest",
        "fetch.max.wait.ms": 100,
    }
    while time.monotonic() < deadline:
        try:
            with (
                Consumer({**base, "isolation.level": "read_committed"}) as reader,
                Consumer(base) as raw,
            ):
                return _read_to_end(reader, raw, tps, ctx, process, deadline, say)
        except Exception as exc:
            log.debug("final reads: %s", exc)
            time.sleep(0.5)
    return False


def _read_to_end(
    reader: Consumer,
    raw: Consumer,
    tps: list[TopicPartition],
    ctx: _Context,
    process: int,
    deadline: float,
    say: Say,
) -> bool:
    # Transactions left open (a crashed client's) hide what follows them until they time out.
    ends: dict[TopicPartition, int] = {}
    while time.monotonic() < deadline:
        ends = reader.list_offsets(tps, LATEST)
        if ends == raw.list_offsets(tps, LATEST):
            break
        time.sleep(0.5)
    else:
        say("open transactions remain: reading up to the last stable offsets")
    reader.assign(tps)
    for tp in tps:
        reader.seek(tp, 0)
    remaining = dict(ends)
    while remaining and time.monotonic() < deadline:
        start = ctx.rec.now()
        records = reader.poll(0.5)
        polled = _polled(records)
        if polled:
            ctx.rec.op(Op(0, process, "poll", OK, start, ctx.rec.now(), [["poll", polled]]))
        for tp in list(remaining):
            if reader.position(tp) >= remaining[tp]:
                del remaining[tp]
    return not remaining


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
        proxy = FaultProxy(cfg.bootstrap, faults=faults, seed=rng.randrange(1 << 30)).start()
        bootstrap = proxy.address
        out(f"proxy {proxy.address} -> {cfg.bootstrap}")

    started = time.monotonic()
    ctx = _Context(topic, bootstrap, run_id, _Recorder(started))
    done = threading.Event()
    clients = [
        _Client(i, cfg, ctx, random.Random(rng.randrange(1 << 30))) for i in range(cfg.processes)
    ]
    threads = [
        threading.Thread(target=c.run, name=f"verify-{c.slot}", daemon=True) for c in clients
    ]
    helpers = [threading.Thread(target=_nemesis, args=(cfg, ctx, done, out), daemon=True)]
    if proxy is not None:
        helpers.append(
            threading.Thread(target=_proxy_windows, args=(cfg, proxy, ctx, done), daemon=True)
        )
    helpers.append(
        threading.Thread(target=_progress, args=(cfg, ctx, proxy, done, out), daemon=True)
    )
    final_complete = False
    try:
        for t in [*threads, *helpers]:
            t.start()
        ctx.stop.wait(cfg.time_limit)
        done.set()  # faults end (a running restart command is waited for)
        for t in helpers:
            t.join(cfg.restart_timeout_s + cfg.pause_s + 5)
        ctx.stop.set()
        for t in threads:
            t.join(60)
        if any(t.is_alive() for t in threads):
            notes.append("some client processes did not stop in time")
        notes.extend(ctx.failures)
        out("operations done; final reads of every partition")
        final_process = max(c.process for c in clients) + 1
        final_complete = _final_reads(cfg, ctx, final_process, out)
        if not final_complete:
            notes.append("the final reads did not reach the end of every partition in time")
    finally:
        done.set()
        ctx.stop.set()
        if proxy is not None:
            proxy.stop()
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
        elapsed=time.monotonic() - started,
        client_errors=dict(ctx.rec.errors),
        notes=notes,
    )
