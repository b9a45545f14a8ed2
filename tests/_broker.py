"""A ``samsa broker`` run as a real process on a free port of 127.0.0.1, for the tests.

Tests import it as ``from _broker import BrokerProcess``; the fixtures in ``conftest.py`` build on
it. (A module of its own because ``from conftest import`` finds whichever conftest was imported
first, and tests/spark has one too.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

READY = re.compile(r"samsa broker ready on 127\.0\.0\.1:(\d+)")
_LOAD_OVER = re.compile(r"coordinators loaded in|replaying the coordinators failed")


class BrokerProcess:
    """A ``samsa broker`` subprocess; ``port`` stays fixed across restarts."""

    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.overrides = overrides or {}
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.log: list[str] = []
        self.preexec_fn: Callable[[], None] | None = None  # run in the child (e.g. setrlimit)
        self.launcher: list[str] = ["-m", "samsa"]  # python's arguments before "broker"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0, *, loaded: bool = True) -> BrokerProcess:
        """Start the broker; return once it serves (its "ready" line) and, with ``loaded``,
        once its coordinators have replayed their topics too (a broker serves while they
        load, answering COORDINATOR_LOAD_IN_PROGRESS for their APIs meanwhile, which a test
        of that sets ``loaded=False`` to see)."""
        first_line = len(self.log)
        cmd = [
            sys.executable,
            *self.launcher,
            "broker",
            "--data-dir",
            str(self.data_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        for key, value in self.overrides.items():
            cmd += ["--override", f"{key}={value}"]
        self.proc = subprocess.Popen(
            cmd,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=self.preexec_fn,
        )
        ready = threading.Event()
        proc = self.proc

        def pump() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                self.log.append(line.rstrip("\n"))
                m = READY.search(line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not ready.wait(0.05):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("broker did not start:\n" + "\n".join(self.log[-30:]))
        # The load ends loaded, or failed (the broker then stops), or the process is gone.
        while loaded and proc.poll() is None and time.monotonic() < deadline:
            if any(_LOAD_OVER.search(line) for line in self.log[first_line:]):
                break
            time.sleep(0.01)
        return self

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, nothing flushed beyond what reached the OS."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20) -> int | None:
        """SIGTERM and wait for the clean shutdown (SIGKILL after ``timeout`` seconds)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode if self.proc else None

    def log_contains(self, text: str) -> bool:
        return any(text in line for line in self.log)

    def wait_for_log(self, text: str, *, after: int = 0, timeout: float = 5.0) -> str | None:
        """The first line at or after index ``after`` containing ``text``, waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log[after:]:
                if text in line:
                    return line
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
