"""A leader stamps its own epoch on every batch it appends, whatever the producer wrote there
(Kafka's clients write -1): consumers read it back and commit it with their positions."""

from __future__ import annotations

from pathlib import Path

from samsa.log.log import Log, LogConfig
from samsa.log.segment import LEADER_EPOCH
from samsa.protocol.records import (
    NewRecord,
    RecordBatchView,
    build_batch,
    iter_batches,
    validate_produce_batch,
)

NOW = 1_700_000_000_000


def test_appended_batches_carry_the_leaders_epoch_and_a_valid_crc(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig(), NOW)
    try:
        for producers_epoch in (-1, 7):
            raw = build_batch([NewRecord(b"v")], partition_leader_epoch=producers_epoch, now_ms=NOW)
            log.append(validate_produce_batch(raw), NOW)
        data = b"".join(log.read(0, 1_000_000).chunks)
        batches = list(iter_batches(data))
        assert [b.partition_leader_epoch for b in batches] == [LEADER_EPOCH, LEADER_EPOCH]
        assert [b.base_offset for b in batches] == [0, 1]
        assert all(RecordBatchView(data, b.pos).crc_is_valid() for b in batches)
    finally:
        log.close(NOW)
