"""kcat (librdkafka's command-line client) against samsa, unmodified."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid

import pytest

from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import iter_batches
from samsa.testing import fetch_request

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
pytestmark = pytest.mark.timeout(120)


def kcat(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert KCAT is not None, "kcat is installed by `make test` (apt package kcat)"
    return subprocess.run(
        [KCAT, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


def test_kcat_produces_idempotently_and_consumes(shared_broker) -> None:  # type: ignore[no-untyped-def]
    bs = shared_broker.bootstrap
    topic = f"kcat-{uuid.uuid4().hex[:8]}"
    lines = [f"key{i % 7}:value-{i}" for i in range(500)]
    r = kcat(
        "-b",
        bs,
        "-P",
        "-t",
        topic,
        "-K",
        ":",
        "-X",
        "enable.idempotence=true",
        stdin="\n".join(lines) + "\n",
    )
    assert r.returncode == 0, r.stderr
    r = kcat("-b", bs, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%k:%s\n")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == sorted(lines)  # each record exactly once
    r = kcat("-b", bs, "-L", "-t", topic, "-J")
    assert r.returncode == 0 and f'"topic":"{topic}"' in r.stdout.replace(" ", "")
    [meta] = json.loads(r.stdout)["topics"]
    partitions = [p["partition"] for p in meta["partitions"]]
    # Idempotently: every batch in the log carries one producer id and sequences that start at
    # 0 on each partition and run on without a gap.
    with BlockingConnection("127.0.0.1", shared_broker.port) as conn:
        resp = conn.request(ApiKey.FETCH, 12, fetch_request({(topic, p): 0 for p in partitions}))
    producer_ids = set()
    total = 0
    for part in resp.responses[0].partitions:
        next_seq = 0
        for batch in iter_batches(part.records or b""):
            producer_ids.add(batch.producer_id)
            assert (batch.base_sequence, batch.producer_epoch) == (next_seq, 0), batch
            next_seq += batch.record_count
        total += next_seq
    assert total == 500 and len(producer_ids) == 1 and min(producer_ids) >= 0, producer_ids


def test_kcat_group_consumer_commits(shared_broker) -> None:  # type: ignore[no-untyped-def]
    bs = shared_broker.bootstrap
    topic = f"kcatg-{uuid.uuid4().hex[:8]}"
    assert kcat("-b", bs, "-P", "-t", topic, stdin="a\nb\nc\n").returncode == 0
    group = f"g-{uuid.uuid4().hex[:6]}"
    args = (
        "-b",
        bs,
        "-G",
        group,
        "-X",
        "auto.offset.reset=earliest",
        "-X",
        "enable.auto.commit=true",
        "-X",
        "auto.commit.interval.ms=100",
        "-c",
        "3",
        "-e",
        topic,
    )
    r = kcat(*args)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["a", "b", "c"]
    # The group committed on close: a new member of it starts after "c".
    assert kcat("-b", bs, "-P", "-t", topic, stdin="d\n").returncode == 0
    r = kcat(*args[:-4], "-c", "1", "-e", topic)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["d"]
