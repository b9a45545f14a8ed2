"""Disks for the storage tests: a tmpfs that is small (a full disk) or read-only."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(mount_point: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``mount_point`` (created) for the block: a small or read-only disk
    that root cannot write past either. Tests run as root, as in CI; no mount fails them."""
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs ({options}; root needed): {done.stderr}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
