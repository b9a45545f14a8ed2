"""The DeleteRecords handler: the moved log starts are checkpointed once per request, before
the answer; a checkpoint that cannot be written is KAFKA_STORAGE_ERROR, written at close."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from _handlers import handle
from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.log import log as log_module
from samsa.log.loader import read_offsets_checkpoint
from samsa.log.log import LOG_START_OFFSET_FILE
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import produce_request

K, V = ApiKey.DELETE_RECORDS, 2


def _broker(path: Path) -> Broker:
    broker = Broker(BrokerConfig(data_dir=path, group_initial_rebalance_delay_ms=0))
    broker.start()
    return broker


def _delete(broker: Broker, offsets: dict[int, int]) -> list[tuple[int, int]]:
    parts = tuple(
        make_request(K, V, "DeleteRecordsPartition", partition_index=i, offset=o)
        for i, o in offsets.items()
    )
    topic = make_request(K, V, "DeleteRecordsTopic", name="t", partitions=parts)
    req = make_request(K, V, "DeleteRecordsRequest", topics=(topic,), timeout=1000)
    resp = handle(broker, "User:ANONYMOUS", K, V, req, "127.0.0.1")
    return [(int(p.error_code), int(p.low_watermark)) for p in resp.topics[0].partitions]


def test_one_checkpoint_per_request_and_a_storage_error_when_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _broker(tmp_path)
    broker.create_topic("t", 3)
    batch = build_batch([NewRecord(b"v")] * 5)
    req = produce_request({("t", i): batch for i in range(3)})
    resp = handle(broker, "User:ANONYMOUS", ApiKey.PRODUCE, 9, req, "127.0.0.1")
    assert {p.error_code for p in resp.responses[0].partition_responses} == {0}
    writes: list[dict[str, int]] = []
    real = log_module.write_offsets_checkpoint

    def counted(path: Path, offsets: dict[str, int]) -> None:
        if path.name == LOG_START_OFFSET_FILE:
            writes.append(dict(offsets))
        real(path, offsets)

    monkeypatch.setattr(log_module, "write_offsets_checkpoint", counted)
    assert _delete(broker, {0: 2, 1: 3, 2: -1}) == [(0, 2), (0, 3), (0, 5)]
    assert writes == [{"t-0": 2, "t-1": 3, "t-2": 5}]

    def refuse(path: Path, offsets: dict[str, int]) -> None:
        if path.name == LOG_START_OFFSET_FILE:
            raise OSError(28, "No space left on device")
        real(path, offsets)

    monkeypatch.setattr(log_module, "write_offsets_checkpoint", refuse)
    failed = ErrorCode.KAFKA_STORAGE_ERROR
    assert _delete(broker, {0: 4, 1: 9}) == [(failed, -1), (ErrorCode.OFFSET_OUT_OF_RANGE, -1)]
    monkeypatch.undo()
    broker.close()  # writes what could not be written
    assert read_offsets_checkpoint(tmp_path / LOG_START_OFFSET_FILE) == {
        "t-0": 4,
        "t-1": 3,
        "t-2": 5,
    }
    again: Any = _broker(tmp_path)
    try:
        starts = [p.log.log_start_offset for p in again.topics.topics["t"].partitions]
        assert starts == [4, 3, 5]
    finally:
        again.close()
