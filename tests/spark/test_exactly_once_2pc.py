"""The exactly-once sink's task-to-driver hand-off by two-phase commit (KIP-939, rule 37):
tasks prepare, the broker (the transaction coordinator) is SIGKILLed and restarted, and the
driver's commit takes the prepared transactions over with keep_prepared_txn; a second commit
of the same batch is a replay; the output holds every record once."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pyarrow as pa
import pytest

from _broker import BrokerProcess
from samsa.client import Admin
from samsa.spark._options import SinkOptions
from samsa.spark._write import commit_job, committed_batches, write_task
from samsa.testing import read_topic

pytestmark = pytest.mark.timeout(120)


def test_2pc_hand_off_survives_a_coordinator_crash(tmp_path: Path) -> None:
    b = BrokerProcess(
        tmp_path / "data",
        {
            "transaction.two.phase.commit.enable": "true",
            "transaction.state.log.num.partitions": "2",
            "offsets.topic.num.partitions": "2",
            "log.flush.interval.messages": "1",
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "100",
        },
    ).start()
    try:
        with Admin({"bootstrap.servers": b.bootstrap}) as admin:
            admin.create_topic("tpc-out", 1)
        opts = SinkOptions.parse(
            {
                "kafka.bootstrap.servers": b.bootstrap,
                "kafka.transaction.two.phase.commit.enable": "true",
                "kafka.transaction.timeout.ms": "1000",  # 2PC: not applied
                "topic": "tpc-out",
                "checkpointLocation": str(tmp_path / "ckpt"),
            },
            streaming=True,
            job_id="unused",
        )

        def rows(lo: int, hi: int) -> pa.RecordBatch:
            return pa.RecordBatch.from_pydict({"value": [str(i) for i in range(lo, hi)]})

        msgs = [
            write_task(opts, iter([rows(0, 30)]), 0, 0),
            write_task(opts, iter([rows(30, 50)]), 1, 0),
        ]
        b.kill()  # between the tasks' prepare and the driver's commit
        b.start()
        time.sleep(1.5)  # past the tasks' transaction.timeout.ms, many checks later
        first = commit_job(opts, msgs, 0)
        # The driver took the transaction over (keep_prepared_txn bumps the epoch) and
        # committed it with EndTxn v5 (another bump), not under the task's identity.
        tid = msgs[0].transactional_id
        assert tid is not None
        with Admin({"bootstrap.servers": b.bootstrap}) as admin:
            desc = admin.describe_transactions([tid])[tid]
        assert (desc.state, desc.epoch) == ("CompleteCommit", msgs[0].epoch + 2)
        second = commit_job(opts, msgs, 0)
        assert (first.committed, first.replayed) == (2, 0)
        assert (second.committed, second.replayed) == (0, 2)
        assert committed_batches(opts, [0, 1]) == {0: 1, 1: 1}
        got = collections.Counter(r.value for r in read_topic(b.bootstrap, "tpc-out"))
        assert got == collections.Counter(b"%d" % i for i in range(50))
    finally:
        b.stop()
