"""A virtual Kafka cluster of N brokers in front of one samsa broker (tests only).

Every test broker is one process with one log, so the client paths that only a cluster
takes (a connection per leader, per-leader Produce and Fetch requests, a metadata refresh
on NOT_LEADER_OR_FOLLOWER, a coordinator on another node, NOT_COORDINATOR, a leader that
moves mid-stream) would never run. :class:`VirtualCluster` makes them run:

* N virtual brokers (node ids ``0..N-1``), each a listener on its own free port, all
  forwarding to the one upstream broker.
* Metadata and DescribeCluster answers name the N nodes. A partition's leader comes from a
  leadership map (default ``partition % N``), its replicas and ISR are ``[leader]``; leader
  epochs stay what the broker reports (they are not rewritten, in answers or requests).
  FindCoordinator (v0-3 and the batched v4+ form, group and transaction keys alike) answers
  a node per key (default ``crc32(key) % N``).
* Routing is strict, as in a real cluster. Produce, ListOffsets and DeleteRecords partitions that
  the receiving node does not lead are answered by the virtual broker itself with
  NOT_LEADER_OR_FOLLOWER; the partitions it leads are forwarded in a rewritten request and
  the two answers merged. Coordinator requests (group and transaction APIs) reaching a node
  that is not their key's coordinator are answered NOT_COORDINATOR without reaching the
  broker (the admin group APIs too: DescribeGroups, ConsumerGroupDescribe, DeleteGroups,
  OffsetDelete). ListGroups and ListTransactions answers list only what the node
  coordinates, so that a client asking every node sees each once.
  :meth:`move_leader` and :meth:`move_coordinator` change the maps at run time.
* Fetch sessions (KIP-227) work as on a real cluster: a Fetch is forwarded whole (the
  broker keeps the session the client believes in) and the virtual node tracks each
  session's partitions, so that every answer says NOT_LEADER_OR_FOLLOWER for the session's
  partitions it does not lead, even those the request did not name.

What this does not prove: there is one log and no replication, so acks=all across
replicas, ISR shrinking and unclean elections are not exercised.

Answers keep each connection's request order: every request gets a slot in a queue that one
writer drains in order, whether the answer comes from the broker or from the virtual node.
Counters of the errors the virtual nodes gave are in :attr:`VirtualCluster.stats`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime
import logging
import socket
import typing
import zlib
from dataclasses import dataclass, field
from typing import Any

from samsa.protocol.errors import ErrorCode
from samsa.protocol.framing import (
    FrameError,
    frame_request,
    frame_response,
    parse_request_header,
    peek_request_header,
    split_response,
)
from samsa.protocol.messages import (
    ApiKey,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    is_flexible,
    response_class,
)
from samsa.testing._relay import SIZE, Relay, listening_socket, read_frame
from samsa.testing.proxy import parse_address

log = logging.getLogger("samsa.vcluster")

NOT_LEADER = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
NOT_COORDINATOR = int(ErrorCode.NOT_COORDINATOR)

_GROUP_APIS = frozenset(
    {
        ApiKey.JOIN_GROUP,
        ApiKey.SYNC_GROUP,
        ApiKey.HEARTBEAT,
        ApiKey.LEAVE_GROUP,
        ApiKey.OFFSET_COMMIT,
        ApiKey.OFFSET_FETCH,
        ApiKey.TXN_OFFSET_COMMIT,  # sent to the group's coordinator, as in Kafka
        ApiKey.CONSUMER_GROUP_HEARTBEAT,
        ApiKey.DESCRIBE_GROUPS,  # the admin APIs on groups too
        ApiKey.CONSUMER_GROUP_DESCRIBE,
        ApiKey.DELETE_GROUPS,
        ApiKey.OFFSET_DELETE,
    }
)
_TXN_APIS = frozenset(
    {
        ApiKey.INIT_PRODUCER_ID,
        ApiKey.ADD_PARTITIONS_TO_TXN,
        ApiKey.ADD_OFFSETS_TO_TXN,
        ApiKey.END_TXN,
        ApiKey.DESCRIBE_TRANSACTIONS,
    }
)
_ROUTED = frozenset({ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.LIST_OFFSETS, ApiKey.DELETE_RECORDS})
_DECODED = _GROUP_APIS | _TXN_APIS | _ROUTED | {ApiKey.FIND_COORDINATOR}
_REWRITTEN = frozenset({ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER, ApiKey.FIND_COORDINATOR})
_MAX_KEYS = 10_000  # coordinator keys remembered for coordinator_keys
_MAX_SESSIONS = 16  # fetch sessions tracked per connection (a consumer opens one per node)
# Listings each broker answers for the keys it coordinates: (list field, key field).
_LISTINGS = {
    ApiKey.LIST_GROUPS: ("groups", "group_id"),
    ApiKey.LIST_TRANSACTIONS: ("transaction_states", "transactional_id"),
}
# Per API: (the request's topic list, its partition list, the partition index field) and the
# same three names in the response.
_LAYOUT: dict[int, tuple[tuple[str, str, str], tuple[str, str, str]]] = {
    ApiKey.PRODUCE: (
        ("topic_data", "partition_data", "index"),
        ("responses", "partition_responses", "index"),
    ),
    ApiKey.FETCH: (
        ("topics", "partitions", "partition"),
        ("responses", "partitions", "partition_index"),
    ),
    ApiKey.LIST_OFFSETS: (
        ("topics", "partitions", "partition_index"),
        ("topics", "partitions", "partition_index"),
    ),
    ApiKey.DELETE_RECORDS: (
        ("topics", "partitions", "partition_index"),
        ("topics", "partitions", "partition_index"),
    ),
}
# Response list fields whose request counterpart has another name.
_ALIASES = {
    "results_by_topic_v3_and_below": ("v3_and_below_topics", "topics"),
    "results_by_partition": ("partitions",),
    "partitions": ("partition_indexes", "partitions"),
    "transaction_states": ("transactional_ids",),
    "responses": ("topic_data", "topics"),
    "results": ("groups_names",),
    "groups": ("group_ids",),
}


@dataclass
class ClusterStats:
    connections: int = 0
    requests: int = 0
    forwarded: int = 0
    split_requests: int = 0  # forwarded with some partitions removed
    not_leader: int = 0  # partitions answered NOT_LEADER_OR_FOLLOWER
    not_coordinator: int = 0  # requests answered NOT_COORDINATOR
    incremental_fetches: int = 0  # Fetch requests of an open session (KIP-227)
    # api key -> requests answered NOT_LEADER_OR_FOLLOWER / NOT_COORDINATOR (any partition)
    refused: collections.Counter[int] = field(default_factory=collections.Counter)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class _Node:
    node_id: int
    sock: socket.socket
    server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])


@dataclass
class _Slot:
    """One request's place in its connection's answer order."""

    api_key: int
    version: int
    cid: int
    answer: asyncio.Future[bytes | None]
    request: Any = None
    errors: list[tuple[str, Any, list[int]]] = field(default_factory=list)  # to merge in
    # Fetch: the connection's sessions (id -> partitions, each with its topic id or None)
    # and the partitions this request's session holds once it is answered.
    sessions: dict[int, dict[tuple[str, int], Any]] = field(default_factory=dict)
    session_parts: dict[tuple[str, int], Any] = field(default_factory=dict)


class VirtualCluster(Relay):
    """N virtual brokers in front of one samsa broker; see the module docstring."""

    def __init__(self, upstream: tuple[str, int] | str, nodes: int = 3) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        super().__init__("samsa-vcluster")
        self.upstream = parse_address(upstream) if isinstance(upstream, str) else upstream
        self.stats = ClusterStats()
        self._nodes = [_Node(i, listening_socket("127.0.0.1", 0)) for i in range(nodes)]
        self._leaders: dict[tuple[str, int], int] = {}
        self._coordinators: dict[str, int] = {}
        self._topic_names: dict[Any, str] = {}  # topic id -> name, learnt from Metadata
        self._keys: dict[str, None] = {}  # coordinator keys clients looked up, in order
        self._writers: set[asyncio.StreamWriter] = set()

    # --- public API ------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """Every node's ``host:port``, comma separated (any one of them works alone)."""
        return ",".join(self.address(n.node_id) for n in self._nodes)

    def address(self, node_id: int) -> str:
        return f"127.0.0.1:{self._nodes[node_id].port}"

    @property
    def size(self) -> int:
        return len(self._nodes)

    def leader(self, topic: str, partition: int) -> int:
        return self._leaders.get((topic, partition), partition % len(self._nodes))

    def coordinator(self, key: str) -> int:
        node = self._coordinators.get(key)
        return zlib.crc32(key.encode()) % len(self._nodes) if node is None else node

    @property
    def coordinator_keys(self) -> list[str]:
        """The group and transactional ids clients asked FindCoordinator about."""
        return list(self._keys)

    def move_leader(self, topic: str, partition: int, node: int) -> None:
        self._check_node(node)
        self._leaders[(topic, partition)] = node

    def move_coordinator(self, key: str, node: int) -> None:
        self._check_node(node)
        self._coordinators[key] = node

    def start(self) -> VirtualCluster:
        self._start_serving(self._serve_all)
        return self

    def __enter__(self) -> VirtualCluster:
        return self.start()

    def _check_node(self, node: int) -> None:
        if not 0 <= node < len(self._nodes):
            raise ValueError(f"no node {node} in a cluster of {len(self._nodes)}")

    # --- serving ---------------------------------------------------------------------------

    async def _serve_all(self) -> None:
        for node in self._nodes:
            node.server = await self._serve_socket(
                node.sock, lambda r, w, node=node: self._handle(node, r, w)
            )

    def _sockets(self) -> list[socket.socket]:
        return [n.sock for n in self._nodes]

    def _close(self) -> None:
        for n in self._nodes:
            if n.server is not None:
                n.server.close()
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()

    async def _handle(
        self, node: _Node, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter
    ) -> None:
        self.stats.connections += 1
        try:
            ureader, uwriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            cwriter.transport.abort()
            return
        self._writers.update((cwriter, uwriter))
        order: asyncio.Queue[_Slot] = asyncio.Queue()
        forwarded: asyncio.Queue[_Slot] = asyncio.Queue()
        sessions: dict[int, dict[tuple[str, int], Any]] = {}  # this connection's fetch sessions
        tasks = [
            asyncio.ensure_future(self._upward(node, creader, uwriter, order, forwarded, sessions)),
            asyncio.ensure_future(self._downward(ureader, forwarded)),
            asyncio.ensure_future(self._answer(node, cwriter, order)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for w in (cwriter, uwriter):
                self._writers.discard(w)
                with contextlib.suppress(Exception):
                    w.transport.abort()

    async def _upward(
        self,
        node: _Node,
        reader: asyncio.StreamReader,
        upstream: asyncio.StreamWriter,
        order: asyncio.Queue[_Slot],
        forwarded: asyncio.Queue[_Slot],
        sessions: dict[int, dict[tuple[str, int], Any]],
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            frame = await read_frame(reader)
            if frame is None:
                return
            try:
                api_key, version, cid = peek_request_header(frame)
            except FrameError:
                return
            self.stats.requests += 1
            slot = _Slot(api_key, version, cid, loop.create_future(), sessions=sessions)
            out: bytes | None = frame
            if api_key in _DECODED:
                out = self._route(node, slot, frame)
            if out is not None:
                self.stats.forwarded += 1
                acks0 = (
                    api_key == ApiKey.PRODUCE
                    and slot.request is not None
                    and (slot.request.acks == 0)
                )
                if not acks0:  # acks=0: the broker sends no answer
                    await forwarded.put(slot)
                    await order.put(slot)
                upstream.write(SIZE.pack(len(out)) + out)
                await upstream.drain()
            else:
                await order.put(slot)

    async def _downward(
        self, reader: asyncio.StreamReader, forwarded: asyncio.Queue[_Slot]
    ) -> None:
        while True:
            frame = await read_frame(reader)
            if frame is None:
                return
            slot = await forwarded.get()
            if not slot.answer.done():
                slot.answer.set_result(frame)

    async def _answer(
        self, node: _Node, writer: asyncio.StreamWriter, order: asyncio.Queue[_Slot]
    ) -> None:
        while True:
            slot = await order.get()
            frame = await slot.answer
            if frame is None:
                continue
            if (
                slot.api_key in _REWRITTEN
                or slot.api_key in _LISTINGS
                or slot.errors
                or slot.api_key == ApiKey.FETCH
            ):
                frame = self._rewrite(node, slot, frame)
            writer.write(SIZE.pack(len(frame)) + frame)
            await writer.drain()

    # --- requests --------------------------------------------------------------------------

    def _route(self, node: _Node, slot: _Slot, frame: bytes) -> bytes | None:
        """The frame to forward (maybe rewritten), or None when answered here (the answer is
        then already in ``slot.answer``)."""
        flexible = is_flexible(slot.api_key, slot.version)
        try:
            header = parse_request_header(frame, flexible)
            req = decode_request(slot.api_key, slot.version, frame, header.body_offset)
        except FrameError:
            return frame  # the broker answers malformed requests
        slot.request = req
        if slot.api_key == ApiKey.FIND_COORDINATOR:
            for key in getattr(req, "coordinator_keys", None) or [req.key]:
                self._keys[str(key)] = None
            while len(self._keys) > _MAX_KEYS:  # bounded: forget the oldest
                del self._keys[next(iter(self._keys))]
            return frame
        if slot.api_key == ApiKey.FETCH:
            return self._route_fetch(node, slot, req, frame, header)
        if slot.api_key in _ROUTED:
            return self._route_partitions(node, slot, req, frame, header)
        keys = _coordinator_keys(slot.api_key, req)
        if not keys or all(self.coordinator(k) == node.node_id for k in keys):
            return frame
        self.stats.not_coordinator += 1
        self.stats.refused[slot.api_key] += 1
        body = _error_entity(response_class(slot.api_key, slot.version), req, NOT_COORDINATOR)
        slot.answer.set_result(_frame(slot, encode_response(slot.api_key, slot.version, body)))
        return None

    def _route_partitions(
        self, node: _Node, slot: _Slot, req: Any, frame: bytes, header: Any
    ) -> bytes | None:
        (topics_f, parts_f, index_f), _ = _LAYOUT[slot.api_key]
        keep_topics = []
        for topic in getattr(req, topics_f):
            name = self._topic_name(topic)
            keep, wrong = [], []
            for p in getattr(topic, parts_f):
                index = int(getattr(p, index_f))
                (keep if self.leader(name, index) == node.node_id else wrong).append(p)
            if wrong:
                self.stats.not_leader += len(wrong)
                self.stats.refused[slot.api_key] += 1
                ident = _topic_ident(topic)
                slot.errors.append((name, ident, [int(getattr(p, index_f)) for p in wrong]))
            if keep:
                keep_topics.append(dataclasses.replace(topic, **{parts_f: tuple(keep)}))
        changes: dict[str, Any] = {}
        if slot.errors:
            changes[topics_f] = tuple(keep_topics)
        if slot.errors and not keep_topics:
            if slot.api_key == ApiKey.PRODUCE and req.acks == 0:
                slot.answer.set_result(None)
                return None
            empty = _error_entity(response_class(slot.api_key, slot.version), None, 0)
            resp = self._merge(slot, empty)
            slot.errors = []
            slot.answer.set_result(_frame(slot, encode_response(slot.api_key, slot.version, resp)))
            return None
        if not changes:
            return frame
        if slot.errors:
            self.stats.split_requests += 1
        return _reframe(slot, header, dataclasses.replace(req, **changes))

    def _route_fetch(
        self, node: _Node, slot: _Slot, req: Any, frame: bytes, header: Any
    ) -> bytes | None:
        """A Fetch goes to the broker whole, so that its session (KIP-227) stays what the
        client thinks it is; its answer then says NOT_LEADER_OR_FOLLOWER for every partition
        of the session that this node does not lead (data for them is dropped), as a real
        broker's would. Such a Fetch does not wait (max_wait 0): Kafka answers at once when
        a partition has an error."""
        incremental = slot.version >= 7 and req.session_epoch > 0
        self.stats.incremental_fetches += incremental
        parts = dict(slot.sessions.get(req.session_id, {})) if incremental else {}
        for topic in req.topics:
            name, ident = self._topic_name(topic), _topic_ident(topic)
            for p in topic.partitions:
                parts[(name, int(p.partition))] = ident
        for topic in getattr(req, "forgotten_topics_data", ()):
            name = self._topic_name(topic)
            for index in topic.partitions:
                parts.pop((name, int(index)), None)
        slot.session_parts = parts
        wrong: dict[tuple[str, Any], list[int]] = {}
        for (name, index), ident in parts.items():
            if self.leader(name, index) != node.node_id:
                wrong.setdefault((name, ident), []).append(index)
        if not wrong:
            return frame
        self.stats.refused[ApiKey.FETCH] += 1
        self.stats.not_leader += sum(len(v) for v in wrong.values())
        slot.errors = [(name, ident, indexes) for (name, ident), indexes in wrong.items()]
        return _reframe(slot, header, dataclasses.replace(req, max_wait=datetime.timedelta(0)))

    def _topic_name(self, topic: Any) -> str:
        name = getattr(topic, "topic", None) or getattr(topic, "name", None)
        if name:
            return str(name)
        return self._topic_names.get(getattr(topic, "topic_id", None), "")

    # --- responses -------------------------------------------------------------------------

    def _rewrite(self, node: _Node, slot: _Slot, frame: bytes) -> bytes:
        flexible = is_flexible(slot.api_key, slot.version)
        try:
            cid, offset = split_response(frame, flexible)
            resp = decode_response(slot.api_key, slot.version, frame, offset)
            if slot.api_key == ApiKey.FETCH:
                self._track_session(slot, resp)
            if slot.api_key in _ROUTED:
                resp = self._merge(slot, resp)
            elif slot.api_key == ApiKey.FIND_COORDINATOR:
                resp = self._rewrite_coordinator(slot.request, resp)
            elif slot.api_key in _LISTINGS:  # each node lists what it coordinates
                items, key = _LISTINGS[slot.api_key]
                mine = tuple(
                    x
                    for x in getattr(resp, items)
                    if self.coordinator(str(getattr(x, key))) == node.node_id
                )
                resp = dataclasses.replace(resp, **{items: mine})
            else:
                resp = self._rewrite_brokers(slot.api_key, resp)
            body = encode_response(slot.api_key, slot.version, resp)
        except Exception as exc:  # an undecodable response goes through as it came
            log.warning("cannot rewrite %s v%d response: %s", slot.api_key, slot.version, exc)
            return frame
        return frame_response_body(cid, body, flexible)

    def _brokers(self, cls: type[Any]) -> tuple[Any, ...]:
        out = []
        for n in self._nodes:
            values = {"node_id": n.node_id, "host": "127.0.0.1", "port": n.port, "rack": None}
            out.append(cls(**{k: v for k, v in values.items() if k in _fields(cls)}))
        return tuple(out)

    def _rewrite_brokers(self, api_key: int, resp: Any) -> Any:
        broker_cls = _item_type(type(resp), "brokers")
        changes: dict[str, Any] = {"brokers": self._brokers(broker_cls)}
        if "controller_id" in _fields(type(resp)):
            changes["controller_id"] = 0
        if api_key == ApiKey.METADATA:
            topics = []
            for t in resp.topics:
                if getattr(t, "topic_id", None) is not None and t.name:
                    self._topic_names[t.topic_id] = str(t.name)
                parts = []
                for p in t.partitions:
                    if int(p.leader_id) >= 0:
                        lead = self.leader(str(t.name), int(p.partition_index))
                        p = dataclasses.replace(
                            p, leader_id=lead, replica_nodes=(lead,), isr_nodes=(lead,)
                        )
                        if "offline_replicas" in _fields(type(p)):
                            p = dataclasses.replace(p, offline_replicas=())
                    parts.append(p)
                topics.append(dataclasses.replace(t, partitions=tuple(parts)))
            changes["topics"] = tuple(topics)
        return dataclasses.replace(resp, **changes)

    def _rewrite_coordinator(self, req: Any, resp: Any) -> Any:
        def place(entity: Any, key: str) -> Any:
            if int(entity.error_code) != 0:
                return entity
            node = self._nodes[self.coordinator(key)]
            return dataclasses.replace(
                entity, node_id=node.node_id, host="127.0.0.1", port=node.port
            )

        if hasattr(resp, "coordinators"):  # v4+: one entry per key
            return dataclasses.replace(
                resp, coordinators=tuple(place(c, str(c.key)) for c in resp.coordinators)
            )
        return place(resp, str(req.key))

    def _track_session(self, slot: _Slot, resp: Any) -> None:
        req = slot.request
        if slot.version < 7 or req is None:
            return
        if int(resp.error_code) != 0 or req.session_epoch == -1:
            slot.sessions.pop(req.session_id, None)
        if int(resp.error_code) == 0 and int(resp.session_id) != 0:
            slot.sessions[int(resp.session_id)] = slot.session_parts
            while len(slot.sessions) > _MAX_SESSIONS:  # bounded: forget the oldest
                del slot.sessions[next(iter(slot.sessions))]

    def _merge(self, slot: _Slot, resp: Any) -> Any:
        """``resp`` with the NOT_LEADER_OR_FOLLOWER partitions of ``slot`` (in place of any
        data the broker gave for them)."""
        _, (topics_f, parts_f, index_f) = _LAYOUT[slot.api_key]
        topic_cls = _item_type(type(resp), topics_f)
        part_cls = _item_type(topic_cls, parts_f)
        topics = []
        for t in getattr(resp, topics_f):
            drop = {
                i
                for name, ident, indexes in slot.errors
                if _same_topic(t, name, ident)
                for i in indexes
            }
            kept = tuple(p for p in getattr(t, parts_f) if int(getattr(p, index_f)) not in drop)
            if kept or not drop:
                topics.append(dataclasses.replace(t, **{parts_f: kept}))
        for name, ident, indexes in slot.errors:
            errs = tuple(_error_entity(part_cls, None, NOT_LEADER, {index_f: i}) for i in indexes)
            for i, t in enumerate(topics):
                if _same_topic(t, name, ident):
                    topics[i] = dataclasses.replace(t, **{parts_f: (*getattr(t, parts_f), *errs)})
                    break
            else:
                names = {"name": name, "topic": name, "topic_id": ident}
                topics.append(_error_entity(topic_cls, None, 0, {**names, parts_f: errs}))
        return dataclasses.replace(resp, **{topics_f: tuple(topics)})


# --- helpers -------------------------------------------------------------------------------


def frame_response_body(cid: int, body: bytes, flexible: bool) -> bytes:
    """A response frame without its size prefix."""
    return frame_response(cid, body, flexible)[4:]


def _frame(slot: _Slot, body: bytes) -> bytes:
    return frame_response_body(slot.cid, body, is_flexible(slot.api_key, slot.version))


def _reframe(slot: _Slot, header: Any, req: Any) -> bytes:
    """``req`` encoded as the frame (without size) of ``slot``'s request."""
    body = encode_request(slot.api_key, slot.version, req)
    flexible = is_flexible(slot.api_key, slot.version)
    return frame_request(slot.api_key, slot.version, slot.cid, header.client_id, body, flexible)[4:]


def _topic_ident(topic: Any) -> Any:
    """A request topic's id when it is named by id only (Fetch v13+), else None."""
    named = getattr(topic, "topic", None) or getattr(topic, "name", None)
    return None if named else getattr(topic, "topic_id", None)


def _same_topic(t: Any, name: str, ident: Any) -> bool:
    if ident is not None:
        return getattr(t, "topic_id", None) == ident
    return str(getattr(t, "name", None) or getattr(t, "topic", "")) == name


def _coordinator_keys(api_key: int, req: Any) -> list[str]:
    if api_key in _GROUP_APIS:
        if api_key == ApiKey.OFFSET_FETCH and getattr(req, "groups", None):
            return [str(g.group_id) for g in req.groups]
        if api_key == ApiKey.DESCRIBE_GROUPS:
            return [str(g) for g in req.groups]
        if api_key == ApiKey.CONSUMER_GROUP_DESCRIBE:
            return [str(g) for g in req.group_ids]
        if api_key == ApiKey.DELETE_GROUPS:
            return [str(g) for g in req.groups_names]
        group = getattr(req, "group_id", None)
        return [str(group)] if group else []
    if api_key == ApiKey.DESCRIBE_TRANSACTIONS:
        return [str(t) for t in req.transactional_ids]
    txn = getattr(req, "transactional_id", None) or getattr(
        req, "v3_and_below_transactional_id", None
    )
    return [str(txn)] if txn else []  # InitProducerId without one: any node answers


def _fields(cls: type[Any]) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _item_type(cls: type[Any], name: str) -> type[Any]:
    hint = typing.get_type_hints(cls)[name]
    return typing.get_args(hint)[0]  # type: ignore[no-any-return]


def _error_entity(cls: type[Any], req: Any, code: int, given: dict[str, Any] | None = None) -> Any:
    """An instance of the kio entity ``cls`` carrying error ``code`` in every error field,
    mirroring ``req`` where the two share fields (names, ids, partition indexes), as Kafka's
    getErrorResponse does; other fields get their defaults or -1, empty, null."""
    given = given or {}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        nullable = type(None) in args
        base = next((a for a in args if a is not type(None)), hint) if nullable else hint
        kind = f.metadata.get("kafka_type")
        if f.name in given:
            values[f.name] = given[f.name]
        elif kind == "records":
            values[f.name] = b""  # as Kafka's empty MemoryRecords: librdkafka rejects null
        elif kind == "error_code":
            values[f.name] = ErrorCode(code) if code else ErrorCode(0)
        elif typing.get_origin(base) is tuple:
            values[f.name] = _mirror_list(f.name, typing.get_args(base)[0], req, code)
        elif (
            req is not None
            and hasattr(req, f.name)
            and not dataclasses.is_dataclass(getattr(req, f.name))
        ):
            values[f.name] = getattr(req, f.name)
        elif f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
        elif nullable:
            values[f.name] = None
        elif dataclasses.is_dataclass(base):
            values[f.name] = _error_entity(base, None, code)  # type: ignore[arg-type]
        elif kind in ("timedelta_i32", "timedelta_i64"):
            values[f.name] = datetime.timedelta(0)
        elif base is bool:
            values[f.name] = False
        elif base is str or kind == "string":
            values[f.name] = ""
        elif base is bytes or kind in ("bytes", "records"):
            values[f.name] = b""
        elif kind == "uuid":
            values[f.name] = None
        else:
            values[f.name] = base(-1)  # type: ignore[operator]
    if "error_code" in values and code == 0:
        values["error_code"] = ErrorCode(0)
    return cls(**values)


def _mirror_list(name: str, item: Any, req: Any, code: int) -> tuple[Any, ...]:
    if req is None:
        return ()
    for source in (name, *_ALIASES.get(name, ())):
        items = getattr(req, source, None)
        if not isinstance(items, tuple):
            continue
        if not dataclasses.is_dataclass(item):
            return items  # a list of scalars mirrored as it is
        out = []
        for x in items:
            if dataclasses.is_dataclass(x):
                out.append(_error_entity(item, x, code))
            else:  # a scalar (a partition index, a transactional id) keys the entity
                key = next(
                    f.name
                    for f in dataclasses.fields(item)
                    if (isinstance(x, int) and f.name.endswith("index"))
                    or (isinstance(x, str) and f.name.endswith("id"))
                )
                out.append(_error_entity(item, None, code, {key: x}))
        return tuple(out)
    return ()


__all__ = ["ClusterStats", "VirtualCluster"]
