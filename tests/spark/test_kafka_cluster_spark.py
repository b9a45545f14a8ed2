"""The Spark source (streaming, with a checkpoint) and the exactly-once sink on a 3-node
Apache Kafka cluster, with a failed task, a driver crash after the sink's commit and a
SIGKILLed partition leader in the same run: the restarted query finishes and the output
holds every input record's result exactly once (read_committed)."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from _broker import BrokerProcess
from samsa.client import Admin, Producer
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.spark._options import SinkOptions, SparkOptionError
from samsa.spark._write import commit_job, committed_batches, write_task
from samsa.testing import read_topic
from samsa.testing.kafka import KafkaCluster, KafkaNode

pytestmark = pytest.mark.timeout(600)


def query(spark: Any, bs: str, src: str, out: str, checkpoint: str, **sink: str) -> Any:
    w = (
        spark.readStream.format("samsa")
        .option("kafka.bootstrap.servers", bs)
        .option("subscribe", src)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "300")
        .load()
        .selectExpr("CAST(CAST(value AS STRING) AS INT) AS n", "partition")
        .selectExpr("CAST(n AS STRING) AS key", "CAST(n * 10 AS STRING) AS value", "partition")
        .writeStream.format("samsa")
        .option("kafka.bootstrap.servers", bs)
        .option("topic", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
    )
    for k, v in sink.items():
        w = w.option(k, v)
    return w.start()


def run(spark: Any, bs: str, checkpoint: str, **sink: str) -> bool:
    """Run the query to its end; True if it ended in the injected driver crash. A Python
    worker too slow to connect back to Spark (a loaded machine) fails the query too: that
    is one more driver restart from the checkpoint, which exactly-once must survive."""
    for _ in range(3):
        q = query(spark, bs, "ksrc", "kout", checkpoint, **sink)
        try:
            assert q.awaitTermination(240) and q.exception() is None
            return False
        except Exception as exc:
            if "injected driver crash" in str(exc):
                return True
            if "Python worker failed to connect back" not in str(exc):
                raise
    raise AssertionError("the query failed three times")


def test_stream_exactly_once_with_task_failure_driver_crash_and_leader_kill(
    spark: Any, kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    bs, n = kafka_cluster.bootstrap, 900
    with Admin({"bootstrap.servers": bs}) as admin:
        for t in ("ksrc", "kout"):
            admin.create_topic(t, 3)  # replication factor 3: the broker's default
    kafka_cluster.wait_in_sync("kout")
    with Producer({"bootstrap.servers": bs}) as p:
        for i in range(n):
            p.produce("ksrc", b"%d" % i, partition=i % 3)
        assert p.flush(30) == 0
    checkpoint = str(tmp_path / "checkpoint")
    moves: list[tuple[int, int, int, int]] = []

    def kill_when_output_appears() -> None:
        # once the first batch's output is in the log, kill the output's partition-0 leader
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ends = kafka_cluster.leaders("kout")
            with Admin({"bootstrap.servers": bs}) as admin:
                if sum(admin.list_offsets([("kout", p) for p in ends], -1).values()) > 0:
                    break
            time.sleep(0.1)
        moves.append(kafka_cluster.kill_leader("kout", 0))  # and restart it

    killer = threading.Thread(target=kill_when_output_appears, daemon=True)
    killer.start()
    # attempt 0 of the task writing partition 0 dies after 50 rows (once); the driver dies after
    # the sink committed batch 1, before Spark's commit log says so
    crashed = run(spark, bs, checkpoint, injectTaskFailure=f"0:50:{tmp_path / 'once'}",
                  injectCommitFailure="1")  # fmt: skip
    assert crashed
    killer.join(180)
    kafka_cluster.wait_all()
    # the driver restarts from the checkpoint: batch 1 is replayed and aborted by the sink
    assert not run(spark, bs, checkpoint)
    old, old_epoch, new, new_epoch = moves[0]
    assert new != old and new_epoch > old_epoch
    got = collections.Counter(r.value for r in read_topic(bs, "kout", timeout=30))
    assert got == collections.Counter(b"%d" % (i * 10) for i in range(n))
    # the failed attempt's rows and the replayed batch are in the log, aborted
    assert len(read_topic(bs, "kout", committed=False, timeout=30)) >= n + 50


def _rows(lo: int, hi: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"value": [str(i) for i in range(lo, hi)]})


def _max_version(bootstrap: str, api: int) -> int:
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with BlockingConnection(host, int(port), timeout=10) as conn:
        req = make_request(
            ApiKey.API_VERSIONS, 3, "ApiVersionsRequest",
            client_software_name="samsa-test", client_software_version="0",
        )  # fmt: skip
        resp = conn.request(ApiKey.API_VERSIONS, 3, req)
    return max((int(k.max_version) for k in resp.api_keys if int(k.api_key) == api), default=-1)


def _init_2pc(bootstrap: str, txn_id: str, *, keep_prepared: bool) -> int:
    """InitProducerId v6 with enable_2pc (to the only node, which coordinates): its error."""
    host, port = bootstrap.rsplit(":", 1)
    req = make_request(
        ApiKey.INIT_PRODUCER_ID, 6, "InitProducerIdRequest", transactional_id=txn_id,
        transaction_timeout=60_000, producer_id=-1, producer_epoch=-1, enable2_pc=True,
        keep_prepared_txn=keep_prepared,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        with BlockingConnection(host, int(port), timeout=10) as conn:
            code = int(conn.request(ApiKey.INIT_PRODUCER_ID, 6, req).error_code)
        loading = (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if code not in loading or time.monotonic() > deadline:
            return code
        time.sleep(0.1)


def _tasks(opts: SinkOptions) -> list[Any]:
    return [
        write_task(opts, iter([_rows(0, 30)]), 0, 0),
        write_task(opts, iter([_rows(30, 50)]), 1, 0),
    ]


def _sink(bs: str, topic: str, ckpt: Path, **client: str) -> SinkOptions:
    opts = {"kafka.bootstrap.servers": bs, "topic": topic, "checkpointLocation": str(ckpt)}
    return SinkOptions.parse({**opts, **client}, streaming=True, job_id="unused")


def test_sink_hand_off_survives_the_coordinator_node_killed(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    """The sink's task-to-driver hand-off on the cluster: two tasks write their
    transactions, the node coordinating their transactional ids is SIGKILLed (and
    restarted), and the driver's commit, then a replay of the same batch, leaves every
    record once: the driver ends the tasks' open transactions at the new coordinator."""
    bs = kafka_cluster.bootstrap
    kafka_cluster.wait_all()
    assert _max_version(bs, ApiKey.INIT_PRODUCER_ID) == 5  # no 2PC without unstable APIs
    with Admin({"bootstrap.servers": bs}) as admin:
        admin.create_topic("hand-off", 1)
    opts = _sink(bs, "hand-off", tmp_path / "ckpt")
    msgs = _tasks(opts)
    tid = msgs[0].transactional_id
    assert tid is not None
    old, new = kafka_cluster.kill_coordinator(tid, transaction=True)
    assert new != old
    first = commit_job(opts, msgs, 0)
    second = commit_job(opts, msgs, 0)
    assert (first.committed, first.replayed) == (2, 0)
    assert (second.committed, second.replayed) == (0, 2)
    assert committed_batches(opts, [0, 1]) == {0: 1, 1: 1}
    got = collections.Counter(r.value for r in read_topic(bs, "hand-off", timeout=30))
    assert got == collections.Counter(b"%d" % i for i in range(50))


def test_2pc_hand_off_is_refused_by_kafka_and_aborted(tmp_path: Path) -> None:
    """With KIP-939's 2PC, Kafka 4.4 serves InitProducerId v6 only with
    unstable.api.versions.enable, and even then refuses keep_prepared_txn
    (UNSUPPORTED_VERSION), which samsa serves (D-CLUSTER-1): the driver cannot take the
    tasks' prepared transactions over, so it aborts them (they have no timeout) and fails
    with a clear error; nothing stays open holding the last stable offset back."""
    node = KafkaNode(
        tmp_path / "kafka",
        overrides={
            "unstable.api.versions.enable": "true",
            "transaction.two.phase.commit.enable": "true",
            "transaction.state.log.num.partitions": "2",
            "offsets.topic.num.partitions": "2",
        },
    ).start()
    samsa = BrokerProcess(tmp_path / "samsa", {"transaction.two.phase.commit.enable": "true"})
    try:
        bs = node.bootstrap
        assert _max_version(bs, ApiKey.INIT_PRODUCER_ID) >= 6  # behind unstable APIs only
        with Admin({"bootstrap.servers": bs}) as admin:
            admin.create_topic("hand-off", 1)
        opts = _sink(bs, "hand-off", tmp_path / "ckpt",
                     **{"kafka.transaction.two.phase.commit.enable": "true"})  # fmt: skip
        msgs = _tasks(opts)
        node.kill()  # between the tasks' prepare and the driver's commit
        node.start()
        with pytest.raises(SparkOptionError, match="keep_prepared_txn: UNSUPPORTED_VERSION"):
            commit_job(opts, msgs, 0)
        with Producer({"bootstrap.servers": bs}) as p:
            p.produce("hand-off", b"after")
            assert p.flush(30) == 0
        # nothing of the tasks is visible, and no open transaction holds the LSO back
        assert [r.value for r in read_topic(bs, "hand-off", timeout=30)] == [b"after"]
        # D-CLUSTER-1: the same take-over, raw: samsa hands it over, Kafka 4.4 refuses
        samsa.start()
        for target, refused in ((bs, True), (samsa.bootstrap, False)):
            assert _init_2pc(target, "raw-2pc", keep_prepared=False) == 0
            code = _init_2pc(target, "raw-2pc", keep_prepared=True)
            assert code == (ErrorCode.UNSUPPORTED_VERSION if refused else 0), target
    finally:
        samsa.stop()
        node.stop()
