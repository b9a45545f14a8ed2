"""A consume-transform-produce copier (confluent-kafka), run as a subprocess by
test_transactions: copies IN to OUT exactly once, uppercasing each value.

usage: _txn_copier.py BOOTSTRAP IN OUT GROUP TRANSACTIONAL_ID

Each poll's records are produced and their consumer positions sent to the transaction, then
committed together. The test SIGKILLs it at arbitrary moments and starts it again: the
restarted copier's init_transactions fences (and aborts) whatever the dead one left open,
and it resumes from the offsets the last committed transaction stored.
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer

BATCH = 50
PAUSE = 0.02


def main() -> None:
    bootstrap, src, dst, group, txn_id = sys.argv[1:6]
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 1000,
            "heartbeat.interval.ms": 200,
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "transaction.timeout.ms": 10_000,
            "linger.ms": 5,
        }
    )
    producer.init_transactions(30)
    consumer.subscribe([src])
    print("ready", flush=True)
    while True:
        msgs = consumer.consume(BATCH, 0.2)
        msgs = [m for m in msgs if m.error() is None]
        if not msgs:
            continue
        producer.begin_transaction()
        for m in msgs:
            producer.produce(dst, value=m.value().upper(), key=m.key(), partition=m.partition())
        try:
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            producer.commit_transaction(30)
            print("committed", len(msgs), flush=True)
        except KafkaException as exc:
            if exc.args[0].txn_requires_abort():
                producer.abort_transaction(30)
                # Rewind to the committed offsets: this batch is copied again.
                for tp in consumer.committed(consumer.assignment(), 30):
                    if tp.offset < 0:
                        tp.offset = OFFSET_BEGINNING
                    consumer.seek(tp)
                continue
            raise
        time.sleep(PAUSE)  # slow enough for the test's kills to land mid-copy


if __name__ == "__main__":
    main()
