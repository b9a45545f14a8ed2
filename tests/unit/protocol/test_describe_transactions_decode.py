"""DescribeTransactions answers for idle transactional ids decode: Kafka sends a start time of
-1 when no transaction is open, which kio's own reader refuses as a negative timestamp."""

from __future__ import annotations

import datetime
import io

from kio.schema.describe_transactions.v0 import response as schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from samsa.client._admin_txns import _millis
from samsa.protocol.messages import ApiKey, decode_response


def _encoded(start: datetime.datetime) -> bytes:
    state = schema.TransactionState(
        error_code=ErrorCode.none,
        transactional_id="idle",
        transaction_state="Empty",
        transaction_timeout=datetime.timedelta(seconds=60),
        transaction_start_time=start,
        producer_id=7,
        producer_epoch=3,
        topics=(),
    )
    response = schema.DescribeTransactionsResponse(
        throttle_time=datetime.timedelta(0), transaction_states=(state,)
    )
    buf = io.BytesIO()
    entity_writer(schema.DescribeTransactionsResponse)(buf, response)
    return buf.getvalue()


def test_an_unset_start_time_reads_as_none_and_the_rest_is_kept() -> None:
    unset = datetime.datetime.fromtimestamp(-0.001, tz=datetime.UTC)  # -1 on the wire
    response = decode_response(ApiKey.DESCRIBE_TRANSACTIONS, 0, _encoded(unset), 0)
    (state,) = response.transaction_states
    assert state.transaction_start_time is None
    assert (state.transactional_id, state.transaction_state) == ("idle", "Empty")
    assert (state.producer_id, state.producer_epoch) == (7, 3)
    assert _millis(state.transaction_start_time) == -1


def test_a_set_start_time_still_reads_as_a_timestamp() -> None:
    start = datetime.datetime.fromtimestamp(1_700_000_000.123, tz=datetime.UTC)
    response = decode_response(ApiKey.DESCRIBE_TRANSACTIONS, 0, _encoded(start), 0)
    assert _millis(response.transaction_states[0].transaction_start_time) == 1_700_000_000_123
