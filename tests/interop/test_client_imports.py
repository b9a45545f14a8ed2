"""What a client process imports: pandas never (pyarrow would load it on its first look at a
Python object: ~0.25 s and ~50 MB), whichever path produced or consumed.

Each case runs in a fresh interpreter (sys.modules of this one has everything the other tests
loaded) against a samsa broker, and prints what it saw and which modules were loaded.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from _broker import BrokerProcess
from samsa.client import Admin

T = 60.0

# Per-record paths: a few records (the per-record encoder), a burst of 20,000 (the
# columnar intake: Python bytes to Arrow columns), poll() and consume() decoding.
PER_RECORD = """
import json, sys
from samsa.client import Consumer, Producer, TopicPartition
bs, topic = sys.argv[1], sys.argv[2]
p = Producer({"bootstrap.servers": bs, "linger.ms": 50})
for i in range(3):
    p.produce(topic, b"v%d" % i, None if i == 1 else b"k%d" % i)
p.flush(30)
for i in range(20_000):
    p.produce(topic, b"x" * (i % 7), b"%d" % i)
left = p.flush(30)
p.close()
c = Consumer({"bootstrap.servers": bs, "auto.offset.reset": "earliest"})
parts = [TopicPartition(topic, q) for q in range(2)]
c.assign(parts)
got = []
while len(got) < 20_003:
    batch = c.consume(10_000, 5.0)
    if not batch:
        break
    got += batch
c.close()
print(json.dumps({"left": left, "read": len(got),
                  "firsts": sorted(r.value.decode() for r in got if r.value[:1] == b"v"),
                  "modules": [m for m in ("pandas", "pyarrow") if m in sys.modules]}))
"""

# Columnar paths with Python objects in every column (nulls, str, headers as pairs, a
# timestamp and a partition per row), consume_arrow() with headers, and an empty one.
COLUMNAR = """
import json, sys
from samsa.client import Consumer, Producer, TopicPartition
bs, topic = sys.argv[1], sys.argv[2]
p = Producer({"bootstrap.servers": bs})
n = 300
f = p.produce_batch(
    topic,
    [None if i % 50 == 0 else ("s%d" % i if i % 2 else b"b%d" % i) for i in range(n)],
    [None if i % 3 == 0 else b"k%d" % i for i in range(n)],
    partition=[i % 2 for i in range(n)],
    headers=[[("h", b"%d" % i)] if i % 5 == 0 else None for i in range(n)],
    timestamps=[1_700_000_000_000 + i for i in range(n)],
)
md = f.result(30)
p.close()
c = Consumer({"bootstrap.servers": bs, "auto.offset.reset": "earliest"})
parts = [TopicPartition(topic, q) for q in range(2)]
c.assign(parts)
rows = 0
nulls = 0
heads = 0
while rows < n:
    b = c.consume_arrow(1000, 5.0, include_headers=True)
    if not b.num_rows:
        break
    rows += b.num_rows
    nulls += b.column(1).null_count
    heads += sum(1 for h in b.column(7).to_pylist() if h)
empty = c.consume_arrow(10, 0.2).num_rows  # all read: an empty batch
c.close()
print(json.dumps({"count": md.count, "read": rows, "null_values": nulls, "with_headers": heads,
                  "empty": empty,
                  "modules": [m for m in ("pandas", "pyarrow") if m in sys.modules]}))
"""


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    b = BrokerProcess(tmp_path_factory.mktemp("imports")).start()
    yield b.bootstrap
    b.stop()


def _run(bootstrap: str, script: str) -> dict[str, object]:
    topic = f"imports-{uuid.uuid4().hex[:8]}"
    with Admin({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topic(topic, 2)
    proc = subprocess.run(
        [sys.executable, "-c", script, bootstrap, topic],
        capture_output=True,
        text=True,
        timeout=T,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_pandas_is_installed_so_the_checks_below_mean_something() -> None:
    # (pyspark's extra brings it; without it these tests could not catch the import)
    assert importlib.util.find_spec("pandas") is not None


def test_per_record_paths_do_not_import_pandas(bootstrap: str) -> None:
    out = _run(bootstrap, PER_RECORD)
    assert out["left"] == 0
    assert out["read"] == 20_003
    assert out["firsts"] == ["v0", "v1", "v2"]
    assert "pandas" not in out["modules"]  # type: ignore[operator]


def test_columnar_paths_do_not_import_pandas(bootstrap: str) -> None:
    out = _run(bootstrap, COLUMNAR)
    assert out["count"] == 300
    assert out["read"] == 300
    assert out["null_values"] == 6  # rows 0, 50, ..., 250
    assert out["with_headers"] == 60
    assert out["empty"] == 0
    assert "pandas" not in out["modules"]  # type: ignore[operator]
