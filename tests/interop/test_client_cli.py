"""The client commands as subprocesses: samsa topics / produce / consume / producers."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

SAMSA = [sys.executable, "-m", "samsa"]


def run(*args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SAMSA, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_topics_produce_consume_producers(shared_broker) -> None:  # type: ignore[no-untyped-def]
    bs = ["--bootstrap-server", shared_broker.bootstrap]
    topic = f"cli-{uuid.uuid4().hex[:6]}"
    r = run("topics", "create", topic, "--partitions", "2", *bs)
    assert r.returncode == 0, r.stderr
    assert f"Created topic {topic}." in r.stdout
    r = run("topics", "create", topic, *bs)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "TOPIC_ALREADY_EXISTS" in r.stderr
    assert topic in run("topics", "list", *bs).stdout.split()
    r = run("topics", "describe", topic, *bs)
    assert "PartitionCount: 2" in r.stdout and "Partition: 1" in r.stdout

    lines = [f"k{i % 10}:value {i}" for i in range(500)]
    r = run("produce", topic, "--key-separator", ":", *bs, stdin="\n".join(lines) + "\n")
    assert r.returncode == 0, r.stderr
    assert "500 records produced" in r.stderr

    r = run(
        "consume", topic, "--from-beginning", "--max-messages", "500", "--timeout-ms", "10000", *bs
    )
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == sorted(f"value {i}" for i in range(500))

    by_partition = []
    for partition in ("0", "1"):
        r = run(
            "consume",
            topic,
            "--from-beginning",
            "--print-key",
            "--key-separator",
            "=",
            "--partition",
            partition,
            "--timeout-ms",
            "1000",
            *bs,
        )
        assert r.returncode == 0, r.stderr
        by_partition.append(r.stdout.splitlines())
    # Each partition alone, keys printed: together exactly every record, and a key's records
    # all in one partition.
    assert all(by_partition), by_partition
    assert sorted(by_partition[0] + by_partition[1]) == sorted(
        f"k{i % 10}=value {i}" for i in range(500)
    )
    keys = [{line.split("=")[0] for line in lines} for lines in by_partition]
    assert not keys[0] & keys[1], keys

    # a group reads everything once, commits, and then has nothing left
    group = ["--group", f"g-{uuid.uuid4().hex[:6]}", "--from-beginning", "--timeout-ms", "3000"]
    r = run("consume", topic, *group, *bs)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 500
    r = run("consume", topic, *group, *bs)
    assert r.returncode == 0 and r.stdout == "", r.stderr

    r = run("producers", topic, *bs)
    assert r.returncode == 0, r.stderr
    rows = [line.split("\t") for line in r.stdout.splitlines()[1:]]
    assert {row[0] for row in rows} == {"0", "1"}
    assert all(int(row[1]) >= 0 and row[2] == "0" for row in rows)
    # One producer wrote every record, from sequence 0 at offset 0 of each partition: its
    # last sequence is its last offset, and the last offsets add up to all 500 records.
    assert all(row[3] == row[4] for row in rows)
    assert sum(int(row[4]) + 1 for row in rows) == 500

    r = run("topics", "delete", topic, *bs)
    assert r.returncode == 0 and f"Deleted topic {topic}." in r.stdout
    r = run("consume", topic, "--timeout-ms", "500", *bs)
    assert r.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in r.stderr


def test_unreachable_broker_is_one_line_error() -> None:
    r = run("topics", "list", "--bootstrap-server", "127.0.0.1:1", timeout=30)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "error" in r.stderr
