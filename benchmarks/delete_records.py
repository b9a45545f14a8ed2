"""DeleteRecords on many partitions (issue 27): one request deleting the one record of each of
``--partitions`` partitions, against a samsa broker from ``--src`` (the code before) and from
this tree: the request's wall time and the fsyncs the broker made for it (counted by
``strace -c -f -e trace=fsync,fdatasync`` attached to the broker for that request alone, when
strace is installed and may attach).

    python benchmarks/delete_records.py --src /path/to/old/tree               # ~2 min
    python benchmarks/delete_records.py --src /path/to/old/tree --partitions 1000
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _brokers import HOST, SamsaBroker

from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import NewRecord, build_batch
from samsa.testing import create_topic, produce_request

TOPIC = "deleted"
DELETE_RECORDS_V = 2


def delete_request(partitions: int) -> object:
    k, v = ApiKey.DELETE_RECORDS, DELETE_RECORDS_V
    parts = tuple(
        make_request(k, v, "DeleteRecordsPartition", partition_index=i, offset=-1)
        for i in range(partitions)
    )
    topic = make_request(k, v, "DeleteRecordsTopic", name=TOPIC, partitions=parts)
    return make_request(k, v, "DeleteRecordsRequest", topics=(topic,), timeout=60_000)


def fsyncs(out: Path) -> int:
    """Calls of fsync and fdatasync in ``strace -c`` output."""
    total = 0
    for line in out.read_text().splitlines():
        fields = line.split()
        if fields and fields[-1] in ("fsync", "fdatasync"):
            total += int(fields[3])
    return total


def one(name: str, data: Path, src: Path | None, partitions: int) -> tuple[float, int | None]:
    with SamsaBroker(data, src=src, start_timeout=600) as broker:
        with BlockingConnection(HOST, broker.port, timeout=600) as conn:
            t0 = time.perf_counter()
            if create_topic(conn, TOPIC, partitions) != 0:
                raise RuntimeError("CreateTopics failed")
            batch = build_batch([NewRecord(b"v" * 100, timestamp=int(time.time() * 1000))])
            resp = conn.request(
                ApiKey.PRODUCE,
                9,
                produce_request({(TOPIC, i): batch for i in range(partitions)}, acks=1),
            )
            errors = {p.error_code for t in resp.responses for p in t.partition_responses}
            if errors != {0}:
                raise RuntimeError(f"Produce errors {errors}")
            print(f"  {name}: {partitions} partitions made and filled in "
                  f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
            spy = shutil.which("strace")
            out = data.parent / f"{name}.strace"
            tracer = None
            if spy:
                cmd = [spy, "-c", "-f", "-e", "trace=fsync,fdatasync", "-o", str(out)]
                tracer = subprocess.Popen([*cmd, "-p", str(broker.pid)], stderr=subprocess.DEVNULL)
                time.sleep(1.0)  # attaching
            t0 = time.perf_counter()
            resp = conn.request(ApiKey.DELETE_RECORDS, DELETE_RECORDS_V, delete_request(partitions))
            seconds = time.perf_counter() - t0
            if tracer is not None:
                tracer.send_signal(signal.SIGINT)
                tracer.wait(60)
            lows = {p.low_watermark for p in resp.topics[0].partitions}
            codes = {p.error_code for p in resp.topics[0].partitions}
            if codes != {0} or lows != {1}:
                raise RuntimeError(f"DeleteRecords answered {codes}, low watermarks {lows}")
    return seconds, fsyncs(out) if tracer is not None and out.exists() else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True, help="source tree of the code before")
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--work-dir", type=Path, help="parent of the data dirs (default $TMPDIR)")
    args = parser.parse_args()
    print(f"{os.uname().nodename}, {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="samsa-delete-bench-", dir=args.work_dir) as tmp:
        for name, src in (("before", args.src), ("after", None)):
            seconds, count = one(name, Path(tmp) / name, src, args.partitions)
            rows.append((name, seconds, count))
    print(f"DeleteRecords of {args.partitions} partitions (one record each), one request:")
    for name, seconds, count in rows:
        print(f"  {name:<7} {seconds:8.2f} s  {'?' if count is None else count:>7} fsyncs")
    (_, before, _), (_, after, _) = rows
    print(f"after/before time: {after / before:.3f}x; load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
