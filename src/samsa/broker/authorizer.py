"""Kafka's ACL authorizer: who may do what to which resource (docs/semantics.md, rule 33).

An ACL binding is a resource pattern (type, name, LITERAL or PREFIXED) and an entry
(principal, host, operation, ALLOW or DENY). A request is allowed when the principal is a
``super.users`` member, or some ALLOW binding matches it and no DENY binding does (DENY
wins); with no binding at all on the resource, ``allow.everyone.if.no.acl.found`` decides.
ALLOW of Read, Write, Delete or Alter implies Describe; ALLOW of AlterConfigs implies
DescribeConfigs; All stands for every operation. TwoPhaseCommit (KIP-939) implies nothing and
is implied only by All.

Bindings live in ``<data dir>/acls.json``, written atomically before a change is answered, and
are indexed by resource type and name, so an authorize call is a few dictionary lookups (one
per prefix of the name for PREFIXED bindings). Nothing here knows about requests or sockets.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import crc32c

from samsa.log.durable import fsync_dir, write_atomically
from samsa.protocol.errors import ErrorCode

ACLS_FILE = "acls.json"
# Producer id -> principal bindings, appended as they are made: one line each, the CRC-32C
# of the JSON ``[producer id, principal]`` in hex, a space, that JSON.
PRODUCER_OWNERS_FILE = "producer-owners"
CLUSTER_NAME = "kafka-cluster"  # the one name of the Cluster resource, as in Kafka
WILDCARD = "*"
# Bounds what clients can make the broker hold: ACLs, and producer id -> principal bindings.
MAX_ACLS = 100_000
MAX_PRODUCER_OWNERS = 1_000_000
MAX_CACHED_DECISIONS = 100_000  # remembered decisions, forgotten whenever the ACLs change

# authorizer.class.name values that mean "on" (samsa has one authorizer, Kafka's model).
AUTHORIZER_CLASS_NAMES = frozenset(
    {
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "kafka.security.authorizer.AclAuthorizer",
    }
)


log = logging.getLogger("samsa.authorizer")


def _owner_record(producer_id: int, principal: str) -> bytes:
    body = json.dumps([producer_id, principal]).encode()
    return b"%08x %s\n" % (crc32c.crc32c(body), body)


def _parse_owner_record(line: bytes) -> tuple[int, str] | None:
    """(producer id, principal), or None for a damaged record. A line that is bare JSON was
    written before records carried a checksum (it is rewritten with one at start)."""
    crc, _, body = line.partition(b" ")
    if line.startswith(b"["):
        crc, body = b"", line
    try:
        if crc and (len(crc) != 8 or int(crc, 16) != crc32c.crc32c(body)):
            return None
        pid, principal = json.loads(body)
    except (ValueError, TypeError):
        return None
    if type(pid) is not int or not isinstance(principal, str):
        return None
    return pid, principal


class ResourceType(IntEnum):  # Kafka's org.apache.kafka.common.resource.ResourceType codes
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):  # Kafka's AclOperation codes
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15  # KIP-939, on a TransactionalId (Kafka 4.1+)


class Permission(IntEnum):  # Kafka's AclPermissionType codes
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# Which operations an ALLOW of each operation also grants (Kafka's implied operations).
_IMPLIED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset(
        {Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
    ),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
}
_CONCRETE_TYPES = frozenset(
    {ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID}
)


class AclError(Exception):
    """A binding or filter that cannot be stored or used; ``code`` is Kafka's error."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def check(self) -> None:
        """Raise AclError unless this binding can be stored (Kafka's CreateAcls checks)."""
        if self.resource_type not in _CONCRETE_TYPES:
            raise AclError(f"ACLs on resource type {_name(self.resource_type)} are not supported")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise AclError(f"pattern type must be LITERAL or PREFIXED, not {self.pattern_type}")
        if self.operation in (Operation.UNKNOWN, Operation.ANY):
            raise AclError(f"operation must be a concrete one, not {_name(self.operation)}")
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            raise AclError(f"permission must be ALLOW or DENY, not {_name(self.permission)}")
        if not self.name:
            raise AclError("resource name must not be empty")
        if self.resource_type == ResourceType.CLUSTER and self.name != CLUSTER_NAME:
            raise AclError(f"the only Cluster resource name is {CLUSTER_NAME!r}")
        kind, sep, who = self.principal.partition(":")
        if not sep or not kind or not who:
            raise AclError(f"principal must be TYPE:NAME (e.g. User:alice), got {self.principal!r}")
        if not self.host:
            raise AclError("host must not be empty (use * for any host)")

    def to_json(self) -> dict[str, str]:
        return {
            "resource_type": self.resource_type.name,
            "name": self.name,
            "pattern_type": self.pattern_type.name,
            "principal": self.principal,
            "host": self.host,
            "operation": self.operation.name,
            "permission": self.permission.name,
        }

    @classmethod
    def from_json(cls, doc: dict[str, str]) -> AclBinding:
        return cls(
            ResourceType[doc["resource_type"]],
            doc["name"],
            PatternType[doc["pattern_type"]],
            doc["principal"],
            doc["host"],
            Operation[doc["operation"]],
            Permission[doc["permission"]],
        )


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Kafka's AclBindingFilter: None or ANY matches anything; pattern type MATCH matches
    the LITERAL and PREFIXED bindings that would apply to the named resource."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def check(self) -> None:
        for value, what in (
            (self.resource_type, "resource type"),
            (self.pattern_type, "pattern type"),
            (self.operation, "operation"),
            (self.permission, "permission"),
        ):
            if value == 0:
                raise AclError(f"filter {what} is UNKNOWN")

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, b.resource_type):
            return False
        if self.operation not in (Operation.ANY, b.operation):
            return False
        if self.permission not in (Permission.ANY, b.permission):
            return False
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.pattern_type == PatternType.MATCH:
            if self.name is None:
                return True
            if b.pattern_type == PatternType.LITERAL:
                return b.name in (self.name, WILDCARD)
            return self.name.startswith(b.name)
        if self.pattern_type not in (PatternType.ANY, b.pattern_type):
            return False
        return self.name is None or self.name == b.name


def _name(value: IntEnum) -> str:
    return value.name if isinstance(value, IntEnum) else str(value)


def enum_or_unknown(enum: type[IntEnum], code: int) -> Any:
    """A wire code as the enum, UNKNOWN (0) for codes this broker does not know."""
    try:
        return enum(code)
    except ValueError:
        return enum(0)


class Authorizer:
    def __init__(
        self,
        data_dir: Path,
        super_users: Iterable[str] = (),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        self.path = Path(data_dir) / ACLS_FILE
        self.owners_path = Path(data_dir) / PRODUCER_OWNERS_FILE
        self._owner_lines = 0  # lines in the owners file (rewritten when it holds many stale)
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._bindings: dict[AclBinding, None] = {}  # insertion-ordered set
        # (resource type, pattern type) -> resource name -> bindings
        self._index: dict[tuple[ResourceType, PatternType], dict[str, list[AclBinding]]] = {}
        # (principal, host, operation, resource type, name) -> decision, for the current ACLs.
        self._decisions: dict[tuple[str, str, Operation, ResourceType, str], bool] = {}
        # Producer id -> the principal that got it from InitProducerId (rule 33), in the order
        # bound; replayed from the owners file at start.
        self._producer_owners: dict[int, str] = {}
        self.load()
        self._load_owners()

    # -- storage -------------------------------------------------------------------------

    def load(self) -> None:
        if not self.path.exists():
            self._set([])
            return
        try:
            doc = json.loads(self.path.read_text())
            bindings = [AclBinding.from_json(d) for d in doc["acls"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise AclError(f"cannot read ACLs from {self.path}: {exc}") from None
        self._set(bindings)

    def _set(self, bindings: Iterable[AclBinding]) -> None:
        self._bindings = dict.fromkeys(bindings)
        index: dict[tuple[ResourceType, PatternType], dict[str, list[AclBinding]]] = {}
        for b in self._bindings:
            index.setdefault((b.resource_type, b.pattern_type), {}).setdefault(b.name, []).append(b)
        self._index = index
        self._decisions = {}

    def _save(self, bindings: list[AclBinding]) -> None:
        doc = {"version": 1, "acls": [b.to_json() for b in bindings]}
        write_atomically(self.path, json.dumps(doc, indent=1).encode())

    def bindings(self) -> list[AclBinding]:
        return list(self._bindings)

    def create(self, bindings: list[AclBinding]) -> list[AclError | None]:
        """Store the valid bindings (durably, before returning); one result per binding."""
        results: list[AclError | None] = []
        new = dict(self._bindings)
        for b in bindings:
            try:
                b.check()
                if b not in new and len(new) >= MAX_ACLS:
                    raise AclError(
                        f"the broker holds at most {MAX_ACLS} ACLs; delete some first",
                        ErrorCode.POLICY_VIOLATION,
                    )
            except AclError as exc:
                results.append(exc)
                continue
            new[b] = None
            results.append(None)
        if len(new) != len(self._bindings):
            self._save(list(new))
            self._set(new)
        return results

    def describe(self, flt: AclFilter) -> list[AclBinding]:
        flt.check()
        return [b for b in self._bindings if flt.matches(b)]

    def delete(self, filters: list[AclFilter]) -> list[list[AclBinding] | AclError]:
        """Remove every binding each filter matches (durably); per filter, what it removed."""
        results: list[list[AclBinding] | AclError] = []
        gone: set[AclBinding] = set()
        for flt in filters:
            try:
                flt.check()
            except AclError as exc:
                results.append(exc)
                continue
            matched = [b for b in self._bindings if flt.matches(b)]
            gone.update(matched)
            results.append(matched)
        if gone:
            remaining = [b for b in self._bindings if b not in gone]
            self._save(remaining)
            self._set(remaining)
        return results

    # -- decisions -----------------------------------------------------------------------

    def _candidates(self, rtype: ResourceType, name: str) -> list[AclBinding]:
        found: list[AclBinding] = []
        literal = self._index.get((rtype, PatternType.LITERAL))
        if literal:
            found += literal.get(name, ())
            if name != WILDCARD:
                found += literal.get(WILDCARD, ())
        prefixed = self._index.get((rtype, PatternType.PREFIXED))
        if prefixed:
            for i in range(1, len(name) + 1):
                found += prefixed.get(name[:i], ())
        return found

    def authorize(
        self, principal: str, host: str, op: Operation, rtype: ResourceType, name: str
    ) -> bool:
        if principal in self.super_users:
            return True
        key = (principal, host, op, rtype, name)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decide(principal, host, op, rtype, name)
            if len(self._decisions) >= MAX_CACHED_DECISIONS:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def _decide(
        self, principal: str, host: str, op: Operation, rtype: ResourceType, name: str
    ) -> bool:
        candidates = self._candidates(rtype, name)
        if not candidates:
            return self.allow_everyone_if_no_acl_found
        granting = _IMPLIED_BY.get(op, frozenset({op}))
        allowed = False
        for b in candidates:
            if b.principal not in (principal, "User:*") or b.host not in (host, WILDCARD):
                continue
            if b.permission == Permission.DENY:
                if b.operation in (op, Operation.ALL):
                    return False  # DENY wins over any ALLOW
            elif b.operation == Operation.ALL or b.operation in granting:
                allowed = True
        return allowed

    def authorize_any(self, principal: str, host: str, op: Operation, rtype: ResourceType) -> bool:
        """Kafka's authorizeByResourceType: may the principal do ``op`` on some resource of
        this type? An ALLOW on any name counts unless a DENY covers every name."""
        if principal in self.super_users:
            return True
        allowed = False
        for (t, pattern), by_name in self._index.items():
            if t != rtype:
                continue
            for name, bindings in by_name.items():
                for b in bindings:
                    if b.principal not in (principal, "User:*") or b.host not in (host, WILDCARD):
                        continue
                    if b.operation not in (op, Operation.ALL):
                        continue
                    covers_all = (pattern == PatternType.LITERAL and name == WILDCARD) or (
                        pattern == PatternType.PREFIXED and name == ""
                    )
                    if b.permission == Permission.DENY and covers_all:
                        return False
                    if b.permission == Permission.ALLOW:
                        allowed = True
        return allowed

    # -- producer ids bound to principals --------------------------------------------------

    def bind_producer(self, producer_id: int, principal: str, durable: bool = True) -> None:
        """Bind the producer id to the principal, in memory and appended to the owners file,
        fsynced before returning when ``durable`` (so a restart keeps it, after a power cut
        too; an OSError means it was not recorded)."""
        owners = self._producer_owners
        if owners.get(producer_id) == principal:
            return
        owners.pop(producer_id, None)
        owners[producer_id] = principal
        if len(owners) > MAX_PRODUCER_OWNERS:
            del owners[next(iter(owners))]  # the oldest binding
        if self._owner_lines >= 2 * len(owners) + 1000:
            self._rewrite_owners()  # atomic, fsynced
            return
        created = not self.owners_path.exists()
        fd = os.open(self.owners_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, _owner_record(producer_id, principal))  # one write: a whole line
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        if created and durable:
            fsync_dir(self.owners_path.parent)
        self._owner_lines += 1

    def _load_owners(self) -> None:
        """Replay the owners file. A record whose checksum does not match (a line a crash cut
        short, a flipped byte) is skipped, and the file rewritten without it; that binding is
        redone by the producer's next InitProducerId or first batch."""
        try:
            data = self.owners_path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise AclError(f"cannot read {self.owners_path}: {exc}") from None
        owners = self._producer_owners
        lines = data.split(b"\n")
        # Every record ends with a newline: anything after the last one was cut short (kept
        # if its checksum says it is whole), and the file is rewritten so appends start afresh.
        torn = lines[-1] != b""
        if not torn:
            lines.pop()
        bad, rewrite = 0, torn
        for line in lines:
            binding = _parse_owner_record(line)
            if binding is None:
                bad += 1
                continue
            rewrite = rewrite or line.startswith(b"[")  # no checksum yet
            owners.pop(binding[0], None)
            owners[binding[0]] = binding[1]
        while len(owners) > MAX_PRODUCER_OWNERS:
            del owners[next(iter(owners))]
        self._owner_lines = len(lines)
        if bad:
            log.warning("%s: skipped %d damaged record(s)", self.owners_path, bad)
        if bad or rewrite:
            try:
                self._rewrite_owners()  # appends must not continue a torn line
            except OSError as exc:
                raise AclError(f"cannot rewrite {self.owners_path}: {exc}") from None

    def _rewrite_owners(self) -> None:
        records = [_owner_record(pid, p) for pid, p in self._producer_owners.items()]
        write_atomically(self.owners_path, b"".join(records))
        self._owner_lines = len(records)

    def producer_owner_ok(self, producer_id: int, principal: str) -> bool:
        """May ``principal`` write batches with this producer id? A producer id no principal
        is bound to (the oldest bindings are forgotten) is bound to its first writer."""
        owner = self._producer_owners.get(producer_id)
        if owner is None:
            # Bound in memory even if not recorded; not fsynced: losing it to a power cut
            # only means the first writer binds it again.
            with contextlib.suppress(OSError):
                self.bind_producer(producer_id, principal, durable=False)
            return True
        return owner == principal


def authorizer_enabled(class_name: str) -> bool:
    """``authorizer.class.name``: empty means off; Kafka's authorizer class names mean on."""
    if not class_name.strip():
        return False
    if class_name.strip() not in AUTHORIZER_CLASS_NAMES:
        raise AclError(
            f"authorizer.class.name {class_name!r} is not supported; use "
            + " or ".join(sorted(AUTHORIZER_CLASS_NAMES))
        )
    return True


def parse_super_users(value: str) -> list[str]:
    """``super.users``: principals separated by semicolons (User:admin;User:ops)."""
    users = [u.strip() for u in value.split(";") if u.strip()]
    for u in users:
        kind, sep, who = u.partition(":")
        if not sep or not kind or not who:
            raise AclError(f"super.users: {u!r} is not a principal (TYPE:NAME, e.g. User:admin)")
    return users
