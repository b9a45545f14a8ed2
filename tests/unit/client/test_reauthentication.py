"""KIP-368 on samsa's client connection: while it re-authenticates, no other request goes
out (Kafka's broker closes a connection that sends one in the middle of an authentication);
those made meanwhile are written after it, in order, and answered as usual."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from samsa.client._aconn import AsyncConnection
from samsa.client._errors import KafkaConnectionError
from samsa.client._security import Security
from samsa.protocol.framing import frame_response
from samsa.protocol.messages import ApiKey, encode_response, is_flexible, make, make_request

_PLAIN = Security(protocol="SASL_PLAINTEXT", mechanism="PLAIN", username="u", password="p")


class _Wire:
    """The connection's writer: the api key and correlation id of each frame written."""

    def __init__(self) -> None:
        self.frames: list[tuple[int, int]] = []

    def write(self, data: bytes) -> None:
        # size, api key, version, correlation id
        self.frames.append(
            (int.from_bytes(data[4:6], "big"), int.from_bytes(data[8:12], "big", signed=True))
        )

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None


def _connection() -> tuple[AsyncConnection, _Wire]:
    conn = AsyncConnection("127.0.0.1", 9, security=_PLAIN)
    wire = _Wire()
    conn._writer = wire  # type: ignore[assignment]  # a connected writer, as after connect()
    conn.api_versions = {
        int(ApiKey.SASL_HANDSHAKE): (0, 1),
        int(ApiKey.SASL_AUTHENTICATE): (0, 2),
        int(ApiKey.METADATA): (0, 12),
    }
    return conn, wire


def _answer(conn: AsyncConnection, cid: int, api_key: int, version: int, name: str,
            **fields: Any) -> None:  # fmt: skip
    body = encode_response(api_key, version, make(api_key, version, name, **fields))
    flexible = is_flexible(api_key, version) and api_key != ApiKey.API_VERSIONS
    conn._dispatch(frame_response(cid, body, flexible)[4:])


def _metadata() -> Any:
    return make_request(ApiKey.METADATA, 12, "MetadataRequest", topics=(),
                        allow_auto_topic_creation=False,
                        include_cluster_authorized_operations=False,
                        include_topic_authorized_operations=False)  # fmt: skip


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_requests_made_during_a_reauthentication_wait_for_it() -> None:
    async def body() -> None:
        conn, wire = _connection()
        conn._start_reauth()
        await _settle()
        assert [k for k, _ in wire.frames] == [ApiKey.SASL_HANDSHAKE]
        metadata = _metadata()
        first = conn.send_nowait(ApiKey.METADATA, metadata, version=12)
        second = conn.send_nowait(ApiKey.METADATA, metadata, version=12)
        assert [k for k, _ in wire.frames] == [ApiKey.SASL_HANDSHAKE]  # held
        _answer(conn, wire.frames[0][1], ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeResponse",
                error_code=0, mechanisms=["PLAIN"])  # fmt: skip
        await _settle()
        assert [k for k, _ in wire.frames] == [ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE]
        _answer(conn, wire.frames[1][1], ApiKey.SASL_AUTHENTICATE, 2,
                "SaslAuthenticateResponse", error_code=0, error_message=None, auth_bytes=b"",
                session_lifetime=datetime.timedelta(seconds=60))  # fmt: skip
        await _settle()
        keys = [k for k, _ in wire.frames]
        assert keys == [ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE] + [ApiKey.METADATA] * 2
        assert wire.frames[2][1] < wire.frames[3][1]  # in the order they were made
        for (_, cid), fut in zip(wire.frames[2:], (first, second), strict=True):
            _answer(conn, cid, ApiKey.METADATA, 12, "MetadataResponse", throttle_time=0,
                    brokers=(), cluster_id=None, controller_id=-1, topics=())  # fmt: skip
            assert (await asyncio.wait_for(fut, 1)).controller_id == -1
        assert conn._reauth is not None and isinstance(conn._reauth, asyncio.TimerHandle)
        conn.close()

    asyncio.run(body())


def test_requests_held_by_a_failed_reauthentication_fail_with_the_connection() -> None:
    async def body() -> None:
        conn, wire = _connection()
        conn._start_reauth()
        await _settle()
        metadata = _metadata()
        held = conn.send_nowait(ApiKey.METADATA, metadata, version=12)
        _answer(conn, wire.frames[0][1], ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeResponse",
                error_code=33, mechanisms=["SCRAM-SHA-256"])  # fmt: skip
        await _settle()
        assert conn.closed and [k for k, _ in wire.frames] == [ApiKey.SASL_HANDSHAKE]
        try:
            await asyncio.wait_for(held, 1)
        except KafkaConnectionError as exc:
            assert "re-authentication failed" in str(exc)
        else:
            raise AssertionError("a request held by a failed re-authentication succeeded")

    asyncio.run(body())
