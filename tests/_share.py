"""Share-group (KIP-932) test set-up for client tests: a one-partition topic holding
``records`` values ``v0``, ``v1``, ... and a share group that reads it from the start
(``share.auto.offset.reset=earliest``), made with confluent-kafka's admin and producer."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)


def share_topic(bootstrap: str, records: int, prefix: str = "share") -> tuple[str, str]:
    """(topic, group), both new."""
    topic, group = f"{prefix}-{uuid.uuid4().hex[:8]}", f"sg-{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        f.result(timeout=20)
    earliest = ConfigEntry(
        "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[earliest])
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(timeout=20)
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(records):
        p.produce(topic, value=f"v{i}".encode())
    assert p.flush(20) == 0
    return topic, group
