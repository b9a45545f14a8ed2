"""The hand-written encoders produce what kio (generated from Kafka's schemas) decodes."""

from __future__ import annotations

import uuid

import pytest

from samsa.protocol.hotpath import (
    FetchPartitionResult,
    ProducePartitionResult,
    encode_fetch_response,
    encode_produce_response,
)
from samsa.protocol.messages import ApiKey, decode_response


@pytest.mark.parametrize("version", range(3, 14))
def test_produce_response(version: int) -> None:
    a = uuid.uuid4()
    body = encode_produce_response(
        version,
        [
            (
                a if version >= 13 else "topic-a",
                [
                    ProducePartitionResult(0, 0, 41, -1, 3),
                    ProducePartitionResult(2, 45, error_message="gap"),
                ],
            ),
            (None if version >= 13 else "b", []),
        ],
        throttle_time_ms=7,
    )
    resp = decode_response(ApiKey.PRODUCE, version, body, 0)
    first, second = resp.responses[0].partition_responses
    if version >= 13:  # topics by id (KIP-516); the zero id decodes as None
        assert resp.responses[0].topic_id == a and resp.responses[1].topic_id is None
    else:
        assert resp.responses[0].name == "topic-a" and resp.responses[1].name == "b"
    assert (first.index, int(first.error_code), first.base_offset) == (0, 0, 41)
    assert (second.index, int(second.error_code)) == (2, 45)
    if version >= 5:
        assert first.log_start_offset == 3
    if version >= 8:
        assert second.error_message == "gap"


@pytest.mark.parametrize("version", range(4, 19))
def test_fetch_response(version: int) -> None:
    topic_id = uuid.uuid4()
    pieces = encode_fetch_response(
        version,
        [
            (
                topic_id if version >= 13 else "t",
                [
                    FetchPartitionResult(0, 0, 100, 90, 5, [(7, 50)], [b"abc", b"defg"], 7),
                    FetchPartitionResult(1, 1, 0, 0, 0, None),
                ],
            )
        ],
    )
    resp = decode_response(ApiKey.FETCH, version, b"".join(pieces), 0)
    if version >= 13:
        assert resp.responses[0].topic_id == topic_id
    else:
        assert resp.responses[0].topic == "t"
    p0, p1 = resp.responses[0].partitions
    assert p0.records == b"abcdefg" and p0.high_watermark == 100 and p0.last_stable_offset == 90
    assert [(a.producer_id, a.first_offset) for a in p0.aborted_transactions] == [(7, 50)]
    assert int(p1.error_code) == 1 and p1.aborted_transactions is None and not p1.records
    assert b"abc" in pieces and b"defg" in pieces  # record bytes are passed through, not copied
