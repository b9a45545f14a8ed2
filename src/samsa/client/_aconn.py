"""One asyncio connection to a broker: pipelined requests matched by correlation id.

Requests are written in order and Kafka answers them in order on a connection, so a reader
task pops the oldest pending request for each response frame. Any failure (EOF, reset,
malformed frame, or a request timing out) closes the connection and fails every request
still pending on it with :class:`KafkaConnectionError`: the caller cannot know whether the
broker acted on them, which is exactly the "unknown outcome" the producer's retry logic is
built around. After ApiVersions the connection knows the version range of every API the
broker serves; :meth:`AsyncConnection.version` picks the highest both sides speak.

KIP-368 re-authentication runs on the open connection before the session ends. While it
does, requests other than its own SaslHandshake and SaslAuthenticate are held, not written
(Kafka's broker closes a connection that sends one in the middle of an authentication), and
written in their order once it completes; answers to requests written before it still come
first, as the broker answers in order.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from typing import Any

from samsa.client._errors import KafkaConnectionError, KafkaError
from samsa.client._security import PLAINTEXT, Security, sasl_steps
from samsa.protocol.errors import ErrorCode
from samsa.protocol.framing import FrameDecoder, FrameError, frame_request, split_response
from samsa.protocol.messages import (
    ApiKey,
    api_name,
    decode_response,
    encode_request,
    is_flexible,
    make_request,
)

log = logging.getLogger("samsa.client")
_SASL_APIS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


class AsyncConnection:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str = "samsa",
        request_timeout: float = 30.0,
        node_id: int = -1,
        security: Security = PLAINTEXT,
    ) -> None:
        self.security = security
        self.host = host
        self.port = port
        self.node_id = node_id
        self.client_id = client_id
        self.request_timeout = request_timeout
        self.api_versions: dict[int, tuple[int, int]] = {}
        # Finalized feature levels (ApiVersions v3+), e.g. transaction.version.
        self.features: dict[str, int] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: collections.OrderedDict[int, tuple[int, int, asyncio.Future[Any]]] = (
            collections.OrderedDict()
        )
        self._correlation = 0
        self._read_task: asyncio.Task[None] | None = None
        self._reauth: asyncio.TimerHandle | asyncio.Task[None] | None = None
        # Requests made during a re-authentication, written once it completes (None: none
        # under way): (correlation id, api key, version, future or None, frame).
        self._held: list[tuple[int, int, int, asyncio.Future[Any] | None, bytes]] | None = None
        self._closed = False
        self.close_reason: str | None = None

    def __repr__(self) -> str:
        return f"AsyncConnection({self.host}:{self.port}, node={self.node_id})"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def connect(self, timeout: float | None = None) -> AsyncConnection:
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self.security.ssl_context,
                    server_hostname=self.security.server_hostname(self.host),
                ),
                timeout or self.request_timeout,
            )
        except (OSError, TimeoutError) as exc:
            self._closed = True
            raise KafkaConnectionError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        self._read_task = asyncio.get_running_loop().create_task(self._read_loop())
        try:
            await self._negotiate()
            if self.security.sasl:
                await self._authenticate()
        except BaseException:
            self.close("ApiVersions or SASL authentication failed")  # not left half-open
            raise
        return self

    async def _negotiate(self) -> None:
        for version in (3, 0):
            req = make_request(
                ApiKey.API_VERSIONS,
                version,
                "ApiVersionsRequest",
                client_software_name="samsa",
                client_software_version="0.1",
            )
            resp = await self.request(ApiKey.API_VERSIONS, req, version=version)
            if resp.error_code == ErrorCode.UNSUPPORTED_VERSION:
                continue
            if resp.error_code:
                raise KafkaError(int(resp.error_code), "ApiVersions")
            self.api_versions = {
                int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys
            }
            if getattr(resp, "finalized_features_epoch", -1) >= 0:
                self.features = {
                    str(f.name): int(f.max_version_level) for f in resp.finalized_features
                }
            return
        raise KafkaError(ErrorCode.UNSUPPORTED_VERSION, "broker refused ApiVersions v0 and v3")

    async def _authenticate(self) -> None:
        steps = sasl_steps(self.security, self.version(ApiKey.SASL_AUTHENTICATE, 0, 2))
        step = next(steps)
        while True:
            resp = await self.request(step[0], step[2], version=step[1])
            try:
                step = steps.send(resp)
            except StopIteration:
                break
        # KIP-368: re-authenticate on this connection before the session ends (at 85% of
        # its lifetime, as Java's client does at 85-95%).
        lifetime = getattr(resp, "session_lifetime", None)  # kio: a timedelta (v1+)
        seconds = lifetime.total_seconds() if lifetime is not None else 0.0
        if seconds > 0 and not self._closed:
            loop = asyncio.get_running_loop()
            self._reauth = loop.call_later(seconds * 0.85, self._start_reauth)

    def _start_reauth(self) -> None:
        if not self._closed:
            self._reauth = asyncio.get_running_loop().create_task(self._reauthenticate())

    async def _reauthenticate(self) -> None:
        self._held = []
        try:
            await self._authenticate()
        except KafkaError as exc:
            self.close(f"re-authentication failed: {exc}")
        finally:
            held, self._held = self._held, None
            if not self._closed:
                for cid, api_key, version, fut, data in held:
                    self._write(cid, api_key, version, fut, data)

    def supports(self, api_key: int) -> bool:
        return api_key in self.api_versions

    def version(self, api_key: int, lo: int, hi: int) -> int:
        """Highest version in [lo, hi] the broker also serves."""
        if api_key not in self.api_versions:
            raise KafkaError(
                ErrorCode.UNSUPPORTED_VERSION, f"broker does not serve {api_name(api_key)}"
            )
        blo, bhi = self.api_versions[api_key]
        v = min(hi, bhi)
        if v < max(lo, blo):
            raise KafkaError(
                ErrorCode.UNSUPPORTED_VERSION,
                f"{api_name(api_key)}: broker serves v{blo}-{bhi}, client v{lo}-{hi}",
            )
        return v

    def send_nowait(
        self, api_key: int, entity: Any, *, version: int, expect_response: bool = True
    ) -> asyncio.Future[Any]:
        """Write a request now; the future resolves with the decoded response entity."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._closed or self._writer is None:
            fut.set_exception(KafkaConnectionError(f"connection to {self} is closed"))
            return fut
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        cid = self._correlation
        data = frame_request(
            api_key,
            version,
            cid,
            self.client_id,
            encode_request(api_key, version, entity),
            is_flexible(api_key, version),
        )
        waiting = fut if expect_response else None
        if not expect_response:
            fut.set_result(None)
        if self._held is not None and api_key not in _SASL_APIS:
            self._held.append((cid, api_key, version, waiting, data))
        else:
            self._write(cid, api_key, version, waiting, data)
        return fut

    def _write(
        self, cid: int, api_key: int, version: int, fut: asyncio.Future[Any] | None, data: bytes
    ) -> None:
        assert self._writer is not None
        if fut is not None:
            self._pending[cid] = (api_key, version, fut)
        try:
            self._writer.write(data)
        except (OSError, RuntimeError) as exc:
            self.close(f"write failed: {exc}")

    async def request(
        self, api_key: int, entity: Any, *, version: int, timeout: float | None = None
    ) -> Any:
        fut = self.send_nowait(api_key, entity, version=version)
        await self.drain()
        return await self.wait_response(fut, api_key, timeout)

    async def drain(self) -> None:
        writer = self._writer
        if writer is not None and not self._closed:
            try:
                await writer.drain()
            except (OSError, RuntimeError) as exc:
                self.close(f"write failed: {exc}")

    async def wait_response(
        self, fut: asyncio.Future[Any], api_key: int, timeout: float | None = None
    ) -> Any:
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout or self.request_timeout)
        except TimeoutError:
            # Responses come in order: one that is late blocks all others, so the connection
            # is given up (as Kafka's clients do) and every request on it fails.
            self.close(f"{api_name(api_key)} timed out")
            with contextlib.suppress(BaseException):
                await fut
            raise KafkaConnectionError(
                f"{api_name(api_key)} to {self.host}:{self.port} timed out"
            ) from None

    async def _read_loop(self) -> None:
        assert self._reader is not None
        decoder = FrameDecoder(1 << 30)
        reason = "broker closed the connection"
        try:
            while True:
                data = await self._reader.read(1 << 18)
                if not data:
                    break
                for frame in decoder.feed(data):
                    self._dispatch(frame)
        except (OSError, FrameError, KafkaConnectionError) as exc:
            reason = str(exc) or type(exc).__name__
        except asyncio.CancelledError:
            reason = "connection closed"
        self.close(reason)

    def _dispatch(self, frame: bytes) -> None:
        if not self._pending:
            raise KafkaConnectionError("response without a request")
        cid, (api_key, version, fut) = self._pending.popitem(last=False)
        flexible = is_flexible(api_key, version) and api_key != ApiKey.API_VERSIONS
        got, offset = split_response(frame, flexible)
        if got != cid:
            raise KafkaConnectionError(f"correlation id {got} does not match {cid}")
        if fut.done():
            return
        try:
            fut.set_result(decode_response(api_key, version, frame, offset))
        except Exception as exc:  # a body kio cannot read: fail this request only
            fut.set_exception(
                KafkaError(ErrorCode.CORRUPT_MESSAGE, f"malformed {api_name(api_key)}: {exc}")
            )

    def close(self, reason: str = "closed by client") -> None:
        if self._closed:
            return
        self._closed = True
        self.close_reason = reason
        log.debug("closing %s: %s", self, reason)
        pending = [fut for _key, _v, fut in self._pending.values()]
        pending += [fut for _c, _k, _v, fut, _d in self._held or () if fut is not None]
        self._pending.clear()
        self._held = None
        for fut in pending:
            if not fut.done():
                fut.set_exception(KafkaConnectionError(f"{self.host}:{self.port}: {reason}"))
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        if self._reauth is not None and self._reauth is not asyncio.current_task():
            self._reauth.cancel()
        task = self._read_task
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()
