"""Many partitions under a small file-descriptor limit (issue 10 §3), timed.

Starts a samsa broker with RLIMIT_NOFILE set to ``--limit`` (soft and hard), creates one
topic of ``--partitions`` partitions, produces one record to each (one Produce request),
stops the broker cleanly, starts it again under the same limit, produces a second record to
each and fetches every partition back (both records must be there). Prints the time of each
step and the descriptors the broker holds at the end.

    python benchmarks/many_partitions.py                        # 10,000 under 1,024 (~2 min)
    python benchmarks/many_partitions.py --partitions 1000 --limit 128
    python benchmarks/many_partitions.py --src DIR              # another source tree's broker
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from samsa.client._connection import BlockingConnection
from samsa.protocol.messages import ApiKey
from samsa.protocol.records import NewRecord, build_batch, iter_batches
from samsa.testing import create_topic, fetch_request, produce_request

READY = re.compile(r"samsa broker ready on 127\.0\.0\.1:(\d+)")
TOPIC = "many"


class Broker:
    def __init__(self, data_dir: Path, limit: int, port: int = 0) -> None:
        def set_limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        cmd = [sys.executable, "-m", "samsa", "broker", "--data-dir", str(data_dir),
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=set_limit,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self.port = 0
        ready = threading.Event()
        proc = self.proc

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                self.lines.append(line.rstrip("\n"))
                m = READY.search(line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + 600
        while not ready.wait(0.1):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("broker did not start:\n" + "\n".join(self.lines[-20:]))

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(600)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def produce_everywhere(conn: BlockingConnection, partitions: int, value: bytes) -> None:
    batch = build_batch([NewRecord(value, timestamp=int(time.time() * 1000))])
    req = produce_request({(TOPIC, i): batch for i in range(partitions)}, acks=1)
    resp = conn.request(ApiKey.PRODUCE, 9, req)
    codes = {int(p.error_code) for t in resp.responses for p in t.partition_responses}
    if codes != {0}:
        raise RuntimeError(f"produce errors: {codes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--limit", type=int, default=1024, help="RLIMIT_NOFILE, soft and hard")
    parser.add_argument("--src", help="run the broker from this source tree's src/")
    args = parser.parse_args()
    if args.src:
        os.environ["PYTHONPATH"] = str(Path(args.src).resolve() / "src")
    n = args.partitions
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="samsa-many-") as tmp:
        data = Path(tmp) / "data"
        t = time.monotonic()
        broker = Broker(data, args.limit)
        try:
            times["start"] = time.monotonic() - t
            with BlockingConnection("127.0.0.1", broker.port, timeout=600) as c:
                t = time.monotonic()
                code = create_topic(c, TOPIC, n)
                times["create"] = time.monotonic() - t
                if code != 0:
                    print(
                        f"CreateTopics of {n} partitions under a limit of {args.limit}: "
                        f"error {code}"
                    )
                    print("\n".join(line for line in broker.lines if "ERROR" in line)[-500:])
                    return
                t = time.monotonic()
                produce_everywhere(c, n, b"one")
                times["produce"] = time.monotonic() - t
            t = time.monotonic()
        finally:
            broker.stop()
        times["clean stop"] = time.monotonic() - t
        t = time.monotonic()
        broker = Broker(data, args.limit, broker.port)
        try:
            times["restart"] = time.monotonic() - t
            with BlockingConnection("127.0.0.1", broker.port, timeout=600) as c:
                t = time.monotonic()
                produce_everywhere(c, n, b"two")
                times["produce again"] = time.monotonic() - t
                t = time.monotonic()
                req: Any = fetch_request({(TOPIC, i): 0 for i in range(n)}, max_bytes=1 << 30)
                resp = c.request(ApiKey.FETCH, 12, req)
                times["fetch all"] = time.monotonic() - t
            parts = [p for tp in resp.responses for p in tp.partitions]
            whole = sum(
                int(p.error_code) == 0 and len(list(iter_batches(p.records))) == 2 for p in parts
            )
            held = broker.descriptors()
            emfile = sum("Too many open files" in line for line in broker.lines)
        finally:
            broker.stop()
    print(f"{n:,} partitions under RLIMIT_NOFILE {args.limit:,}:")
    for step, seconds in times.items():
        print(f"  {step:>14}: {seconds:6.1f} s")
    print(
        f"  {whole:,} of {n:,} partitions read back with both records; the broker held "
        f"{held} descriptors; 'Too many open files' in its log: {emfile}"
    )


if __name__ == "__main__":
    main()
