"""Kafka framing, sans-IO: size-prefixed frames in, request headers out.

Theory of operation
-------------------
Every Kafka request and response is ``int32 size`` followed by ``size`` bytes. A
:class:`FrameDecoder` is fed whatever bytes the socket produced (or lends the buffer the
socket reads into, as Kafka reads a request into a buffer of its declared size) and returns
the complete frames it now holds; it never touches a socket, so the same code serves the
broker, the client and the tests. A frame larger than the configured limit
(``socket.request.max.bytes``, or ``sasl.server.max.receive.size`` before authentication) or
with a negative size is a :class:`FrameError`: the caller closes the connection, as Kafka does,
because the stream can no longer be trusted.

Request headers come in three versions: v0 (key, version, correlation id), v1 (+ nullable
client id) and v2 (v1 + tagged fields), v2 being used by the "flexible" versions of each API.
They are parsed with ``struct`` here rather than through kio because every request pays
for it.
"""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass

# A frame without its size prefix: bytes, or (a decoder lending its buffers) a read-only view.
Frame = bytes | memoryview

_SIZE = struct.Struct(">i")
_HEADER_FIXED = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_CORRELATION = struct.Struct(">i")
_HEADER_ROUTE = struct.Struct(">hhi")  # api key, api version, correlation id


_SMALL_FRAME = 1 << 16  # frames up to this (with their prefix) are assembled in the read buffer
_READ_BUFFER = 1 << 18  # a decoder's own read buffer, when not given a shared one


def _references_of_a_local() -> int:
    obj = bytearray(1)
    return sys.getrefcount(obj)


# What sys.getrefcount says of an object only a local variable refers to, measured with the
# same code shape as FrameDecoder._reclaim's test, so the interpreter's own counting cancels
# out. Reuse relies on a count meaning "nobody else can read it": not so without the GIL.
_ALONE = _references_of_a_local()
_COUNTS_REFERENCES = (
    sys.implementation.name == "cpython" and getattr(sys, "_is_gil_enabled", lambda: True)()
)


class FrameBuffers:
    """Large frames' buffers kept for reuse, shared by many decoders, at most ``capacity``
    bytes of them in all (each at most ``largest``).

    A decoder lending frames hands out the very buffer it read a frame into (no copy) and
    keeps a reference to it, counted here. When its next large frame comes, it reads into
    that buffer again if nothing else refers to it any longer: whoever handled the frame is
    done with it, as any view or slice into it would hold a reference. Reusing saves the
    allocation, its zero-fill and, for a fresh large one, its page faults."""

    __slots__ = ("capacity", "kept", "largest", "reused")

    def __init__(self, capacity: int, largest: int = 1 << 21) -> None:
        self.capacity = capacity if _COUNTS_REFERENCES else 0
        self.largest = largest
        self.kept = 0  # bytes of buffers decoders hold on to between frames
        self.reused = 0  # frames read into a kept buffer (for tests and benchmarks)

    def keep(self, size: int) -> bool:
        """May a decoder keep a buffer of ``size`` bytes? (It is then counted.)"""
        if size > self.largest or self.kept + size > self.capacity:
            return False
        self.kept += size
        return True


class FrameError(Exception):
    """The byte stream is not valid Kafka framing; the connection must be closed."""


class FrameDecoder:
    """Splits a byte stream into frames (without their size prefix).

    Two ways in: ``feed(data)`` with bytes already read, or the buffered-protocol pair
    ``get_buffer()`` / ``buffer_updated(n)``, which has the caller read straight into the
    decoder's memory. There, small frames are read many at a time into one read buffer (which
    may be shared by many decoders: nothing stays in it between the two calls), and a frame
    larger than ``_SMALL_FRAME`` (or half the read buffer) is read into a buffer of its
    declared size, allocated once when the next read asks for it (not when the prefix arrives,
    so a caller that must first reserve the memory can hold off reading), and never copied
    while it fills. After a large frame the next size is read alone, so that a run of large
    frames is read without a copy. With :class:`FrameBuffers`, large frames are lent out
    (read-only views, not copies) and their buffers reused.
    """

    __slots__ = (
        "_buffers",
        "_filled",
        "_frame",
        "_into_frame",
        "_kept",
        "_kept_size",
        "_large_next",
        "_pending",
        "_scratch",
        "_small",
        "_view",
        "limit_name",
        "max_frame_size",
    )

    def __init__(
        self,
        max_frame_size: int,
        read_buffer: bytearray | None = None,
        limit_name: str = "socket.request.max.bytes",
        buffers: FrameBuffers | None = None,
    ) -> None:
        self.max_frame_size = max_frame_size
        self.limit_name = limit_name  # the setting named when a frame is over the limit
        self._scratch = read_buffer
        self._view: memoryview | None = None  # of _scratch, made at the first read
        # Larger frames get their own buffer; smaller ones are completed in the read buffer,
        # which must keep room to read into after them.
        self._small = min(_SMALL_FRAME, len(read_buffer) // 2 if read_buffer else _READ_BUFFER)
        self._pending = b""  # raw bytes of an incomplete frame not yet in a frame buffer
        self._frame: bytearray | None = None  # the large frame being read, once allocated
        self._filled = 0  # bytes of _frame received
        self._into_frame = False  # the last get_buffer handed out _frame
        # With ``buffers``, large frames are handed out as read-only views of the bytearray
        # they were read into, the last one kept (_kept) to read the next into once nobody
        # else refers to it; without, as bytes (a copy), as the clients expect.
        self._buffers = buffers
        self._kept: bytearray | None = None
        self._kept_size = 0  # as counted in buffers.kept
        # The last frame was large: read the next one's size alone first, as Kafka does, so
        # its body goes straight into its buffer, not into the read buffer to be copied out.
        self._large_next = False

    # -- the buffered-protocol pair --------------------------------------------------------

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next bytes read should go (any amount up to its length)."""
        pending = self._pending
        if self._frame is None and not pending:  # the common case: between frames
            self._into_frame = False
            view = self._view or self._read_view()
            return view[:4] if self._large_next else view[:]  # a view of its own: released
        if self._frame is None and self._large_pending():
            self._allocate()
        frame = self._frame
        if frame is not None:
            self._into_frame = True
            return memoryview(frame)[self._filled :]
        self._into_frame = False
        view = self._view or self._read_view()
        view[: len(pending)] = pending
        return view[len(pending) :]

    def _read_view(self) -> memoryview:
        if self._scratch is None:
            self._scratch = bytearray(_READ_BUFFER)
        self._view = memoryview(self._scratch)  # kept: the buffer is never resized
        return self._view

    def buffer_updated(self, nbytes: int) -> list[Frame]:
        """``nbytes`` were written at the start of the last :meth:`get_buffer`'s buffer."""
        if self._into_frame:
            self._filled += nbytes
            frame = self._frame
            assert frame is not None
            if self._filled < len(frame):
                return []
            return [self._complete(frame)]
        view = self._view
        assert view is not None
        end = len(self._pending) + nbytes
        frames: list[Frame] = []
        pos = self._split(view, 0, end, frames)
        self._pending = view[pos:end].tobytes() if pos < end else b""
        if frames:
            self._large_next = False  # small frames again: read many at a time
        return frames

    # -- bytes already read -------------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        frames: list[Frame] = []
        with memoryview(data) as view:
            end = len(view)
            pos = self._complete_pending(view, frames) if self._pending or self._frame else 0
            if pos < end:
                pos = self._split(view, pos, end, frames)
                self._pending = view[pos:end].tobytes() if pos < end else b""
        return frames

    def _complete_pending(self, view: memoryview, frames: list[Frame]) -> int:
        """Use the start of ``view`` to complete the frame already begun; where it ends."""
        pos, end = 0, len(view)
        while pos < end:
            if self._frame is None and self._large_pending():
                self._allocate()
            frame = self._frame
            if frame is not None:
                n = min(end - pos, len(frame) - self._filled)
                frame[self._filled : self._filled + n] = view[pos : pos + n]
                self._filled += n
                pos += n
                if self._filled == len(frame):
                    frames.append(self._complete(frame))
                return pos
            pending = self._pending
            if not pending:
                return pos
            # A small frame or a partial size prefix: complete the prefix, then the frame.
            need = 4 - len(pending) if len(pending) < 4 else 4 + self._declared() - len(pending)
            take = min(need, end - pos)
            pending = self._pending = pending + view[pos : pos + take].tobytes()
            pos += take
            if len(pending) == 4:
                self._declared()  # checks the size now that it is known
            if len(pending) >= 4 and len(pending) == 4 + self._declared():
                frames.append(pending[4:])
                self._pending = b""
        return pos

    def _split(self, view: memoryview, pos: int, end: int, frames: list[Frame]) -> int:
        """Append the complete frames of ``view[pos:end]``; where the incomplete rest starts."""
        limit = self.max_frame_size
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(view, pos)
            if size < 0 or size > limit:
                self._check(size)
            if end - pos - 4 < size:
                break
            frames.append(view[pos + 4 : pos + 4 + size].tobytes())
            pos += 4 + size
        return pos

    def _check(self, size: int) -> None:
        if size < 0 or size > self.max_frame_size:
            raise FrameError(
                f"frame of {size} bytes exceeds {self.limit_name} ({self.max_frame_size})"
                if size > 0
                else f"negative frame size {size}"
            )

    def _declared(self) -> int:
        (size,) = _SIZE.unpack_from(self._pending, 0)
        self._check(size)
        return int(size)

    def _large_pending(self) -> bool:
        return len(self._pending) >= 4 and self._declared() + 4 > self._small

    def _allocate(self) -> None:
        pending = self._pending
        size = self._declared()
        self._frame = frame = self._reclaim(size) or bytearray(size)
        self._filled = len(pending) - 4
        frame[: self._filled] = memoryview(pending)[4:]
        self._pending = b""

    def _reclaim(self, size: int) -> bytearray | None:
        """The kept buffer, resized to ``size``, if nothing but this decoder refers to it."""
        kept = self._kept
        if kept is None:
            return None
        self.release()
        if sys.getrefcount(kept) > _ALONE:
            return None  # still read by whoever handled it (a queued append, a view): let go
        if not len(kept) // 2 <= size <= len(kept):
            return None  # growing or halving it would reallocate (and copy) anyway
        del kept[size:]  # in place: CPython keeps the allocation unless it halves
        assert self._buffers is not None
        self._buffers.reused += 1
        return kept

    def _complete(self, frame: bytearray) -> Frame:
        """The large frame is in: hand it out (the buffer itself when lending)."""
        self._frame, self._filled = None, 0
        self._large_next = True
        buffers = self._buffers
        if buffers is None:
            return bytes(frame)
        if buffers.keep(len(frame)):
            self._kept, self._kept_size = frame, len(frame)
        # Read-only, as bytes are: a handler cannot change what another part still reads.
        return memoryview(frame).toreadonly()

    def release(self) -> None:
        """Let go of the kept buffer (the connection is gone): the allowance gets it back."""
        if self._kept is not None and self._buffers is not None:
            self._buffers.kept -= self._kept_size
        self._kept, self._kept_size = None, 0

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame received so far (with its size prefix)."""
        return 4 + self._filled if self._frame is not None else len(self._pending)

    @property
    def pending_frame_size(self) -> int | None:
        """Declared size of the incomplete frame being read, once its 4-byte prefix is in
        (already checked against the limit); None before that."""
        if self._frame is not None:
            return len(self._frame)
        if len(self._pending) < 4:
            return None
        return int(_SIZE.unpack_from(self._pending, 0)[0])


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int  # where the request body starts in the frame


def peek_request_header(frame: Frame) -> tuple[int, int, int]:
    """api key, api version, correlation id: enough to route or to refuse a request."""
    if len(frame) < 8:
        raise FrameError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _HEADER_ROUTE.unpack_from(frame, 0)
    return api_key, api_version, correlation_id


def parse_request_header(frame: Frame, flexible: bool) -> RequestHeader:
    """Parse a v1 (or, when ``flexible``, v2) request header."""
    if len(frame) < 10:
        raise FrameError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id, client_len = _HEADER_FIXED.unpack_from(frame, 0)
    pos = 10
    client_id: str | None = None
    if client_len >= 0:
        if pos + client_len > len(frame):
            raise FrameError("client id runs past the end of the request")
        client_id = str(frame[pos : pos + client_len], "utf-8", "replace")
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


def skip_tagged_fields(buf: bytes | memoryview, pos: int) -> int:
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
