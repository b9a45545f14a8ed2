"""What peers.py and its section modules share: the row, the machine, a topic."""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PARTITIONS = 3
# Makes a broker for a section (a fresh one in this data dir, or one already running); Any
# stands for _brokers.BrokerProcess.
Starter = Callable[[Path], AbstractContextManager[Any]]


@dataclass
class Row:
    label: str
    unit: str
    higher_is_better: bool = True
    values: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def machine() -> str:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()
    return (
        f"{platform.node()}: {os.cpu_count()} cores ({model}), {mem:.0f} GiB, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
        f"load average at start {load[0]:.2f}"
    )


def rss_mb(pid: int | None) -> float:
    if pid is None:
        return 0.0
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        if (
            md
            and md.error is None
            and len(md.partitions) == partitions
            and all(p.leader >= 0 for p in md.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{topic} not ready on {bootstrap}")


def wait_coordinator(port: int, key: str, key_type: int, timeout: float = 60.0) -> None:
    """FindCoordinator (0: a group, 1: a transactional id) until one is named: Kafka creates
    its internal topic on the first such request and is NOT_COORDINATOR until it is led."""
    from samsa.client._connection import BlockingConnection
    from samsa.protocol.messages import ApiKey, make_request

    req = make_request(ApiKey.FIND_COORDINATOR, 4, "FindCoordinatorRequest", key_type=key_type,
                       coordinator_keys=(key,))  # fmt: skip
    deadline = time.monotonic() + timeout
    with BlockingConnection("127.0.0.1", port, timeout=timeout) as c:
        while time.monotonic() < deadline:
            (coord,) = c.request(ApiKey.FIND_COORDINATOR, 4, req).coordinators
            if coord.error_code == 0:
                return
            time.sleep(0.1)
    raise RuntimeError(f"no coordinator for {key!r} after {timeout} s")


def wait_producer_id(port: int, timeout: float = 60.0) -> None:
    """InitProducerId (idempotent) until it succeeds: Kafka's first ids come from a block
    the controller hands out after start-up."""
    from samsa.client._connection import BlockingConnection
    from samsa.testing import init_producer_id

    deadline = time.monotonic() + timeout
    with BlockingConnection("127.0.0.1", port, timeout=timeout) as c:
        while init_producer_id(c)[0] != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"InitProducerId failing after {timeout} s")
            time.sleep(0.1)


def pipelined(conn: Any, api_key: int, version: int, requests: Iterable[Any], window: int = 64
              ) -> list[Any]:  # fmt: skip
    """Send ``requests`` on ``conn`` (a BlockingConnection) with up to ``window`` in flight;
    their answers, in order."""
    out: list[Any] = []
    inflight: list[int] = []
    for req in requests:
        inflight.append(conn.send(api_key, version, req))
        if len(inflight) >= window:
            out.append(conn.receive(api_key, version, inflight.pop(0)))
    out.extend(conn.receive(api_key, version, cid) for cid in inflight)
    return out
