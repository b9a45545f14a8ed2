"""Cost of ACL checks on the request path: Produce (one 1-record batch to each of
``--topics`` topics, handled in-process, no sockets) by a principal allowed by a PREFIXED ACL
among ``--acls`` others, as a ratio to the peer in the same run, the same requests to a broker
with no authorizer (interleaved, best of 5). Also the time of one authorize call (a
prefixed hit, decided before).

    .venv/bin/python benchmarks/authorizer.py [--acls 10000] [--topics 3] [--requests 5000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from samsa.broker.authorizer import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from samsa.broker.broker import Broker
from samsa.broker.config import BrokerConfig
from samsa.broker.handlers import APIS, RequestContext
from samsa.protocol.framing import RequestHeader
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import produce_request

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
PRINCIPAL = "User:app-7"


def broker(directory: Path, acls: int) -> Broker:
    config = BrokerConfig(data_dir=directory, authorizer_class_name=STANDARD if acls else "")
    b = Broker(config)
    b.start()
    if b.authorizer is not None:
        bindings = [
            AclBinding(
                ResourceType.TOPIC,
                f"team-{i}.",
                PatternType.PREFIXED,
                f"User:app-{i}",
                "*",
                Operation.WRITE,
                Permission.ALLOW,
            )
            for i in range(acls)
        ]
        b.authorizer.create(bindings)
    return b


def run(b: Broker, topics: int, requests: int) -> float:
    handler = APIS[ApiKey.PRODUCE].handler
    ctx = RequestContext(
        RequestHeader(ApiKey.PRODUCE, 9, 1, "bench", 0), 9, "10.0.0.1:1", PRINCIPAL
    )
    batch = build_batch([NewRecord(b"v" * 100)])
    request = produce_request({(f"team-7.t{i}", 0): batch for i in range(topics)})
    for i in range(topics):  # a Produce never creates a topic (as in Kafka)
        if f"team-7.t{i}" not in b.topics.topics:
            b.create_topic(f"team-7.t{i}")
    handler(b, ctx, request)
    start = time.perf_counter()
    for _ in range(requests):
        handler(b, ctx, request)
    return (time.perf_counter() - start) / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--acls", type=int, default=10_000)
    parser.add_argument("--topics", type=int, default=3)
    parser.add_argument("--requests", type=int, default=5_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as root:
        plain = broker(Path(root) / "open", 0)
        guarded = broker(Path(root) / "acls", args.acls)
        auth = guarded.authorizer
        assert auth is not None
        n = 100_000
        t0 = time.perf_counter()
        for _ in range(n):
            auth.authorize(PRINCIPAL, "10.0.0.1", Operation.WRITE, ResourceType.TOPIC, "team-7.t0")
        per_call = (time.perf_counter() - t0) / n
        # Interleaved, best of 5 each: the machine may be shared.
        base, checked = float("inf"), float("inf")
        for _ in range(5):
            base = min(base, run(plain, args.topics, args.requests))
            checked = min(checked, run(guarded, args.topics, args.requests))
        plain.close()
        guarded.close()
    print(f"authorize (prefixed hit among {args.acls} ACLs): {per_call * 1e6:.2f} us/call")
    print(f"Produce, {args.topics} topics, no authorizer: {base * 1e6:.1f} us/request")
    print(f"Produce, {args.topics} topics, {args.acls} ACLs: {checked * 1e6:.1f} us/request")
    print(f"ratio (ACLs / no authorizer): {checked / base:.3f}")


if __name__ == "__main__":
    main()
