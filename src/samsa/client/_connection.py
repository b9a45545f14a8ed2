"""The client side's only socket code: one Kafka connection, framing from ``protocol/``.

:class:`BlockingConnection` sends a request entity and waits for its response; it is what
the CLI, the tests and the benchmarks use to speak raw protocol. Pipelining is available
through :meth:`send` / :meth:`receive` for load generators that keep several requests in
flight.
"""

from __future__ import annotations

import socket
from typing import Any

from samsa.client._security import PLAINTEXT, Security, sasl_steps
from samsa.protocol.framing import FrameDecoder, frame_request, split_response
from samsa.protocol.messages import ApiKey, decode_response, encode_request, is_flexible


class ConnectionClosed(Exception):
    pass


class BlockingConnection:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str = "samsa",
        timeout: float = 30.0,
        security: Security = PLAINTEXT,
    ) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client_id = client_id
        self._decoder = FrameDecoder(1 << 30)
        self._frames: list[bytes] = []
        self._correlation = 0
        try:
            if security.ssl_context is not None:
                self.sock = security.ssl_context.wrap_socket(
                    self.sock, server_hostname=security.server_hostname(host)
                )
            if security.sasl:
                self._authenticate(security)
        except BaseException:
            self.sock.close()
            raise

    def _authenticate(self, security: Security) -> None:
        # SaslAuthenticate v1: every broker with SASL serves it (Kafka 1.0+).
        steps = sasl_steps(security, 1)
        step = next(steps)
        while True:
            resp = self.request(step[0], step[1], step[2])
            try:
                step = steps.send(resp)
            except StopIteration:
                return

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> BlockingConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_correlation_id(self) -> int:
        self._correlation += 1
        return self._correlation

    def encode(self, api_key: int, version: int, entity: Any, correlation_id: int) -> bytes:
        return frame_request(
            api_key,
            version,
            correlation_id,
            self.client_id,
            encode_request(api_key, version, entity),
            is_flexible(api_key, version),
        )

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, api_key: int, version: int, entity: Any) -> int:
        cid = self.next_correlation_id()
        self.sock.sendall(self.encode(api_key, version, entity, cid))
        return cid

    def receive_frame(self) -> bytes:
        while not self._frames:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionClosed("broker closed the connection")
            self._frames.extend(self._decoder.feed(data))
        return self._frames.pop(0)

    def receive(self, api_key: int, version: int, correlation_id: int) -> Any:
        frame = self.receive_frame()
        # ApiVersions responses always carry a v0 header.
        flexible = is_flexible(api_key, version) and api_key != ApiKey.API_VERSIONS
        cid, offset = split_response(frame, flexible)
        if cid != correlation_id:
            raise ConnectionClosed(f"correlation id {cid} does not match {correlation_id}")
        return decode_response(api_key, version, frame, offset)

    def request(self, api_key: int, version: int, entity: Any) -> Any:
        cid = self.send(api_key, version, entity)
        return self.receive(api_key, version, cid)

    def is_closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True once the broker has closed the connection (reads EOF or a reset)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
