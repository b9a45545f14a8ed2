"""The sans-IO connection core (broker/connection.py) on its own: bytes in, frames out;
answers out in request order; the frame limits; SASL gating; back-pressure. No event loop,
no transport, no broker: the clock is whatever the test passes in."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import pytest

from samsa.broker.connection import (
    MAX_PENDING_RESPONSES,
    MAX_QUEUED_RESPONSE_BYTES,
    ConnectionCore,
    RequestMemory,
)
from samsa.protocol.framing import FrameDecoder, FrameError, split_response
from samsa.protocol.messages import ApiKey


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _core(
    max_frame: int = 1 << 20, pool: int = 0, woken: list[int] | None = None
) -> ConnectionCore:
    memory = RequestMemory(pool)
    return ConnectionCore(
        FrameDecoder(max_frame),
        memory,
        lambda: woken.append(1) if woken is not None else None,
        now=0.0,
    )


def _responses(core: ConnectionCore) -> list[int]:
    """Correlation ids of the responses the core lets out now, in the order it does."""
    out = []
    while (pieces := core.pop_response()) is not None:
        data = b"".join(pieces)
        out.append(split_response(data[4:], False)[0])
    return out


def test_bytes_in_pieces_come_out_as_whole_frames() -> None:
    core = _core(pool=1 << 20)
    frames = [_frame(bytes([i]) * (10 + i)) for i in range(3)]
    data = b"".join(frames)
    for i in range(0, len(data), 7):  # cut anywhere, sizes included
        core.receive(data[i : i + 7], now=1.0)
    taken = []
    while core.has_work:
        taken.append(core.take_frame())
    assert taken == [f[4:] for f in frames]
    # The frames are held in the pool until handled, then released.
    assert core.memory.used == sum(len(f) - 4 for f in frames)
    core.end_turn(3, sum(len(f) - 4 for f in frames))
    assert core.memory.used == 0 and core.handled == 3


def test_answers_leave_in_request_order_whatever_order_they_complete_in() -> None:
    core = _core()
    first = core.expect(1, False, frame_bytes=0)
    second = core.expect(2, False, frame_bytes=0)
    core.respond(3, False, b"ready at once")
    core.complete(second, b"second")
    assert _responses(core) == []  # 1 is not answered: nothing may overtake it
    core.complete(first, b"first")
    assert _responses(core) == [1, 2, 3]
    assert core.idle


def test_answers_queued_behind_a_waiting_one_count_as_unsent() -> None:
    # Whether ready at once or completed early, an answer that cannot leave yet is held for
    # the client: the connection stops taking requests at MAX_QUEUED_RESPONSE_BYTES of them.
    for completed_early in (False, True):
        core = _core()
        waiting = core.expect(1, False, frame_bytes=0)
        if completed_early:
            core.complete(core.expect(2, False, frame_bytes=0), b"x" * MAX_QUEUED_RESPONSE_BYTES)
        else:
            core.respond(2, False, b"x" * MAX_QUEUED_RESPONSE_BYTES)
        assert core.blocked
        core.complete(waiting, b"")
        assert _responses(core) == [1, 2]
        assert not core.blocked


def test_a_frame_over_the_limit_is_refused_as_soon_as_its_size_is_in() -> None:
    core = _core(max_frame=100)
    core.receive(_frame(b"x" * 100), now=1.0)  # at the limit: fine
    with pytest.raises(FrameError, match=re.escape("socket.request.max.bytes")):
        core.receive(struct.pack(">i", 101), now=1.0)


def test_pending_requests_block_the_connection_and_pause_reading() -> None:
    core = _core()
    core.receive(_frame(b"a") * (MAX_PENDING_RESPONSES + 1), now=1.0)
    assert core.update_reading(1.0) is True  # frames wait: read no more
    for cid in range(MAX_PENDING_RESPONSES):
        core.take_frame()
        core.expect(cid, False, frame_bytes=0)
    assert core.blocked and not core.has_work and core.backlog
    assert core.update_reading(1.0) is None  # already paused


def test_a_frame_that_does_not_fit_the_pool_waits_for_room() -> None:
    woken: list[int] = []
    core = _core(pool=16_000, woken=woken)
    other = _core(pool=16_000)
    other.memory = core.memory  # two connections, one pool
    other.receive(_frame(b"o" * 12_000), now=1.0)  # held until handled
    core.receive(struct.pack(">i", 8_000), now=1.0)  # declares a frame that does not fit
    assert core.waiting_memory and core.update_reading(1.0) is True
    other.take_frame()
    other.end_turn(1, 12_000)  # handled: the pool wakes the waiter
    assert not core.waiting_memory and woken == [1]
    assert core.update_reading(2.0) is False


@dataclass
class _Session:
    authenticated: bool = False
    renewing: bool = False  # a re-authentication's handshake accepted, not yet complete
    expires_at: float = float("inf")

    def expired(self, now: float) -> bool:
        return now > self.expires_at


def _sasl_core(session: _Session) -> ConnectionCore:
    core = _core(max_frame=1 << 20, pool=1 << 20)
    core.require_sasl(session, max_receive=64, timeout_s=5.0, now=0.0)  # type: ignore[arg-type]
    return core


def test_before_sasl_authentication_only_the_sasl_apis_are_served() -> None:
    session = _Session()
    core = _sasl_core(session)
    for api in (ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE):
        core.gate(api, now=1.0)
    with pytest.raises(FrameError, match="metadata before SASL authentication"):
        core.gate(ApiKey.METADATA, now=1.0)
    session.authenticated = True
    core.authenticated()
    core.gate(ApiKey.METADATA, now=1.0)
    session.renewing = True
    core.gate(ApiKey.SASL_AUTHENTICATE, now=1.0)
    with pytest.raises(FrameError, match="metadata during SASL re-authentication"):
        core.gate(ApiKey.METADATA, now=1.0)
    session.renewing = False
    session.expires_at = 2.0
    with pytest.raises(FrameError, match=re.escape("connections.max.reauth.ms")):
        core.gate(ApiKey.PRODUCE, now=3.0)


def test_before_sasl_authentication_frames_are_small_and_outside_the_pool() -> None:
    session = _Session()
    core = _sasl_core(session)
    core.receive(_frame(b"t" * 60), now=1.0)
    assert core.memory.used == 0  # sasl.server.max.receive.size bounds them instead
    with pytest.raises(FrameError, match=re.escape("sasl.server.max.receive.size")):
        core.receive(struct.pack(">i", 65), now=1.0)
    fresh = _sasl_core(session)
    fresh.authenticated()
    fresh.end_turn(0, 0)  # the pool counts this connection from the end of the turn
    fresh.receive(_frame(b"m" * 1000), now=1.0)  # socket.request.max.bytes again
    assert fresh.memory.used == 1000


def test_an_unauthenticated_connection_times_out() -> None:
    core = _sasl_core(_Session())
    assert core.timeout(4.0, read_timeout_s=30.0, idle_s=-1) is None
    why = core.timeout(6.0, read_timeout_s=30.0, idle_s=-1)
    assert why is not None and "sasl.server.authentication.timeout.ms" in why[0]
    core.authenticated()
    assert core.timeout(6.0, read_timeout_s=30.0, idle_s=-1) is None


def test_a_partial_request_times_out_but_not_while_we_paused_reading() -> None:
    core = _core()
    core.receive(_frame(b"x" * 10)[:6], now=1.0)
    assert core.timeout(2.0, read_timeout_s=5.0, idle_s=-1) is None
    core.draining = True
    assert core.update_reading(3.0) is True
    assert core.timeout(100.0, read_timeout_s=5.0, idle_s=-1) is None  # our pause
    why = _core()
    why.receive(b"\x00\x00", now=1.0)
    reason = why.timeout(7.0, read_timeout_s=5.0, idle_s=-1)
    assert reason is not None and "socket.request.read.timeout.ms" in reason[0]


def test_a_closed_connection_gives_its_kept_frame_buffer_back() -> None:
    memory = RequestMemory(1 << 24)
    core = ConnectionCore(
        FrameDecoder(1 << 20, buffers=memory.frames), memory, lambda: None, now=0.0
    )
    body = b"p" * 200_000
    data = _frame(body)
    core.receive(data[:1000], now=1.0)  # a large frame, known before it is in
    core.receive(data[1000:], now=1.0)
    frame = core.take_frame()
    assert frame == body
    core.end_turn(1, len(frame))
    del frame
    # Answered: out of queued.max.request.bytes, its buffer kept apart, within its bound.
    assert memory.used == 0 and memory.frames.kept == 200_000 <= memory.frames.capacity
    core.close()
    assert memory.frames.kept == 0
