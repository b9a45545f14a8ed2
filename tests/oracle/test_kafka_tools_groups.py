"""kafka-console-producer, kafka-console-consumer and kafka-consumer-groups against samsa and
against Apache Kafka, the same command lines, the output compared once normalised
(tests/oracle/_tool_oracle.py); and samsa's own produce/consume commands, spelled with
Kafka's flags, printing what Kafka's tools print."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _tool_oracle import Out, Pair, normalise, tool_pair
from confluent_kafka import Consumer

from samsa.testing.kafka import run_tool_in_process

BS = ("--bootstrap-server", "BS")
# header h1:x,h2:y, key k1, value v1; NULL (the null marker) for no headers and a null value
LINES = "h1:x,h2:y\tk1:v1\nh1:z\tk2:v2\nNULL\tk3:NULL\n"
READ = ("--property", "parse.key=true", "--property", "key.separator=:",
        "--property", "parse.headers=true", "--property", "null.marker=NULL")  # fmt: skip
PRINT = ("--property", "print.key=true", "--property", "print.headers=true",
         "--property", "print.partition=true", "--property", "print.offset=true")  # fmt: skip


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with tool_pair(tmp_path_factory.mktemp("tools-groups")) as p:
        p.same("kafka-topics", *BS, "--create", "--topic", "kv", "--partitions", "2")
        made = p.same("kafka-console-producer", *BS, "--topic", "kv", *READ, input=LINES)
        assert made.rc == 0, made
        yield p


def _samsa(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "samsa", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_console_consumer_prints_keys_headers_and_commits(pair: Pair) -> None:
    s, k = pair.run("kafka-console-consumer", *BS, "--topic", "kv", "--from-beginning",
                    "--max-messages", "3", *PRINT, "--group", "g1",
                    "--timeout-ms", "30000")  # fmt: skip
    assert sorted(s.out) == sorted(k.out)  # partitions interleave as fetches return
    assert sorted(s.out) == [
        "Option --property is deprecated and will be removed in a future version. "
        "Use --formatter-property instead.",
        "Partition:0 Offset:0 NO_HEADERS k3 null",
        "Partition:1 Offset:0 h1:x,h2:y k1 v1",
        "Partition:1 Offset:1 h1:z k2 v2",
    ]
    # samsa's own consume, spelled as kafka-console-consumer, prints the same lines
    mine = _samsa("consume", "--topic", "kv", "--bootstrap-server", pair.samsa.bootstrap,
                  "--offset", "earliest", *PRINT, "--max-messages", "3",
                  "--timeout-ms", "10000")  # fmt: skip
    assert mine.returncode == 0, mine.stderr
    assert sorted(mine.stdout.replace("\t", " ").splitlines()) == sorted(s.out)[1:]


def test_samsa_produce_with_kafkas_flags_writes_what_kafka_reads(pair: Pair) -> None:
    """samsa produce, spelled as kafka-console-producer, against both brokers: Kafka's
    console consumer then reads the same keys, headers and values from each."""
    pair.same("kafka-topics", *BS, "--create", "--topic", "kv2", "--partitions", "1")
    for broker in (pair.samsa.bootstrap, pair.kafka.bootstrap):
        made = _samsa("produce", "--topic", "kv2", "--bootstrap-server", broker, *READ, "-q",
                      stdin=LINES)  # fmt: skip
        assert made.returncode == 0, made.stderr
    read = pair.same("kafka-console-consumer", *BS, "--topic", "kv2", "--from-beginning",
                     "--max-messages", "3", *PRINT, "--timeout-ms", "30000")  # fmt: skip
    assert read.out[1:] == [
        "Partition:0 Offset:0 h1:x,h2:y k1 v1",
        "Partition:0 Offset:1 h1:z k2 v2",
        "Partition:0 Offset:2 NO_HEADERS k3 null",
    ]


def _groups(out: Out) -> list[str]:
    return sorted(re.sub(r"console-consumer-\d+", "console-consumer-N", x) for x in out.out)


def _live_member(bootstrap: str, group: str) -> Consumer:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": "live",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})  # fmt: skip
    c.subscribe(["kv"])
    deadline = time.monotonic() + 30
    while not c.assignment() and time.monotonic() < deadline:
        c.poll(0.2)
    assert c.assignment(), f"no assignment from {bootstrap}"
    return c


def test_consumer_groups_list_and_describe_with_lag_and_members(pair: Pair) -> None:
    pair.same("kafka-console-producer", *BS, "--topic", "kv", *READ, input="NULL\tk1:v4\n")
    lag = pair.same("kafka-consumer-groups", *BS, "--describe", "--group", "g1")
    assert lag.out[0].startswith("GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG")
    assert lag.out[1:3] == ["g1 kv 0 1 1 0 - - -", "g1 kv 1 2 3 1 - - -"]
    assert lag.err == ["Consumer group 'g1' has no active members."]
    for flags in (["--list"], ["--list", "--state"], ["--list", "--type"]):
        # console consumers without --group made console-consumer-<random> groups; the
        # listing's order follows a hash map
        s, k = pair.run("kafka-consumer-groups", *BS, *flags)
        assert _groups(s) == _groups(k) and len(s.out) >= 2
    for flags in (["--state", "--verbose"], ["--offsets"]):
        pair.same("kafka-consumer-groups", *BS, "--describe", "--group", "g1", *flags)
    missing = pair.same("kafka-consumer-groups", *BS, "--describe", "--group", "nosuch")
    assert "GroupIdNotFoundException: Group nosuch not found." in missing.text

    members = [_live_member(b, "live") for b in (pair.samsa.bootstrap, pair.kafka.bootstrap)]
    try:
        described = pair.same("kafka-consumer-groups", *BS, "--describe", "--group", "live")
        assert [row.split(" ")[-3:] for row in described.out[1:]] == [
            ["MEMBER", "/127.0.0.1", "live"]
        ] * 2
        verbose = pair.same("kafka-consumer-groups", *BS, "--describe", "--group", "live",
                            "--members", "--verbose")  # fmt: skip
        assert verbose.out[1].startswith("live MEMBER /127.0.0.1 live 2")
        state = pair.same("kafka-consumer-groups", *BS, "--describe", "--group", "live",
                          "--state")  # fmt: skip
        assert state.out[1].split(" ")[-2:] == ["Stable", "1"]
    finally:
        for m in members:
            m.close()


def _reset(pair: Pair, *how: str, execute: bool = True) -> Out:
    return pair.same("kafka-consumer-groups", *BS, "--group", "g2", "--reset-offsets", *how,
                     "--execute" if execute else "--dry-run")  # fmt: skip


def test_reset_offsets_by_position(pair: Pair) -> None:
    pair.same("kafka-topics", *BS, "--create", "--topic", "r", "--partitions", "2")
    lines = "".join(f"k{i}:v{i}\n" for i in range(8))
    pair.same("kafka-console-producer", *BS, "--topic", "r", *READ[:4], input=lines)
    # k0..k7 hash to partitions 1,1,1,0,0,0,1,0: four records each
    assert sorted(_reset(pair, "--to-latest", "--topic", "r").out[1:]) == ["g2 r 0 4", "g2 r 1 4"]
    assert sorted(_reset(pair, "--to-earliest", "--all-topics", execute=False).out[1:]) == [
        "g2 r 0 0",
        "g2 r 1 0",
    ]
    current = _reset(pair, "--to-current", "--topic", "r").out[1:]
    assert sorted(current) == ["g2 r 0 4", "g2 r 1 4"]
    assert sorted(_reset(pair, "--to-offset", "1", "--topic", "r").out[1:]) == [
        "g2 r 0 1",
        "g2 r 1 1",
    ]
    assert _reset(pair, "--shift-by", "-1", "--topic", "r:0").out[1:] == ["g2 r 0 0"]
    assert _reset(pair, "--shift-by", "100", "--topic", "r:1").out[1:] == ["g2 r 1 4"]


def test_reset_offsets_by_time_and_file(pair: Pair, tmp_path: Path) -> None:
    pair.same("kafka-topics", *BS, "--create", "--topic", "rt", "--partitions", "1")
    pair.same("kafka-console-producer", *BS, "--topic", "rt", input="a\nb\nc\n")
    rt = ("--topic", "rt")
    assert _reset(pair, "--to-datetime", "2020-01-01T00:00:00.000", *rt).out[-1] == "g2 rt 0 0"
    assert _reset(pair, "--to-datetime", "2099-01-01T00:00:00.000", *rt).out[-1] == "g2 rt 0 3"
    assert _reset(pair, "--by-duration", "P1D", *rt).out[-1] == "g2 rt 0 0"
    exported = _reset(pair, "--to-offset", "2", *rt, "--export", execute=False)
    assert exported.out == ["rt,0,2"]
    plan = tmp_path / "plan.csv"
    plan.write_text("rt,0,1\n")
    assert _reset(pair, "--from-file", str(plan)).out[-1] == "g2 rt 0 1"
    described = pair.same("kafka-consumer-groups", *BS, "--describe", "--group", "g2")
    assert "g2 rt 0 1 3 2 - - -" in described.out


def test_delete_offsets_and_delete_group(pair: Pair) -> None:
    pair.same("kafka-topics", *BS, "--create", "--topic", "d", "--partitions", "1")
    pair.same("kafka-consumer-groups", *BS, "--group", "g3", "--reset-offsets", "--to-earliest",
              "--topic", "d", "--execute")  # fmt: skip
    deleted = pair.same("kafka-consumer-groups", *BS, "--group", "g3", "--delete-offsets",
                        "--topic", "d")  # fmt: skip
    assert deleted.out == [
        "Request succeeded for deleting offsets from group g3.",
        "TOPIC PARTITION STATUS",
        "d 0 Successful",
    ]
    gone = pair.same("kafka-consumer-groups", *BS, "--delete", "--group", "g3")
    assert gone.out == ["Deletion of requested consumer groups ('g3') was successful."]
    again = pair.same("kafka-consumer-groups", *BS, "--delete", "--group", "g3")
    assert "GroupIdNotFoundException" in again.text


def _mine_vs_kafkas(pair: Pair, *args: str) -> tuple[Out, Out]:
    """``samsa groups`` against samsa and kafka-consumer-groups against Kafka, the same
    flags, both normalised."""
    with ThreadPoolExecutor(2) as pool:
        mine = pool.submit(_samsa, "groups", *[pair.samsa.bootstrap if a == "BS" else a
                                               for a in args])  # fmt: skip
        theirs = pool.submit(run_tool_in_process, "kafka-consumer-groups",
                             *[pair.kafka.bootstrap if a == "BS" else a for a in args])  # fmt: skip
        return normalise(mine.result(), pair.samsa.bootstrap), normalise(
            theirs.result(), pair.kafka.bootstrap
        )


def test_samsa_groups_resets_and_deletes_offsets_as_kafkas_tool(pair: Pair) -> None:
    pair.same("kafka-topics", *BS, "--create", "--topic", "rs", "--partitions", "2")
    lines = "".join(f"k{i}:v{i}\n" for i in range(4))  # k0, k1, k2 -> 1; k3 -> 0
    pair.same("kafka-console-producer", *BS, "--topic", "rs", *READ[:4], input=lines)
    g = ("--bootstrap-server", "BS", "--group", "g4")
    for how, rows in (
        (["--to-earliest", "--topic", "rs", "--execute"], ["g4 rs 0 0", "g4 rs 1 0"]),
        (["--shift-by", "2", "--topic", "rs:1", "--execute"], ["g4 rs 1 2"]),
        (["--to-datetime", "2099-01-01T00:00:00.000", "--all-topics"], ["g4 rs 0 1", "g4 rs 1 3"]),
        (["--by-duration", "P1D", "--topic", "rs", "--export"], ["rs,0,0", "rs,1,0"]),
    ):
        mine, theirs = _mine_vs_kafkas(pair, *g, "--reset-offsets", *how)
        assert mine.rc == theirs.rc == 0, (mine, theirs)
        assert sorted(mine.out) == sorted(theirs.out)
        assert sorted(x for x in mine.out if not x.startswith(("GROUP", "Warn:"))) == rows
    mine, theirs = _mine_vs_kafkas(pair, *g, "--delete-offsets", "--topic", "rs")
    assert mine.rc == theirs.rc == 0
    assert sorted(mine.out) == sorted(theirs.out)
    assert mine.out[0] == "Request succeeded for deleting offsets from group g4."
