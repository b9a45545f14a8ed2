"""kafka-transactions (list, describe, describe-producers, find-hanging, abort) and
kafka-console-consumer's read_committed against samsa and against Apache Kafka, the same
command lines, the output compared once normalised (tests/oracle/_tool_oracle.py).

A transaction is left open by a producer that exits without ending it; ``abort`` then closes
it on its partition by WriteTxnMarkers, as an operator does with a hanging transaction."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest
from _tool_oracle import Pair, columns, normalise, tool_pair

from samsa.testing.kafka import run_tool_in_process

BS = ("--bootstrap-server", "BS")

# Leaves tx-open's transaction open on t-0 (os._exit skips every cleanup), and commits
# tx-done's on t-1.
_TRANSACTIONS = """
import os, sys
from confluent_kafka import Producer
bs = sys.argv[1]
p = Producer({"bootstrap.servers": bs, "transactional.id": "tx-open",
              "transaction.timeout.ms": 600000})
p.init_transactions(60); p.begin_transaction(); p.produce("t", b"open", partition=0)
assert p.flush(60) == 0
q = Producer({"bootstrap.servers": bs, "transactional.id": "tx-done"})
q.init_transactions(60); q.begin_transaction(); q.produce("t", b"done", partition=1)
q.commit_transaction(60)
os._exit(0)
"""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with tool_pair(tmp_path_factory.mktemp("tools-txn")) as p:
        p.same("kafka-topics", *BS, "--create", "--topic", "t", "--partitions", "2")
        for bs in (p.samsa.bootstrap, p.kafka.bootstrap):
            subprocess.run([sys.executable, "-c", _TRANSACTIONS, bs], check=True, timeout=120)
        yield p


def test_list_describe_and_describe_producers(pair: Pair) -> None:
    # Kafka answers EndTxn once PrepareCommit is logged and writes the markers after it, so
    # right after the set-up (under load) its list may still say PrepareCommit
    listed = pair.same_read("kafka-transactions", *BS, "list")
    assert listed.out == [
        "TransactionalId Coordinator ProducerId TransactionState",
        "tx-done 1 1 CompleteCommit",
        "tx-open 1 0 Ongoing",
    ]
    s, k = pair.run("kafka-transactions", *BS, "describe", "--transactional-id", "tx-open")
    header = "CoordinatorId"
    (mine,), (theirs,) = columns(s, header), columns(k, header)
    assert mine.pop("TransactionDurationMs").isdigit() and theirs.pop("TransactionDurationMs")
    assert mine == theirs == {
        "CoordinatorId": "1", "TransactionalId": "tx-open", "ProducerId": "0",
        "ProducerEpoch": "0", "TransactionState": "Ongoing", "TransactionTimeoutMs": "600000",
        "CurrentTransactionStartTimeMs": "TS", "TopicPartitions": "t-0",
    }  # fmt: skip
    missing = pair.same("kafka-transactions", *BS, "describe", "--transactional-id", "nosuch")
    assert missing.rc == 1 and "the ID could not be found" in missing.err[0]
    open_one = pair.same("kafka-transactions", *BS, "describe-producers", "--topic", "t",
                         "--partition", "0")  # fmt: skip
    assert open_one.out[1] == "0 0 -1 0 TS 0"  # CurrentTransactionStartOffset 0: open
    committed = pair.same("kafka-transactions", *BS, "describe-producers", "--topic", "t",
                          "--partition", "1")  # fmt: skip
    assert committed.out[1] == "1 0 0 0 TS None"
    # nothing is hanging: the coordinator knows tx-open, and it is not past its timeout
    hanging = pair.same("kafka-transactions", *BS, "find-hanging", "--broker-id", "1")
    assert hanging.out == [
        "Topic Partition ProducerId ProducerEpoch CoordinatorEpoch StartOffset LastTimestamp "
        "Duration(min)"
    ]


def test_abort_closes_the_open_transaction_for_read_committed(pair: Pair) -> None:
    read = ("kafka-console-consumer", *BS, "--topic", "t", "--from-beginning",
            "--formatter-property", "print.partition=true", "--timeout-ms", "20000",
            "--max-messages")  # fmt: skip
    uncommitted = pair.run(*read, "2", "--isolation-level", "read_uncommitted")
    assert [sorted(o.out) for o in uncommitted] == [["Partition:0 open", "Partition:1 done"]] * 2
    aborted = pair.same("kafka-transactions", *BS, "abort", "--topic", "t", "--partition", "0",
                        "--start-offset", "0")  # fmt: skip
    assert aborted.rc == 0 and aborted.err == []
    after = pair.same("kafka-transactions", *BS, "describe-producers", "--topic", "t",
                      "--partition", "0")  # fmt: skip
    assert after.out[1] == "0 0 0 0 TS None"  # the marker's coordinator epoch, no open txn
    committed = pair.same(*read, "1", "--isolation-level", "read_committed")
    assert committed.out == ["Partition:1 done"]
    again = pair.same("kafka-transactions", *BS, "abort", "--topic", "t", "--partition", "0",
                      "--start-offset", "0")  # fmt: skip
    assert again.rc == 1


def _samsa_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "samsa", "transactions", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_samsa_find_hanging_and_abort_answer_as_kafkas_tool(pair: Pair) -> None:
    """samsa's own ``transactions find-hanging`` and ``abort`` beside Kafka's tool, both on the
    samsa broker. A transaction left open on t2-0 is not hanging while its coordinator holds
    it; once the coordinator has lost it (the broker SIGKILLed and its transaction state
    deleted), both tools list it as hanging, and ``samsa transactions abort`` closes it."""
    bs = pair.samsa.bootstrap
    pair.run("kafka-topics", *BS, "--create", "--topic", "t2", "--partitions", "1")
    script = _TRANSACTIONS.replace('"tx-open"', '"tx-lost"').replace('"t", b"open"', '"t2", b"x"')
    subprocess.run([sys.executable, "-c", script, bs], check=True, timeout=120)

    def both_hanging() -> tuple[list[str], list[str]]:
        mine = _samsa_cli("find-hanging", "--topic", "t2", "--max-transaction-timeout", "0",
                          "--bootstrap-server", bs)  # fmt: skip
        assert mine.returncode == 0, mine.stderr
        theirs = run_tool_in_process("kafka-transactions", "--bootstrap-server", bs, "find-hanging",
                          "--topic", "t2", "--max-transaction-timeout", "0")  # fmt: skip
        assert theirs.returncode == 0, theirs.stderr
        norm = [normalise(r, bs).out for r in (mine, theirs)]
        return norm[0], norm[1]

    mine, theirs = both_hanging()
    assert mine == theirs and len(mine) == 1  # the header: the coordinator holds it
    pair.samsa.kill()
    for state in pair.samsa.data_dir.glob("__transaction_state-*"):
        shutil.rmtree(state)
    pair.samsa.start()
    mine, theirs = both_hanging()
    assert mine == theirs and mine[1].startswith("t2 0 "), mine  # hanging now
    assert _samsa_cli("abort", "--topic", "t2", "--partition", "0", "--start-offset", "0",
                      "--bootstrap-server", bs).returncode == 0  # fmt: skip
    mine, theirs = both_hanging()
    assert mine == theirs and len(mine) == 1
    again = _samsa_cli("abort", "--topic", "t2", "--partition", "0", "--start-offset", "0",
                       "--bootstrap-server", bs)  # fmt: skip
    assert again.returncode == 1
    assert again.stderr.strip() == (
        "Could not find any open transactions starting at offset 0 on partition t2-0"
    )
