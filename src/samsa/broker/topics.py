"""Topics and partitions on disk: which logs exist, creating and deleting them.

Each partition is a directory ``<topic>-<partition>`` under the data directory holding its
segments, like Kafka. Each also holds ``partition.metadata`` with the topic id, again like
Kafka, so that topic ids survive restarts without a separate catalogue. The partitions'
recovery points and the clean-shutdown marker are the data directory's, shared
(:class:`samsa.log.log.LogDir`): a clean stop closes the logs, then writes both once.

A topic appears whole or not at all. Creation builds every partition directory (with its
``partition.metadata``) in a staging directory ``<topic id>.creating``, then renames them
into place, the highest partition first: an interrupted creation never leaves a partition 0
without the rest, and the staging directory says what to remove at the next start. Deletion
renames every partition away (``<dir>.<hex>-delete``) before removing anything, and leftovers
of either are removed at start, with a log line. An OS error in either is a
KAFKA_STORAGE_ERROR for that topic, with nothing left half done.

A topic's own configs (the keys of :mod:`samsa.broker.topic_config`) are written to
``topic.config`` in every partition directory before the directories are renamed into place,
so they are as durable as the topic; altering them rewrites each file atomically, partition 0
(the one the loader reads) last, and applies them to the live logs. Partitions added later
(CreatePartitions) are built aside as ``<topic id>-<n>.adding`` and renamed into place in
index order. The internal topics are always compacted, as in Kafka.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from samsa.broker.topic_config import InvalidConfigError, parse_topic_configs
from samsa.log.durable import fsync_dir, write_durably
from samsa.log.log import AppendResult, Log, LogConfig, LogDir
from samsa.protocol.errors import ErrorCode

log = logging.getLogger("samsa.topics")

_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
_CREATING = re.compile(r"^(?P<topic_id>[0-9a-f]{32})\.creating$")
_DELETING = re.compile(r"^.+\.[0-9a-f]{32}-delete$")
_ADDING = re.compile(r"^[0-9a-f]{32}-\d+\.adding$")
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})
TOPIC_CONFIG_FILE = "topic.config"
# Threads closing partitions at a clean stop (TopicManager.close).
CLOSE_THREADS = 8


def topic_log_config(
    base: LogConfig,
    name: str,
    configs: dict[str, str],
    internal_segment_bytes: dict[str, int] | None = None,
) -> LogConfig:
    """The log config of topic ``name``: the broker's, the topic's own configs over it, and
    compaction (and ``offsets.topic.segment.bytes`` or ``transaction.state.log.segment.bytes``,
    given as ``internal_segment_bytes``) for the internal topics. INVALID_CONFIG names a bad
    value."""
    try:
        values = parse_topic_configs(configs)
    except InvalidConfigError as exc:
        raise TopicError(ErrorCode.INVALID_CONFIG, str(exc)) from None
    if name in INTERNAL_TOPICS:
        values["cleanup_policy"] = "compact"
        if internal_segment_bytes and name in internal_segment_bytes:
            values["segment_bytes"] = internal_segment_bytes[name]
    config = replace(base, **values)  # type: ignore[arg-type]
    if config.min_compaction_lag_ms > config.max_compaction_lag_ms:
        raise TopicError(
            ErrorCode.INVALID_CONFIG,
            f"min.compaction.lag.ms ({config.min_compaction_lag_ms}) is larger than "
            f"max.compaction.lag.ms ({config.max_compaction_lag_ms})",
        )
    return config


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
    # The last append still waiting for its batch's check in a worker thread (Broker.append):
    # later appends wait for it, so they are written in the order they arrived.
    append_tail: asyncio.Future[AppendResult] | None = None

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
    configs: dict[str, str] = field(default_factory=dict)  # the topic's own (dynamic) configs

    @property
    def internal(self) -> bool:
        return self.name in INTERNAL_TOPICS


class TopicManager:
    def __init__(
        self,
        data_dir: Path,
        log_config: LogConfig,
        internal_segment_bytes: dict[str, int] | None = None,
        max_partitions: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.max_partitions = max_partitions  # max.partitions; None: no limit
        self.log_config = log_config
        self.internal_segment_bytes = internal_segment_bytes or {}
        self.topics: dict[str, Topic] = {}
        self.topics_by_id: dict[uuid.UUID, Topic] = {}
        self.log_dir = LogDir(data_dir)
        # Why the data directory went offline (a failed fsync); None while it serves.
        self.offline: str | None = None

    def load(self, now_ms: int) -> None:
        """Open every partition found in the data directory (recovering each log)."""
        self.log_dir.begin_load()
        self._remove_leftovers()
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
            configs = _read_topic_configs(dirs[0])
            try:
                config = self._log_config(name, configs)
            except TopicError as exc:
                log.error("topic %s: %s; the broker's defaults apply", name, exc)
                config = self._log_config(name, {})
            partitions = []
            for i in indexes:
                if _read_topic_id(dirs[i]) is None:
                    _write_topic_id(dirs[i], topic_id)
                plog = self.log_dir.open_log(dirs[i], config, now_ms)
                partitions.append(Partition(name, i, plog))
            self._add(Topic(name, topic_id, partitions, configs))
        self.log_dir.end_load()
        log.info("loaded %d topics from %s", len(self.topics), self.data_dir)

    def _log_config(self, name: str, configs: dict[str, str]) -> LogConfig:
        return topic_log_config(self.log_config, name, configs, self.internal_segment_bytes)

    def _add(self, topic: Topic) -> None:
        self.topics[topic.name] = topic
        self.topics_by_id[topic.topic_id] = topic

    def get_partition(self, topic: str, partition: int) -> Partition | None:
        if self.offline is not None:
            return None  # nothing is served from an offline directory
        t = self.topics.get(topic)
        if t is None or not 0 <= partition < len(t.partitions):
            return None
        return t.partitions[partition]

    def create(
        self, name: str, num_partitions: int, now_ms: int, configs: dict[str, str] | None = None
    ) -> Topic:
        validate_topic_name(name)
        configs = dict(configs or {})
        config = self._log_config(name, configs)
        if name in self.topics:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        if num_partitions < 1:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS,
                f"number of partitions must be >= 1, got {num_partitions}",
            )
        self._check_partition_limit(num_partitions)
        self._check_online()
        topic_id = uuid.uuid4()
        staging = self.data_dir / f"{topic_id.hex}.creating"
        final = [self.data_dir / f"{name}-{i}" for i in range(num_partitions)]
        opened: list[Log] = []
        try:
            for directory in final:
                if directory.exists():  # a directory the loader skipped: never merge into it
                    raise FileExistsError(errno.EEXIST, "already exists", str(directory))
            staging.mkdir()
            for directory in final:
                (staging / directory.name).mkdir()
                _write_topic_id(staging / directory.name, topic_id)
                if configs:
                    _write_topic_configs(staging / directory.name, configs)
            for directory in reversed(final):  # partition 0 last: see the module docstring
                os.rename(staging / directory.name, directory)
            fsync_dir(self.data_dir)
            staging.rmdir()
            for directory in final:
                opened.append(self.log_dir.open_log(directory, config, now_ms))
        except OSError as exc:
            for plog in opened:
                _close_files(plog)
                self.log_dir.forget(plog)
            self._undo_create(staging, final, topic_id)
            log.error("cannot create topic %s in %s: %s", name, self.data_dir, exc)
            raise TopicError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"cannot create topic {name!r}: {_describe(exc)}",
            ) from None
        topic = Topic(
            name, topic_id, [Partition(name, i, plog) for i, plog in enumerate(opened)], configs
        )
        self._add(topic)
        log.info("created topic %s with %d partitions", name, num_partitions)
        return topic

    def _undo_create(self, staging: Path, final: list[Path], topic_id: uuid.UUID) -> None:
        """Remove whatever a failed creation made: the staging directory and the partitions
        already renamed into place (those holding this topic id)."""
        for directory in final:
            if directory.is_dir() and _read_topic_id(directory) == topic_id:
                try:
                    _remove_dir(directory)
                except OSError:
                    shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)

    def _remove_leftovers(self) -> None:
        """Finish what a crash interrupted: remove half-created and half-deleted topics."""
        for entry in sorted(self.data_dir.iterdir()):
            m = _CREATING.match(entry.name)
            if m is not None and entry.is_dir():
                topic_id = uuid.UUID(hex=m["topic_id"])
                names = sorted(p.name for p in entry.iterdir())
                moved = sorted(
                    d
                    for d in self.data_dir.iterdir()
                    if d.is_dir() and _PARTITION_DIR.match(d.name) and _read_topic_id(d) == topic_id
                )
                for d in moved:
                    _remove_dir(d)
                shutil.rmtree(entry)
                log.warning(
                    "removed an interrupted topic creation %s: %d partition directories "
                    "(staged: %s; renamed into place: %s)",
                    entry,
                    len(names) + len(moved),
                    ", ".join(names) or "none",
                    ", ".join(d.name for d in moved) or "none",
                )
            elif _ADDING.match(entry.name) and entry.is_dir():
                shutil.rmtree(entry)
                log.warning("removed %s, left by an interrupted partition creation", entry)
            elif _DELETING.match(entry.name) and entry.is_dir():
                shutil.rmtree(entry)
                log.warning("removed %s, left by an interrupted topic deletion", entry)

    def delete(self, name: str) -> None:
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        self._check_online()
        # Rename every partition first, so a crash or an error never leaves half a topic.
        moved: list[tuple[Path, Path]] = []
        try:
            for p in topic.partitions:
                directory = p.log.directory
                doomed = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}-delete")
                os.rename(directory, doomed)
                moved.append((directory, doomed))
        except OSError as exc:
            for directory, doomed in reversed(moved):
                with contextlib.suppress(OSError):
                    os.rename(doomed, directory)
            log.error("cannot delete topic %s: %s", name, exc)
            raise TopicError(
                ErrorCode.KAFKA_STORAGE_ERROR, f"cannot delete topic {name!r}: {_describe(exc)}"
            ) from None
        del self.topics[name]
        self.topics_by_id.pop(topic.topic_id, None)
        for p, (_directory, doomed) in zip(topic.partitions, moved, strict=True):
            _close_files(p.log)  # nothing of a deleted topic needs flushing
            self.log_dir.forget(p.log)
            shutil.rmtree(doomed, ignore_errors=True)
            p.notify()
        with contextlib.suppress(OSError):
            fsync_dir(self.data_dir)
        log.info("deleted topic %s", name)

    def alter_configs(self, name: str, configs: dict[str, str], validate_only: bool) -> None:
        """Replace topic ``name``'s own configs with ``configs`` (the whole set, rule 28): validated
        (INVALID_CONFIG), written durably to every partition directory, partition 0 last
        (the loader reads partition 0's), and applied to the live logs at once."""
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        config = self._log_config(name, configs)
        if validate_only:
            return
        self._check_online()
        try:
            for p in reversed(topic.partitions):
                _write_topic_configs(p.log.directory, configs)
        except OSError as exc:
            log.error("cannot write the configs of topic %s: %s", name, exc)
            raise TopicError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"cannot write the configs of topic {name!r}: {_describe(exc)}",
            ) from None
        topic.configs = dict(configs)
        for p in topic.partitions:
            p.log.config = config  # read at each append, retention check and cleaner pass
        log.info("topic %s configs now %s", name, configs or "the broker's defaults")

    def add_partitions(self, name: str, count: int, now_ms: int, validate_only: bool) -> None:
        """CreatePartitions (rule 32): grow topic ``name`` to ``count`` partitions (never shrink:
        INVALID_PARTITIONS). Each new partition is built aside and renamed into place in
        index order, so a crash leaves the partitions contiguous."""
        topic = self.topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
        current = len(topic.partitions)
        if count <= current:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS,
                f"The topic {name} currently has {current} partition(s); {count} would not be "
                "an increase.",
            )
        if topic.internal:
            raise TopicError(
                ErrorCode.INVALID_REQUEST, f"the partitions of {name!r} cannot be changed"
            )
        self._check_partition_limit(count - current)
        if validate_only:
            return
        self._check_online()
        config = self._log_config(name, topic.configs)
        for i in range(current, count):
            directory = self.data_dir / f"{name}-{i}"
            staging = self.data_dir / f"{topic.topic_id.hex}-{i}.adding"
            try:
                if directory.exists():
                    raise FileExistsError(errno.EEXIST, "already exists", str(directory))
                staging.mkdir()
                _write_topic_id(staging, topic.topic_id)
                if topic.configs:
                    _write_topic_configs(staging, topic.configs)
                os.rename(staging, directory)
                fsync_dir(self.data_dir)
                plog = self.log_dir.open_log(directory, config, now_ms)
            except OSError as exc:
                shutil.rmtree(staging, ignore_errors=True)
                log.error("cannot add partition %d to topic %s: %s", i, name, exc)
                raise TopicError(
                    ErrorCode.KAFKA_STORAGE_ERROR,
                    f"cannot add partition {i} to topic {name!r}: {_describe(exc)}",
                ) from None
            topic.partitions.append(Partition(name, i, plog))
        log.info("topic %s now has %d partitions (was %d)", name, count, current)

    def delete_records(self, name: str, index: int, offset: int) -> tuple[ErrorCode, int]:
        """DeleteRecords (KIP-107) on one partition: (error, low watermark). ``offset`` -1
        means the high watermark; beyond it, or below -1, is OFFSET_OUT_OF_RANGE; a compacted
        topic without ``delete`` in its cleanup.policy refuses with POLICY_VIOLATION, as
        Kafka's (an empty policy, KIP-1161, allows it)."""
        partition = self.get_partition(name, index)
        if partition is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
        plog = partition.log
        if plog.config.compact and not plog.config.delete:
            return ErrorCode.POLICY_VIOLATION, -1
        target = plog.high_watermark if offset == -1 else offset
        if not 0 <= target <= plog.high_watermark:
            return ErrorCode.OFFSET_OUT_OF_RANGE, -1
        try:
            return ErrorCode.NONE, plog.delete_records_before(target)
        except OSError as exc:
            log.error("DeleteRecords on %s: %s", plog.directory, exc)
            return ErrorCode.KAFKA_STORAGE_ERROR, -1

    def _check_partition_limit(self, more: int) -> None:
        held = sum(len(t.partitions) for t in self.topics.values())
        if self.max_partitions is not None and held + more > self.max_partitions:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS,
                f"{more} more partitions would exceed max.partitions={self.max_partitions} "
                f"(the broker holds {held})",
            )

    def _check_online(self) -> None:
        if self.offline is not None:
            raise TopicError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"log directory {self.data_dir} is offline: {self.offline}",
            )

    def partitions(self) -> Iterator[Partition]:
        for t in self.topics.values():
            yield from t.partitions

    def close(self, now_ms: int) -> list[tuple[Partition, OSError]]:
        """Close every partition cleanly (flush what is unflushed, snapshot), then write the
        data directory's checkpoint and clean-shutdown marker, which names the partitions
        closed cleanly; the ones that failed are returned, with their files closed all the
        same (all of them if the marker could not be written). Partitions close in
        CLOSE_THREADS threads, as Kafka's shutdown threads close its logs: nearly all of a
        close is fsyncs, which release the GIL, so one partition's wait for the disk does not
        hold up the next."""

        def close_one(p: Partition) -> tuple[Partition, OSError] | None:
            try:
                p.log.close(now_ms)
            except OSError as exc:
                _close_files(p.log)
                return p, exc
            return None

        partitions = list(self.partitions())
        if len(partitions) <= 1:
            results = [close_one(p) for p in partitions]
        else:
            workers = min(CLOSE_THREADS, len(partitions))
            with ThreadPoolExecutor(workers, thread_name_prefix="samsa-close") as pool:
                results = list(pool.map(close_one, partitions))
        failures = [r for r in results if r is not None]
        failed = {p for p, _ in failures}
        try:
            self.log_dir.close([p.log for p in partitions if p not in failed])
        except OSError as exc:
            log.error("cannot write the checkpoint of %s: %s", self.data_dir, exc)
            return [(p, exc) for p in partitions]
        return failures

    def abandon(self) -> None:
        """Close every partition's files without writing anything (an offline directory):
        no clean-shutdown marker, so the next start recovers each log."""
        for p in self.partitions():
            _close_files(p.log)


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


def _read_topic_configs(directory: Path) -> dict[str, str]:
    try:
        text = (directory / TOPIC_CONFIG_FILE).read_text()
    except FileNotFoundError:
        return {}
    configs = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            configs[key.strip()] = value.strip()
    return configs


def _write_topic_configs(directory: Path, configs: dict[str, str]) -> None:
    # Written in the staging directory: the renames that publish the topic publish it too.
    write_durably(directory / TOPIC_CONFIG_FILE, "".join(f"{k}={v}\n" for k, v in configs.items()))


def _close_files(plog: Log) -> None:
    """Close a log's segment files, writing nothing."""
    for seg in plog.segments:
        with contextlib.suppress(OSError):
            seg.close()


def _remove_dir(directory: Path) -> None:
    """Rename away, then remove: a crash in between leaves a ``-delete`` leftover, never a
    partition directory with some of its files."""
    doomed = directory.with_name(f"{directory.name}.{uuid.uuid4().hex}-delete")
    os.rename(directory, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _describe(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"
