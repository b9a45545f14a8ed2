"""The zero-copy writer: one Fetch response at a time from segment files to a descriptor.

A response whose record bytes are pinned segment-file slices (:class:`FileSlice`) is written
with our own syscalls, as Kafka's ``FileRecords.writeTo`` does: the bytes with ``os.write``,
the slices with ``os.sendfile`` (kernel to socket, no copy through Python). The writer knows
no event loop and no socket: ``broker/server.py`` hands it a duplicate of the socket's
descriptor once the transport has written everything before the response, calls
:meth:`ZeroCopyWriter.send` again when the descriptor is writable, and counts
:attr:`ZeroCopyWriter.unsent` against the connection's back-pressure limit.
"""

from __future__ import annotations

import errno
import os
from collections import deque
from typing import Any

from samsa.broker.connection import release_pieces
from samsa.log.segment import FileSlice


class ZeroCopyWriter:
    """The pieces of the response being written and how far it got."""

    def __init__(self) -> None:
        self.pieces: deque[Any] | None = None  # bytes and FileSlice, None: idle
        self.offset = 0  # bytes of pieces[0] already written
        self.unsent = 0  # bytes of the response not yet written

    @property
    def busy(self) -> bool:
        return self.pieces is not None

    def start(self, pieces: list[Any]) -> None:
        """Take a framed response (its prefix first); nothing is written until :meth:`send`."""
        self.pieces = deque(pieces)
        self.offset = 0
        self.unsent = sum(len(p) for p in pieces)

    def send(self, fd: int) -> bool:
        """Write as much as the descriptor takes; True once everything is written, False when
        it would block (call again when writable). Other errors propagate, the place kept."""
        pieces = self.pieces
        assert pieces is not None
        off = self.offset
        try:
            while pieces:
                piece = pieces[0]
                if isinstance(piece, FileSlice):
                    n = os.sendfile(fd, piece.fd, piece.position + off, piece.size - off)
                    if n == 0:
                        raise OSError(errno.EIO, f"segment file ended inside {piece!r}")
                else:
                    n = os.write(fd, memoryview(piece)[off:])
                off += n
                self.unsent -= n
                if off == len(piece):
                    pieces.popleft()
                    if isinstance(piece, FileSlice):
                        piece.release()
                    off = 0
        except (BlockingIOError, InterruptedError):
            self.offset = off
            return False
        except OSError:
            self.offset = off
            raise
        self.pieces = None
        self.offset = self.unsent = 0
        return True

    def stop(self) -> None:
        """The connection is gone: unpin what was not sent."""
        if self.pieces is not None:
            release_pieces(self.pieces)
            self.pieces = None
            self.unsent = 0


__all__ = ["ZeroCopyWriter"]
