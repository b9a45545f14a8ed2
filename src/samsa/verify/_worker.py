"""One verify client process: a producer and a consumer, issuing operations until told to stop.

Theory of operation
-------------------
:func:`main` runs in its own OS process (spawned by :mod:`samsa.verify.workload`), so that a
client crash is a real SIGKILL: whatever the clients held (connections, an open transaction,
a group membership) dies with the process, as when a Jepsen client node is killed. The
parent and the worker talk over one :func:`multiprocessing.Pipe`:

* worker -> parent: ``("ready", pid)``; ``("invoke", op)`` when an operation starts and
  ``("complete", op)`` when it ends (``op`` a :meth:`Op.to_json` dict, times in seconds since
  the parent's wall-clock ``epoch``); ``("error", name)`` for each client error;
  ``("stopped",)``; ``("final", complete, positions)``; ``("failed", text)``.
* parent -> worker: ``("go", epoch)``; ``("stop",)``: finish the operation in flight, issue no
  more; ``("final", ends, timeout_s)``: poll from where the consumer is until every
  partition's position reached ``ends`` (by assign: a group consumer is replaced by one
  assigned every partition from the beginning, as Jepsen's final reads); ``("exit",)``.

An operation the parent saw invoked but never completed is the parent's to record as ``info``.
Values are unique in the run without asking the parent: process ``p`` sends
``p * VALUE_STRIDE + n``. The worker ends when its parent is gone (a watch thread sees it
re-parented; end-of-file on the pipe), so no client outlives an interrupted run.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from samsa.client import Consumer, ConsumerRecord, Producer, TopicPartition
from samsa.verify.history import FAIL, INFO, OK, Op

VALUE_STRIDE = 1_000_000_000


class _ParentGone(Exception):
    """The pipe to the parent closed: the run is over, this process must end."""


def _polled(records: list[ConsumerRecord]) -> dict[int, list[list[int]]]:
    out: dict[int, list[list[int]]] = {}
    for r in records:
        try:
            v = int(r.value or b"")
        except ValueError:
            v = -1  # not ours: the checker reports it as a value nobody sent
        out.setdefault(r.partition, []).append([r.offset, v])
    return out


def error_name(exc: BaseException) -> str:
    name = type(exc).__name__
    code = getattr(exc, "name", None) or getattr(exc, "code", None)
    return name if code is None else f"{name}({code})"


class Client:
    """The clients of process ``process`` (slot ``slot``) and the operations they issue."""

    def __init__(self, spec: dict[str, Any], conn: Connection, epoch: float) -> None:
        self.spec = spec
        self.slot: int = spec["slot"]
        self.process: int = spec["process"]
        self.keys: int = spec["keys"]
        self.topic: str = spec["topic"]
        self.conn = conn
        self.epoch = epoch
        self.rng = random.Random(spec["seed"])
        self.values = iter(
            range(self.process * VALUE_STRIDE + 1, (self.process + 1) * VALUE_STRIDE)
        )
        self.producer: Producer | None = None
        self.consumer: Consumer | None = None
        self.stopping = False

    # --- the pipe ------------------------------------------------------------------------

    def now(self) -> float:
        return time.time() - self.epoch

    def send(self, msg: tuple[Any, ...]) -> None:
        try:
            self.conn.send(msg)
        except OSError as exc:
            raise _ParentGone from exc

    def error(self, exc: BaseException) -> str:
        name = error_name(exc)
        self.send(("error", name))
        return name

    def wait_command(self, timeout: float) -> tuple[Any, ...] | None:
        try:
            if self.conn.poll(max(0.0, timeout)):
                msg: tuple[Any, ...] = self.conn.recv()
                return msg
        except (EOFError, OSError) as exc:
            raise _ParentGone from exc
        return None

    # --- clients -------------------------------------------------------------------------

    def _producer_config(self) -> dict[str, Any]:
        c: dict[str, Any] = {
            "bootstrap.servers": self.spec["bootstrap"],
            "client.id": f"verify-{self.slot}",
            "linger.ms": 0,
            "request.timeout.ms": self.spec["request_timeout_ms"],
            "retry.backoff.ms": 20,
            "retry.backoff.max.ms": 500,
            "socket.connection.setup.timeout.ms": 3000,
            "delivery.timeout.ms": 15_000,
            "max.block.ms": 15_000,
        }
        if not self.spec["idempotence"]:
            c["enable.idempotence"] = False
        if self.spec["transactions"]:
            # Per slot, not per process: a successor's init_transactions fences its predecessor.
            c["transactional.id"] = f"verify-{self.spec['run_id']}-{self.slot}"
            c["transaction.timeout.ms"] = self.spec["transaction_timeout_ms"]
        return c

    def _consumer_config(self, group: bool) -> dict[str, Any]:
        c: dict[str, Any] = {
            "bootstrap.servers": self.spec["bootstrap"],
            "client.id": f"verify-{self.slot}-consumer",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.max.wait.ms": 100,
            "request.timeout.ms": self.spec["request_timeout_ms"],
            "socket.connection.setup.timeout.ms": 3000,
        }
        if group:
            c["group.id"] = f"verify-{self.spec['run_id']}"
            # A member SIGKILLed while its JoinGroup was pending holds the join phase up to
            # the rebalance timeout (max.poll.interval.ms, 5 min by default): bound it too.
            session = self.spec["session_timeout_ms"]
            c["session.timeout.ms"] = session
            c["heartbeat.interval.ms"] = max(1, min(500, session // 3))
            c["max.poll.interval.ms"] = 3 * session
        return c

    def _tps(self) -> list[TopicPartition]:
        return [TopicPartition(self.topic, k) for k in range(self.keys)]

    def ensure_clients(self) -> bool:
        try:
            if self.producer is None:
                p = Producer(self._producer_config())
                try:
                    if self.spec["transactions"]:
                        p.init_transactions(15)
                except BaseException:
                    with contextlib.suppress(Exception):
                        p.close(0)
                    raise
                self.producer = p
            if self.consumer is None:
                c = Consumer(self._consumer_config(self.spec["subscribe"]))
                if self.spec["subscribe"]:
                    c.subscribe([self.topic])
                else:
                    c.assign(self._tps())
                self.consumer = c
            return True
        except Exception as exc:
            self.error(exc)
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

    # --- the operations phase ------------------------------------------------------------

    def run(self) -> None:
        """Operations at this process's share of the rate until the parent says stop."""
        interval = self.spec["interval"]
        due = time.monotonic() + self.rng.uniform(0, interval)
        while True:
            msg = self.wait_command(due - time.monotonic())
            if msg is not None:
                if msg[0] in ("stop", "exit"):
                    self.stopping = msg[0] == "exit"
                    return
                continue
            due = max(due + interval, time.monotonic() - interval)
            if not self.ensure_clients():
                if (msg := self.wait_command(0.2)) is not None and msg[0] in ("stop", "exit"):
                    self.stopping = msg[0] == "exit"
                    return
                continue
            self._one_op()

    def _mops(self) -> list[list[Any]]:
        n = self.rng.randint(1, 4) if self.spec["transactions"] else 1
        out: list[list[Any]] = []
        for _ in range(n):
            if self.rng.random() < 0.5:
                out.append(["send", self.rng.randrange(self.keys), next(self.values), None])
            else:
                out.append(["poll", {}])
        return out

    def _membership(self) -> tuple[int, frozenset[TopicPartition]]:
        c = self.consumer
        assert c is not None
        if not self.spec["subscribe"]:
            return -1, frozenset()
        return c.group_metadata().generation_id, frozenset(c.assignment())

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

    def _one_op(self) -> None:
        mops = self._mops()
        f = "txn" if self.spec["transactions"] else mops[0][0]
        op = Op(0, self.process, f, INFO, self.now(), 0.0, mops)
        self.send(("invoke", op.to_json()))
        if self.spec["transactions"]:
            op.type, op.error, moved = self._txn(mops)
        else:
            op.type, op.error, moved = self._single(mops[0])
        op.end, op.rebalance = self.now(), sorted(moved)
        self.send(("complete", op.to_json()))

    def _single(self, mop: list[Any]) -> tuple[str, str | None, set[int]]:
        p, c = self.producer, self.consumer
        assert p is not None and c is not None
        if mop[0] == "send":
            try:
                fut = p.send(self.topic, b"%d" % mop[2], partition=mop[1])
                md = fut.result(30)
                mop[3] = md.offset
                return OK, None, set()
            except Exception as exc:
                return INFO, self.error(exc), set()
        try:
            mop[1], moved = self._poll()
        except Exception as exc:
            return FAIL, self.error(exc), set()
        if self.spec["subscribe"] and mop[1]:
            try:
                c.commit()
            except Exception as exc:
                return INFO, self.error(exc), moved
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
                    futures.append((m, p.send(self.topic, b"%d" % m[2], partition=m[1])))
                else:
                    m[1], more = self._poll()
                    moved |= more
            if self.rng.random() < self.spec["abort_rate"]:
                # Flushed first, so that the log holds them and the abort must hide them.
                p.flush(10)
                return self._abort(), "aborted on purpose", moved
            if self.spec["subscribe"]:
                offsets = {tp: c.position(tp) for tp in c.assignment()}
                if offsets:
                    p.send_offsets_to_transaction(offsets, c.group_metadata(), 10)
        except _ParentGone:
            raise
        except Exception as exc:
            err = self.error(exc)
            return self._abort(), err, moved  # no commit asked for: it cannot commit
        finally:
            self._offsets(futures)
        try:
            p.commit_transaction(15)
            self._offsets(futures)
            return OK, None, moved
        except Exception as exc:
            err = self.error(exc)
            self._abort()
            self._offsets(futures)
            return INFO, err, moved  # the commit may have reached the coordinator

    def _offsets(self, futures: list[tuple[list[Any], Any]]) -> None:
        for m, fut in futures:
            if fut.done() and fut.exception() is None:
                m[3] = fut.result().offset

    def _abort(self) -> str:
        p = self.producer
        assert p is not None
        try:
            p.abort_transaction(15)
        except Exception as exc:
            self.error(exc)
            self._drop_producer()  # the next one fences it and aborts what it left open
        return FAIL

    # --- the final phase -----------------------------------------------------------------

    def final(self, ends: dict[int, int], timeout_s: float) -> tuple[bool, dict[int, int]]:
        """Poll until every partition's position reached ``ends``; each poll is recorded."""
        deadline = time.monotonic() + timeout_s
        tps = self._tps()
        rebalance: list[int] = []
        positions: dict[int, int] = {}
        while time.monotonic() < deadline:
            try:
                if self.spec["subscribe"] or self.consumer is None:
                    # By assign, from the beginning: a group member owns only some partitions,
                    # and the reads of a poll a crash cut short are in nobody's history.
                    if self.consumer is not None:
                        with contextlib.suppress(Exception):
                            self.consumer.close()
                        self.consumer = None
                    c = Consumer(self._consumer_config(group=False))
                    c.assign(tps)
                    for tp in tps:
                        c.seek(tp, 0)
                    self.consumer = c
                    self.spec = {**self.spec, "subscribe": False}
                    rebalance = list(range(self.keys))  # positions jumped on purpose
                break
            except Exception as exc:
                self.error(exc)
                self.consumer = None
                time.sleep(0.2)
        c = self.consumer
        while c is not None and time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                positions = {tp.partition: c.position(tp) for tp in tps}
            if all(positions.get(k, -1) >= end for k, end in ends.items()):
                return True, positions
            if (msg := self.wait_command(0)) is not None and msg[0] == "exit":
                break
            op = Op(0, self.process, "poll", INFO, self.now(), 0.0, [["poll", {}]], None)
            self.send(("invoke", op.to_json()))
            try:
                op.value[0][1] = _polled(c.poll(0.5))
                op.type = OK
            except Exception as exc:
                op.type, op.error = FAIL, self.error(exc)
                time.sleep(0.1)
            op.end, op.rebalance, rebalance = self.now(), rebalance, []
            self.send(("complete", op.to_json()))
        return False, positions


def _die_with_parent() -> None:
    """End this process as soon as its parent is gone, however the parent died.

    (Not PR_SET_PDEATHSIG: it follows the parent *thread*, and successors are spawned by a
    thread that ends before they do.)
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(spec: dict[str, Any], conn: Connection) -> None:
    """The process's body (a ``multiprocessing`` target, spawned)."""
    _die_with_parent()
    # Ctrl-C reaches the whole process group: the parent ends its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    client: Client | None = None
    try:
        conn.send(("ready", os.getpid()))
        msg = conn.recv()
        if msg[0] != "go":
            return
        client = Client(spec, conn, msg[1])
        client.run()
        if client.stopping:
            return
        client.send(("stopped",))
        while True:
            msg = conn.recv()
            if msg[0] == "final":
                complete, positions = client.final(msg[1], msg[2])
                client.send(("final", complete, positions))
            elif msg[0] == "exit":
                return
    except (_ParentGone, EOFError, OSError):
        pass
    except BaseException as exc:  # reported, never silently lost with the process
        with contextlib.suppress(Exception):
            conn.send(("failed", f"process {spec['process']}: {exc!r}"))
    finally:
        if client is not None:
            client.close()
        with contextlib.suppress(Exception):
            conn.close()
