"""Nothing unauthenticated holds the broker (issue 27 part 2), on SASL listeners of a broker
served in-process over real sockets on 127.0.0.1: before authentication a frame is at most
sasl.server.max.receive.size and claims nothing of queued.max.request.bytes; a connection
that does not authenticate in time is closed; connections per address are bounded; a failed
authentication is answered only after connection.failed.authentication.delay.ms; an unknown
SCRAM user costs no PBKDF2 and gets the same salt every time; log lines carry a bounded prefix
of what the client sent."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from samsa.broker.config import BrokerConfig
from samsa.broker.sasl import ScramCredentials
from samsa.broker.server import BrokerServer
from samsa.protocol import sasl as sasl_protocol
from samsa.protocol.errors import ErrorCode
from samsa.protocol.framing import frame_request, split_response
from samsa.protocol.messages import (
    ApiKey,
    decode_response,
    encode_request,
    is_flexible,
    make_request,
)
from samsa.protocol.sasl import ScramServer, make_credential

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _metadata(topics: list[str] | None) -> Any:
    return make_request(
        ApiKey.METADATA,
        9,
        "MetadataRequest",
        topics=None
        if topics is None
        else tuple(
            make_request(ApiKey.METADATA, 9, "MetadataRequestTopic", name=t) for t in topics
        ),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


METADATA = _metadata(None)


def _frame(api_key: int, version: int, entity: Any, cid: int = 7) -> bytes:
    body = encode_request(api_key, version, entity)
    return frame_request(api_key, version, cid, "t", body, is_flexible(api_key, version))


async def _call(conn: Conn, api_key: int, version: int, entity: Any) -> Any:
    reader, writer = conn
    writer.write(_frame(api_key, version, entity))
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    frame = await reader.readexactly(size)
    cid, offset = split_response(frame, is_flexible(api_key, version))
    assert cid == 7
    return decode_response(api_key, version, frame, offset)


def _handshake(mechanism: str) -> Any:
    return make_request(ApiKey.SASL_HANDSHAKE, 1, "SaslHandshakeRequest", mechanism=mechanism)


def _token(token: bytes) -> Any:
    return make_request(ApiKey.SASL_AUTHENTICATE, 2, "SaslAuthenticateRequest", auth_bytes=token)


def _sized_token_frame(size: int) -> bytes:
    """A SaslAuthenticate frame of ``size`` bytes (prefix excluded): PLAIN, wrong password."""
    pad = size
    for _ in range(3):  # the token's length prefix grows with it
        frame = _frame(ApiKey.SASL_AUTHENTICATE, 2, _token(b"\0bob\0" + b"x" * pad))
        pad += size - (len(frame) - 4)
    assert len(frame) - 4 == size
    return frame


async def _plain(conn: Conn, password: str) -> Any:
    assert (await _call(conn, ApiKey.SASL_HANDSHAKE, 1, _handshake("PLAIN"))).error_code == 0
    return await _call(conn, ApiKey.SASL_AUTHENTICATE, 2, _token(b"\0bob\0" + password.encode()))


async def _until_closed(reader: asyncio.StreamReader, timeout: float) -> bytes | None:
    """What the broker sends until it closes the connection; None if it is still open after
    ``timeout``."""
    got = b""
    try:
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(1 << 16):
                got += chunk
        return got
    except TimeoutError:
        return None
    except ConnectionError:
        return got


async def _closed(reader: asyncio.StreamReader, timeout: float) -> bool:
    return await _until_closed(reader, timeout) is not None


def _serve(
    tmp_path: Path, test: Callable[[BrokerServer, int], Awaitable[None]], **props: str
) -> None:
    """Run ``test(server, sasl_port)`` against a broker with a SASL_PLAINTEXT listener (PLAIN
    user bob/pw, SCRAM-SHA-256) and a PLAINTEXT one."""
    users = tmp_path / "plain"
    users.write_text("bob=pw\n")
    config = BrokerConfig(data_dir=tmp_path / "data", port=0).with_properties(
        {
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
            "sasl.plain.users.file": str(users),
            **props,
        }
    )
    config = config.with_overrides(port=0).validate()

    async def main() -> None:
        server = BrokerServer(config)
        await server.start()
        try:
            await test(server, server.port)
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


@contextlib.asynccontextmanager
async def _connections(port: int, n: int) -> AsyncIterator[list[Conn]]:
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]
    try:
        yield conns
    finally:
        for _r, w in conns:
            w.close()


def test_a_frame_before_authentication_is_at_most_sasl_server_max_receive_size(
    tmp_path: Path,
) -> None:
    async def test(server: BrokerServer, port: int) -> None:
        async with _connections(port, 2) as ((r1, w1), conn2):
            # A 100 MB frame declared before any handshake: closed on its prefix, nothing read
            # into the pool (it used to claim 100 MB and read it all).
            w1.write(struct.pack(">i", 100 << 20) + bytes(1 << 20))
            assert await _closed(r1, 5)
            assert server.limits.memory.peak == 0
            # Kafka's bound is inclusive: a PLAIN token in a frame of exactly 524288 bytes is
            # read and answered (a wrong password); one byte more closes the connection.
            conn3 = await asyncio.open_connection("127.0.0.1", port)
            for conn, size in ((conn2, 524288), (conn3, 524289)):
                hs = await _call(conn, ApiKey.SASL_HANDSHAKE, 1, _handshake("PLAIN"))
                assert hs.error_code == 0
                conn[1].write(_sized_token_frame(size))
            assert await _until_closed(conn2[0], 5)  # answered, then closed
            assert await _until_closed(conn3[0], 5) == b""  # closed unanswered
            conn3[1].close()
        # After authentication, frames may again be up to socket.request.max.bytes.
        async with _connections(port, 1) as [conn]:
            assert (await _plain(conn, "pw")).error_code == 0
            big = _metadata([f"{i}{'t' * 32000}" for i in range(20)])  # 640 KB
            resp = await _call(conn, ApiKey.METADATA, 9, big)
            assert len(resp.topics) == 20

    _serve(tmp_path, test)


def test_unauthenticated_connections_claim_nothing_of_the_request_pool(tmp_path: Path) -> None:
    async def test(server: BrokerServer, port: int) -> None:
        memory = server.limits.memory
        async with _connections(port, 8) as stalled:
            for _r, w in stalled:  # each: 200 KB of a 500 KB frame, then nothing
                w.write(struct.pack(">i", 500_000) + bytes(200_000))
            await asyncio.sleep(0.3)
            assert (memory.used, memory.peak) == (0, 0)
            async with _connections(port, 1) as [conn]:
                assert (await _plain(conn, "pw")).error_code == 0
                assert (memory.used, memory.peak) == (0, 0)  # its SASL frames did not either
                meta = await _call(conn, ApiKey.METADATA, 9, METADATA)
                assert meta.brokers[0].port == port
                assert memory.peak > 0  # authenticated: its requests are the pool's

    _serve(tmp_path, test)


def test_a_connection_that_does_not_authenticate_in_time_is_closed(tmp_path: Path) -> None:
    versions = make_request(ApiKey.API_VERSIONS, 0, "ApiVersionsRequest")

    async def test(server: BrokerServer, port: int) -> None:
        async with _connections(port, 3) as [(silent, _w), chatty, authed]:
            assert (await _plain(authed, "pw")).error_code == 0
            start = time.monotonic()
            # ApiVersions over and over is traffic, but no authentication.
            for _ in range(3):
                await _call(chatty, ApiKey.API_VERSIONS, 0, versions)
                await asyncio.sleep(0.05)
            assert await _closed(silent, 5)
            assert 0.25 < time.monotonic() - start < 3
            assert await _closed(chatty[0], 1)
            # The authenticated one stays, quiet past the deadline.
            await asyncio.sleep(0.4)
            assert (await _call(authed, ApiKey.METADATA, 9, METADATA)).brokers

    _serve(tmp_path, test, **{"sasl.server.authentication.timeout.ms": "300"})


def test_connections_per_address_on_a_sasl_listener_are_bounded(tmp_path: Path) -> None:
    assert BrokerConfig().sasl_max_connections_per_ip == 256
    versions = make_request(ApiKey.API_VERSIONS, 0, "ApiVersionsRequest")

    async def test(server: BrokerServer, port: int) -> None:
        plaintext = server.endpoints[1].sockets[0].getsockname()[1]
        async with _connections(port, 3) as mine, _connections(port, 1) as [(r4, _w4)]:
            assert await _closed(r4, 5)  # the fourth from 127.0.0.1
            for conn in mine:
                assert (await _call(conn, ApiKey.API_VERSIONS, 0, versions)).error_code == 0
            # Another listener without SASL is not bound by it.
            async with _connections(plaintext, 4) as others:
                for conn in others:
                    assert (await _call(conn, ApiKey.API_VERSIONS, 0, versions)).error_code == 0
        await asyncio.sleep(0.1)
        async with _connections(port, 3) as again:  # the slots came back
            for conn in again:
                assert (await _call(conn, ApiKey.API_VERSIONS, 0, versions)).error_code == 0

    _serve(tmp_path, test, **{"sasl.max.connections.per.ip": "3"})


def test_wrong_passwords_are_answered_after_the_failed_authentication_delay(
    tmp_path: Path,
) -> None:
    async def test(server: BrokerServer, port: int) -> None:
        attempts, end = [], time.monotonic() + 1.0
        while time.monotonic() < end:  # one wrong password after another, for a second
            async with _connections(port, 1) as [conn]:
                start = time.monotonic()
                resp = await _plain(conn, "wrong")
                attempts.append(time.monotonic() - start)
                assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
                assert await _closed(conn[0], 5)
        assert len(attempts) <= 10 and min(attempts) >= 0.095  # was hundreds a second
        async with _connections(port, 1) as [conn]:  # the right one is not delayed
            start = time.monotonic()
            assert (await _plain(conn, "pw")).error_code == 0
            assert time.monotonic() - start < 0.095

    _serve(tmp_path, test)


def test_an_unknown_scram_user_costs_no_pbkdf2_and_keeps_its_salt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ScramCredentials(tmp_path)
    store.put("alice", "SCRAM-SHA-256", make_credential("SCRAM-SHA-256", "pw", 8192))

    def first(user: str, store: ScramCredentials) -> str:
        server = ScramServer("SCRAM-SHA-256", store.lookup, mock=store.mock)
        return server.step(f"n,,n={user},r=abc".encode()).decode()

    def salt_and_iterations(reply: str) -> tuple[str, str]:
        attrs = dict(part.split("=", 1) for part in reply.split(","))
        return attrs["s"], attrs["i"]

    def no_pbkdf2(*args: Any) -> bytes:
        raise AssertionError("PBKDF2 for an unknown user")

    monkeypatch.setattr(sasl_protocol.hashlib, "pbkdf2_hmac", no_pbkdf2)
    salt, iterations = salt_and_iterations(first("mallory", store))
    assert iterations == "8192"  # as the real users have
    assert salt_and_iterations(first("mallory", store)) == (salt, iterations)
    assert salt_and_iterations(first("mallory", ScramCredentials(tmp_path)))[0] == salt  # restart
    assert salt_and_iterations(first("trudy", store))[0] != salt
    assert salt_and_iterations(first("alice", store))[0] != salt


def test_log_lines_carry_a_bounded_prefix_of_what_the_client_sent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="samsa")
    name = "m" * 400_000  # under sasl.server.max.receive.size
    mechanism = "M" * 30_000  # a handshake's mechanism is a (16-bit) string

    async def test(server: BrokerServer, port: int) -> None:
        async with _connections(port, 2) as [mech, scram]:
            resp = await _call(mech, ApiKey.SASL_HANDSHAKE, 1, _handshake(mechanism))
            assert resp.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
            assert await _closed(mech[0], 5)
            hs = await _call(scram, ApiKey.SASL_HANDSHAKE, 1, _handshake("SCRAM-SHA-256"))
            assert hs.error_code == 0
            reply = await _call(
                scram, ApiKey.SASL_AUTHENTICATE, 2, _token(b"n,,n=%s,r=abc" % name.encode())
            )
            assert reply.error_code == 0  # an unknown user goes on to the final message
            nonce = dict(p.split("=", 1) for p in reply.auth_bytes.decode().split(","))["r"]
            final = f"c=biws,r={nonce},p=AAAA".encode()
            reply = await _call(scram, ApiKey.SASL_AUTHENTICATE, 2, _token(final))
            assert reply.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
            assert await _closed(scram[0], 5)

    _serve(tmp_path, test)
    closing = [r.getMessage() for r in caplog.records if "closing connection" in r.getMessage()]
    assert len(closing) == 2 and "MMMM" in closing[0] and "mmmm" in closing[1]
    assert max(len(r.getMessage()) for r in caplog.records) < 2000
