"""Differential scenarios of bad input: unsupported versions, unknown APIs, malformed frames
(answered or the connection closed, as Kafka does), and produce, fetch and metadata requests
that name what does not exist or break the record format's rules."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable

from _scenario import TS, batch, producer, topic

from samsa.protocol.framing import frame_request
from samsa.protocol.messages import ApiKey, encode_request, make_request
from samsa.protocol.records import NewRecord, build_batch, build_control_batch
from samsa.testing.oracle import Deviation, Outcome, Rule, Side

Run = Callable[..., Outcome]


def frame(api_key: int, version: int, body: bytes, flexible: bool = True) -> bytes:
    return frame_request(api_key, version, 1, "samsa-oracle", body, flexible)


def metadata_body(v: int, *names: str, auto_create: bool = False) -> bytes:
    return encode_request(ApiKey.METADATA, v, metadata_request(v, *names, auto_create=auto_create))


def metadata_request(v: int, *names: str, auto_create: bool = False) -> object:
    return make_request(
        ApiKey.METADATA, v, "MetadataRequest",
        topics=tuple(
            make_request(ApiKey.METADATA, v, "MetadataRequestTopic", name=n,
                         topic_id=uuid.UUID(int=0))
            for n in names
        ),
        allow_auto_topic_creation=auto_create, include_topic_authorized_operations=False,
    )  # fmt: skip


def test_unsupported_versions_unknown_apis_and_malformed_frames(differential: Run) -> None:
    """ApiVersions of a version the broker does not know is answered in v0 with
    UNSUPPORTED_VERSION (the list of APIs, which differs by design, is not compared: only
    ApiVersions' own entry, whose ceiling is 4 in samsa, D-FETCH-2); any other unknown
    version or API, and a body that does not parse, closes the connection."""

    def scenario(s: Side) -> None:
        resp = s.call_raw("api-versions-v99", ApiKey.API_VERSIONS, 0, frame(18, 99, b""))
        own = [k for k in resp.api_keys if k.api_key == ApiKey.API_VERSIONS] if resp else None
        s.note("api-versions-v99-own-entry", own)
        s.call_raw("metadata-v99", ApiKey.METADATA, 12, frame(ApiKey.METADATA, 99, b""))
        s.call_raw("unknown-api", ApiKey.METADATA, 12, frame(999, 0, b""))
        good = metadata_body(12)
        s.call_raw("metadata-truncated", ApiKey.METADATA, 12, frame(3, 12, good[:-2]))
        s.call_raw("metadata-garbage", ApiKey.METADATA, 12, frame(3, 12, b"\xff" * 7))
        s.call_raw("negative-size", ApiKey.METADATA, 12, struct.pack(">i", -5) + b"\0" * 8)
        s.call_raw("huge-size", ApiKey.METADATA, 12, struct.pack(">i", 1 << 30) + b"\0" * 8)
        # The connection of a closed request does not take the next one down.
        s.call_raw("metadata-after", ApiKey.METADATA, 12, frame(3, 12, good))

    differential(
        scenario,
        rules={"api_keys": Rule.DROP, "brokers": Rule.DROP},
        deviations=[Deviation("api-versions-v99-own-entry[0].max_version", 4, 5, "D-FETCH-2")],
    )


def test_produce_refusals(differential: Run) -> None:
    """Refused batches write nothing and the producer's next sequence is still taken; a
    produce to an unknown topic is UNKNOWN_TOPIC_OR_PARTITION and creates nothing (only
    Metadata auto-creates), the topic still unknown to the Metadata after it."""

    def scenario(s: Side) -> None:
        t = topic(s)
        pid, epoch = producer(s)
        ok = batch(pid, epoch, 0)
        missing = s.unique("missing")
        s.produce("unknown-topic", {(missing, 0): ok})
        s.call("metadata-after-unknown", ApiKey.METADATA, 12, metadata_request(12, missing))
        s.produce("unknown-partition", {(t, 4): ok, (t, 0): ok})
        s.produce("acks-2", {(t, 0): batch(pid, epoch, 1)}, acks=2)
        corrupt = bytearray(batch(pid, epoch, 1))
        corrupt[-1] ^= 0xFF  # a record byte: the CRC no longer matches
        s.produce("corrupt-crc", {(t, 0): bytes(corrupt)})
        s.produce("two-batches", {(t, 0): batch(pid, epoch, 1) + batch(pid, epoch, 2)})
        s.produce("negative-sequence", {(t, 0): batch(pid, epoch, -5)})
        control = build_control_batch(1, producer_id=pid, producer_epoch=epoch,
                                      coordinator_epoch=0, now_ms=TS)  # fmt: skip
        s.produce("control-batch", {(t, 0): control})
        txn = build_batch([NewRecord(value=b"x", timestamp=TS)], producer_id=pid,
                          producer_epoch=epoch, base_sequence=1, transactional=True)  # fmt: skip
        s.produce("transactional-without-id", {(t, 0): txn})
        s.produce("still-in-order", {(t, 0): batch(pid, epoch, 1)})
        s.fetch("log", {(t, 0): 0})

    differential(scenario, rules={"brokers": Rule.DROP})


def test_metadata_and_fetch_of_what_does_not_exist(differential: Run) -> None:
    def scenario(s: Side) -> None:
        t = topic(s)
        v = 12
        for label, name in [
            ("unknown", s.unique("missing")),
            ("invalid-name", "bad name!"),
            ("too-long", "x" * 250),
            ("dot-dot", ".."),
        ]:
            req = metadata_request(v, name, auto_create=label != "unknown")
            s.call(f"metadata-{label}", ApiKey.METADATA, v, req)
        s.call("metadata-known", ApiKey.METADATA, v, metadata_request(v, t))
        fv = 13
        req = make_request(
            ApiKey.FETCH, fv, "FetchRequest", cluster_id=None, replica_id=-1, max_wait=0,
            min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
            topics=(make_request(
                ApiKey.FETCH, fv, "FetchTopic", topic_id=uuid.UUID(int=12345),
                partitions=(make_request(
                    ApiKey.FETCH, fv, "FetchPartition", partition=0, current_leader_epoch=-1,
                    fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                    partition_max_bytes=1 << 20,
                ),),
            ),),
            forgotten_topics_data=(), rack_id="",
        )  # fmt: skip
        s.call("fetch-unknown-topic-id", ApiKey.FETCH, fv, req)

    differential(scenario, rules={"brokers": Rule.DROP})
