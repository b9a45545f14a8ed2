"""The skeleton the two in-process proxies share (:class:`~samsa.testing.proxy.FaultProxy`,
:class:`~samsa.testing.cluster.VirtualCluster`): an event loop on a daemon thread serving
listening sockets, each client connection relayed frame by frame to an upstream broker, and
a stop that can be called at any time, twice, or never started.

What a proxy does with the frames is its own; here are only the parts that must behave the
same in both: how frames are read, how listeners are bound and served, and how everything is
torn down so that closing the loop leaves no pending task behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

SIZE = struct.Struct(">i")
MAX_FRAME = 1 << 30

T = TypeVar("T")
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """One frame without its size prefix; None at EOF, on a reset or on a bad size."""
    try:
        (size,) = SIZE.unpack(await reader.readexactly(4))
        if not 0 <= size <= MAX_FRAME:
            return None
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        return None


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (port 0: a free one, known at once)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    return sock


class Relay:
    """The loop thread and the lifecycle; subclasses say what to serve at start
    (:meth:`_start_serving`), which sockets they listen on (:meth:`_sockets`), and how to close
    their servers and connections (:meth:`_close`)."""

    def __init__(self, thread_name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=thread_name)
        self._thread.daemon = True
        self._started = False
        self._stopped = False

    def stop(self) -> None:
        """Close every listener and connection, stop the thread; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._started and self._thread.is_alive():
            with contextlib.suppress(Exception):
                self._call(self._shutdown(), 5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
        for sock in self._sockets():
            sock.close()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start_serving(self, serve: Callable[[], Coroutine[Any, Any, object]]) -> None:
        """Start the loop thread and run ``serve()`` on it, once."""
        if self._started:
            return
        self._started = True
        self._thread.start()
        self._call(serve())

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        """Run ``coro`` on the loop thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @staticmethod
    async def _serve_socket(sock: socket.socket, handle: Handler) -> asyncio.Server:
        async def guarded(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            # Stopping cancels the connections; a cancelled connection task would make
            # asyncio's StreamReaderProtocol log a spurious error, so end it normally.
            with contextlib.suppress(asyncio.CancelledError):
                await handle(r, w)

        return await asyncio.start_server(guarded, sock=sock)

    async def _shutdown(self) -> None:
        self._close()
        # Let connection handlers finish so that closing the loop destroys no pending task.
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _sockets(self) -> list[socket.socket]:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError
