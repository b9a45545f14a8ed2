from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from samsa.protocol.framing import (
    FrameBuffers,
    FrameDecoder,
    FrameError,
    frame_request,
    frame_response,
    parse_request_header,
    split_response,
)


def test_frames_split_across_feeds() -> None:
    dec = FrameDecoder(1000)
    data = struct.pack(">i", 3) + b"abc" + struct.pack(">i", 2) + b"de"
    out = []
    for i in range(len(data)):
        out += dec.feed(data[i : i + 1])
    assert out == [b"abc", b"de"]
    assert dec.buffered == 0


def test_oversized_and_negative_frames_are_errors() -> None:
    with pytest.raises(FrameError, match=r"socket\.request\.max\.bytes"):
        FrameDecoder(10).feed(struct.pack(">i", 11))
    with pytest.raises(FrameError, match="negative"):
        FrameDecoder(10).feed(struct.pack(">i", -1))


@pytest.mark.parametrize("flexible", [False, True])
def test_request_header_round_trip(flexible: bool) -> None:
    frame = frame_request(3, 12, 99, "client-x", b"BODY", flexible)[4:]
    header = parse_request_header(frame, flexible)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        3,
        12,
        99,
        "client-x",
    )
    assert frame[header.body_offset :] == b"BODY"


def test_null_client_id_and_truncated_header() -> None:
    frame = frame_request(0, 9, 1, None, b"", True)[4:]
    assert parse_request_header(frame, True).client_id is None
    with pytest.raises(FrameError):
        parse_request_header(frame[:5], False)
    with pytest.raises(FrameError):
        parse_request_header(struct.pack(">hhih", 0, 9, 1, 50) + b"short", False)


@pytest.mark.parametrize("flexible", [False, True])
def test_response_framing(flexible: bool) -> None:
    framed = frame_response(5, b"xyz", flexible)
    (size,) = struct.unpack_from(">i", framed)
    assert size == len(framed) - 4
    cid, off = split_response(framed[4:], flexible)
    assert cid == 5 and framed[4 + off :] == b"xyz"


@given(
    st.lists(st.binary(max_size=300), max_size=8),
    st.lists(st.integers(1, 400), min_size=1, max_size=30),
)
def test_any_split_of_the_stream_gives_the_same_frames(
    bodies: list[bytes], cuts: list[int]
) -> None:
    stream = b"".join(struct.pack(">i", len(b)) + b for b in bodies)
    dec = FrameDecoder(1000)
    out: list[bytes] = []
    pos = 0
    for n in cuts * (len(stream) // max(sum(cuts), 1) + 1):
        out += dec.feed(stream[pos : pos + n])
        pos += n
        if pos >= len(stream):
            break
    out += dec.feed(stream[pos:])
    assert out == bodies
    assert dec.buffered == 0


def _read_through_buffers(dec: FrameDecoder, stream: bytes, cuts: list[int]) -> list[bytes]:
    """Deliver ``stream`` as a buffered protocol would: into get_buffer, at most ``cut`` bytes
    a read (cycling through ``cuts``)."""
    out: list[bytes] = []
    pos, i = 0, 0
    while pos < len(stream):
        buf = dec.get_buffer()
        assert len(buf) > 0
        n = min(len(buf), cuts[i % len(cuts)], len(stream) - pos)
        buf[:n] = stream[pos : pos + n]
        buf.release()
        out += dec.buffer_updated(n)
        pos += n
        i += 1
    return out


@given(
    st.lists(st.binary(max_size=300), max_size=8),
    st.lists(st.integers(1, 400), min_size=1, max_size=30),
    st.sampled_from([0, 1, 70_000]),
)
def test_buffered_reads_give_the_same_frames(
    bodies: list[bytes], cuts: list[int], big: int
) -> None:
    bodies = [*bodies, bytes(range(256)) * (big // 256)]  # one frame past the small-frame size
    stream = b"".join(struct.pack(">i", len(b)) + b for b in bodies)
    shared = bytearray(1024)
    dec = FrameDecoder(1 << 20, shared)
    assert _read_through_buffers(dec, stream, [*cuts, 50_000]) == bodies
    assert dec.buffered == 0 and dec.pending_frame_size is None


def test_a_large_frame_is_read_into_one_buffer_of_its_size_allocated_on_demand() -> None:
    size = 5_000_000
    dec = FrameDecoder(size, bytearray(4096))
    prefix = struct.pack(">i", size) + b"x" * 100
    buf = dec.get_buffer()
    buf[: len(prefix)] = prefix
    buf.release()
    assert dec.buffer_updated(len(prefix)) == []
    # Known size, nothing allocated yet: a caller may reserve the memory before reading on.
    assert (dec.pending_frame_size, dec.buffered) == (size, 104)
    assert dec._frame is None
    first = dec.get_buffer()
    assert len(first) == size - 100  # the rest of the frame, straight into its buffer
    frame_buffer = first.obj
    first[:] = b"y" * (size - 100)
    first.release()
    assert dec.buffered == 104
    [frame] = dec.buffer_updated(size - 100)
    assert frame == b"x" * 100 + b"y" * (size - 100)
    assert len(frame_buffer) == size  # allocated once at its declared size, never regrown
    assert dec.buffered == 0


def test_the_limit_is_checked_on_the_prefix_and_named() -> None:
    dec = FrameDecoder(512, bytearray(64), limit_name="sasl.server.max.receive.size")
    buf = dec.get_buffer()
    buf[:4] = struct.pack(">i", 513)
    buf.release()
    with pytest.raises(FrameError, match=r"513 bytes exceeds sasl\.server\.max\.receive\.size"):
        dec.buffer_updated(4)


def _large(dec: FrameDecoder, body: bytes) -> memoryview:
    """Read one large frame through the decoder's buffers, in two reads."""
    stream = struct.pack(">i", len(body)) + body
    [frame] = _read_through_buffers(dec, stream, [1000, len(stream)])
    assert isinstance(frame, memoryview)
    return frame


def test_a_lending_decoder_hands_out_its_buffer_and_reads_the_next_frame_into_it() -> None:
    buffers = FrameBuffers(1 << 20)
    dec = FrameDecoder(1 << 20, bytearray(4096), buffers=buffers)
    frame = _large(dec, b"a" * 100_000)
    assert frame.readonly and frame == b"a" * 100_000  # no copy: a view of the read buffer
    with pytest.raises(TypeError):
        frame[0] = 0  # type: ignore[index]
    assert buffers.kept == 100_000
    del frame  # handled and answered: nobody refers to it any more
    frame = _large(dec, b"b" * 90_000)  # smaller, within the same allocation
    assert frame == b"b" * 90_000 and buffers.reused == 1 and buffers.kept == 90_000
    dec.release()  # the connection is gone
    assert buffers.kept == 0


def test_a_frame_still_referred_to_is_never_overwritten() -> None:
    # A queued append (or a slice, a decoded field) still reading the last frame: the next
    # frame goes into a new buffer, and what the holder reads is unchanged.
    buffers = FrameBuffers(1 << 20)
    dec = FrameDecoder(1 << 20, bytearray(4096), buffers=buffers)
    first = _large(dec, b"a" * 100_000)
    tail = first[50_000:]
    del first
    second = _large(dec, b"b" * 100_000)
    assert tail == b"a" * 50_000 and second == b"b" * 100_000
    assert buffers.reused == 0


def test_kept_buffers_are_bounded_across_decoders() -> None:
    buffers = FrameBuffers(250_000, largest=150_000)
    decoders = [FrameDecoder(1 << 20, bytearray(4096), buffers=buffers) for _ in range(4)]
    for dec in decoders:
        assert _large(dec, b"x" * 100_000) == b"x" * 100_000
    assert buffers.kept == 200_000  # two kept; a third would pass the capacity
    dec = decoders[-1]
    assert _large(dec, b"y" * 200_000) == b"y" * 200_000  # over `largest`: not kept
    assert buffers.kept == 200_000
    for dec in decoders:
        dec.release()
    assert buffers.kept == 0


def test_a_decoder_without_buffers_hands_out_bytes() -> None:
    # The clients' decoders: their frames are bytes, as their parsers expect.
    dec = FrameDecoder(1 << 20, bytearray(4096))
    stream = struct.pack(">i", 100_000) + b"z" * 100_000
    [frame] = _read_through_buffers(dec, stream, [1000, len(stream)])
    assert type(frame) is bytes and frame == b"z" * 100_000
    [frame] = FrameDecoder(1 << 20).feed(stream)
    assert type(frame) is bytes


def test_after_a_large_frame_the_next_size_is_read_alone() -> None:
    # As Kafka reads a size then its body: the next large body goes straight into its own
    # buffer, never through the read buffer to be copied out of it.
    dec = FrameDecoder(1 << 20, bytearray(4096), buffers=FrameBuffers(1 << 20))
    assert len(dec.get_buffer()) == 4096
    _large(dec, b"a" * 100_000)
    buf = dec.get_buffer()
    assert len(buf) == 4
    buf[:] = struct.pack(">i", 100_000)
    buf.release()
    assert dec.buffer_updated(4) == []
    body = dec.get_buffer()
    assert len(body) == 100_000 and dec.buffered == 4  # the whole body, nothing copied
    body[:] = b"b" * 100_000
    body.release()
    assert dec.buffer_updated(100_000) == [b"b" * 100_000]
    # Small frames again: read many at a time.
    assert _read_through_buffers(dec, struct.pack(">i", 3) + b"abc", [4]) == [b"abc"]
    assert len(dec.get_buffer()) == 4096
