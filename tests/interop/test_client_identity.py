"""Resumable producer identity and sequence recovery, against real brokers.

* A producer process is SIGKILLed mid-stream. It checkpointed (input position, producer
  state) after each flush; a new producer resumed from the last checkpoint sends everything
  after it again, and the log holds every record exactly once.
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

CHILD = r"""
import json, os, sys
from samsa.client import Producer
bootstrap, topic, checkpoint, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "batch.size": 2000})
for i in range(n):
    p.produce(topic, b"rec-%06d" % i, b"k%d" % (i % 5))
    if i % 150 == 149:
        p.flush()
        tmp = checkpoint + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"next": i + 1, "state": p.state().to_json()}, f)
        os.replace(tmp, checkpoint)
p.flush()
print("finished", flush=True)
"""


def _read(bootstrap: str, topic: str, count: int) -> list[bytes]:
    got = []
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            got += c.poll(0.5)
        got += c.poll(0.3)
    return [r.value for r in sorted(got, key=lambda r: (r.partition, r.offset))]  # type: ignore[misc]


@pytest.mark.parametrize("kill_after", [900, 1650])
def test_killed_producer_resumes_without_duplicates(
    shared_broker, tmp_path: Path, kill_after: int
) -> None:  # type: ignore[no-untyped-def]
    bootstrap = shared_broker.bootstrap
    topic = f"resume-{uuid.uuid4().hex[:6]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(topic, PARTITIONS)
    checkpoint = tmp_path / "checkpoint.json"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, bootstrap, topic, str(checkpoint), str(N)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "child made no progress"
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
            if checkpoint.exists() and json.loads(checkpoint.read_text())["next"] >= kill_after:
                break
            time.sleep(0.005)
        time.sleep(0.03)  # mid-stream: records past the checkpoint are written or in flight
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    saved = json.loads(checkpoint.read_text())
    state = ProducerState.from_json(saved["state"])
    before = _read(bootstrap, topic, saved["next"])
    assert len(before) >= saved["next"]  # the child got further than its checkpoint
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 3}, state=state) as p:
        assert (p.producer_id, p.epoch) == (state.producer_id, state.epoch)
        futures = [
            p.produce(topic, b"rec-%06d" % i, b"k%d" % (i % 5)) for i in range(saved["next"], N)
        ]
        assert p.flush(30) == 0
        skipped = sum(f.result().duplicate for f in futures)
    values = _read(bootstrap, topic, N)
    assert len(values) == N and len(set(values)) == N
    assert skipped == len(before) - saved["next"]


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
        futures = [p.produce(topic, b"b%d" % i, partition=0) for i in range(5)]
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
