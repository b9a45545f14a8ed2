"""What a client knows of the cluster: brokers, topics, partition leaders, connections.

One :class:`Cluster` per client object. It bootstraps from ``bootstrap.servers``, keeps one
connection per broker node (reopened on demand after a failure) and refreshes metadata when
asked, coalescing concurrent refreshes into one Metadata request.

It is also where requests are retried (see ``_retry.py``): a failed connection attempt to an
address delays the next one to it by ``reconnect.backoff.ms``, doubling per consecutive
failure up to ``reconnect.backoff.max.ms`` (Java's ClusterConnectionStates); metadata
refreshes retry until the client's API timeout; :meth:`Cluster.retry` runs any request
attempt under the client's retry policy; :meth:`Cluster.coordinator_call` sends a request
to the coordinator of a group or transactional id, finding it (FindCoordinator) and finding
it again when it moved or its connection was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from samsa.client._aconn import AsyncConnection
from samsa.client._config import Config
from samsa.client._errors import BootstrapError, KafkaConnectionError, KafkaError
from samsa.client._retry import (
    COORDINATOR_MOVED,
    INVALID_METADATA,
    Backoff,
    RetryLater,
    deciding_code,
    retry,
)
from samsa.client._security import AUTHENTICATION_ERRORS, PLAINTEXT, Security
from samsa.client._security import from_config as security_from_config
from samsa.client._types import TopicPartition
from samsa.protocol.constants import READ_UNCOMMITTED
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, api_name, make_request

log = logging.getLogger("samsa.client")
T = TypeVar("T")
KEY_GROUP = 0
KEY_TRANSACTION = 1
# A coordinator request's answers that only ask to try again (after a backoff).
COORDINATOR_RETRY = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})


def parse_bootstrap(servers: str | list[str]) -> list[tuple[str, int]]:
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out: list[tuple[str, int]] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        if "://" in item:
            item = item.split("://", 1)[1]
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"bootstrap server {item!r} is not HOST:PORT")
        out.append((host.strip("[]") or "127.0.0.1", int(port)))
    if not out:
        raise ValueError("bootstrap.servers is empty")
    return out


@dataclass(slots=True)
class PartitionInfo:
    partition: int
    leader: int
    leader_epoch: int = -1
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    error: int = 0


@dataclass(slots=True)
class TopicInfo:
    name: str
    partitions: dict[int, PartitionInfo] = field(default_factory=dict)
    error: int = 0
    topic_id: Any = None
    internal: bool = False


@dataclass(slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None


class Cluster:
    def __init__(
        self,
        bootstrap: str | list[str],
        *,
        client_id: str = "samsa",
        request_timeout: float = 30.0,
        allow_auto_create_topics: bool = False,
        api_timeout: float = 60.0,
        retry_backoff: float = 0.1,
        retry_backoff_max: float = 1.0,
        reconnect_backoff: float = 0.05,
        reconnect_backoff_max: float = 1.0,
        connect_timeout: float | None = None,
        security: Security = PLAINTEXT,
    ) -> None:
        self.security = security
        self.bootstrap = parse_bootstrap(bootstrap)
        self.allow_auto_create_topics = allow_auto_create_topics
        self.client_id = client_id
        self.request_timeout = request_timeout
        self.api_timeout = api_timeout
        self.connect_timeout = connect_timeout or request_timeout
        self.backoff = Backoff(retry_backoff, retry_backoff_max)
        self.reconnect_backoff = Backoff(reconnect_backoff, reconnect_backoff_max)
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.cluster_id: str | None = None
        self.controller_id = -1
        self._conns: dict[int, AsyncConnection] = {}
        self._connecting: dict[int, asyncio.Task[AsyncConnection]] = {}
        self._bootstrap_conn: AsyncConnection | None = None
        # (host, port) -> (consecutive failed connection attempts, time of the last attempt)
        self._reconnects: dict[tuple[str, int], tuple[int, float]] = {}
        self._coordinators: dict[tuple[int, str], int] = {}
        self._connected_once = False
        self._bootstrap_since: float | None = None  # first failed bootstrap, never connected
        self._refresh: asyncio.Task[None] | None = None
        self._refresh_topics: set[str] = set()
        self._closed = False

    @classmethod
    def from_config(
        cls, c: Config, *, api_timeout: float, allow_auto_create_topics: bool = False
    ) -> Cluster:
        """A cluster with the connection and retry settings every client shares."""
        return cls(
            c["bootstrap.servers"],
            client_id=c["client.id"],
            request_timeout=c.seconds("request.timeout.ms"),
            allow_auto_create_topics=allow_auto_create_topics,
            api_timeout=api_timeout,
            retry_backoff=c.seconds("retry.backoff.ms"),
            retry_backoff_max=c.seconds("retry.backoff.max.ms"),
            reconnect_backoff=c.seconds("reconnect.backoff.ms"),
            reconnect_backoff_max=c.seconds("reconnect.backoff.max.ms"),
            connect_timeout=c.seconds("socket.connection.setup.timeout.ms"),
            security=security_from_config(c.values),
        )

    # --- connections -------------------------------------------------------------------

    async def _open(self, host: str, port: int, node_id: int) -> AsyncConnection:
        """Connect (after the reconnect backoff this address has earned) and negotiate."""
        loop = asyncio.get_running_loop()
        addr = (host, port)
        failures, last = self._reconnects.get(addr, (0, 0.0))
        if failures:
            wait = last + self.reconnect_backoff.delay(failures) - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
        started = loop.time()
        self._reconnects[addr] = (failures, started)
        conn = AsyncConnection(
            host,
            port,
            client_id=self.client_id,
            request_timeout=self.request_timeout,
            node_id=node_id,
            security=self.security,
        )
        try:
            await conn.connect(self.connect_timeout)
        except KafkaError:
            # another attempt to the same address may have run meanwhile (bootstrap + node)
            count = self._reconnects.get(addr, (failures, started))[0]
            self._reconnects[addr] = (count + 1, started)
            raise
        self._reconnects.pop(addr, None)
        self._connected_once = True
        return conn

    def connected(self, node_id: int) -> AsyncConnection | None:
        """The open connection to broker ``node_id``, or None (never connects)."""
        conn = self._conns.get(node_id)
        return conn if conn is not None and not conn.closed else None

    async def connection(self, node_id: int) -> AsyncConnection:
        """The open connection to broker ``node_id``, connecting if needed."""
        conn = self._conns.get(node_id)
        if conn is not None and not conn.closed:
            return conn
        task = self._connecting.get(node_id)
        if task is None:
            info = self.brokers.get(node_id)
            if info is None:
                raise KafkaError(ErrorCode.BROKER_NOT_AVAILABLE, f"unknown broker {node_id}")
            task = asyncio.get_running_loop().create_task(self._open(info.host, info.port, node_id))
            # Waiters await it through shield(); if they are all cancelled, its failure would
            # otherwise be logged as "Task exception was never retrieved".
            task.add_done_callback(_retrieve_exception)
            self._connecting[node_id] = task
            try:
                conn = await asyncio.shield(task)
            finally:
                self._connecting.pop(node_id, None)
            self._conns[node_id] = conn
            return conn
        return await asyncio.shield(task)

    async def any_connection(self) -> AsyncConnection:
        """A connection to some broker: an open one, else a known broker, else bootstrap."""
        for conn in self._conns.values():
            if not conn.closed:
                return conn
        if self._bootstrap_conn is not None and not self._bootstrap_conn.closed:
            return self._bootstrap_conn
        errors: list[str] = []
        for node_id in list(self.brokers):
            try:
                return await self.connection(node_id)
            except KafkaError as exc:
                if exc.code in AUTHENTICATION_ERRORS:
                    raise  # as Java's AuthenticationException: retrying will not help
                errors.append(str(exc))
        servers = list(self.bootstrap)
        random.shuffle(servers)
        for host, port in servers:
            try:
                self._bootstrap_conn = await self._open(host, port, -1)
                return self._bootstrap_conn
            except KafkaError as exc:
                if exc.code in AUTHENTICATION_ERRORS:
                    raise  # as Java's AuthenticationException: retrying will not help
                errors.append(str(exc))
        message = "no broker reachable: " + "; ".join(errors)
        if not self._connected_once:
            now = asyncio.get_running_loop().time()
            if self._bootstrap_since is None:
                self._bootstrap_since = now
            elif now - self._bootstrap_since >= self.connect_timeout:
                raise BootstrapError(f"{message} (for {now - self._bootstrap_since:.1f}s)")
        raise KafkaConnectionError(message)

    # --- requests under the retry policy -----------------------------------------------

    async def retry(
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        what: str,
        timeout: float | None = None,
        on_retriable: Callable[[KafkaError], Awaitable[None] | None] | None = None,
    ) -> T:
        """:func:`samsa.client._retry.retry` with this client's backoff; ``timeout``
        defaults to the client's API timeout."""
        return await retry(
            attempt,
            what=what,
            timeout=self.api_timeout if timeout is None else timeout,
            backoff=self.backoff,
            on_retriable=on_retriable,
        )

    async def send(
        self,
        node: int | None,
        api_key: int,
        versions: tuple[int, int],
        cls: str,
        fields: Callable[[int], dict[str, Any]],
        *,
        timeout: float | None = None,
    ) -> Any:
        """One attempt of a request to broker ``node`` (None: any broker), at the highest
        version in ``versions`` the broker serves; ``fields(version)`` builds the body."""
        conn = await (self.any_connection() if node is None else self.connection(node))
        v = conn.version(api_key, *versions)
        req = make_request(api_key, v, cls, **fields(v))
        return await conn.request(api_key, req, version=v, timeout=timeout)

    async def find_coordinator(self, key_type: int, key: str, min_version: int, what: str) -> int:
        """The node coordinating ``key`` (FindCoordinator), added to ``brokers`` when new.

        ``min_version`` is the lowest FindCoordinator version the caller accepts (key types
        other than 0 need v1); a coordinator error raises KafkaError with message ``what``.
        """
        conn = await self.any_connection()
        v = conn.version(ApiKey.FIND_COORDINATOR, min_version, 4)
        req = make_request(
            ApiKey.FIND_COORDINATOR,
            v,
            "FindCoordinatorRequest",
            key=key,
            key_type=key_type,
            coordinator_keys=(key,),
        )
        resp = await conn.request(ApiKey.FIND_COORDINATOR, req, version=v)
        c = resp.coordinators[0] if v >= 4 else resp
        if c.error_code:
            raise KafkaError(int(c.error_code), what)
        node = int(c.node_id)
        if node not in self.brokers:
            self.brokers[node] = BrokerInfo(node, c.host, int(c.port))
        return node

    async def coordinator(self, key_type: int, key: str) -> AsyncConnection:
        """The connection to the coordinator of a group (KEY_GROUP) or transactional id
        (KEY_TRANSACTION): the one known, else found with FindCoordinator."""
        node = self._coordinators.get((key_type, key))
        if node is not None:
            try:
                return await self.connection(node)
            except KafkaError:
                self.forget_coordinator(key_type, key)
        # key_type exists from v1
        node = await self.find_coordinator(
            key_type, key, 1 if key_type else 0, f"FindCoordinator({key!r})"
        )
        self._coordinators[(key_type, key)] = node
        return await self.connection(node)

    def forget_coordinator(self, key_type: int, key: str) -> None:
        self._coordinators.pop((key_type, key), None)

    async def coordinator_call(
        self,
        key_type: int,
        key: str,
        api_key: int,
        versions: tuple[int, int],
        cls: str,
        fields: Callable[[int], dict[str, Any]],
        codes: Callable[[Any], Iterable[int]] = lambda r: (int(r.error_code),),
        *,
        retry_codes: frozenset[int] = COORDINATOR_RETRY,
        timeout: float | None = None,
        request_timeout: float | None = None,
    ) -> tuple[Any, int]:
        """Send to the coordinator of ``key`` until the answer is final; returns (response,
        deciding error code). A lost connection or NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE
        finds the coordinator again; the codes in ``retry_codes`` are retried after a
        backoff; until ``timeout`` (default: the API timeout), then KafkaTimeoutError. The
        caller must only use this for requests the coordinator answers consistently when
        they are resent after a lost response."""
        name = f"{api_name(api_key)} for {key!r}"

        async def attempt() -> tuple[Any, int]:
            conn = await self.coordinator(key_type, key)
            v = conn.version(api_key, *versions)
            req = make_request(api_key, v, cls, **fields(v))
            resp = await conn.request(api_key, req, version=v, timeout=request_timeout)
            code = deciding_code(codes(resp), retry_codes)
            if code in COORDINATOR_MOVED or code in retry_codes:
                raise RetryLater(code, name, resp)
            return resp, code

        def react(exc: KafkaError) -> None:
            if isinstance(exc, KafkaConnectionError) or exc.code in COORDINATOR_MOVED:
                self.forget_coordinator(key_type, key)

        return await self.retry(attempt, what=name, timeout=timeout, on_retriable=react)

    # --- metadata ------------------------------------------------------------------------

    async def refresh(
        self, topics: list[str] | None = None, *, timeout: float | None = None
    ) -> None:
        """Fetch metadata for ``topics`` (plus every known topic); None means all topics.
        Lost connections are retried for ``timeout`` seconds (default: the API timeout;
        0: one attempt)."""
        if topics is None:
            await self._fetch_metadata(None, timeout)
            return
        self._refresh_topics.update(topics)
        task = self._refresh
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._refresh_known(timeout))
            task.add_done_callback(_retrieve_exception)
            self._refresh = task
        await asyncio.shield(task)
        missing = [t for t in topics if t not in self.topics]
        if missing:  # asked for while a refresh without them was running
            await self._fetch_metadata(sorted(set(self.topics) | set(missing)), timeout)

    async def _refresh_known(self, timeout: float | None) -> None:
        await asyncio.sleep(0)  # let concurrent callers add their topics
        wanted = sorted(set(self.topics) | self._refresh_topics)
        self._refresh_topics.clear()
        await self._fetch_metadata(wanted, timeout)

    async def _fetch_metadata(self, topics: list[str] | None, timeout: float | None) -> None:
        await self.retry(
            lambda: self._fetch_metadata_once(topics), what="Metadata", timeout=timeout
        )

    async def _fetch_metadata_once(self, topics: list[str] | None) -> None:
        conn = await self.any_connection()
        v = conn.version(ApiKey.METADATA, 1, 12)
        req = make_request(
            ApiKey.METADATA,
            v,
            "MetadataRequest",
            topics=None
            if topics is None
            else tuple(
                make_request(ApiKey.METADATA, v, "MetadataRequestTopic", name=t, topic_id=None)
                for t in topics
            ),
            allow_auto_topic_creation=self.allow_auto_create_topics and topics is not None,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        resp = await conn.request(ApiKey.METADATA, req, version=v)
        self.apply_metadata(resp, full=topics is None)

    def apply_metadata(self, resp: Any, full: bool) -> None:
        self.brokers = {
            int(b.node_id): BrokerInfo(int(b.node_id), b.host, int(b.port), b.rack)
            for b in resp.brokers
        }
        self.cluster_id = getattr(resp, "cluster_id", None)
        self.controller_id = int(getattr(resp, "controller_id", -1))
        # A broker that left (or moved) loses its connection.
        for node_id, conn in list(self._conns.items()):
            info = self.brokers.get(node_id)
            if info is None or (info.host, info.port) != (conn.host, conn.port):
                conn.close("broker left the cluster metadata")
                del self._conns[node_id]
        if full:
            self.topics = {}
        for t in resp.topics:
            if t.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                self.topics.pop(t.name, None)
                continue
            info = TopicInfo(
                t.name,
                error=int(t.error_code),
                topic_id=getattr(t, "topic_id", None),
                internal=bool(getattr(t, "is_internal", False)),
            )
            for p in t.partitions:
                info.partitions[int(p.partition_index)] = PartitionInfo(
                    int(p.partition_index),
                    int(p.leader_id),
                    int(getattr(p, "leader_epoch", -1)),
                    tuple(int(r) for r in p.replica_nodes),
                    tuple(int(r) for r in p.isr_nodes),
                    int(p.error_code),
                )
            self.topics[t.name] = info

    def leader(self, topic: str, partition: int) -> int | None:
        info = self.topics.get(topic)
        if info is None:
            return None
        p = info.partitions.get(partition)
        if p is None or p.leader < 0 or p.leader not in self.brokers:
            return None
        return p.leader

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The partition's leader epoch as the metadata last said (-1: unknown)."""
        info = self.topics.get(topic)
        p = info.partitions.get(partition) if info is not None else None
        return p.leader_epoch if p is not None else -1

    async def each_broker(self, what: str, call: Callable[[int], Awaitable[Any]]) -> list[Any]:
        """``call(node)`` on every broker, each retried on its own (ListGroups,
        ListTransactions: each broker answers for what it coordinates)."""
        await self.refresh([])
        out: list[Any] = []
        for node in list(self.brokers):
            out.append(await self.retry(lambda node=node: call(node), what=f"{what} to {node}"))
        return out

    async def leader_call(
        self,
        tps: list[TopicPartition],
        api_key: int,
        versions: tuple[int, int],
        cls: str,
        fields: Callable[[int, dict[str, list[int]]], dict[str, Any]],
        results: Callable[[Any], Iterable[tuple[TopicPartition, int, Any]]],
        *,
        errors_in_result: bool = False,
        timeout: float | None = None,
    ) -> dict[TopicPartition, Any]:
        """One request per partition leader (``fields(version, {topic: partitions})``),
        resent until ``timeout`` for the partitions whose leader is unknown or moved (the
        metadata refreshed first); ``results(resp)`` yields (partition, error, value). A
        partition's other error raises, or with ``errors_in_result`` is its value."""
        what = api_name(api_key)
        names = sorted({tp.topic for tp in tps})
        out: dict[TopicPartition, Any] = {}

        async def attempt() -> None:
            by_node: dict[int, dict[str, list[int]]] = {}
            for tp in tps:
                if tp in out:
                    continue
                leader = self.leader(*tp)
                if leader is None:
                    await self.refresh(names)
                    leader = self.leader(*tp)
                    if leader is None:
                        raise KafkaError(ErrorCode.LEADER_NOT_AVAILABLE, f"no leader for {tp}")
                by_node.setdefault(leader, {}).setdefault(tp.topic, []).append(tp.partition)
            stale = 0
            for node, topics in by_node.items():
                resp = await self.send(
                    node, api_key, versions, cls, lambda v, topics=topics: fields(v, topics)
                )
                for tp, code, value in results(resp):
                    if code in INVALID_METADATA:
                        stale = stale or code
                    elif code and errors_in_result:
                        out[tp] = KafkaError(code, f"{what} {tp.topic}-{tp.partition}")
                    elif code:
                        raise KafkaError(code, f"{what} {tp.topic}-{tp.partition}")
                    else:
                        out[tp] = value
            if stale:
                await self.refresh(names)
                raise RetryLater(stale, what)

        await self.retry(attempt, what=what, timeout=timeout)
        return out

    async def list_offsets(
        self,
        tps: list[TopicPartition],
        timestamp: int,
        *,
        isolation_level: int = READ_UNCOMMITTED,
        timeout: float | None = None,
    ) -> dict[TopicPartition, int]:
        """ListOffsets at each partition's leader: ``EARLIEST``, ``LATEST`` or the first
        offset at or after a timestamp (-1: none)."""
        k = ApiKey.LIST_OFFSETS

        def fields(v: int, topics: dict[str, list[int]]) -> dict[str, Any]:
            return {
                "replica_id": -1,
                "isolation_level": isolation_level,
                "topics": tuple(
                    make_request(
                        k,
                        v,
                        "ListOffsetsTopic",
                        name=t,
                        partitions=tuple(
                            make_request(
                                k,
                                v,
                                "ListOffsetsPartition",
                                partition_index=p,
                                current_leader_epoch=-1,
                                timestamp=timestamp,
                            )
                            for p in ps
                        ),
                    )
                    for t, ps in topics.items()
                ),
            }

        found = await self.leader_call(
            tps,
            k,
            (1, 7),
            "ListOffsetsRequest",
            fields,
            lambda resp: [
                (TopicPartition(t.name, int(p.partition_index)), int(p.error_code), int(p.offset))
                for t in resp.topics
                for p in t.partitions
            ],
            timeout=timeout,
        )
        return {tp: int(found[tp]) for tp in tps if tp in found}

    def partition_count(self, topic: str) -> int | None:
        info = self.topics.get(topic)
        if info is None or not info.partitions:
            return None
        return len(info.partitions)

    async def close(self) -> None:
        self._closed = True
        for task in self._connecting.values():
            task.cancel()
        for conn in self._conns.values():
            conn.close()
        if self._bootstrap_conn is not None:
            self._bootstrap_conn.close()
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
            with contextlib.suppress(BaseException):
                await self._refresh
        await asyncio.sleep(0)


def _retrieve_exception(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
