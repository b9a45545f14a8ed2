"""Differential scenarios of transactions (rules 14-19, 36): the coordinator's answers to the
transactional APIs, TV1 (AddPartitionsToTxn, EndTxn v4) and TV2 (Produce v12 adding partitions
implicitly, EndTxn v5 bumping the epoch), their misuses, and what read_committed readers see:
the last stable offset in ListOffsets and Fetch and the aborted-transaction list."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from _scenario import TS, producer, topic

from samsa.protocol.constants import READ_COMMITTED
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing.oracle import Outcome, Side, transient

Run = Callable[..., Outcome]


def txn_batch(pid: int, epoch: int, seq: int, count: int = 1, value: bytes = b"t") -> bytes:
    records = [NewRecord(value=value + b"%d" % i, timestamp=TS) for i in range(count)]
    return build_batch(
        records, producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=True
    )


def add_partitions(
    s: Side, label: str, txn: str, pid: int, epoch: int, parts: dict[str, tuple[int, ...]]
) -> Any:
    v = 3
    req = make_request(
        ApiKey.ADD_PARTITIONS_TO_TXN, v, "AddPartitionsToTxnRequest",
        v3_and_below_transactional_id=txn, v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=tuple(
            make_request(ApiKey.ADD_PARTITIONS_TO_TXN, v, "AddPartitionsToTxnTopic", name=t,
                         partitions=p)
            for t, p in parts.items()
        ),
    )  # fmt: skip
    return s.call(label, ApiKey.ADD_PARTITIONS_TO_TXN, v, req, retry=transient)


def end_txn(s: Side, label: str, txn: str, pid: int, epoch: int, commit: bool, v: int = 4) -> Any:
    req = make_request(
        ApiKey.END_TXN, v, "EndTxnRequest", transactional_id=txn, producer_id=pid,
        producer_epoch=epoch, committed=commit,
    )  # fmt: skip
    return s.call(label, ApiKey.END_TXN, v, req, retry=transient)


def add_offsets(s: Side, label: str, txn: str, pid: int, epoch: int, group: str) -> Any:
    v = 4
    req = make_request(
        ApiKey.ADD_OFFSETS_TO_TXN, v, "AddOffsetsToTxnRequest", transactional_id=txn,
        producer_id=pid, producer_epoch=epoch, group_id=group,
    )  # fmt: skip
    return s.call(label, ApiKey.ADD_OFFSETS_TO_TXN, v, req, retry=transient)


def txn_offset_commit(
    s: Side, label: str, txn: str, pid: int, epoch: int, group: str, t: str, offset: int,
    v: int = 4, generation: int = -1, member: str = "",
) -> Any:  # fmt: skip
    req = make_request(
        ApiKey.TXN_OFFSET_COMMIT, v, "TxnOffsetCommitRequest", transactional_id=txn,
        group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=generation,
        member_id=member,
        group_instance_id=None,
        topics=(make_request(
            ApiKey.TXN_OFFSET_COMMIT, v, "TxnOffsetCommitRequestTopic", name=t,
            partitions=(make_request(
                ApiKey.TXN_OFFSET_COMMIT, v, "TxnOffsetCommitRequestPartition",
                partition_index=0, committed_offset=offset, committed_leader_epoch=-1,
                committed_metadata="m",
            ),),
        ),),
    )  # fmt: skip
    return s.call(label, ApiKey.TXN_OFFSET_COMMIT, v, req, retry=transient)


def _unstable(resp: Any) -> bool:
    """Offsets whose transaction's marker is still being written: a consumer retries."""
    codes = [int(p.error_code) for t in resp.topics for p in t.partitions]
    return transient(resp) or ErrorCode.UNSTABLE_OFFSET_COMMIT in codes


def offset_fetch(s: Side, label: str, group: str, t: str, settled: bool = True) -> Any:
    """OffsetFetch requiring stable offsets; ``settled``: once no transaction is pending."""
    v = 7
    req = make_request(
        ApiKey.OFFSET_FETCH, v, "OffsetFetchRequest", group_id=group, require_stable=True,
        topics=(make_request(ApiKey.OFFSET_FETCH, v, "OffsetFetchRequestTopic", name=t,
                             partition_indexes=(0,)),),
    )  # fmt: skip
    return s.call(label, ApiKey.OFFSET_FETCH, v, req, retry=_unstable if settled else transient)


def list_offsets_request(t: str, isolation: int, timestamp: int = -1) -> Any:
    v = 7
    return make_request(
        ApiKey.LIST_OFFSETS, v, "ListOffsetsRequest", replica_id=-1, isolation_level=isolation,
        topics=(make_request(
            ApiKey.LIST_OFFSETS, v, "ListOffsetsTopic", name=t,
            partitions=(make_request(ApiKey.LIST_OFFSETS, v, "ListOffsetsPartition",
                                     partition_index=0, current_leader_epoch=-1,
                                     timestamp=timestamp),),
        ),),
    )  # fmt: skip


def list_offsets(s: Side, label: str, t: str, isolation: int, timestamp: int = -1) -> Any:
    return s.call(label, ApiKey.LIST_OFFSETS, 7, list_offsets_request(t, isolation, timestamp))


def _completing(resp: Any) -> bool:
    """A transaction decided but its markers not all written yet (Kafka answers EndTxn
    before writing them): what a client polling the state waits out."""
    return any(str(t.transaction_state).startswith("Prepare") for t in resp.transaction_states)


def describe(s: Side, label: str, txn: str) -> Any:
    req = make_request(
        ApiKey.DESCRIBE_TRANSACTIONS, 0, "DescribeTransactionsRequest", transactional_ids=(txn,)
    )
    return s.call(label, ApiKey.DESCRIBE_TRANSACTIONS, 0, req, retry=_completing)


def settle(s: Side, t: str, timeout: float = 15.0) -> None:
    """Wait (unrecorded) until no transaction is open on ``t``-0: the last stable offset has
    reached the high watermark. Kafka writes the markers after answering EndTxn, so right
    after a commit its LSO may still lag; a read_committed reader waits the same way."""
    deadline = time.monotonic() + timeout
    while True:
        committed, latest = (
            int(
                s.conn.request(ApiKey.LIST_OFFSETS, 7, list_offsets_request(t, iso))
                .topics[0]
                .partitions[0]
                .offset
            )
            for iso in (1, 0)
        )
        if committed == latest or time.monotonic() > deadline:
            return
        time.sleep(0.05)


def list_transactions(s: Side, label: str) -> Any:
    v = 2
    req = make_request(
        ApiKey.LIST_TRANSACTIONS, v, "ListTransactionsRequest", state_filters=(),
        producer_id_filters=(), duration_filter=-1,
        transactional_id_pattern="^" + s.unique().replace(".", "\\\\.") + ".*",
    )  # fmt: skip
    return s.call(label, ApiKey.LIST_TRANSACTIONS, v, req)


def describe_producers(s: Side, label: str, t: str) -> Any:
    req = make_request(
        ApiKey.DESCRIBE_PRODUCERS, 0, "DescribeProducersRequest",
        topics=(make_request(ApiKey.DESCRIBE_PRODUCERS, 0, "TopicRequest", name=t,
                             partition_indexes=(0,)),),
    )  # fmt: skip
    return s.call(label, ApiKey.DESCRIBE_PRODUCERS, 0, req)


def verify_only(
    s: Side, label: str, txn: str, pid: int, epoch: int, parts: dict[str, tuple[int, ...]]
) -> Any:
    """AddPartitionsToTxn v4's broker-to-coordinator check (KIP-890 part 1)."""
    v = 4
    req = make_request(
        ApiKey.ADD_PARTITIONS_TO_TXN, v, "AddPartitionsToTxnRequest",
        transactions=(make_request(
            ApiKey.ADD_PARTITIONS_TO_TXN, v, "AddPartitionsToTxnTransaction",
            transactional_id=txn, producer_id=pid, producer_epoch=epoch, verify_only=True,
            topics=tuple(
                make_request(ApiKey.ADD_PARTITIONS_TO_TXN, v, "AddPartitionsToTxnTopic",
                             name=t, partitions=p)
                for t, p in parts.items()
            ),
        ),),
    )  # fmt: skip
    return s.call(label, ApiKey.ADD_PARTITIONS_TO_TXN, v, req)


def consumer_group(s: Side) -> str:
    """The scenario's group, its coordinator found (Kafka creates __consumer_offsets then)."""
    group = s.unique("g")
    s.find_coordinator("group-coordinator", group, key_type=0)
    return group


def begin(s: Side, suffix: str = "txn") -> tuple[str, int, int]:
    txn = s.unique(suffix)
    s.find_coordinator(f"coordinator-{suffix}", txn)
    pid, epoch = producer(s, f"init-{suffix}", txn)
    return txn, pid, epoch


def test_tv1_commit_and_abort_as_read_committed_sees_them(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = topic(s)
        txn, pid, epoch = begin(s)
        add_partitions(s, "add", txn, pid, epoch, {t: (0,)})
        s.produce("produce-1", {(t, 0): txn_batch(pid, epoch, 0, 2)}, transactional_id=txn)
        list_offsets(s, "lso-open", t, READ_COMMITTED)
        list_offsets(s, "hw-open", t, 0)
        s.fetch("fetch-committed-open", {(t, 0): 0}, isolation_level=READ_COMMITTED)
        describe(s, "describe-ongoing", txn)
        list_transactions(s, "list-ongoing")
        describe_producers(s, "producers-open", t)
        end_txn(s, "abort", txn, pid, epoch, commit=False)
        add_partitions(s, "add-2", txn, pid, epoch, {t: (0,)})
        s.produce("produce-2", {(t, 0): txn_batch(pid, epoch, 2)}, transactional_id=txn)
        end_txn(s, "commit", txn, pid, epoch, commit=True)
        end_txn(s, "commit-retried", txn, pid, epoch, commit=True)
        end_txn(s, "abort-after-commit", txn, pid, epoch, commit=False)
        settle(s, t)
        list_offsets(s, "lso-closed", t, READ_COMMITTED)
        s.fetch("fetch-committed", {(t, 0): 0}, isolation_level=READ_COMMITTED)
        s.fetch("fetch-uncommitted", {(t, 0): 0})
        s.fetch("fetch-committed-from-2", {(t, 0): 2}, isolation_level=READ_COMMITTED)
        describe(s, "describe-complete", txn)
        describe_producers(s, "producers-closed", t)

    differential(scenario)


def test_tv1_misuse_errors(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = topic(s)
        other = topic(s, suffix="other")
        group = consumer_group(s)
        txn, pid, epoch = begin(s)
        end_txn(s, "commit-empty", txn, pid, epoch, commit=True)
        end_txn(s, "abort-empty", txn, pid, epoch, commit=False)
        add_partitions(s, "add-wrong-epoch", txn, pid, epoch + 1, {t: (0,)})
        add_partitions(s, "add-wrong-pid", txn, pid + 1000, epoch, {t: (0,)})
        add_partitions(s, "add-unknown-id", s.unique("nope"), pid, epoch, {t: (0,)})
        add_partitions(s, "add-unknown-topic", txn, pid, epoch, {s.unique("missing"): (0,)})
        add_partitions(s, "add", txn, pid, epoch, {t: (0,)})
        s.produce("produce-not-added", {(other, 0): txn_batch(pid, epoch, 0)},
                  transactional_id=txn)  # fmt: skip
        s.produce("produce-not-added-v11", {(other, 0): txn_batch(pid, epoch, 0)},
                  transactional_id=txn, version=11)  # fmt: skip
        s.produce("produce", {(t, 0): txn_batch(pid, epoch, 0)}, transactional_id=txn)
        verify_only(s, "verify", txn, pid, epoch, {t: (0,), other: (0,)})
        verify_only(s, "verify-wrong-epoch", txn, pid, epoch + 1, {t: (0,)})
        verify_only(s, "verify-wrong-pid", txn, pid + 1000, epoch, {t: (0,)})
        txn_offset_commit(s, "offsets-without-add-v3", txn, pid, epoch, group, t, 1, v=3)
        txn_offset_commit(s, "offsets-without-add", txn, pid, epoch, group, t, 1)
        end_txn(s, "end-wrong-pid", txn, pid + 1000, epoch, commit=True)
        # A new instance fences this one; its open transaction is aborted first.
        producer(s, "init-fencing", txn)
        add_offsets(s, "add-offsets-fenced", txn, pid, epoch, group)
        txn_offset_commit(s, "offsets-fenced", txn, pid, epoch, group, t, 1)
        add_partitions(s, "add-fenced", txn, pid, epoch, {t: (0,)})
        s.produce("produce-fenced", {(t, 0): txn_batch(pid, epoch, 1)}, transactional_id=txn)
        end_txn(s, "commit-fenced", txn, pid, epoch, commit=True)
        describe(s, "describe", txn)
        settle(s, t)
        s.fetch("fetch-committed", {(t, 0): 0, (other, 0): 0}, isolation_level=READ_COMMITTED)

    differential(scenario)


def test_tv1_offsets_commit_with_the_transaction(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = topic(s)
        group = consumer_group(s)
        txn, pid, epoch = begin(s)
        add_offsets(s, "add-offsets", txn, pid, epoch, group)
        txn_offset_commit(s, "offsets", txn, pid, epoch, group, t, 7)
        # KIP-447: a group-aware commit names a member and generation the group must have.
        txn_offset_commit(s, "offsets-unknown-member", txn, pid, epoch, group, t, 8,
                          generation=3, member="nobody")  # fmt: skip
        txn_offset_commit(s, "offsets-generation-only", txn, pid, epoch, group, t, 8,
                          generation=3)  # fmt: skip
        txn_offset_commit(s, "offsets-wrong-pid", txn, pid + 1000, epoch, group, t, 8)
        offset_fetch(s, "fetch-pending", group, t, settled=False)
        end_txn(s, "commit", txn, pid, epoch, commit=True)
        offset_fetch(s, "fetch-committed", group, t)
        add_offsets(s, "add-offsets-2", txn, pid, epoch, group)
        txn_offset_commit(s, "offsets-2", txn, pid, epoch, group, t, 9)
        end_txn(s, "abort", txn, pid, epoch, commit=False)
        offset_fetch(s, "fetch-after-abort", group, t)

    differential(scenario)


def test_tv2_implicit_partitions_and_epoch_bump(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = topic(s)
        group = consumer_group(s)
        txn, pid, epoch = begin(s)
        s.produce("produce", {(t, 0): txn_batch(pid, epoch, 0, 2)}, transactional_id=txn,
                  version=12)  # fmt: skip
        describe(s, "describe-ongoing", txn)
        add_offsets(s, "add-offsets", txn, pid, epoch, group)
        txn_offset_commit(s, "offsets", txn, pid, epoch, group, t, 2, v=5)
        end = end_txn(s, "commit", txn, pid, epoch, commit=True, v=5)
        bumped = int(end.producer_epoch)
        end_txn(s, "commit-old-epoch", txn, pid, epoch, commit=True, v=5)
        s.produce("produce-old-epoch", {(t, 0): txn_batch(pid, epoch, 2)},
                  transactional_id=txn, version=12)  # fmt: skip
        s.produce("produce-bumped", {(t, 0): txn_batch(pid, bumped, 0)}, transactional_id=txn,
                  version=12)  # fmt: skip
        end_txn(s, "abort", txn, pid, bumped, commit=False, v=5)
        end_txn(s, "abort-empty", txn, pid, bumped + 1, commit=False, v=5)
        offset_fetch(s, "offsets-fetched", group, t)
        settle(s, t)
        s.fetch("fetch-committed", {(t, 0): 0}, isolation_level=READ_COMMITTED)
        describe(s, "describe", txn)

    differential(scenario)


def test_real_client_transactions_leave_the_same_log(differential: Run) -> None:
    """confluent-kafka's transactional producer (librdkafka) against each broker: an aborted
    and a committed transaction; its delivery reports, then what a read_committed fetch and
    ListOffsets see."""
    from confluent_kafka import Producer

    def scenario(s: Side) -> None:
        t = topic(s)
        p = Producer({"bootstrap.servers": s.bootstrap, "transactional.id": s.unique("txn"),
                      "linger.ms": 0})  # fmt: skip
        reports: list[tuple[str | None, int]] = []

        def report(err: Any, msg: Any) -> None:
            reports.append((err.name() if err else None, msg.offset()))

        p.init_transactions(30)
        for commit, values in ((False, [b"a1", b"a2"]), (True, [b"c1", b"c2", b"c3"])):
            p.begin_transaction()
            for v in values:
                p.produce(t, v, partition=0, timestamp=TS, on_delivery=report)
            p.flush(30)
            (p.commit_transaction if commit else p.abort_transaction)(30)
        s.note("delivery-reports", reports)
        settle(s, t)
        list_offsets(s, "lso", t, READ_COMMITTED)
        s.fetch("fetch-committed", {(t, 0): 0}, isolation_level=READ_COMMITTED)

    differential(scenario)
