"""``samsa broker`` start-up failures: one line naming what and where, status 2 for bad
settings and usage, 1 for a broker that cannot start, never a traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from _disks import tmpfs

PREFIX = "samsa broker: error: "


def broker_cli(*args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "samsa", "broker", "--host", "127.0.0.1", *args]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def outcome(proc: subprocess.Popen[str]) -> tuple[int, list[str]]:
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return proc.returncode, err.splitlines()


def assert_one_error_line(lines: list[str], expected: str) -> None:
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    errors = [line for line in lines if line.startswith(PREFIX)]
    assert errors == [lines[-1]], "\n".join(lines)
    assert expected in lines[-1], lines[-1]


def test_bad_settings_exit_2_with_one_line(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    cases = {
        ("--port", "70000"): "listener port must be between 0 and 65535, got 70000",
        ("--override", "log.segment.bytes=-1"): "log.segment.bytes must be at least 1048576",
        ("--override", "socket.request.max.bytes=0"): "socket.request.max.bytes must be at least",
        ("--override", "offsets.topic.num.partitions=0"): "offsets.topic.num.partitions must",
        ("--override", "num.partitions=0"): "num.partitions must be at least 1, got 0",
        ("--override", "message.max.bytes=-5"): "message.max.bytes must be at least 0, got -5",
        ("--override", "no.such.setting=1"): "unknown setting 'no.such.setting'",
    }
    procs = {args: broker_cli("--data-dir", data_dir, *args) for args in cases}
    for args, proc in procs.items():
        status, lines = outcome(proc)
        assert status == 2, (args, lines)
        assert len(lines) == 1, lines  # nothing else happened: not even a log line
        assert_one_error_line(lines, cases[args])
    assert not Path(data_dir).exists()


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory no one can write to, root included: a read-only tmpfs mount."""
    with tmpfs(tmp_path / "ro", "ro,size=64k") as mnt:
        yield mnt


def test_start_failures_exit_1_with_one_line(tmp_path: Path, read_only_dir: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    ok_dir = str(tmp_path / "data")
    cases = {
        ("--data-dir", ok_dir, "--port", str(port)): f"cannot listen on 127.0.0.1:{port}: "
        "address already in use",
        ("--data-dir", str(a_file), "--port", "0"): f"data directory {a_file} is not a directory",
        ("--data-dir", str(a_file / "sub"), "--port", "0"): f"cannot create data directory "
        f"{a_file / 'sub'}: Not a directory",
        ("--data-dir", str(read_only_dir), "--port", "0"): f"data directory {read_only_dir} "
        "is not writable: Read-only file system",
        ("--data-dir", ok_dir, "--host", "no-such-host.invalid", "--port", "0"): "cannot "
        "resolve listen host 'no-such-host.invalid'",
    }
    try:
        procs = {args: broker_cli(*args) for args in cases}
        for args, proc in procs.items():
            status, lines = outcome(proc)
            assert status == 1, (args, lines)
            assert_one_error_line(lines, cases[args])
    finally:
        busy.close()
    assert os.listdir(read_only_dir) == []
