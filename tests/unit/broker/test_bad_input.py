"""Bad input closes the offending connection and harms nothing else."""

from __future__ import annotations

import struct

from samsa.client._connection import BlockingConnection
from samsa.protocol.errors import ErrorCode
from samsa.protocol.framing import frame_request, split_response
from samsa.protocol.messages import ApiKey, decode_response, make_request
from samsa.testing import create_topic, fetch_request, idempotent_batch, produce_one


def _healthy(port: int, topic: str, expected_batches: int) -> None:
    with BlockingConnection("127.0.0.1", port) as c:
        resp = c.request(ApiKey.FETCH, 12, fetch_request({(topic, 0): 0}))
        p = resp.responses[0].partitions[0]
        assert int(p.error_code) == 0
        assert int(p.high_watermark) == expected_batches


def test_unsupported_api_versions_version_gets_35_with_v0_body(shared_broker) -> None:  # type: ignore[no-untyped-def]
    with BlockingConnection("127.0.0.1", shared_broker.port) as c:
        c.send_bytes(frame_request(ApiKey.API_VERSIONS, 99, 7, "t", b"\x00", True))
        frame = c.receive_frame()
        cid, off = split_response(frame, False)
        assert cid == 7
        body = decode_response(ApiKey.API_VERSIONS, 0, frame, off)
        assert int(body.error_code) == ErrorCode.UNSUPPORTED_VERSION
        keys = {int(k.api_key) for k in body.api_keys}
        assert {ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.API_VERSIONS} <= keys


def test_api_versions_every_version(shared_broker) -> None:  # type: ignore[no-untyped-def]
    with BlockingConnection("127.0.0.1", shared_broker.port) as c:
        for v in range(5):
            req = make_request(
                ApiKey.API_VERSIONS,
                v,
                "ApiVersionsRequest",
                client_software_name="t",
                client_software_version="1",
            )
            resp = c.request(ApiKey.API_VERSIONS, v, req)
            assert int(resp.error_code) == 0
            produce = next(k for k in resp.api_keys if int(k.api_key) == ApiKey.PRODUCE)
            assert (int(produce.min_version), int(produce.max_version)) == (3, 13)


def _bad_connection_closed(port: int, payload: bytes) -> bool:
    with BlockingConnection("127.0.0.1", port) as c:
        c.send_bytes(payload)
        return c.is_closed_by_peer()


def test_bad_frames_close_only_their_connection(shared_broker) -> None:  # type: ignore[no-untyped-def]
    port = shared_broker.port
    with BlockingConnection("127.0.0.1", port) as good:
        assert create_topic(good, "bad-input") == 0
        assert produce_one(good, "bad-input", 0, idempotent_batch(-1, -1, -1)) == (0, 0)
        cases = {
            "frame over socket.request.max.bytes": struct.pack(">i", 200 * 1024 * 1024),
            "negative size": struct.pack(">i", -5),
            "unknown api key": frame_request(999, 0, 1, "t", b"", False),
            "unsupported produce version": frame_request(ApiKey.PRODUCE, 1, 1, "t", b"", False),
            "garbage body": frame_request(ApiKey.PRODUCE, 9, 1, "t", b"\xff" * 40, True),
            "garbage bytes": struct.pack(">i", 6) + b"\x00\x03\xff\xff\xff\xff",
        }
        for name, payload in cases.items():
            seen = len(shared_broker.log)
            assert _bad_connection_closed(port, payload), name
            line = shared_broker.wait_for_log("closing connection", after=seen)
            assert line is not None, name
            print(name, "->", line)
        # A truncated frame: the broker waits for the rest; closing our end loses nothing.
        with BlockingConnection("127.0.0.1", port) as c:
            c.send_bytes(frame_request(ApiKey.PRODUCE, 9, 1, "t", b"\x00" * 100, True)[:50])
        # The good connection and the data are untouched.
        assert produce_one(good, "bad-input", 0, idempotent_batch(-1, -1, -1)) == (0, 1)
    _healthy(port, "bad-input", 2)
