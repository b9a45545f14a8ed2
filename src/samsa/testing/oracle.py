"""Differential conformance: run one scenario against samsa and against Apache Kafka, compare.

A *scenario* is a function of one :class:`Side`. It sends requests (raw kio requests over a
:class:`BlockingConnection`, or anything else it records with :meth:`Side.note`) and uses the
raw responses to build the next requests (producer ids, offsets). :func:`run_scenario` runs it
once against each broker; every recorded step becomes a plain tree (kio dataclasses to dicts,
tuples to lists, error codes to their names, record batches decoded), normalised where two
correct brokers may legitimately differ, and the two transcripts are compared field by field.

Normalised (see :data:`DEFAULT_RULES`): throttle times and free-text error messages are dropped;
cluster ids, hosts, ports and wall-clock times become placeholders; node ids, producer ids and
topic ids become identities (``pid#0``, ``pid#1``, ... in order of first appearance, so "the
same producer" and "a new producer" still compare, while sentinels such as -1 stay as they are);
lists of topics or partitions are sorted by name or index. A scenario adds its own rules with
``rules=``.

A scenario may declare :class:`Deviation`\\ s, each naming the ``D-...`` entry of
docs/semantics.md: the comparison must then find exactly those differences and no others.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from samsa.client._connection import BlockingConnection, ConnectionClosed
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, make_request
from samsa.protocol.records import decode_records, iter_batches
from samsa.testing import FETCH_VERSION, PRODUCE_VERSION, fetch_request, produce_request

__all__ = [
    "CLOSED",
    "DEFAULT_RULES",
    "TRANSIENT",
    "Deviation",
    "Mismatch",
    "Outcome",
    "Rule",
    "Side",
    "Step",
    "Target",
    "compare",
    "normalise",
    "run_scenario",
    "summary_lines",
    "to_tree",
    "transient",
]

# The pytest user property each scenario's Outcome.summary() travels in (to the controller
# under pytest-xdist), for summary_lines at the end of the run.
USER_PROPERTY = "differential"

CLOSED = "<connection closed>"  # what a step records when the broker closed the connection


class Rule(enum.Enum):
    """What normalisation does with the value of a key."""

    DROP = "drop"  # the key is removed
    ANY = "any"  # any value but the sentinels (None, -1) becomes "<any>"
    NODE = "node"  # identities: the n-th distinct value becomes "node#n"
    PRODUCER = "pid"
    TOPIC_ID = "topic"
    SESSION = "session"  # fetch sessions (KIP-227): 0 is "no session"


# Keys as kio names them, in every API. A scenario extends or overrides them with ``rules=``.
DEFAULT_RULES: dict[str, Rule] = {
    "throttle_time": Rule.DROP,
    "error_message": Rule.DROP,
    "cluster_id": Rule.ANY,
    "host": Rule.ANY,
    "port": Rule.ANY,
    "rack": Rule.ANY,
    "node_id": Rule.NODE,
    "leader_id": Rule.NODE,
    "broker_id": Rule.NODE,
    "controller_id": Rule.NODE,
    "coordinator_id": Rule.NODE,
    "replica_nodes": Rule.NODE,
    "isr_nodes": Rule.NODE,
    "producer_id": Rule.PRODUCER,
    "topic_id": Rule.TOPIC_ID,
    "session_id": Rule.SESSION,
    # Wall-clock times the broker takes itself.
    "log_append_time": Rule.ANY,
    "transaction_start_time": Rule.ANY,
    "last_timestamp": Rule.ANY,
    # The CRC covers the batch's timestamps and leader epoch; the decoded fields are compared.
    "crc": Rule.DROP,
}

# Members last: Kafka lists a group's members in HashMap order, arbitrary for random ids, so
# they are sorted by their identity (member ids are Rule.NODE where groups are compared).
_SORT_KEYS = (
    "name",
    "topic",
    "partition_index",
    "partition",
    "index",
    "transactional_id",
    "member_id",
)


# --- trees ------------------------------------------------------------------------------


def to_tree(value: Any) -> Any:
    """A plain tree of a kio entity (or of anything a scenario notes): dicts, lists, scalars.

    Error codes become their names; durations, milliseconds; datetimes, epoch milliseconds;
    UUIDs, strings; a ``records`` field holding bytes, its decoded batches.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.name == "records" and isinstance(v, bytes | bytearray | memoryview):
                out[f.name] = records_tree(bytes(v))
            elif f.metadata.get("kafka_type") == "error_code" or "error_code" in f.name:
                out[f.name] = _error_name(v)
            else:
                out[f.name] = to_tree(v)
        return out
    if isinstance(value, Mapping):
        return {str(k): to_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_tree(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.name if not isinstance(value, int) else int(value)
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)  # kio's i32/i64 NewTypes and IntEnums alike
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def _error_name(code: Any) -> Any:
    if code is None:
        return None
    try:
        return ErrorCode(int(code)).name
    except ValueError:
        return int(code)


def records_tree(data: bytes) -> list[dict[str, Any]]:
    """The batches of a Fetch response's records, decoded (a partial last batch is left out,
    as clients do)."""
    out = []
    for view in iter_batches(data):
        batch: dict[str, Any] = {
            "base_offset": view.base_offset,
            "last_offset_delta": view.last_offset_delta,
            "producer_id": view.producer_id,
            "producer_epoch": view.producer_epoch,
            "base_sequence": view.base_sequence,
            "transactional": view.is_transactional,
            "control": view.is_control,
            "compression": view.compression,
            "timestamp_type": (view.attributes >> 3) & 1,
            "partition_leader_epoch": view.partition_leader_epoch,
        }
        records = decode_records(view)
        if view.is_control:
            # A marker's timestamp is the broker's clock; its key says COMMIT or ABORT.
            batch["records"] = [{"offset": r.offset, "key": r.key} for r in records]
        else:
            batch["max_timestamp"] = view.max_timestamp
            batch["records"] = [
                {
                    "offset": r.offset,
                    "timestamp": r.timestamp,
                    "key": r.key,
                    "value": r.value,
                    "headers": [list(h) for h in r.headers],
                }
                for r in records
            ]
        out.append(batch)
    return out


def normalise(tree: Any, rules: Mapping[str, Rule] = DEFAULT_RULES) -> Any:
    """``tree`` with the rules applied; identities are numbered per call (one transcript)."""
    ids: dict[Rule, dict[Any, str]] = {}

    def identity(rule: Rule, v: Any) -> Any:
        if v is None or v == -1 or v == str(uuid.UUID(int=0)) or (rule is Rule.SESSION and v == 0):
            return v
        seen = ids.setdefault(rule, {})
        if v not in seen:
            seen[v] = f"{rule.value}#{len(seen)}"
        return seen[v]

    def apply(rule: Rule, v: Any) -> Any:
        if isinstance(v, list):
            return [apply(rule, x) for x in v]
        if rule is Rule.ANY:
            return v if v is None or v == -1 else "<any>"
        return identity(rule, v)

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                rule = rules.get(k)
                if rule is Rule.DROP:
                    continue
                out[k] = apply(rule, v) if rule is not None else walk(v)
            return out
        if isinstance(node, list):
            items = [walk(x) for x in node]
            key = _sort_key(items)
            return sorted(items, key=lambda x: repr(x[key])) if key else items
        return node

    return walk(tree)


def _sort_key(items: list[Any]) -> str | None:
    if len(items) < 2 or not all(isinstance(x, dict) for x in items):
        return None
    for key in _SORT_KEYS:
        if all(key in x for x in items):
            return key
    return None


# --- comparison -------------------------------------------------------------------------


@dataclass(frozen=True)
class Mismatch:
    """One difference: where, and what each broker answered."""

    path: str
    samsa: Any
    kafka: Any

    def __str__(self) -> str:
        return f"{self.path}: samsa {self.samsa!r} != kafka {self.kafka!r}"


@dataclass(frozen=True)
class Deviation:
    """A documented difference: at ``path`` samsa answers ``samsa`` where Kafka answers
    ``kafka``, as the entry ``id`` (``D-IDEM-1``, ...) of docs/semantics.md explains."""

    path: str
    samsa: Any
    kafka: Any
    id: str

    def matches(self, m: Mismatch) -> bool:
        return (self.path, self.samsa, self.kafka) == (m.path, m.samsa, m.kafka)


_MISSING = "<absent>"


def compare(samsa: Any, kafka: Any, path: str = "") -> list[Mismatch]:
    """Every leaf where the two normalised trees differ, with its path."""
    if isinstance(samsa, dict) and isinstance(kafka, dict):
        out = []
        for k in list(samsa) + [k for k in kafka if k not in samsa]:
            sub = f"{path}.{k}" if path else k
            out += compare(samsa.get(k, _MISSING), kafka.get(k, _MISSING), sub)
        return out
    if isinstance(samsa, list) and isinstance(kafka, list):
        if len(samsa) != len(kafka):
            return [Mismatch(f"{path}.len", len(samsa), len(kafka))] + [
                m
                for i, (a, b) in enumerate(zip(samsa, kafka, strict=False))
                for m in compare(a, b, f"{path}[{i}]")
            ]
        out = []
        for i, (a, b) in enumerate(zip(samsa, kafka, strict=True)):
            out += compare(a, b, f"{path}[{i}]")
        return out
    if samsa == kafka:
        return []
    return [Mismatch(path, samsa, kafka)]


# Answers that mean "not yet": a coordinator loading or moving, a transaction completing.
TRANSIENT = frozenset(
    {
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.CONCURRENT_TRANSACTIONS,
    }
)


def _transient(resp: Any) -> bool:
    return int(getattr(resp, "error_code", 0)) in TRANSIENT


def transient(resp: Any) -> bool:
    """Any error code anywhere in the response is a "not yet" (:data:`TRANSIENT`): the
    ``retry`` of a call whose per-partition answers a client retries."""
    names = {e.name for e in TRANSIENT}

    def walk(node: Any) -> bool:
        if isinstance(node, dict):
            return any(
                (k.endswith("error_code") and v in names) or walk(v) for k, v in node.items()
            )
        return isinstance(node, list) and any(walk(x) for x in node)

    return walk(to_tree(resp))


# --- running ----------------------------------------------------------------------------


@dataclass
class Step:
    """One recorded step of a transcript: its label and the response (or noted value)."""

    label: str
    tree: Any


@dataclass
class Target:
    """A broker to run scenarios against: its bootstrap address, and how to restart it in
    place (same address, same data), for the scenarios that need it."""

    name: str
    bootstrap: str
    restart: Callable[[], None] | None = None


def wait_served(
    conn: BlockingConnection, topic: str, partitions: int, timeout: float = 30.0, who: str = ""
) -> None:
    """Wait until every partition of ``topic`` answers ListOffsets: Kafka names a leader in
    Metadata (and acknowledges CreateTopics) before that leader has loaded the partition."""
    v = 7
    req = make_request(
        ApiKey.LIST_OFFSETS, v, "ListOffsetsRequest", replica_id=-1, isolation_level=0,
        topics=(make_request(
            ApiKey.LIST_OFFSETS, v, "ListOffsetsTopic", name=topic,
            partitions=tuple(
                make_request(ApiKey.LIST_OFFSETS, v, "ListOffsetsPartition",
                             partition_index=i, current_leader_epoch=-1, timestamp=-1)
                for i in range(partitions)
            ),
        ),),
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        resp = conn.request(ApiKey.LIST_OFFSETS, v, req)
        codes = [int(p.error_code) for t in resp.topics for p in t.partitions]
        if len(codes) == partitions and not any(codes):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{who}: {topic} not served after {timeout} s: {codes}")
        time.sleep(0.05)


class Side:
    """One broker as a scenario sees it. Every :meth:`call` and :meth:`note` adds a step to
    the transcript under its label; the raw response is returned for the next request."""

    def __init__(self, target: Target, scenario: str) -> None:
        self.target = target
        self.scenario = scenario
        self.steps: list[Step] = []
        self._conns: list[BlockingConnection] = []
        self._conn: BlockingConnection | None = None

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def host(self) -> str:
        return self.target.bootstrap.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.target.bootstrap.rsplit(":", 1)[1])

    @property
    def bootstrap(self) -> str:
        return self.target.bootstrap

    def unique(self, suffix: str = "") -> str:
        """A topic / transactional id / group name of this scenario, the same on both sides."""
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", self.scenario).strip("-")[:200]
        return f"{base}-{suffix}" if suffix else base

    @property
    def conn(self) -> BlockingConnection:
        """The scenario's main connection, opened on first use (and again after a restart)."""
        if self._conn is None:
            self._conn = self.connect()
        return self._conn

    def connect(self, timeout: float = 30.0) -> BlockingConnection:
        """Another connection (closed with the side)."""
        conn = BlockingConnection(self.host, self.port, timeout=timeout)
        self._conns.append(conn)
        return conn

    def close(self) -> None:
        for c in self._conns:
            c.close()
        self._conns.clear()
        self._conn = None

    def _record(self, label: str, tree: Any) -> None:
        taken = {s.label for s in self.steps}
        unique, n = label, 1
        while unique in taken:
            n += 1
            unique = f"{label}#{n}"
        self.steps.append(Step(unique, tree))

    def note(self, label: str, value: Any) -> None:
        """Record a value the scenario observed (a client's result, a derived fact)."""
        self._record(label, to_tree(value))

    def call(
        self,
        label: str,
        api_key: int,
        version: int,
        request: Any,
        *,
        conn: BlockingConnection | None = None,
        retry: Callable[[Any], bool] | None = None,
        timeout: float = 20.0,
    ) -> Any:
        """Send ``request`` and record its response under ``label``; returns the response,
        or ``None`` (recorded as :data:`CLOSED`) when the broker closed the connection.

        ``retry(response)`` true means a transient answer (a coordinator still loading, a
        transaction still completing): the request is sent again, for up to ``timeout``
        seconds, and only the last answer is recorded.
        """
        deadline = time.monotonic() + timeout
        c = conn or self.conn
        while True:
            try:
                resp = c.request(api_key, version, request)
            except (ConnectionClosed, ConnectionError):
                self._record(label, CLOSED)
                return None
            if retry is None or not retry(resp) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self._record(label, to_tree(resp))
        return resp

    def call_raw(
        self, label: str, api_key: int, version: int, frame: bytes, *, timeout: float = 5.0
    ) -> Any:
        """Send ``frame`` (a whole request, size prefix included, correlation id 1 on a new
        connection) and record the decoded response, or :data:`CLOSED`."""
        c = self.connect(timeout)
        try:
            c.send_bytes(frame)
            resp = c.receive(api_key, version, 1)
        except (ConnectionClosed, ConnectionError, TimeoutError):
            self._record(label, CLOSED)
            return None
        self._record(label, to_tree(resp))
        return resp

    def create_topic(
        self, name: str, partitions: int = 1, configs: Mapping[str, str] | None = None
    ) -> None:
        """Create a topic and wait until every partition has a leader (not recorded: setup)."""
        v = 7
        req = make_request(
            ApiKey.CREATE_TOPICS, v, "CreateTopicsRequest",
            topics=(make_request(
                ApiKey.CREATE_TOPICS, v, "CreatableTopic", name=name, num_partitions=partitions,
                replication_factor=-1, assignments=(),
                configs=tuple(
                    make_request(ApiKey.CREATE_TOPICS, v, "CreatableTopicConfig", name=k,
                                 value=val)
                    for k, val in (configs or {}).items()
                ),
            ),),
            timeout=30_000, validate_only=False,
        )  # fmt: skip
        resp = self.conn.request(ApiKey.CREATE_TOPICS, v, req)
        code = int(resp.topics[0].error_code)
        if code != 0:
            raise AssertionError(f"{self.name}: creating {name}: {_error_name(code)}")
        self.wait_leaders(name, partitions)

    def wait_leaders(self, topic: str, partitions: int, timeout: float = 30.0) -> None:
        wait_served(self.conn, topic, partitions, timeout, who=self.name)

    # The requests most scenarios send, as recorded calls.

    def produce(
        self,
        label: str,
        partitions: Mapping[tuple[str | uuid.UUID, int], bytes],
        *,
        transactional_id: str | None = None,
        acks: int = -1,
        version: int = PRODUCE_VERSION,
        conn: BlockingConnection | None = None,
    ) -> Any:
        req = produce_request(dict(partitions), acks=acks, version=version)
        req = dataclasses.replace(req, transactional_id=transactional_id)
        return self.call(label, ApiKey.PRODUCE, version, req, conn=conn)

    def fetch(
        self,
        label: str,
        partitions: Mapping[tuple[str, int], int],
        *,
        version: int = FETCH_VERSION,
        **options: Any,
    ) -> Any:
        """A sessionless Fetch (see :func:`samsa.testing.fetch_request` for the options)."""
        req = fetch_request(dict(partitions), version=version, **options)
        return self.call(label, ApiKey.FETCH, version, req)

    def init_producer_id(
        self,
        label: str,
        transactional_id: str | None = None,
        *,
        producer_id: int = -1,
        epoch: int = -1,
        timeout_ms: int = 60_000,
        version: int = 4,
    ) -> Any:
        """InitProducerId, sent again while the coordinator is loading or busy (Kafka creates
        its transaction log on first use)."""
        req = make_request(
            ApiKey.INIT_PRODUCER_ID, version, "InitProducerIdRequest",
            transactional_id=transactional_id, transaction_timeout=timeout_ms,
            producer_id=producer_id, producer_epoch=epoch,
        )  # fmt: skip
        return self.call(label, ApiKey.INIT_PRODUCER_ID, version, req, retry=_transient)

    def find_coordinator(self, label: str, key: str, key_type: int = 1, version: int = 4) -> Any:
        """FindCoordinator (key type 1: a transactional id, 0: a group), sent again until the
        coordinator is available: Kafka creates its internal topic on the first one."""
        req = make_request(
            ApiKey.FIND_COORDINATOR, version, "FindCoordinatorRequest",
            key=key, key_type=key_type, coordinator_keys=(key,),
        )  # fmt: skip

        def transient(resp: Any) -> bool:
            codes = [int(c.error_code) for c in getattr(resp, "coordinators", ())]
            return any(c in TRANSIENT for c in codes) or _transient(resp)

        return self.call(label, ApiKey.FIND_COORDINATOR, version, req, retry=transient,
                         timeout=60.0)  # fmt: skip

    def restart(self) -> None:
        """Restart the broker (same address and data) and reconnect (not recorded)."""
        if self.target.restart is None:
            raise RuntimeError(f"{self.name} cannot be restarted in this scenario")
        self.close()
        self.target.restart()


@dataclass
class Outcome:
    """The comparison of one scenario: its transcripts, differences and declared deviations."""

    scenario: str
    samsa: list[Step]
    kafka: list[Step]
    mismatches: list[Mismatch]
    deviations: Sequence[Deviation] = ()
    unexpected: list[Mismatch] = field(init=False)  # differences no deviation declares
    missing: list[Deviation] = field(init=False)  # declared deviations that did not happen

    def __post_init__(self) -> None:
        dev, found = self.deviations, self.mismatches
        self.unexpected = [m for m in found if not any(d.matches(m) for d in dev)]
        self.missing = [d for d in dev if not any(d.matches(m) for m in found)]

    @property
    def identical(self) -> bool:
        return not self.mismatches

    @property
    def ok(self) -> bool:
        return not self.unexpected and not self.missing

    def report(self) -> str:
        lines = [f"scenario {self.scenario}: {len(self.samsa)} steps"]
        for m in self.unexpected:
            lines.append(f"  MISMATCH {m}")
        for d in self.missing:
            lines.append(
                f"  DEVIATION {d.id} NOT SEEN at {d.path}: expected samsa {d.samsa!r}, "
                f"kafka {d.kafka!r}"
            )
        for d in self.deviations:
            if d not in self.missing:
                lines.append(f"  deviation {d.id} at {d.path}: samsa {d.samsa!r}, "
                             f"kafka {d.kafka!r}")  # fmt: skip
        return "\n".join(lines)

    def check(self) -> None:
        """Raise AssertionError unless the differences are exactly the declared deviations."""
        if not self.ok:
            raise AssertionError(self.report())

    def summary(self) -> dict[str, Any]:
        """What the suite's end-of-run summary counts (serialisable for pytest-xdist)."""
        return {
            "scenario": self.scenario,
            "identical": self.identical,
            "ok": self.ok,
            "deviations": sorted({d.id for d in self.deviations}),
        }


def _transcript_tree(steps: Iterable[Step], rules: Mapping[str, Rule]) -> dict[str, Any]:
    return normalise({s.label: s.tree for s in steps}, rules)


def run_scenario(
    name: str,
    scenario: Callable[[Side], None],
    samsa: Target,
    kafka: Target,
    *,
    deviations: Sequence[Deviation] = (),
    rules: Mapping[str, Rule] | None = None,
) -> Outcome:
    """Run ``scenario`` against samsa, then against Kafka, and compare the transcripts.

    The outcome's ``unexpected`` are differences no deviation declares, ``missing`` the
    declared deviations that did not happen; :meth:`Outcome.check` fails on either.
    """
    sides = []
    for target in (samsa, kafka):
        side = Side(target, name)
        try:
            scenario(side)
        finally:
            side.close()
        sides.append(side)
    merged = {**DEFAULT_RULES, **(rules or {})}
    a, b = (_transcript_tree(s.steps, merged) for s in sides)
    # The step labels, in order, are part of the comparison: a scenario that took another
    # branch on one side shows here.
    order = compare([s.label for s in sides[0].steps], [s.label for s in sides[1].steps], "steps")
    mismatches = order + compare(a, b)
    return Outcome(name, sides[0].steps, sides[1].steps, mismatches, tuple(deviations))


def summary_lines(reports: Iterable[Any]) -> list[str]:
    """The end-of-run summary of the differential scenarios, from pytest's call reports (or
    any objects with ``user_properties``) carrying :meth:`Outcome.summary` values."""
    items = [
        value
        for report in reports
        if getattr(report, "when", "call") == "call"
        for key, value in getattr(report, "user_properties", ())
        if key == USER_PROPERTY
    ]
    if not items:
        return []
    identical = sum(1 for o in items if o["identical"])
    with_dev = [o for o in items if not o["identical"] and o["ok"]]
    failed = [o for o in items if not o["ok"]]
    ids = sorted({d for o in items for d in o["deviations"]})
    lines = [
        f"differential scenarios run: {len(items)}, identical to Kafka: {identical}, "
        f"with documented deviations only: {len(with_dev)}, failing: {len(failed)}",
    ]
    if ids:
        lines.append(f"documented deviations seen: {', '.join(ids)}")
    lines += [f"  failing: {o['scenario']}" for o in failed]
    return lines
