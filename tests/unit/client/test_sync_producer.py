"""The sync Producer's per-record path: what produce() leaves to the loop thread, and when."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from typing import Any

import pytest

from samsa.client import Admin, ClosedError, Producer
from samsa.testing import read_topic

_FRESH = """
import sys
from samsa.client import Producer
from samsa.client import _accumulator
assert "pyarrow" not in sys.modules, "pyarrow loaded before the producer"
p = Producer({"bootstrap.servers": sys.argv[1]})
print(_accumulator.columnar_ready(), "pyarrow" in sys.modules)
p.close()
"""


def test_producer_returns_with_the_columnar_codec_loaded(shared_broker: Any) -> None:
    # A fresh interpreter: the codec's import (pyarrow) must be over when Producer() returns,
    # not run behind the first produce() calls, fighting them for the GIL.
    out = subprocess.run(
        [sys.executable, "-c", _FRESH, shared_broker.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"sync-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(name, partitions)
    return name


def test_threads_producing_at_once_keep_order_and_exact_buffer_accounting(
    shared_broker: Any,
) -> None:
    # The owner thread appends without a lock, the others with one; with a buffer.memory
    # small enough that all of them block for space, every record lands, each thread's
    # records keep their order per partition, and once flushed the producer holds nothing.
    topic = _topic(shared_broker.bootstrap, 3)
    per_thread, threads = 3_000, 4
    config = {"bootstrap.servers": shared_broker.bootstrap, "buffer.memory": 64 * 1024}
    with Producer(config) as p:
        errors: list[BaseException] = []

        def run(t: int) -> None:
            try:
                for i in range(per_thread):
                    key = None if i % 5 == 0 else f"k{t}-{i % 7}".encode()
                    p.produce(topic, f"{t}:{i}".encode(), key)
            except BaseException as exc:  # reported below, not lost in a thread
                errors.append(exc)

        others = [threading.Thread(target=run, args=(t,)) for t in range(1, threads)]
        for th in others:
            th.start()
        run(0)  # the owner: the thread that made the producer
        for th in others:
            th.join(60)
        assert not errors
        assert p.flush(60) == 0
        assert p._held() == 0  # every byte counted in was given back, none twice
    records = read_topic(shared_broker.bootstrap, topic)
    assert len(records) == threads * per_thread
    last: dict[tuple[int, int], int] = {}
    for r in records:
        t, i = map(int, r.value.split(b":"))
        assert last.get((r.partition, t), -1) < i  # offsets follow each thread's order
        last[(r.partition, t)] = i


def test_produce_after_close_raises_and_queues_nothing(shared_broker: Any) -> None:
    topic = _topic(shared_broker.bootstrap, 1)
    p = Producer({"bootstrap.servers": shared_broker.bootstrap})
    p.produce(topic, b"before", b"k")
    p.close()
    with pytest.raises(ClosedError):
        p.produce(topic, b"after", b"k")  # the fast path's case: bytes value and key
    assert [r.value for r in read_topic(shared_broker.bootstrap, topic)] == [b"before"]
