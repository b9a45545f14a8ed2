"""Resumable producer identity and sequence recovery, against real brokers.

* A producer process is SIGKILLed after writing records past its last checkpoint (input
  position, producer state, saved after each flush); a new producer resumed from that
  checkpoint sends everything after it again, exactly the records already written are
  recognised, and the log holds every record exactly once.
* A producer whose sequences diverged from the broker's (OUT_OF_ORDER_SEQUENCE_NUMBER)
  recovers by bumping its epoch and renumbering, writing each record once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from samsa.client import Admin, Consumer, Producer, ProducerState, TopicPartition

N = 3000
PARTITIONS = 2

PAST = 100  # records the child writes after its last checkpoint, before it is killed

CHILD = r"""
import json, os, sys, time
from samsa.client import Producer
bootstrap, topic, checkpoint, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
stop_at, past = int(sys.argv[5]), int(sys.argv[6])
p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "batch.size": 2000})
for i in range(n):
    p.produce(topic, b"rec-%06d" % i, b"k%d" % (i % 5))
    if i % 150 == 149 and i < stop_at:
        p.flush()
        tmp = checkpoint + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"next": i + 1, "state": p.state().to_json()}, f)
        os.replace(tmp, checkpoint)
    if i + 1 == stop_at + past:
        p.flush()  # written, but after the checkpoint: the resumed producer must skip them
        open(checkpoint + ".stopped", "w").close()
        time.sleep(60)  # until the SIGKILL
p.flush()
print("finished", flush=True)
"""


def _read(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes]]:
    """(partition, value) of every record, in (partition, offset) order."""
    got = []
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            got += c.poll(0.5)
        got += c.poll(0.3)
    got.sort(key=lambda r: (r.partition, r.offset))
    return [(r.partition, r.value) for r in got]  # type: ignore[misc]


def _expected(count: int) -> list[bytes]:
    return [b"rec-%06d" % i for i in range(count)]


@pytest.mark.parametrize("kill_after", [900, 1650])
def test_killed_producer_resumes_without_duplicates(
    shared_broker, tmp_path: Path, kill_after: int
) -> None:  # type: ignore[no-untyped-def]
    bootstrap = shared_broker.bootstrap
    topic = f"resume-{uuid.uuid4().hex[:6]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(topic, PARTITIONS)
    checkpoint = tmp_path / "checkpoint.json"
    stopped = tmp_path / "checkpoint.json.stopped"
    args = [bootstrap, topic, str(checkpoint), str(N), str(kill_after), str(PAST)]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        # The child stops once it has written PAST records beyond its checkpoint: killed there,
        # the log is ahead of the checkpoint by exactly that much.
        deadline = time.monotonic() + 60
        while not stopped.exists():
            assert time.monotonic() < deadline, "child made no progress"
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    saved = json.loads(checkpoint.read_text())
    assert saved["next"] == kill_after  # a checkpoint inside the run, not at its end
    state = ProducerState.from_json(saved["state"])
    before = _read(bootstrap, topic, kill_after + PAST)
    assert sorted(v for _, v in before) == _expected(kill_after + PAST)
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 3}, state=state) as p:
        assert (p.producer_id, p.epoch) == (state.producer_id, state.epoch)
        futures = [
            p.send(topic, b"rec-%06d" % i, b"k%d" % (i % 5)) for i in range(saved["next"], N)
        ]
        assert p.flush(30) == 0
        skipped = [f.result().duplicate for f in futures]
    # Exactly the records written after the checkpoint were recognised, and nothing else.
    assert skipped == [True] * PAST + [False] * (N - kill_after - PAST)
    after = _read(bootstrap, topic, N)
    assert sorted(v for _, v in after) == _expected(N)  # each record once
    for partition in range(PARTITIONS):  # and in production order within a partition
        values = [v for p, v in after if p == partition]
        assert values == sorted(values)


def test_sequence_divergence_recovered_by_epoch_bump(shared_broker) -> None:  # type: ignore[no-untyped-def]
    bootstrap = shared_broker.bootstrap
    topic = f"bump-{uuid.uuid4().hex[:6]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(topic, 1)
    with Producer({"bootstrap.servers": bootstrap}) as p:
        for i in range(10):
            p.produce(topic, b"a%d" % i, partition=0)
        p.flush()
        state = p.state()
    tp = TopicPartition(topic, 0)
    wrong = replace(state, sequences={tp: state.sequences[tp] + 50})  # a gap: 45 from the broker
    with Producer({"bootstrap.servers": bootstrap}, state=wrong) as p:
        futures = [p.send(topic, b"b%d" % i, partition=0) for i in range(5)]
        assert p.flush(30) == 0
        offsets = [f.result().offset for f in futures]
        assert (p.producer_id, p.epoch) != (state.producer_id, state.epoch)
    assert offsets == list(range(10, 15))
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([tp])
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 15 and time.monotonic() < deadline:
            got += c.poll(0.5)
    assert [r.value for r in got] == [b"a%d" % i for i in range(10)] + [
        b"b%d" % i for i in range(5)
    ]
