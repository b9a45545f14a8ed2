"""samsa's clients against a samsa broker: a transactional producer's offsets
(send_offsets_to_transaction) and a consumer's plain commits of the same group partition are
ordered by their position in ``__consumer_offsets``, as in Kafka. A plain commit made after
the TxnOffsetCommit and before the transaction commits stays; one made before it is
replaced. A restart (replay of the topic) gives the same committed offsets."""

from __future__ import annotations

import uuid

from _broker import BrokerProcess
from samsa.client import Admin, Consumer, KafkaError, Producer, TopicPartition
from samsa.protocol.errors import ErrorCode

T = 20.0
OVERRIDES = {
    "transaction.state.log.num.partitions": "2",
    "offsets.topic.num.partitions": "2",
}


def test_plain_and_transactional_commits_ordered_by_the_log(
    broker_factory: type[BrokerProcess],
) -> None:
    b = broker_factory(overrides=OVERRIDES).start()
    topic = f"txo-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:6]}"
    late, early = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with Admin({"bootstrap.servers": b.bootstrap}) as admin:
        admin.create_topic(topic, 2)

    def committed() -> dict[TopicPartition, int | None] | None:
        with Consumer({"bootstrap.servers": b.bootstrap, "group.id": group}) as c:
            try:
                return c.committed([late, early])
            except KafkaError as exc:  # require_stable: pending transactional offsets
                assert exc.code == ErrorCode.UNSTABLE_OFFSET_COMMIT
                return None

    config = {"bootstrap.servers": b.bootstrap, "transactional.id": f"tx-{group}"}
    with Consumer({"bootstrap.servers": b.bootstrap, "group.id": group}) as plain:
        plain.commit({early: 5})  # before the TxnOffsetCommit: replaced at the commit
        p = Producer({**config, "max.block.ms": 20_000})
        try:
            p.init_transactions(T)
            p.begin_transaction()
            p.produce(topic, b"x", partition=0)
            p.send_offsets_to_transaction({late: 42, early: 43}, group, T)
            plain.commit({late: 50})  # after the TxnOffsetCommit, before the marker: stays
            assert committed() is None  # transactional offsets still pending
            p.commit_transaction(T)
        finally:
            p.close()
    assert committed() == {late: 50, early: 43}
    b.stop()
    b.start()
    assert committed() == {late: 50, early: 43}
