"""Start and stop the brokers that benchmarks run against: samsa and the Tansu reference.

Both run as subprocesses listening on 127.0.0.1 only, on a port picked here. Use them as
context managers so that every process started is stopped, whatever happens::

    with SamsaBroker(data_dir) as b:      # SIGTERM + wait on exit (clean shutdown)
        ...b.port...
    with TansuBroker() as b:              # in-memory storage engine
        ...

``SamsaBroker(profile="pyinstrument", profile_out=path)`` runs the broker under
pyinstrument; the profile is written when the broker exits, which SIGTERM makes a clean
exit. :class:`PySpy` attaches py-spy (when installed) to a running broker instead.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from samsa.testing.tansu import TansuNotInstalled, tansu_broker_args

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parent.parent
_READY = re.compile(r"samsa broker ready on 127\.0\.0\.1:(\d+)")


class BrokerStartError(RuntimeError):
    pass


def free_port() -> int:
    """A port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def find_py_spy() -> str | None:
    """py-spy from the venv or the system, if there is one (it is not a dependency)."""
    candidate = Path(sys.executable).parent / "py-spy"
    if candidate.exists():
        return str(candidate)
    return shutil.which("py-spy")


def _api_versions_ok(port: int, timeout: float = 1.0) -> bool:
    """True once something on ``port`` answers an ApiVersions v0 request."""
    # size, api key 18, version 0, correlation id 1, client id "bench"
    body = b"\x00\x12\x00\x00\x00\x00\x00\x01\x00\x05bench"
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as s:
            s.sendall(len(body).to_bytes(4, "big") + body)
            head = b""
            while len(head) < 10:
                chunk = s.recv(10 - len(head))
                if not chunk:
                    return False
                head += chunk
            # size(4) correlation id(4) error code(2)
            return head[4:8] == b"\x00\x00\x00\x01" and head[8:10] == b"\x00\x00"
    except OSError:
        return False


class BrokerProcess:
    """A subprocess whose stderr is kept (last lines) by a pump thread."""

    name = "broker"

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.lines: deque[str] = deque(maxlen=200)
        self._pump: threading.Thread | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def _spawn(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            cwd=ROOT,
        )
        proc = self.proc

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self._on_line(line.rstrip("\n"))

        self._pump = threading.Thread(target=pump, name=f"{self.name}-stderr", daemon=True)
        self._pump.start()

    def _on_line(self, line: str) -> None:
        self.lines.append(line)

    def tail(self, n: int = 30) -> str:
        return "\n".join(list(self.lines)[-n:])

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def cpu_seconds(self) -> float:
        """User + system CPU time of the broker process so far (0 if unknown)."""
        pid = self.pid
        if pid is None:
            return 0.0
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        # fields[0] is field 3 (state): utime and stime are fields 14 and 15.
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, wait for the process to exit (SIGKILL after ``timeout``)."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self._pump is not None:
            self._pump.join(5)
        return proc.returncode

    def __enter__(self) -> BrokerProcess:
        try:
            self.start()
        except BaseException:
            self.stop(10)
            raise
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop()
        if exc_type is not None:
            print(
                f"--- last lines of the {self.name} broker's log ---\n{self.tail()}",
                file=sys.stderr,
            )

    def start(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class SamsaBroker(BrokerProcess):
    """``python -m samsa broker`` on a free port of 127.0.0.1 with a given data dir."""

    name = "samsa"

    def __init__(
        self,
        data_dir: Path,
        overrides: dict[str, str] | None = None,
        *,
        profile: str | None = None,
        profile_out: Path | None = None,
        start_timeout: float = 60.0,
        src: Path | None = None,
    ) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.src = src  # another source tree to run the broker from (before/after runs)
        self.overrides = overrides or {}
        self.profile = profile
        self.profile_out = profile_out
        self.start_timeout = start_timeout
        self._ready = threading.Event()

    def _on_line(self, line: str) -> None:
        super()._on_line(line)
        m = _READY.search(line)
        if m and not self._ready.is_set():
            self.port = int(m.group(1))
            self._ready.set()

    def command(self) -> list[str]:
        args = ["broker", "--data-dir", str(self.data_dir), "--host", HOST, "--port", "0"]
        for key, value in self.overrides.items():
            args += ["--override", f"{key}={value}"]
        py = sys.executable
        if self.profile is None:
            return [py, "-m", "samsa", *args]
        if self.profile_out is None:
            raise ValueError("profile_out is needed with profile")
        if self.profile == "pyinstrument":
            return [
                py,
                "-m",
                "pyinstrument",
                "-r",
                "pyisession",
                "-o",
                str(self.profile_out),
                "-m",
                "samsa",
                *args,
            ]
        raise ValueError(f"unknown profiler {self.profile!r}")

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = None if self.src is None else {"PYTHONPATH": str(Path(self.src).resolve() / "src")}
        self._spawn(self.command(), env)
        deadline = time.monotonic() + self.start_timeout
        while not self._ready.wait(0.05):
            if not self.alive() or time.monotonic() > deadline:
                raise BrokerStartError("samsa broker did not start:\n" + self.tail())


class TansuBroker(BrokerProcess):
    """Tansu (Rust) with its in-memory storage engine on a free port of 127.0.0.1."""

    name = "tansu"

    def __init__(self, *, start_timeout: float = 30.0) -> None:
        super().__init__()
        self.start_timeout = start_timeout

    def start(self) -> None:
        self.port = free_port()
        try:
            args = tansu_broker_args(self.port, HOST)
        except TansuNotInstalled as e:
            raise BrokerStartError(str(e)) from e
        self._spawn(
            args,
            env={"RUST_LOG": os.environ.get("RUST_LOG", "warn")},
        )
        deadline = time.monotonic() + self.start_timeout
        while not _api_versions_ok(self.port):
            if not self.alive() or time.monotonic() > deadline:
                raise BrokerStartError("tansu did not start:\n" + self.tail())
            time.sleep(0.1)


class PySpy:
    """``py-spy record`` attached to a running process, for the span of a ``with`` block.

    Output is py-spy's "raw" format, collapsed stacks (``f1;f2;f3 count`` lines), which
    flamegraph.pl and speedscope read. ``--nonblocking`` keeps py-spy from pausing the
    broker at each sample (which would slow it several-fold); it rules out ``--native``,
    so time in C code (syscalls, uvloop, crc32c) is charged to the Python line calling it.
    """

    def __init__(self, pid: int, out: Path, rate: int = 1000) -> None:
        spy = find_py_spy()
        if spy is None:
            raise BrokerStartError("py-spy is not installed")
        self.cmd = [
            spy,
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--nonblocking",
            "--rate",
            str(rate),
            "-o",
            str(out),
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PySpy:
        self.proc = subprocess.Popen(
            self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        time.sleep(1.0)  # attaching takes a moment
        if self.proc.poll() is not None:
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            raise BrokerStartError(f"py-spy could not attach: {err.strip()}")
        return self

    def __exit__(self, *exc: object) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class KafkaBroker(BrokerProcess):
    """Apache Kafka (the pinned release, one KRaft node: broker + controller) on 127.0.0.1.

    A thin wrapper of :class:`samsa.testing.kafka.KafkaNode`, so the benchmarks treat it as
    the other brokers (``port``, ``pid``, ``cpu_seconds``, context manager). Its JVM gets a
    fixed heap (``heap``), as a production Kafka would; RSS is measured, not the heap size.
    """

    name = "kafka"

    def __init__(
        self, data_dir: Path, overrides: dict[str, str] | None = None, *, heap: str = "1g"
    ) -> None:
        super().__init__()
        from samsa.testing.kafka import KafkaNode

        self.node = KafkaNode(data_dir, overrides=overrides, heap=heap)
        self.port = self.node.port

    @property
    def pid(self) -> int | None:
        return self.node.pid

    def alive(self) -> bool:
        return self.node.alive()

    def tail(self, n: int = 30) -> str:
        return self.node.tail(n)

    def start(self) -> None:
        from samsa.testing.kafka import KafkaNotInstalled

        try:
            self.node.start()
        except KafkaNotInstalled as e:
            raise BrokerStartError(str(e)) from e

    def stop(self, timeout: float = 60.0) -> int | None:
        self.node.stop(timeout)
        return self.node.proc.returncode if self.node.proc is not None else None
