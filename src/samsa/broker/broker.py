"""The broker's domain state: topics and logs, producer ids, durability; no sockets here.

Handlers (``broker/handlers/``) translate requests into calls on :class:`Broker`;
``broker/server.py`` owns the sockets.

Storage failures. An OS error while serving a request is that partition's or topic's
KAFKA_STORAGE_ERROR (the coordinators answer COORDINATOR_NOT_AVAILABLE, as Kafka maps storage
errors of its internal topics). A failed fsync is different: the kernel may have dropped the
pages it could not write and cleared the error, so a later fsync that succeeds proves
nothing. As Kafka's LogDirFailureChannel does, the data directory then goes offline: nothing
is fsynced or served from it again (KAFKA_STORAGE_ERROR), and since it is this broker's only
log directory, the broker stops, as Kafka halts when its last log directory fails; the logs
are closed without writing anything, so the next start recovers them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from samsa.broker.authorizer import AclError, Authorizer, authorizer_enabled, parse_super_users
from samsa.broker.client_metrics import (
    CLIENT_METRICS_FILE,
    ClientMetricsConfigs,
    ClientMetricsManager,
)
from samsa.broker.config import LONG_MAX, BrokerConfig, ConfigError
from samsa.broker.coordinator_log import CoordinatorLogs
from samsa.broker.dynamic_config import (
    DYNAMIC_CONFIGS_FILE,
    DynamicBrokerConfigs,
    DynamicConfigError,
)
from samsa.broker.features import FEATURES_FILE, Features, FeaturesError
from samsa.broker.fetch_session import FetchSessionCache
from samsa.broker.flusher import Flusher
from samsa.broker.group_config import GROUP_CONFIGS_FILE, GroupConfigs
from samsa.broker.metrics import BrokerMetrics
from samsa.broker.producer_ids import ProducerIdAllocator
from samsa.broker.quotas import CLIENT_QUOTAS_FILE, ClientQuotas
from samsa.broker.share import ShareConfigs, SharePartitions, share_clock
from samsa.broker.topic_config import DescribedConfig, describe_topic_configs
from samsa.broker.topics import Partition, TopicError, TopicManager, topic_log_config
from samsa.coordinator.consumer_group_coordinator import ConsumerConfig, TopicInfo
from samsa.coordinator.group_coordinator import GroupConfig
from samsa.coordinator.group_runtime import GroupCoordinatorRuntime
from samsa.coordinator.share_group import ShareConfig
from samsa.coordinator.share_group_sessions import ShareSessionCache
from samsa.coordinator.transaction_coordinator import TxnConfig
from samsa.coordinator.txn_runtime import StepHook, TransactionCoordinatorRuntime
from samsa.log.cleaner import CleanerConfig, CleanerStoppedError, LogCleaner
from samsa.log.log import AppendResult, Log, LogConfig
from samsa.log.validator import CheckedBatch, check_client_batch, try_client_batch
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import Compression, RecordBatchView

log = logging.getLogger("samsa.broker")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class StartupError(Exception):
    """The broker cannot start (its data directory is unusable); the message says why."""


class ShutdownError(Exception):
    """The broker stopped, but could not write everything it should have."""


class Broker:
    def __init__(self, config: BrokerConfig, txn_on_step: StepHook | None = None) -> None:
        self.config = config.validate()
        self.data_dir = config.data_dir
        _prepare_data_dir(self.data_dir)
        self.cluster_id = config.cluster_id or _load_cluster_id(self.data_dir, config.broker_id)
        # Dynamic broker configs (rule 44) apply before any log opens.
        self.dynamic = DynamicBrokerConfigs(self.config, self.data_dir / DYNAMIC_CONFIGS_FILE)
        # Group configs (KIP-848): per-group overrides, kept beside the dynamic broker configs.
        self.group_configs = GroupConfigs(self.data_dir / GROUP_CONFIGS_FILE)
        try:
            self.config = config = self.dynamic.load()
            self.group_configs.load()
            client_metrics = ClientMetricsConfigs(self.data_dir / CLIENT_METRICS_FILE)
            client_metrics.load()
        except ConfigError as exc:
            raise StartupError(str(exc)) from None
        # Client telemetry subscriptions and the instances pushing (KIP-714).
        self.client_metrics = ClientMetricsManager(client_metrics, config.telemetry_max_bytes)
        # Client quotas (KIP-546), kept beside the dynamic configs; applied by the handlers.
        self.quotas = ClientQuotas(
            self.data_dir / CLIENT_QUOTAS_FILE,
            window_num=config.quota_window_num,
            window_s=config.quota_window_size_seconds,
        )
        try:
            self.quotas.load()
        except ValueError as exc:
            raise StartupError(str(exc)) from None
        # Finalized features (rule 45): the persisted levels, else the transaction.version setting.
        try:
            self.features = Features(
                self.data_dir / FEATURES_FILE, config.broker_id, config.transaction_version
            )
        except FeaturesError as exc:
            raise StartupError(str(exc)) from None
        self.log_config = _log_config(config)
        self.cleaner = LogCleaner(
            CleanerConfig(
                dedupe_buffer_size=config.log_cleaner_dedupe_buffer_size,
                io_max_bytes_per_second=config.log_cleaner_io_max_bytes_per_second,
            )
        )
        self.topics = TopicManager(
            self.data_dir,
            self.log_config,
            {
                "__consumer_offsets": config.offsets_topic_segment_bytes,
                "__transaction_state": config.transaction_state_log_segment_bytes,
            },
            max_partitions=config.max_partitions,
        )
        self.producer_ids = ProducerIdAllocator(self.data_dir)
        # None: no authorizer configured, every request is allowed (handlers/_base.py).
        self.authorizer: Authorizer | None = None
        if authorizer_enabled(config.authorizer_class_name):
            try:
                self.authorizer = Authorizer(
                    self.data_dir,
                    parse_super_users(config.super_users),
                    config.allow_everyone_if_no_acl_found,
                )
            except AclError as exc:
                raise StartupError(str(exc)) from None
        # KIP-227 incremental fetch sessions (handlers/fetch.py).
        self.fetch_sessions = FetchSessionCache(config.max_incremental_fetch_session_cache_slots)
        self.metrics = BrokerMetrics(self)  # Prometheus (broker/metrics.py), served if metrics.port
        self.flusher = Flusher(on_failure=self._flush_failed, on_fsync=self.metrics.fsynced)
        # Why the data directory went offline (see the module docstring); None while serving.
        self.offline: str | None = None
        # Called with the reason when the data directory goes offline (serve() stops).
        self.offline_listeners: list[Callable[[str], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        # Checking compressed or large client batches (Broker.append): one thread per core
        # of the machine this is sized for; each check is bounded (message.max.inflated.bytes).
        self._checkers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="samsa-check")
        self._inline_ns = 0  # time spent checking batches on the event loop in this turn
        # (future, check_client_batch's arguments) of the batches this turn leaves to workers
        self._deferred: collections.deque[_Deferred] = collections.deque()
        # The coordinators' ports (coordinator/ports.py): their internal topics, and markers.
        self.coordinator_logs = CoordinatorLogs(self.topics, now_ms)
        # KIP-932 share groups' record states and share sessions (handlers/share_fetch.py).
        self.share_partitions = SharePartitions(
            ShareConfigs(
                config.group_share_record_lock_duration_ms,
                config.group_share_delivery_count_limit,
                config.group_share_partition_max_record_locks,
            ),
            group_configs=self.group_configs.get,
            store=self.coordinator_logs,
        )
        self.share_sessions = ShareSessionCache(config.group_share_max_share_sessions)
        # Woken when a share partition's lock deadline comes earlier than the one awaited.
        self._share_locks_moved = asyncio.Event()
        # Set once the coordinators have replayed their topics (the cleaner waits for it: it
        # must not rewrite the segments a replay is reading).
        self.coordinators_loaded = asyncio.Event()
        self.share_partitions.on_deadline = lambda _deadline: self._share_locks_moved.set()
        # Called as (topic, partition, producer id, committed) after each marker is written.
        self.txn_marker_listeners = self.coordinator_logs.marker_listeners
        # Transaction coordinator: state rebuilt from __transaction_state at start().
        self.transactions = TransactionCoordinatorRuntime(
            self.coordinator_logs,
            _txn_config(config),
            self.producer_ids.allocate,
            now_ms,
            txn_on_step,  # the crash tests' hook (tests/chaos/test_txn_crash.py), else None
        )
        # Group coordinator: state rebuilt from __consumer_offsets; it asks the transaction
        # coordinator whether a TxnOffsetCommit's producer may write (rule 19).
        self.groups = GroupCoordinatorRuntime(
            self.coordinator_logs,
            _group_config(config),
            now_ms,
            self.transactions.verify,
            self._topic_infos,
            self._group_timeouts,
        )
        share_groups = self.groups.coordinator.share
        share_groups.config = ShareConfig(
            config.group_share_session_timeout_ms,
            config.group_share_heartbeat_interval_ms,
            config.group_share_max_size,
        )
        share_groups.on_leave.append(self._share_member_left)
        share_groups.on_delete.append(self.share_partitions.delete)

    def _share_member_left(self, group_id: str, member_id: str) -> None:
        """A share group member left or was expired: its share session closes and what it
        held is available to the others at once, rather than when the locks run out."""
        self.share_sessions.close_member(group_id, member_id)
        self.share_partitions.release_member(group_id, member_id)

    def connection_closed(self, peer: str) -> None:
        """A client connection is gone (the server tells): the share sessions it opened
        close and their members' records are released, as Kafka's disconnect listener does."""
        for group_id, member_id in self.share_sessions.close_connection(peer):
            self.share_partitions.release_member(group_id, member_id)

    def _group_timeouts(self, group_id: str) -> tuple[int | None, int | None]:
        """A consumer group's own session timeout and heartbeat interval, if it has them."""
        own = self.group_configs
        return (
            own.int_value(group_id, "consumer.session.timeout.ms"),
            own.int_value(group_id, "consumer.heartbeat.interval.ms"),
        )

    def _topic_infos(self) -> dict[str, TopicInfo]:
        """What consumer groups may subscribe to: the topics that are not internal."""
        return {
            t.name: TopicInfo(t.name, t.topic_id, len(t.partitions))
            for t in self.topics.topics.values()
            if not t.internal
        }

    @property
    def node_id(self) -> int:
        return self.config.broker_id

    def start(self) -> None:
        """Open the logs and replay the coordinators at once (in-process tools and tests;
        the server serves meanwhile instead: :meth:`open`, then ``load_coordinators``)."""
        self.open()
        self.groups.load()
        self.transactions.load()
        self.coordinators_loaded.set()

    def open(self) -> None:
        """Open the logs and mark the coordinators' partitions loading: the broker may
        serve, as Kafka opens its port before its coordinators have loaded (they answer
        COORDINATOR_LOAD_IN_PROGRESS meanwhile); ``start_background_tasks`` replays them."""
        self.topics.load(now_ms())
        self.groups.runtime.begin_load()
        self.transactions.runtime.begin_load()
        self.share_partitions.load()

    async def load_coordinators(self) -> None:
        """Replay the coordinators' internal topics, both at once, yielding to the event
        loop (coordinator/runtime.py says why not a thread)."""
        delay = self.config.test_coordinator_load_batch_delay_ms / 1000
        started = time.perf_counter()
        try:
            await asyncio.gather(
                self.groups.runtime.load_in_background(delay),
                self.transactions.runtime.load_in_background(delay),
            )
        except Exception:
            # As a replay failing before the port opened did: the broker stops, rather
            # than answering COORDINATOR_LOAD_IN_PROGRESS for ever.
            log.exception("replaying the coordinators failed: stopping")
            for listener in self.offline_listeners:
                listener("coordinator replay failed")
            return
        log.info("coordinators loaded in %.3f s", time.perf_counter() - started)
        self.coordinators_loaded.set()

    def start_background_tasks(self) -> None:
        loop = asyncio.get_running_loop()
        c = self.config
        self._tasks = [
            loop.create_task(
                _every(c.producer_id_expiration_check_interval_ms, self.expire_producers)
            ),
            loop.create_task(_every(c.log_retention_check_interval_ms, self.apply_retention)),
        ]
        if c.log_cleaner_enable:
            self._tasks.append(loop.create_task(self._run_cleaner()))
        if c.log_flush_scheduler_interval_ms < LONG_MAX:  # Kafka's Long.MAX: no log flusher
            self._tasks.append(
                loop.create_task(_every(c.log_flush_scheduler_interval_ms, self.flush_idle_logs))
            )
        self._tasks.append(loop.create_task(self._expire_share_locks()))
        self._tasks.append(loop.create_task(self.load_coordinators()))
        self.groups.start()
        self.transactions.start()

    async def _expire_share_locks(self) -> None:
        """Kafka's acquisition-lock timer: sleep until the earliest lock deadline of any
        share partition (or until an earlier one is set), then release what ran out."""
        moved = self._share_locks_moved
        while True:
            deadline = self.share_partitions.next_deadline()
            moved.clear()
            if deadline is None:
                await moved.wait()
            else:
                delay = max(deadline - share_clock(), 0) / 1000
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(moved.wait(), delay)
            try:
                self.share_partitions.expire_locks(share_clock())
            except Exception:
                log.exception("expiring share-partition locks failed")

    def expire_producers(self) -> None:
        now = now_ms()
        for p in self.topics.partitions():
            p.log.remove_expired_producers(now)

    def flush_idle_logs(self) -> int:
        """Kafka's log flusher (rule 42): fsync each log whose oldest unflushed append is
        ``flush.ms`` old, so records before a pause do not wait for the next append. The
        fsyncs go to the group-commit flusher's worker thread, as a Produce's do. Returns how
        many logs were handed to it."""
        if self.offline is not None:
            return 0
        now = now_ms()
        due = [p.log for p in self.topics.partitions() if p.log.flush_due(now)]
        for plog in due:
            # Nobody waits: a failure takes the directory offline through _flush_failed.
            self.flusher.flush(plog)
        return len(due)

    def apply_retention(self) -> None:
        """Delete segments past log.retention.ms / log.retention.bytes, in the topics whose
        cleanup.policy has "delete" (the internal topics are compacted, never deleted)."""
        now = now_ms()
        for topic in list(self.topics.topics.values()):
            if topic.internal or self.offline is not None:
                continue
            for p in topic.partitions:
                if not p.log.config.delete:
                    continue
                try:
                    p.log.apply_retention(now)
                except OSError as exc:
                    # As Kafka's log manager does with an IOException while deleting
                    # segments: the directory is no longer trusted (one line, no traceback).
                    self.mark_offline(f"deleting old segments of {p.log.directory}: {exc}")
                    return

    async def clean_logs(self) -> int:
        """One round of compaction over the compacted logs: each is planned and swapped here
        (the logs' thread), its segments rewritten in a worker. Returns how many were."""
        cleaned = 0
        for topic in list(self.topics.topics.values()):
            for p in topic.partitions:
                if not p.log.config.compact or self.offline is not None:
                    continue
                plan = self.cleaner.plan(p.log, now_ms())
                if plan is None:
                    continue
                log.info(
                    "cleaning %s: %d segment(s) from offset %d, dirty ratio %.2f",
                    p.log.directory,
                    len(plan.sources),
                    plan.sources[0].base,
                    plan.dirty_ratio,
                )
                try:
                    await asyncio.to_thread(self.cleaner.build, plan)
                except CleanerStoppedError:
                    pass
                except Exception:
                    log.exception("cleaning %s failed", p.log.directory)
                finally:
                    # Swaps already committed on disk go in now (or at the next start).
                    if self.cleaner.finish(plan) and plan.map_end >= 0:
                        cleaned += 1
        return cleaned

    async def _run_cleaner(self) -> None:
        # Kafka's cleaner thread: clean while there is work, back off when there is none.
        await self.coordinators_loaded.wait()
        while True:
            try:
                cleaned = await self.clean_logs()
            except Exception:
                log.exception("log cleaner round failed")
                cleaned = 0
            await asyncio.sleep(0 if cleaned else self.config.log_cleaner_backoff_ms / 1000)

    def close(self) -> None:
        """Stop the tasks and close every log. Raises ShutdownError, after closing all it
        can, if the data directory was offline or some log could not be closed cleanly."""
        self.cleaner.shutdown()
        self._checkers.shutdown(wait=True, cancel_futures=True)
        for task in self._tasks:
            task.cancel()
        self.transactions.close()
        self.groups.close()
        if self.offline is not None:
            self.topics.abandon()
            raise ShutdownError(
                f"log directory {self.data_dir} went offline ({self.offline}); "
                "stopped without writing to it, the next start recovers its logs"
            )
        failures = self.topics.close(now_ms())
        if failures:
            first = failures[0][1]
            names = ", ".join(f"{p.topic}-{p.index}" for p, _ in failures)
            log.error(
                "could not close %d of %d partitions cleanly (%s): %s; "
                "the next start recovers them",
                len(failures),
                sum(len(t.partitions) for t in self.topics.topics.values()),
                first.strerror or first,
                names,
            )
            raise ShutdownError(
                f"{len(failures)} partitions in {self.data_dir} could not be closed cleanly "
                f"({first.strerror or first})"
            )
        log.info("broker closed: logs flushed, producer-state snapshots written")

    def _flush_failed(self, exc: BaseException) -> None:
        self.mark_offline(f"fsync failed: {exc}")

    def mark_offline(self, reason: str) -> None:
        """Stop serving the data directory for good (see the module docstring)."""
        if self.offline is not None:
            return
        self.offline = reason
        self.topics.offline = reason
        log.critical(
            "log directory %s is offline (%s): its partitions are no longer served; "
            "stopping the broker, as Kafka does when its last log directory fails",
            self.data_dir,
            reason,
        )
        for listener in list(self.offline_listeners):
            listener(reason)

    # --- dynamic broker configs (rule 44) -----------------------------------------------

    def alter_broker_configs(
        self, resource_name: str, configs: dict[str, str], validate_only: bool
    ) -> None:
        """Make ``configs`` the dynamic set of the BROKER resource ``resource_name`` (``""``:
        the cluster default), as Kafka's DynamicLogConfig: checked (DynamicConfigError), written
        durably, then applied at once to every live log whose topic does not set the key."""
        self.dynamic.level(resource_name)  # a wrong broker id is refused first, as Kafka does
        if resource_name:
            default, mine = self.dynamic.default, configs
        else:
            default, mine = configs, self.dynamic.broker
        config = self.dynamic.effective(self.config, default, mine)
        base = _log_config(config)
        rebased = []
        for topic in self.topics.topics.values():
            try:
                log_config = topic_log_config(
                    base, topic.name, topic.configs, self.topics.internal_segment_bytes
                )
            except TopicError as exc:
                raise DynamicConfigError(f"topic {topic.name}: {exc}") from None
            rebased += [(p, log_config) for p in topic.partitions]
        if validate_only:
            return
        if self.offline is not None:
            raise TopicError(
                ErrorCode.KAFKA_STORAGE_ERROR, f"log directory offline ({self.offline})"
            )
        try:
            self.dynamic.store(resource_name, configs)
        except OSError as exc:
            log.error("cannot write the dynamic broker configs: %s", exc)
            raise TopicError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"cannot write the dynamic broker configs: {_reason(exc)}",
            ) from None
        self.config = config
        self.log_config = self.topics.log_config = base
        for p, log_config in rebased:
            p.log.config = log_config  # read at each append, retention check and cleaner pass
        log.info("dynamic broker configs %r now %s", resource_name, configs or "empty")

    def describe_topic(self, configs: dict[str, str]) -> list[DescribedConfig]:
        """DescribeConfigs of a topic with its own ``configs`` (rules 27 and 44)."""
        return describe_topic_configs(
            self.dynamic.static_view(self.config),
            configs,
            self.dynamic.broker,
            self.dynamic.default,
        )

    # --- topics -----------------------------------------------------------------------

    def create_topic(
        self, name: str, num_partitions: int | None = None, configs: dict[str, str] | None = None
    ) -> None:
        n = num_partitions if num_partitions and num_partitions > 0 else self.config.num_partitions
        self.topics.create(name, n, now_ms(), configs)

    def partition_or_error(self, topic: str, index: int) -> Partition | ErrorCode:
        if self.offline is not None:
            return ErrorCode.KAFKA_STORAGE_ERROR
        p = self.topics.get_partition(topic, index)
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if p is None else p

    # --- ListOffsets by time -----------------------------------------------------------

    async def offset_for_timestamp(self, plog: Log, timestamp_ms: int) -> tuple[int, int] | None:
        """``plog.offset_for_timestamp`` with the records of compressed or large batches
        searched in the checkers' threads (inflating one may take seconds: issue 27), so other
        connections are served meanwhile. The batches are found and read on the event loop;
        a segment deleted by retention while searched has the search done again here."""
        loop = asyncio.get_running_loop()
        try:
            for probe in plog.timestamp_probes(timestamp_ms):
                if probe.heavy:
                    hit = await loop.run_in_executor(self._checkers, probe.search, timestamp_ms)
                else:
                    hit = probe.search(timestamp_ms)
                if hit is not None:
                    return hit
            return None
        except OSError:
            return plog.offset_for_timestamp(timestamp_ms)

    # --- produce ----------------------------------------------------------------------

    def append(
        self, partition: Partition, batch: RecordBatchView
    ) -> AppendResult | asyncio.Future[AppendResult]:
        """Append a client batch. Its records are checked first (log/validator.py): on the
        event loop for a small batch while this turn of it has checked for less than
        _INLINE_TURN_NS, else (or if its records inflate past _INLINE_INFLATE_BYTES) in a
        worker thread, whose decompression and numpy passes release the GIL; then the
        append is a future, and later appends to the partition wait for it (arrival order
        is append order)."""
        if batch.producer_id >= 0 and not self.producer_ids.issued(batch.producer_id):
            # D-REC-3: the only issuer of producer ids knows this one was never handed out.
            return AppendResult(
                ErrorCode.UNKNOWN_PRODUCER_ID,
                log_start_offset=partition.log.log_start_offset,
                message=f"producer id {batch.producer_id} was never issued by this broker",
            )
        tail = partition.append_tail
        if tail is None and not _heavy(batch, partition.log.config):
            checked = self._try_inline(partition, batch)
            if checked is not None:
                return self._append_checked(partition, batch, checked)
        checking = self._check_later(
            batch, partition.log.config, f"{partition.topic}-{partition.index}"
        )
        done = asyncio.ensure_future(self._append_after(partition, batch, tail, checking))
        partition.append_tail = done

        def untail(fut: asyncio.Future[AppendResult]) -> None:
            if partition.append_tail is fut:
                partition.append_tail = None

        done.add_done_callback(untail)
        return done

    def _try_inline(self, partition: Partition, batch: RecordBatchView) -> CheckedBatch | None:
        """The batch checked on the event loop if this turn of it has time left for checks
        (a thread hand-off costs more than a small batch's check), its time counted; None
        if the turn has none left, or once the records inflate, or take reading, past
        _INLINE_INFLATE_BYTES (to be checked again by a worker)."""
        if self._inline_ns >= _INLINE_TURN_NS:
            return None
        counted = True
        if not self._inline_ns:
            try:
                asyncio.get_running_loop().call_soon(self._reset_inline_budget)
            except RuntimeError:  # no loop (an in-process harness): nothing else to serve
                counted = False
        started = _clock()
        try:
            return try_client_batch(
                batch,
                partition.log.config,
                now_ms(),
                f"{partition.topic}-{partition.index}",
                _INLINE_INFLATE_BYTES,
            )
        finally:
            if counted:
                self._inline_ns += max(_clock() - started, 1)

    def _reset_inline_budget(self) -> None:
        self._inline_ns = 0

    def _check_later(
        self, batch: RecordBatchView, config: LogConfig, name: str
    ) -> asyncio.Future[CheckedBatch]:
        """The batch's check, by a worker thread. The batches a turn of the loop defers go in
        one hand-off at its end, drained by at most two workers: a hand-off per batch cost the
        loop more than a small compressed batch's check (py-spy: ThreadPoolExecutor.submit
        7.7% of the broker's busy time producing 1000-record gzip batches)."""
        loop = asyncio.get_running_loop()
        checking: asyncio.Future[CheckedBatch] = loop.create_future()
        if not self._deferred:
            loop.call_soon(self._hand_off)
        self._deferred.append((checking, (batch, config, now_ms(), name)))
        return checking

    def _hand_off(self) -> None:
        jobs, self._deferred = self._deferred, collections.deque()
        loop = asyncio.get_running_loop()
        for _ in range(min(2, len(jobs))):
            drained = loop.run_in_executor(self._checkers, _drain, jobs)
            drained.add_done_callback(functools.partial(_settle, jobs))

    async def _append_after(
        self,
        partition: Partition,
        batch: RecordBatchView,
        tail: asyncio.Future[AppendResult] | None,
        checking: asyncio.Future[CheckedBatch],
    ) -> AppendResult:
        if tail is not None:
            await asyncio.wait([tail])  # its outcome is its own request's
        return self._append_checked(partition, batch, await checking)

    def _append_checked(
        self, partition: Partition, batch: RecordBatchView, checked: CheckedBatch | None
    ) -> AppendResult:
        result = partition.log.append(batch, now_ms(), checked=checked)
        if result.error == ErrorCode.NONE and not result.duplicate:
            partition.notify()
        self.metrics.appended(partition, batch, result)
        return result

    def write_txn_marker(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        commit: bool,
    ) -> ErrorCode:
        """Write a transaction's COMMIT/ABORT marker to one partition (rule 16), then tell the
        listeners (the group coordinator makes transactional offsets visible on commit)."""
        return self.coordinator_logs.write_marker(
            topic, partition, producer_id, producer_epoch, coordinator_epoch, commit
        )

    def needs_flush(self, plog: Log) -> bool:
        # The topic's flush.messages / flush.ms, else log.flush.interval.messages (rule 42).
        return plog.flush_due(now_ms())

    def flush(self, plog: Log) -> asyncio.Future[BaseException | None]:
        """Completes once ``plog`` is fsynced: with None, or with the failure (the data
        directory is then offline)."""
        return self.flusher.flush(plog)


# A compressed batch up to _INLINE_CHECK_BYTES whose records inflate to _INLINE_INFLATE_BYTES
# at most, or an uncompressed one up to _INLINE_PLAIN_BYTES whose records that many bytes'
# worth of reading covers, is checked on the event loop, and more in the same turn of the loop
# while its checks took less than _INLINE_TURN_NS; a larger batch, or one past that, goes to a
# worker thread. With the C walker (protocol/_records.c, ~1.2 ns a byte at worst, charged 1/32
# of a byte per byte) every uncompressed batch up to 2 MiB qualifies: ~2.5 ms at worst, tiny
# records; without it numpy reads them (a uniform run charged 1/256 of its bytes, varying
# sizes walked in Python: ~4 ms at worst).
_INLINE_CHECK_BYTES = 64 * 1024
_INLINE_INFLATE_BYTES = 128 * 1024
_INLINE_PLAIN_BYTES = 2 * 1024 * 1024
_INLINE_TURN_NS = 1_000_000
_clock = time.perf_counter_ns  # the loop's latency is wall time


_Deferred = tuple["asyncio.Future[CheckedBatch]", tuple[RecordBatchView, LogConfig, int, str]]


_Outcome = tuple["asyncio.Future[CheckedBatch]", CheckedBatch | Exception]


def _drain(jobs: collections.deque[_Deferred]) -> list[_Outcome]:
    """Check deferred batches until none is left (a worker thread; deque.popleft is atomic,
    so two workers share them): each future with its CheckedBatch or exception."""
    done: list[_Outcome] = []
    while True:
        try:
            checking, args = jobs.popleft()
        except IndexError:
            return done
        try:
            done.append((checking, check_client_batch(*args)))
        except Exception as exc:  # the append's to raise, as the check's own future would
            done.append((checking, exc))


def _settle(jobs: collections.deque[_Deferred], drained: asyncio.Future[list[_Outcome]]) -> None:
    if drained.cancelled():  # the broker is closing: the checks left are abandoned
        with contextlib.suppress(IndexError):  # a worker may take the last one meanwhile
            while True:
                jobs.popleft()[0].cancel()
        return
    for checking, outcome in drained.result():
        if checking.done():
            continue
        if isinstance(outcome, Exception):
            checking.set_exception(outcome)
        else:
            checking.set_result(outcome)


def _heavy(batch: RecordBatchView, config: LogConfig) -> bool:
    """Whether checking the batch's records may take long whatever they inflate to: a
    large compressed batch, or one to re-encode (worker-thread work)."""
    if batch.compression == Compression.NONE:
        kept = config.compression_type in ("producer", "uncompressed")
        return batch.size > _INLINE_PLAIN_BYTES or not kept
    return batch.size > _INLINE_CHECK_BYTES or config.compression_type != "producer"


def _log_config(config: BrokerConfig) -> LogConfig:
    """The broker-wide log defaults: a topic's own configs go over them."""
    return LogConfig(
        segment_bytes=config.log_segment_bytes,
        index_interval_bytes=config.log_index_interval_bytes,
        flush_interval_messages=config.log_flush_interval_messages,
        producer_id_expiration_ms=config.producer_id_expiration_ms,
        max_message_bytes=config.message_max_bytes,
        max_inflated_bytes=config.message_max_inflated_bytes,
        retention_ms=config.log_retention_ms,
        retention_bytes=config.log_retention_bytes,
        segment_ms=config.log_roll_ms,
        cleanup_policy=config.log_cleanup_policy,
        message_timestamp_type=config.log_message_timestamp_type,
        compression_type=config.compression_type,
        compression_gzip_level=config.compression_gzip_level,
        compression_lz4_level=config.compression_lz4_level,
        compression_zstd_level=config.compression_zstd_level,
        min_insync_replicas=config.min_insync_replicas,
        message_timestamp_before_max_ms=config.log_message_timestamp_before_max_ms,
        message_timestamp_after_max_ms=config.log_message_timestamp_after_max_ms,
        flush_ms=config.log_flush_interval_ms,
        segment_jitter_ms=config.log_roll_jitter_ms,
        segment_index_bytes=config.log_index_size_max_bytes,
        preallocate=config.log_preallocate,
        file_delete_delay_ms=config.log_segment_delete_delay_ms,
        unclean_leader_election_enable=config.unclean_leader_election_enable,
        message_downconversion_enable=config.log_message_downconversion_enable,
        min_cleanable_dirty_ratio=config.log_cleaner_min_cleanable_ratio,
        min_compaction_lag_ms=config.log_cleaner_min_compaction_lag_ms,
        max_compaction_lag_ms=config.log_cleaner_max_compaction_lag_ms,
        delete_retention_ms=config.log_cleaner_delete_retention_ms,
    )


def _group_config(config: BrokerConfig) -> GroupConfig:
    return GroupConfig(
        num_partitions=config.offsets_topic_num_partitions,
        initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
        min_session_timeout_ms=config.group_min_session_timeout_ms,
        max_session_timeout_ms=config.group_max_session_timeout_ms,
        max_size=config.group_max_size,
        offsets_retention_ms=config.offsets_retention_minutes * 60_000,
        offsets_retention_check_interval_ms=config.offsets_retention_check_interval_ms,
        consumer=ConsumerConfig(
            session_timeout_ms=config.group_consumer_session_timeout_ms,
            heartbeat_interval_ms=config.group_consumer_heartbeat_interval_ms,
            assignors=tuple(a.strip() for a in config.group_consumer_assignors.split(",")),
            max_size=config.group_consumer_max_size,
            migration_policy=config.group_consumer_migration_policy.lower(),
        ),
    )


def _txn_config(config: BrokerConfig) -> TxnConfig:
    return TxnConfig(
        num_partitions=config.transaction_state_log_num_partitions,
        max_timeout_ms=config.transaction_max_timeout_ms,
        id_expiration_ms=config.transactional_id_expiration_ms,
        abort_timed_out_interval_ms=(
            config.transaction_abort_timed_out_transaction_cleanup_interval_ms
        ),
        remove_expired_interval_ms=(
            config.transaction_remove_expired_transaction_cleanup_interval_ms
        ),
    )


async def _every(interval_ms: int, action: Callable[[], None]) -> None:
    while True:
        await asyncio.sleep(interval_ms / 1000)
        try:
            action()
        except Exception:
            log.exception("periodic %s failed", getattr(action, "__name__", action))


def _prepare_data_dir(path: Path) -> None:
    """Create the data directory if needed and check that files can be created in it, so an
    unusable one stops the start with one clear line rather than failing requests later."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if path.exists() and not path.is_dir():
            raise StartupError(f"data directory {path} is not a directory") from None
        raise StartupError(f"cannot create data directory {path}: {_reason(exc)}") from None
    probe = path / ".samsa-write-probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        probe.unlink()
    except OSError as exc:
        raise StartupError(f"data directory {path} is not writable: {_reason(exc)}") from None


def _reason(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def _load_cluster_id(data_dir: Path, broker_id: int) -> str:
    """Kafka keeps the cluster id in ``meta.properties``; so do we (created at first start)."""
    path = data_dir / "meta.properties"
    try:
        if path.exists():
            for line in path.read_text().splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "cluster.id":
                    return value.strip()
        cluster_id = _random_cluster_id()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"version=1\ncluster.id={cluster_id}\nnode.id={broker_id}\n")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            path.with_suffix(".tmp").unlink()
        raise StartupError(f"cannot write {path}: {_reason(exc)}") from None
    return cluster_id


def _random_cluster_id() -> str:
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
