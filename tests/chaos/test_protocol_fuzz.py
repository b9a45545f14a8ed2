"""Protocol fuzzing: mutated and random frames thrown at the broker's decoder and handlers.

The broker runs in-process (same code as ``samsa broker``, a fake transport instead of a
socket) so Hypothesis can try many frames quickly. For every frame the only allowed outcomes
are a well-formed response with the request's correlation id, or the connection closed
because the input is not valid Kafka. A handler crash (the "internal error" close), a hang,
or a change to bytes already written fails the test.
"""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.broker.server import KafkaConnection
from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.framing import (
    FrameDecoder,
    FrameError,
    parse_request_header,
    peek_request_header,
    split_response,
)
from samsa.protocol.messages import (
    ApiKey,
    _response_reader,
    api_name,
    decode_request,
    is_flexible,
    make_request,
)
from samsa.testing import fetch_request, idempotent_batch, produce_request

TOPIC = "fuzz"


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.aborted = False

    def writelines(self, pieces: list[bytes]) -> None:
        for p in pieces:
            self.written += p

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


class RecordingConnection(KafkaConnection):
    reasons: list[str]

    def close(self, reason: str) -> None:
        self.reasons.append(reason)
        super().close(reason)


def _frame(api_key: int, version: int, entity: Any, correlation_id: int = 42) -> bytes:
    conn = BlockingConnection.__new__(BlockingConnection)
    conn.client_id = "fuzz"
    return conn.encode(api_key, version, entity, correlation_id)


def _seeds() -> list[bytes]:
    batch = idempotent_batch(1, 0, 0, 3)
    return [
        _frame(ApiKey.PRODUCE, 9, produce_request({(TOPIC, 0): batch})),
        _frame(ApiKey.PRODUCE, 7, produce_request({(TOPIC, 0): batch}, version=7)),
        _frame(ApiKey.FETCH, 12, fetch_request({(TOPIC, 0): 0}, max_wait_ms=50)),
        _frame(ApiKey.FETCH, 4, fetch_request({(TOPIC, 0): 0}, max_wait_ms=50, version=4)),
        _frame(
            ApiKey.METADATA,
            12,
            make_request(
                ApiKey.METADATA,
                12,
                "MetadataRequest",
                topics=(
                    make_request(
                        ApiKey.METADATA, 12, "MetadataRequestTopic", topic_id=None, name=TOPIC
                    ),
                ),
                allow_auto_topic_creation=True,
                include_topic_authorized_operations=False,
            ),
        ),
        _frame(
            ApiKey.API_VERSIONS,
            3,
            make_request(
                ApiKey.API_VERSIONS,
                3,
                "ApiVersionsRequest",
                client_software_name="f",
                client_software_version="1",
            ),
        ),
        _frame(
            ApiKey.INIT_PRODUCER_ID,
            4,
            make_request(
                ApiKey.INIT_PRODUCER_ID,
                4,
                "InitProducerIdRequest",
                transactional_id=None,
                transaction_timeout=1000,
                producer_id=-1,
                producer_epoch=-1,
            ),
        ),
        _frame(
            ApiKey.DESCRIBE_PRODUCERS,
            0,
            make_request(
                ApiKey.DESCRIBE_PRODUCERS,
                0,
                "DescribeProducersRequest",
                topics=(
                    make_request(
                        ApiKey.DESCRIBE_PRODUCERS,
                        0,
                        "TopicRequest",
                        name=TOPIC,
                        partition_indexes=(0, 5),
                    ),
                ),
            ),
        ),
    ]


def _coordinator_seeds() -> list[bytes]:
    """Group and transaction APIs: their handlers await the coordinators' timers and logs."""
    r = make_request
    return [
        _frame(
            ApiKey.FIND_COORDINATOR,
            3,
            r(ApiKey.FIND_COORDINATOR, 3, "FindCoordinatorRequest", key="g", key_type=0),
        ),
        _frame(
            ApiKey.JOIN_GROUP,
            7,
            r(
                ApiKey.JOIN_GROUP,
                7,
                "JoinGroupRequest",
                group_id="g",
                session_timeout=10_000,
                rebalance_timeout=10_000,
                member_id="",
                group_instance_id=None,
                protocol_type="consumer",
                protocols=(
                    r(
                        ApiKey.JOIN_GROUP,
                        7,
                        "JoinGroupRequestProtocol",
                        name="range",
                        metadata=b"\0\0",
                    ),
                ),
            ),
        ),
        _frame(
            ApiKey.HEARTBEAT,
            4,
            r(
                ApiKey.HEARTBEAT,
                4,
                "HeartbeatRequest",
                group_id="g",
                generation_id=1,
                member_id="m",
                group_instance_id=None,
            ),
        ),
        _frame(
            ApiKey.OFFSET_COMMIT,
            8,
            r(
                ApiKey.OFFSET_COMMIT,
                8,
                "OffsetCommitRequest",
                group_id="g",
                generation_id_or_member_epoch=-1,
                member_id="",
                group_instance_id=None,
                topics=(
                    r(
                        ApiKey.OFFSET_COMMIT,
                        8,
                        "OffsetCommitRequestTopic",
                        name=TOPIC,
                        partitions=(
                            r(
                                ApiKey.OFFSET_COMMIT,
                                8,
                                "OffsetCommitRequestPartition",
                                partition_index=0,
                                committed_offset=5,
                                committed_leader_epoch=-1,
                                committed_metadata="",
                            ),
                        ),
                    ),
                ),
            ),
        ),
        _frame(
            ApiKey.OFFSET_FETCH,
            8,
            r(
                ApiKey.OFFSET_FETCH,
                8,
                "OffsetFetchRequest",
                require_stable=True,
                groups=(
                    r(ApiKey.OFFSET_FETCH, 8, "OffsetFetchRequestGroup", group_id="g", topics=None),
                ),
            ),
        ),
        _frame(
            ApiKey.INIT_PRODUCER_ID,
            4,
            r(
                ApiKey.INIT_PRODUCER_ID,
                4,
                "InitProducerIdRequest",
                transactional_id="tx",
                transaction_timeout=60_000,
                producer_id=-1,
                producer_epoch=-1,
            ),
        ),
        _frame(
            ApiKey.ADD_PARTITIONS_TO_TXN,
            3,
            r(
                ApiKey.ADD_PARTITIONS_TO_TXN,
                3,
                "AddPartitionsToTxnRequest",
                v3_and_below_transactional_id="tx",
                v3_and_below_producer_id=0,
                v3_and_below_producer_epoch=0,
                v3_and_below_topics=(
                    r(
                        ApiKey.ADD_PARTITIONS_TO_TXN,
                        3,
                        "AddPartitionsToTxnTopic",
                        name=TOPIC,
                        partitions=(0,),
                    ),
                ),
            ),
        ),
        _frame(
            ApiKey.END_TXN,
            3,
            r(
                ApiKey.END_TXN,
                3,
                "EndTxnRequest",
                transactional_id="tx",
                producer_id=0,
                producer_epoch=0,
                committed=True,
            ),
        ),
        _frame(
            ApiKey.CONSUMER_GROUP_HEARTBEAT,
            1,
            r(
                ApiKey.CONSUMER_GROUP_HEARTBEAT,
                1,
                "ConsumerGroupHeartbeatRequest",
                group_id="g848",
                member_id="m",
                member_epoch=0,
                rebalance_timeout=10_000,
                subscribed_topic_names=(TOPIC,),
                subscribed_topic_regex=None,
                server_assignor=None,
                topic_partitions=(),
            ),
        ),
        _frame(
            ApiKey.CONSUMER_GROUP_DESCRIBE,
            1,
            r(
                ApiKey.CONSUMER_GROUP_DESCRIBE,
                1,
                "ConsumerGroupDescribeRequest",
                group_ids=("g848",),
                include_authorized_operations=False,
            ),
        ),
    ]


SEEDS = _seeds() + _coordinator_seeds()

mutations = st.one_of(
    # flip bytes of a valid frame
    st.tuples(
        st.sampled_from(SEEDS),
        st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=8),
    ).map(lambda t: _flip(*t)),
    # cut a valid frame short, or extend it, keeping or fixing its size prefix
    st.tuples(st.sampled_from(SEEDS), st.integers(0, 400), st.booleans()).map(lambda t: _cut(*t)),
    # random bodies behind a correct size prefix
    st.binary(min_size=0, max_size=300).map(lambda b: struct.pack(">i", len(b)) + b),
    # random bytes, size prefix and all
    st.binary(min_size=1, max_size=64),
)


def _flip(frame: bytes, flips: list[tuple[int, int]]) -> bytes:
    data = bytearray(frame)
    for pos, value in flips:
        data[4 + pos % (len(data) - 4)] = value
    return bytes(data)


def _cut(frame: bytes, n: int, fix_size: bool) -> bytes:
    body = frame[4 : 4 + max(0, len(frame) - 4 - n)] if n % 2 == 0 else frame[4:] + bytes(n)
    size = len(body) if fix_size else struct.unpack(">i", frame[:4])[0]
    return struct.pack(">i", size) + body


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    data_dir: Path = tmp_path_factory.mktemp("fuzz")
    loop = asyncio.new_event_loop()
    broker = Broker(BrokerConfig(data_dir=data_dir, socket_request_max_bytes=1 << 20))
    broker.start()
    broker.create_topic(TOPIC, 2)
    partition = broker.topics.get_partition(TOPIC, 0)
    assert partition is not None
    from samsa.protocol.records import validate_produce_batch

    pid = broker.producer_ids.allocate()  # the broker refuses ids it never issued
    for seq in range(0, 30, 3):
        batch = validate_produce_batch(idempotent_batch(pid, 0, seq, 3))
        appended = broker.append(partition, batch)
        assert not isinstance(appended, asyncio.Future) and appended.error == 0
    original = b"".join(partition.log.read(0, 1 << 30).chunks)
    yield loop, broker, partition, original
    broker.close()
    loop.close()


# A handler has this long to answer a frame; they answer in milliseconds, the rest is slack for a
# loaded machine. A response still pending then is a hang and fails the test.
ANSWER_WITHIN_S = 2.0
# Except a Fetch whose (mutated) max wait is longer than this: it is a legitimate long poll, so it
# may still be pending when the test ends; waiting it out would make examples slow.
LONG_POLL_MS = 100


def _request_frames(data: bytes) -> list[bytes]:
    """The request frames the broker's decoder cuts from ``data`` (none if it refuses it)."""
    try:
        return FrameDecoder(1 << 30).feed(data)
    except FrameError:
        return []


def _body(frame: bytes) -> Any:
    """The decoded request, or None when the broker could not decode it either."""
    try:
        api_key, version, _ = peek_request_header(frame)
        header = parse_request_header(frame, is_flexible(api_key, version))
        return decode_request(api_key, version, frame, header.body_offset)
    except Exception:  # unknown key or version, bad header or body: the broker refuses it too
        return None


def _answers(frame: bytes) -> bool:
    """Every request gets a response, except Produce with acks=0 (as in Kafka)."""
    if peek_request_header(frame)[0] != ApiKey.PRODUCE:
        return True
    body = _body(frame)
    return body is None or body.acks != 0


def _well_formed(request: bytes, response: bytes) -> None:
    """``response`` is one whole response of ``request``'s API and version: its header, then
    a body that decodes to the last byte. An ApiVersions request of a version the broker does
    not serve is answered in v0 with UNSUPPORTED_VERSION (as Kafka)."""
    api_key, version, correlation_id = peek_request_header(request)
    # ApiVersions first: is_flexible cannot look up a version kio does not know.
    flexible = api_key != ApiKey.API_VERSIONS and is_flexible(api_key, version)
    cid, offset = split_response(response, flexible)
    assert cid == correlation_id
    if api_key == ApiKey.API_VERSIONS:
        (code,) = struct.unpack_from(">h", response, offset)
        if code == ErrorCode.UNSUPPORTED_VERSION:
            version = 0
    _entity, size = _response_reader(api_key, version)(response, offset)
    assert offset + size == len(response), (api_name(api_key), version, offset + size)


def _long_poll(frame: bytes) -> bool:
    if peek_request_header(frame)[0] != ApiKey.FETCH:
        return False
    body = _body(frame)
    return body is not None and body.max_wait.total_seconds() * 1000 > LONG_POLL_MS


@settings(
    max_examples=int(os.environ.get("SAMSA_FUZZ_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frame=mutations)
def test_mutated_frames_get_a_response_or_a_closed_connection(fuzz_env: Any, frame: bytes) -> None:
    loop, broker, partition, original = fuzz_env
    if len(frame) >= 6:
        (api_key,) = struct.unpack_from(">h", frame, 4)
        assume(api_key != ApiKey.DELETE_TOPICS)  # deleting the topic is legitimate, not damage
    requests = [f for f in _request_frames(frame) if len(f) >= 8]
    long_polls = {peek_request_header(f)[2] for f in requests if _long_poll(f)}
    conn = RecordingConnection(broker)
    conn.reasons = []
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]

    async def drive() -> tuple[bool, list[int]]:
        conn.data_received(frame)
        budget = LONG_POLL_MS / 1000 + 0.05 if long_polls else ANSWER_WITHIN_S
        deadline = loop.time() + budget
        while not conn.closed and conn.core.queue and loop.time() < deadline:
            await asyncio.sleep(0.002)
        closed = conn.closed
        pending = [] if closed else [e.correlation_id for e in conn.core.queue]
        conn.connection_lost(None)  # cancels whatever still waits (a client hanging up)
        await asyncio.sleep(0)
        return closed, pending

    closed, pending = loop.run_until_complete(asyncio.wait_for(drive(), ANSWER_WITHIN_S + 5))
    assert "internal error" not in conn.reasons, conn.reasons
    responses = FrameDecoder(1 << 30).feed(bytes(transport.written))
    answered = [struct.unpack_from(">i", r)[0] for r in responses]  # response correlation ids
    answering = [f for f in requests if _answers(f)]
    due = [peek_request_header(f)[2] for f in answering]
    if closed:
        # Bad input closes the connection; whatever was answered before came in request order.
        assert answered == due[: len(answered)], (answered, due, conn.reasons)
    else:
        # Every frame was valid: each is answered, with its own correlation id, in order. Only a
        # long poll may still be pending, and what is queued behind it.
        assert answered + pending == due, (answered, pending, due)
        assert not pending or pending[0] in long_polls, f"no response to {pending} (a hang)"
    for request, response in zip(answering, responses, strict=False):  # (checked in order above)
        _well_formed(request, response)
    # Bytes already written are untouched (appends after them are allowed).
    now = b"".join(partition.log.read(0, 1 << 30).chunks)
    assert now[: len(original)] == original
