"""Making what was written survive a crash: fsync a file or a directory, replace a small file
atomically and durably."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_file(path: Path) -> None:
    """fsync ``path`` if it exists."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    """Make creations, renames and deletions in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: a crash leaves either the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """:func:`write_durably` for bytes in files of the broker's own (SCRAM credentials, ACLs,
    producer owners): created with ``mode`` (readable by the broker's user alone by default)
    and in a directory made if missing. After a crash ``path`` holds its old or new contents."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{path.name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:  # os.write may write less than asked
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(directory)


def read_versioned_json(path: Path, version: int = 1) -> dict[str, Any] | None:
    """The JSON object a broker file of its own holds (None if there is no file); ValueError
    unless it is an object of ``version``."""
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or doc.get("version") != version:
        raise ValueError(f"expected a JSON object with version {version}")
    return doc


def write_versioned_json(path: Path, version: int = 1, **fields: Any) -> None:
    """:func:`write_atomically` a JSON object of ``version`` and ``fields``."""
    doc = {"version": version, **fields}
    write_atomically(path, json.dumps(doc, indent=1, sort_keys=True).encode())
