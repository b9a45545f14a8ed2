"""Differential scenarios of the idempotent producer (rules 2-6, 9, 11, 13): the same raw
Produce and InitProducerId requests sent to samsa and to Apache Kafka must be answered alike,
and leave the same log behind (each scenario ends with a fetch of what was written)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from _scenario import TS, batch, producer, topic

from samsa.testing.oracle import Outcome, Side

Run = Callable[..., Outcome]


def log(side: Side, name: str) -> None:
    side.fetch("log", {(name, 0): 0})


def test_duplicate_is_answered_with_its_original_offset(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = topic(s)
        pid, epoch = producer(s)
        first, second = batch(pid, epoch, 0, 3), batch(pid, epoch, 3, 2)
        s.produce("seq0", {(t, 0): first})
        s.produce("seq3", {(t, 0): second})
        s.produce("dup-seq0", {(t, 0): first})
        s.produce("dup-seq3", {(t, 0): second})
        s.produce("seq5", {(t, 0): batch(pid, epoch, 5)})
        log(s, t)

    differential(scenario)


def test_gap_is_out_of_order_and_writes_nothing(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = topic(s)
        pid, epoch = producer(s)
        s.produce("seq0", {(t, 0): batch(pid, epoch, 0, 2)})
        s.produce("gap", {(t, 0): batch(pid, epoch, 5)})
        s.produce("overlap", {(t, 0): batch(pid, epoch, 1)})
        s.produce("next", {(t, 0): batch(pid, epoch, 2)})
        log(s, t)

    differential(scenario)


def test_partitions_of_one_request_are_judged_apart(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = s.unique("t")
        s.create_topic(t, 2)
        pid, epoch = producer(s)
        s.produce("both", {(t, 0): batch(pid, epoch, 0), (t, 1): batch(pid, epoch, 0)})
        s.produce("gap-on-1", {(t, 0): batch(pid, epoch, 1), (t, 1): batch(pid, epoch, 7)})
        s.fetch("log", {(t, 0): 0, (t, 1): 0})

    differential(scenario)


def test_fenced_epoch_and_client_epoch_bump(differential: Run) -> None:
    """KIP-360 on the produce path: a higher epoch starting at sequence 0 is taken (the
    producer bumped its own epoch), one starting elsewhere is out of order, and the old epoch
    is fenced."""

    def scenario(s: Side) -> None:
        t = topic(s)
        pid, epoch = producer(s)
        s.produce("e0-seq0", {(t, 0): batch(pid, epoch, 0, 2)})
        s.produce("e1-seq4", {(t, 0): batch(pid, epoch + 1, 4)})
        s.produce("e1-seq0", {(t, 0): batch(pid, epoch + 1, 0)})
        s.produce("e0-seq2", {(t, 0): batch(pid, epoch, 2)})
        s.produce("e0-dup", {(t, 0): batch(pid, epoch, 0, 2)})
        s.produce("e1-seq1", {(t, 0): batch(pid, epoch + 1, 1)})
        log(s, t)

    differential(scenario)


def test_unknown_producer_id_starts_at_any_sequence(differential: Run) -> None:
    """A producer id the partition has no state for (issued, never seen here) is accepted at
    any sequence (rule 5): no UNKNOWN_PRODUCER_ID since Kafka 2.5. (An id the broker never
    issued is D-REC-3, tests/oracle/test_record_validation.py.)"""

    def scenario(s: Side) -> None:
        t = topic(s)
        pid, epoch = producer(s)
        s.produce("unknown-seq42", {(t, 0): batch(pid, epoch, 42, 2)})
        s.produce("next", {(t, 0): batch(pid, epoch, 44)})
        s.produce("gap", {(t, 0): batch(pid, epoch, 46)})
        log(s, t)

    differential(scenario)


def test_init_producer_id_gives_fresh_ids_and_kip360_bumps(differential: Run) -> None:
    """Without a transactional id every InitProducerId is a new producer at epoch 0, even when
    the request names the old one (KIP-360's bump is for transactional ids); with one, the
    epoch is bumped when the current one is named, the retry of the previous one gets the
    current one again, and any other is fenced."""

    def scenario(s: Side) -> None:
        a, _ = producer(s, "idem-1")
        producer(s, "idem-2")
        s.init_producer_id("idem-named", producer_id=a, epoch=0)
        txn = s.unique("txn")
        s.find_coordinator("coordinator", txn)
        first = s.init_producer_id("txn-init", txn)
        pid, epoch = int(first.producer_id), int(first.producer_epoch)
        s.init_producer_id("txn-bump", txn, producer_id=pid, epoch=epoch)
        s.init_producer_id("txn-retry-previous", txn, producer_id=pid, epoch=epoch)
        s.init_producer_id("txn-stale", txn, producer_id=pid, epoch=epoch + 5)
        s.init_producer_id("txn-other-pid", txn, producer_id=a, epoch=0)
        s.init_producer_id("txn-reinit", txn)

    differential(scenario)


def test_sequence_wrap_within_a_producer(differential: Run) -> None:
    """A producer with no state starts near 2^31-1 (rule 5); its batch spanning the top wraps
    to 0, the next starts at the wrapped sequence, and the wrapped batch's retry is a
    duplicate."""

    def scenario(s: Side) -> None:
        t = topic(s)
        pid, epoch = producer(s)
        wrapping = batch(pid, epoch, 2**31 - 2, 3)  # sequences 2^31-2, 2^31-1, 0
        s.produce("wrapping", {(t, 0): wrapping})
        s.produce("after-wrap", {(t, 0): batch(pid, epoch, 1)})
        s.produce("dup-wrapping", {(t, 0): wrapping})
        s.produce("stale-top", {(t, 0): batch(pid, epoch, 2**31 - 1)})
        s.produce("next", {(t, 0): batch(pid, epoch, 2, 2)})
        log(s, t)

    differential(scenario)


def test_duplicate_older_than_the_last_five_batches(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = topic(s)
        pid, epoch = producer(s)
        batches = [batch(pid, epoch, i) for i in range(7)]
        for i, b in enumerate(batches):
            s.produce(f"seq{i}", {(t, 0): b})
        s.produce("dup-seq2-in-window", {(t, 0): batches[2]})
        s.produce("dup-seq1-too-old", {(t, 0): batches[1]})
        s.produce("dup-seq0-too-old", {(t, 0): batches[0]})
        s.produce("dup-seq6-last", {(t, 0): batches[6]})
        s.produce("seq7", {(t, 0): batch(pid, epoch, 7)})
        log(s, t)

    differential(scenario)


def test_real_client_idempotent_producer_leaves_the_same_log(differential: Run) -> None:
    """confluent-kafka's idempotent producer (librdkafka, five requests in flight) against
    each broker: its delivery reports and the batches it left (producer id, epoch,
    sequences)."""
    from confluent_kafka import Producer

    def scenario(s: Side) -> None:
        t = topic(s, 2)
        p = Producer({"bootstrap.servers": s.bootstrap, "enable.idempotence": True,
                      "linger.ms": 5, "batch.num.messages": 3})  # fmt: skip
        reports: list[tuple[str | None, int, int]] = []

        def report(err: Any, msg: Any) -> None:
            reports.append((err.name() if err else None, msg.partition(), msg.offset()))

        for i in range(12):
            p.produce(t, b"m%d" % i, partition=i % 2, timestamp=TS, on_delivery=report)
        assert p.flush(30) == 0
        s.note("delivery-reports", sorted(reports, key=lambda r: (r[1], r[2])))
        s.fetch("log", {(t, 0): 0, (t, 1): 0})

    differential(scenario)
