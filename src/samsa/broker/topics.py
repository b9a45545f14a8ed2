"""Topics and partitions on disk: which logs exist, creating and deleting them.

Each partition is a directory ``<topic>-<partition>`` under the data directory holding its
segments, like Kafka. Each also holds ``partition.metadata`` with the topic id, again like
Kafka, so that topic ids survive restarts without a separate catalogue.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from samsa.log.log import Log, LogConfig
from samsa.protocol.errors import ErrorCode

log = logging.getLogger("samsa.topics")

_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})


class TopicError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def validate_topic_name(name: str) -> None:
    if name in (".", "..") or not _LEGAL_NAME.match(name):
        raise TopicError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} is illegal: 1-249 characters of [a-zA-Z0-9._-], not '.' or '..'",
        )


@dataclass(eq=False)
class Partition:
    topic: str
    index: int
    log: Log
    _waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def wait_for_data(self, fut: asyncio.Future[None]) -> None:
        self._waiters.append(fut)

    def notify(self) -> None:
        """Wake long-polling fetches: new data (or a deleted topic) is there."""
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)


@dataclass(eq=False)
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: list[Partition]

    @property
    def internal(self) -> bool:
        return self.name in INTERNAL_TOPICS


class TopicManager:
    def __init__(self, data_dir: Path, log_config: LogConfig) -> None:
        self.data_dir = data_dir
        self.log_config = log_config
        self.topics: dict[str, Topic] = {}
        self.topics_by_id: dict[uuid.UUID, Topic] = {}

    def load(self, now_ms: int) -> None:
        """Open every partition found in the data directory (recovering each log)."""
        found: dict[str, dict[int, Path]] = {}
        for entry in sorted(self.data_dir.iterdir()):
            m = _PARTITION_DIR.match(entry.name)
            if not entry.is_dir() or m is None:
                continue
            found.setdefault(m["topic"], {})[int(m["partition"])] = entry
        for name, dirs in found.items():
            indexes = sorted(dirs)
            if indexes != list(range(len(indexes))):
                log.error(
                    "topic %s has partitions %s on disk: not contiguous, skipped", name, indexes
                )
                continue
            topic_id = _read_topic_id(dirs[0]) or uuid.uuid4()
            partitions = []
            for i in indexes:
                if _read_topic_id(dirs[i]) is None:
                    _write_topic_id(dirs[i], topic_id)
                partitions.append(Partition(name, i, Log.open(dirs[i], self.log_config, now_ms)))
            self._add(Topic(name, topic_id, partitions))
        log.info("loaded %d topics from %s", len(self.topics), self.data_dir)

    def _add(self, topic: Topic) -> None:
        self.topics[topic.name] = topic
        self.topics_by_id[topic.topic_id] = topic

    def get_partition(self, topic: str, partition: int) -> Partition | None:
        t = self.topics.get(topic)
        if t is None or not 0 <= partition < len(t.partitions):
            return None
        return t.partitions[partition]

    def create(self, name: str, num_partitions: int, now_ms: int) -> Topic:
        validate_topic_name(name)
        if name in self.topics:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if num_partitions < 1:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS,
                f"number of partitions must be >= 1, got {num_partitions}",
            )
        topic_id = uuid.uuid4()
        partitions = []
        for i in range(num_partitions):
            directory = self.data_dir / f"{name}-{i}"
            directory.mkdir(parents=True, exist_ok=False)
            _write_topic_id(directory, topic_id)
            partitions.append(Partition(name, i, Log.open(directory, self.log_config, now_ms)))
        topic = Topic(name, topic_id, partitions)
        self._add(topic)
        log.info("created topic %s with %d partitions", name, num_partitions)
        return topic

    def delete(self, name: str) -> None:
        topic = self.topics.pop(name, None)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        self.topics_by_id.pop(topic.topic_id, None)
        for p in topic.partitions:
            # Rename first so a crash mid-delete never leaves a half topic that reloads.
            doomed = p.log.directory.with_name(f"{p.log.directory.name}.{uuid.uuid4().hex}-delete")
            p.log.close(0)
            p.log.directory.rename(doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            p.notify()
        log.info("deleted topic %s", name)

    def partitions(self) -> Iterator[Partition]:
        for t in self.topics.values():
            yield from t.partitions

    def close(self, now_ms: int) -> None:
        for p in self.partitions():
            p.log.close(now_ms)


def _read_topic_id(directory: Path) -> uuid.UUID | None:
    try:
        for line in (directory / "partition.metadata").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "topic_id":
                return uuid.UUID(value.strip())
    except (OSError, ValueError):
        return None
    return None


def _write_topic_id(directory: Path, topic_id: uuid.UUID) -> None:
    (directory / "partition.metadata").write_text(f"version: 0\ntopic_id: {topic_id}\n")
