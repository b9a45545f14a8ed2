"""Kafka framing, sans-IO: size-prefixed frames in, request headers out.

Theory of operation
-------------------
Every Kafka request and response is ``int32 size`` followed by ``size`` bytes. A
:class:`FrameDecoder` is fed whatever bytes the socket produced and returns the complete
frames it now holds; it never touches a socket, so the same code serves the broker, the
client and the tests. A frame larger than the configured limit (``socket.request.max.bytes``)
or with a negative size is a :class:`FrameError`: the caller closes the connection, as Kafka
does, because the stream can no longer be trusted.

Request headers come in three versions: v0 (key, version, correlation id), v1 (+ nullable
client id) and v2 (v1 + tagged fields), v2 being used by the "flexible" versions of each API.
They are parsed with ``struct`` here rather than through kio because every request pays
for it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_SIZE = struct.Struct(">i")
_HEADER_FIXED = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_CORRELATION = struct.Struct(">i")
_HEADER_ROUTE = struct.Struct(">hhi")  # api key, api version, correlation id


class FrameError(Exception):
    """The byte stream is not valid Kafka framing; the connection must be closed."""


class FrameDecoder:
    """Accumulates bytes and splits them into frames (without their size prefix)."""

    __slots__ = ("_buf", "max_frame_size")

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        # Each frame is copied once, into its own ``bytes``: from ``data`` directly when
        # nothing was pending, else out of the pending buffer through a memoryview.
        buf = self._buf
        if buf:
            buf += data
            source: bytes | bytearray = buf
        else:
            source = data
        frames: list[bytes] = []
        pos = 0
        end = len(source)
        with memoryview(source) as view:
            while end - pos >= 4:
                (size,) = _SIZE.unpack_from(source, pos)
                if size < 0 or size > self.max_frame_size:
                    raise FrameError(
                        f"frame of {size} bytes exceeds socket.request.max.bytes "
                        f"({self.max_frame_size})"
                        if size > 0
                        else f"negative frame size {size}"
                    )
                if end - pos - 4 < size:
                    break
                frames.append(view[pos + 4 : pos + 4 + size].tobytes())
                pos += 4 + size
        if source is buf:
            if pos:
                del buf[:pos]
        elif pos < end:
            buf += data[pos:]
        return frames

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame still waiting for the rest."""
        return len(self._buf)

    @property
    def pending_frame_size(self) -> int | None:
        """Declared size of the incomplete frame being read, once its 4-byte prefix is in
        (already checked against the limit); None before that."""
        if len(self._buf) < 4:
            return None
        return int(_SIZE.unpack_from(self._buf, 0)[0])


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the request body starts in the frame


def peek_request_header(frame: bytes) -> tuple[int, int, int]:
    """api key, api version, correlation id: enough to route or to refuse a request."""
    if len(frame) < 8:
        raise FrameError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _HEADER_ROUTE.unpack_from(frame, 0)
    return api_key, api_version, correlation_id


def parse_request_header(frame: bytes, flexible: bool) -> RequestHeader:
    """Parse a v1 (or, when ``flexible``, v2) request header."""
    if len(frame) < 10:
        raise FrameError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id, client_len = _HEADER_FIXED.unpack_from(frame, 0)
    pos = 10
    client_id: str | None = None
    if client_len >= 0:
        if pos + client_len > len(frame):
            raise FrameError("client id runs past the end of the request")
        client_id = frame[pos : pos + client_len].decode("utf-8", "replace")
        pos += client_len
    if flexible:
        pos = skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


def read_uvarint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise FrameError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 35:
            raise FrameError("varint longer than 5 bytes")


def skip_tagged_fields(buf: bytes, pos: int) -> int:
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise FrameError("tagged field runs past the end of the request")
    return pos


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def response_prefix(correlation_id: int, body_size: int, flexible_header: bool) -> bytes:
    """Size prefix + response header (v0, or v1 with empty tagged fields)."""
    if flexible_header:
        return _SIZE.pack(body_size + 5) + _CORRELATION.pack(correlation_id) + b"\0"
    return _SIZE.pack(body_size + 4) + _CORRELATION.pack(correlation_id)


def frame_response(correlation_id: int, body: bytes, flexible_header: bool) -> bytes:
    return response_prefix(correlation_id, len(body), flexible_header) + body


def frame_request(
    api_key: int,
    api_version: int,
    correlation_id: int,
    client_id: str | None,
    body: bytes,
    flexible_header: bool,
) -> bytes:
    """Size prefix + request header (v1 or v2) + body: the client side of the framing."""
    cid = b"" if client_id is None else client_id.encode()
    header = (
        _HEADER_FIXED.pack(
            api_key, api_version, correlation_id, -1 if client_id is None else len(cid)
        )
        + cid
    )
    if flexible_header:
        header += b"\0"
    return _SIZE.pack(len(header) + len(body)) + header + body


def split_response(frame: bytes, flexible_header: bool) -> tuple[int, int]:
    """Correlation id and body offset of a response frame (client side)."""
    if len(frame) < 4:
        raise FrameError("response shorter than its header")
    (correlation_id,) = _CORRELATION.unpack_from(frame, 0)
    pos = 4
    if flexible_header:
        pos = skip_tagged_fields(frame, pos)
    return correlation_id, pos
