from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from samsa.protocol.framing import (
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
