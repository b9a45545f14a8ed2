"""One group consumer of a real client library, run as a subprocess by test_consumer_groups.

usage: _group_worker.py LIB ASSIGNOR BOOTSTRAP TOPIC GROUP OUTFILE

LIB ``confluent-consumer`` is confluent-kafka with ``group.protocol=consumer`` (KIP-848);
ASSIGNOR is then the server-side assignor (``group.remote.assignor``).

Consumes TOPIC in GROUP and appends a line to OUTFILE per event, flushed at once so a SIGKILL
loses at most a partial last line:

    D <monotonic ns> <partition> <offset>   a record was delivered to us
    C <monotonic ns> <partition> <offset>   a commit of <offset> (next to read) succeeded
    F <monotonic ns> <error>                a commit failed (e.g. partition revoked)

Each poll's records are committed synchronously right after they are logged (at-least-once).
SIGTERM closes the consumer cleanly (LeaveGroup); SIGKILL is the crash case. Monotonic time
is system-wide, so the test can order events across processes.
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
import time
from typing import IO, Any

SESSION_TIMEOUT_MS = 2000
HEARTBEAT_MS = 300
MAX_POLL_INTERVAL_MS = 10_000

stopping = False


def _stop(*_: Any) -> None:
    global stopping
    stopping = True


def _log(out: IO[str], *fields: object) -> None:
    out.write(" ".join(str(f) for f in fields) + "\n")
    out.flush()


def run_confluent(
    assignor: str, bootstrap: str, topic: str, group: str, out: IO[str], kip848: bool = False
) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "client.id": "confluent-worker",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
        "topic.metadata.refresh.interval.ms": 1000,
    }
    if kip848:
        # Timeouts and the assignor are the broker's (group.consumer.*) in this protocol.
        config.update({"group.protocol": "consumer", "group.remote.assignor": assignor})
    else:
        config.update(
            {
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_MS,
                "partition.assignment.strategy": assignor,
            }
        )
    c = Consumer(config)
    c.subscribe([topic])
    while not stopping:
        msgs = c.consume(num_messages=200, timeout=0.1)
        last: dict[int, int] = {}
        for m in msgs:
            if m.error():
                continue
            _log(out, "D", time.monotonic_ns(), m.partition(), m.offset())
            last[m.partition()] = m.offset()
        if last:
            try:
                c.commit(
                    offsets=[TopicPartition(topic, p, o + 1) for p, o in last.items()],
                    asynchronous=False,
                )
            except KafkaException as exc:
                _log(out, "F", time.monotonic_ns(), str(exc).replace("\n", " "))
            else:
                for p, o in last.items():
                    _log(out, "C", time.monotonic_ns(), p, o + 1)
    c.close()


def run_kafka_python(assignor: str, bootstrap: str, topic: str, group: str, out: IO[str]) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.structs import OffsetAndMetadata

    assignors = {
        "range": RangePartitionAssignor,
        "roundrobin": RoundRobinPartitionAssignor,
        "cooperative-sticky": CooperativeStickyAssignor,
    }
    c = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        client_id="kafka-python-worker",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
        partition_assignment_strategy=[assignors[assignor]],
        metadata_max_age_ms=1000,
    )
    c.subscribe([topic])
    while not stopping:
        # Not shorter: kafka-python 3.0.12 can lose a JoinGroup/SyncGroup round that completes
        # in its IO thread after poll() gave up waiting for it (need_rejoin() turns False and
        # the finished join is never applied), leaving the member without heartbeats.
        batches = c.poll(timeout_ms=1000)
        last: dict[int, int] = {}
        for tp, records in batches.items():
            for r in records:
                _log(out, "D", time.monotonic_ns(), tp.partition, r.offset)
                last[tp.partition] = r.offset
        if last:
            try:
                c.commit(
                    {
                        TopicPartition(topic, p): OffsetAndMetadata(o + 1, "", -1)
                        for p, o in last.items()
                    }
                )
            except Exception as exc:  # CommitFailedError and friends
                _log(out, "F", time.monotonic_ns(), type(exc).__name__)
            else:
                for p, o in last.items():
                    _log(out, "C", time.monotonic_ns(), p, o + 1)
    c.close(autocommit=False)


async def run_aiokafka(assignor: str, bootstrap: str, topic: str, group: str, out: IO[str]) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

    assignors = {
        "range": RangePartitionAssignor,
        "roundrobin": RoundRobinPartitionAssignor,
        "sticky": StickyPartitionAssignor,
    }
    c = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        client_id="aiokafka-worker",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
        partition_assignment_strategy=(assignors[assignor],),
        metadata_max_age_ms=1000,
    )
    await c.start()
    try:
        while not stopping:
            batches = await c.getmany(timeout_ms=100)
            last: dict[int, int] = {}
            for tp, records in batches.items():
                for r in records:
                    _log(out, "D", time.monotonic_ns(), tp.partition, r.offset)
                    last[tp.partition] = r.offset
            if last:
                try:
                    await c.commit({TopicPartition(topic, p): o + 1 for p, o in last.items()})
                except Exception as exc:  # CommitFailedError and friends
                    _log(out, "F", time.monotonic_ns(), type(exc).__name__)
                else:
                    for p, o in last.items():
                        _log(out, "C", time.monotonic_ns(), p, o + 1)
    finally:
        await c.stop()


def main() -> None:
    lib, assignor, bootstrap, topic, group, outfile = sys.argv[1:7]
    signal.signal(signal.SIGTERM, _stop)
    faulthandler.register(signal.SIGUSR1)  # stack dump of a stuck client, for debugging
    with open(outfile, "a") as out:
        if lib in ("confluent", "confluent-consumer"):
            run_confluent(assignor, bootstrap, topic, group, out, lib == "confluent-consumer")
        elif lib == "kafka-python":
            run_kafka_python(assignor, bootstrap, topic, group, out)
        else:
            asyncio.run(run_aiokafka(assignor, bootstrap, topic, group, out))
        _log(out, "X", time.monotonic_ns())


if __name__ == "__main__":
    main()
