"""Client quotas (KIP-13, KIP-124, KIP-219, KIP-546): what each user and client id may use,
the rates they use, and how long a client that went over must wait. Pure: no sockets, and the
clock is passed in.

Quotas are kept per *entity*: a user, a client id, a user with a client id (either may be the
default, ``None``), or an IP address. They live in ``<data dir>/client-quotas.json``, written
atomically before AlterClientQuotas is answered (where Kafka appends QuotaRecords to its
metadata log), and apply from the next request on.

A request is charged to one entity per quota key, found as Kafka's ClientQuotaManager does:
user+client-id, user+default client-id, user, default user+client-id, default user+default
client-id, default user, client-id, default client-id; the first that sets the key wins and
every client matched through it shares its rate. Rates are measured over ``quota.window.num``
windows of ``quota.window.size.seconds`` (Kafka's sampled Rate); a client over its bound
waits ``(rate - bound) / bound * window`` (Kafka's QuotaUtils.throttleTime), at most one
window for ``request_percentage`` (as Kafka bounds request-time throttling). An IP's
``connection_creation_rate`` (its own, else the default IP's) counts accepted connections; one
over it is closed at once.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from samsa.log.durable import write_atomically

CLIENT_QUOTAS_FILE = "client-quotas.json"

USER, CLIENT_ID, IP = "user", "client-id", "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)

PRODUCE = "producer_byte_rate"
FETCH = "consumer_byte_rate"
REQUEST = "request_percentage"
MUTATION = "controller_mutation_rate"  # stored and described; samsa's controller is local
CONNECTION = "connection_creation_rate"  # of IP entities: connections accepted per second

# Kafka's names of the quota types (its metric groups).
QUOTA_TYPES = {PRODUCE: "Produce", FETCH: "Fetch", REQUEST: "Request"}

# Kafka's QuotaConfig: each key's type, for the entities that may set it.
USER_CLIENT_KEYS: dict[str, str] = {
    PRODUCE: "LONG",
    FETCH: "LONG",
    REQUEST: "DOUBLE",
    MUTATION: "DOUBLE",
}
IP_KEYS: dict[str, str] = {CONNECTION: "INT"}

DEFAULT_WINDOW_NUM = 11  # quota.window.num
DEFAULT_WINDOW_S = 1.0  # quota.window.size.seconds
MAX_ENTITIES = 10_000  # quota entities stored: AlterClientQuotas past this is refused
MAX_SENSORS = 10_000  # rates tracked; the least recently used is forgotten past this
INT32_MAX = 2**31 - 1

# An entity: its (type, name) pairs in type order; a name of None is the type's default.
Entity = tuple[tuple[str, str | None], ...]


class QuotaError(ValueError):
    """An alteration or filter refused with INVALID_REQUEST (Kafka's messages)."""


def entity_of(pairs: Iterable[tuple[str, str | None]]) -> Entity:
    """The entity named by (type, name) pairs, checked as Kafka's controller checks it."""
    seen: dict[str, str | None] = {}
    for etype, name in pairs:
        if etype in seen:
            raise QuotaError(f"Invalid empty client quota entity, duplicate entity entry {etype}")
        if etype not in ENTITY_TYPES:
            raise QuotaError(f"Unhandled client quota entity type: {etype}")
        if name == "":
            raise QuotaError(f"Empty {etype} not supported")
        seen[etype] = name
    if not seen:
        raise QuotaError("Invalid empty client quota entity")
    if IP in seen and len(seen) > 1:
        raise QuotaError(  # sic, Kafka 4.4's words
            "Invalid quota entity combination, IP entity shouldnot be combined with User or "
            "ClientId"
        )
    ip = seen.get(IP)
    if ip is not None:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            # Kafka resolves host names; samsa takes addresses only (D-QUOTA-1).
            raise QuotaError(f"{ip} is not a valid IP or resolvable host.") from None
    return tuple(sorted(seen.items()))


def keys_for(entity: Entity) -> dict[str, str]:
    return IP_KEYS if entity[0][0] == IP else USER_CLIENT_KEYS


def check_value(entity: Entity, key: str, value: float) -> None:
    kind = keys_for(entity).get(key)
    if kind is None:
        raise QuotaError(f"Invalid configuration key {key}")
    if not math.isfinite(value):
        # D-QUOTA-1: Kafka stores NaN and infinities; no rate can be held to them.
        raise QuotaError(f"{key} must be a finite number, not {value}")
    if kind in ("LONG", "INT") and abs(math.floor(value + 1e-6) - value) > 1e-6:
        raise QuotaError(f"{key} cannot be a fractional value.")


class Rate:
    """Kafka's sampled Rate: ``samples`` windows of ``window_s``; a window starts at the
    first record after the previous one ended, and windows older than all of them together
    are forgotten."""

    __slots__ = ("_current", "_starts", "_values", "samples", "window_s")

    def __init__(self, samples: int, window_s: float, now: float) -> None:
        self.samples = samples
        self.window_s = window_s
        self._starts = [now]
        self._values = [0.0]
        self._current = 0

    def record(self, value: float, now: float) -> None:
        i = self._current
        if now - self._starts[i] >= self.window_s:
            i = self._current = (i + 1) % self.samples
            if i >= len(self._starts):
                self._starts.append(now)
                self._values.append(0.0)
            else:
                self._starts[i], self._values[i] = now, 0.0
        self._values[i] += value

    def _purge(self, now: float) -> None:
        span = self.samples * self.window_s
        for i, start in enumerate(self._starts):
            if now - start >= span:
                self._starts[i], self._values[i] = now, 0.0

    def window_size(self, now: float) -> float:
        """Seconds the rate is measured over: since the oldest window began, and at least
        ``samples - 1`` whole windows (so a new client is not judged on one burst)."""
        self._purge(now)
        elapsed = now - min(self._starts)
        full = int(elapsed / self.window_s)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_s
        return elapsed

    def measure(self, now: float) -> float:
        size = self.window_size(now)
        return sum(self._values) / size if size > 0 else 0.0


class Muting:
    """The throttle one connection owes: the longest its requests earned since the server
    last muted it (KIP-219: the response goes at once, then the channel waits)."""

    __slots__ = ("owed_ms",)

    def __init__(self) -> None:
        self.owed_ms = 0

    def owe(self, ms: int) -> None:
        if ms > self.owed_ms:
            self.owed_ms = ms

    def take(self) -> int:
        ms, self.owed_ms = self.owed_ms, 0
        return ms


@dataclass(frozen=True, slots=True)
class Charge:
    """Where a request's use of one quota key goes: the entity's metric tags (user,
    client-id; ``""`` where shared) and its bound."""

    key: str
    user: str
    client_id: str
    bound: float


class ClientQuotas:
    """The stored quotas of every entity, the rates of the clients charged to them, and the
    throttle times those rates earn."""

    def __init__(
        self,
        path: Path | None,
        *,
        window_num: int = DEFAULT_WINDOW_NUM,
        window_s: float = DEFAULT_WINDOW_S,
        max_entities: int = MAX_ENTITIES,
        max_sensors: int = MAX_SENSORS,
    ) -> None:
        self.path = path
        self.window_num = window_num
        self.window_s = window_s
        self.max_entities = max_entities
        self.max_sensors = max_sensors
        self.quotas: dict[Entity, dict[str, float]] = {}
        # Keys some entity sets: most requests are charged to nothing and stop at this check.
        self.keys: set[str] = set()
        self._rates: OrderedDict[tuple[str, str, str], Rate] = OrderedDict()

    # -- stored quotas ----------------------------------------------------------------------

    def load(self) -> None:
        """Read the file, if any; ValueError naming it if it is damaged."""
        if self.path is None or not self.path.exists():
            return
        try:
            doc = json.loads(self.path.read_text())
            if not isinstance(doc, dict) or doc.get("version") != 1:
                raise ValueError("expected a JSON object with version 1")
            quotas: dict[Entity, dict[str, float]] = {}
            for item in doc["entities"]:
                entity = entity_of((t, n) for t, n in item["entity"])
                values = {str(k): float(v) for k, v in item["quotas"].items()}
                for key, value in values.items():
                    check_value(entity, key, value)
                quotas[entity] = values
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"cannot read the client quotas from {self.path}: {exc}") from None
        self._set(quotas)

    def _set(self, quotas: dict[Entity, dict[str, float]]) -> None:
        self.quotas = quotas
        self.keys = {k for values in quotas.values() for k in values}
        self._rates.clear()  # bounds and sharing may have changed: measure afresh

    def alter(
        self,
        alterations: Sequence[tuple[Entity, Mapping[str, float | None]]],
        *,
        validate_only: bool = False,
    ) -> None:
        """Apply every alteration (None removes a key), already checked, on disk first."""
        quotas = {entity: dict(values) for entity, values in self.quotas.items()}
        for entity, ops in alterations:
            values = quotas.setdefault(entity, {})
            for key, value in ops.items():
                if value is None:
                    values.pop(key, None)
                else:
                    values[key] = value
            if not values:
                del quotas[entity]
        if len(quotas) > self.max_entities:
            raise QuotaError(f"at most {self.max_entities} client quota entities")
        if validate_only or quotas == self.quotas:
            return
        if self.path is not None:
            doc = {
                "version": 1,
                "entities": [
                    {"entity": [list(pair) for pair in entity], "quotas": quotas[entity]}
                    for entity in sorted(quotas, key=_sort_key)
                ],
            }
            write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
        self._set(quotas)

    def describe(
        self, components: Sequence[tuple[str, int, str | None]], strict: bool
    ) -> list[tuple[Entity, dict[str, float]]]:
        """DescribeClientQuotas: entities matching every (type, match type, match) component
        (0: exactly ``match``, 1: the default, 2: any name but the default); strict: no other
        types. QuotaError for a filter Kafka refuses."""
        types = [c[0] for c in components]
        for etype in types:
            if types.count(etype) > 1:
                raise QuotaError(f"Entity type {etype} cannot appear more than once in the filter.")
            if etype not in ENTITY_TYPES:
                raise QuotaError(f"Custom entity type '{etype}' not supported")
        if IP in types and len(types) > 1:
            raise QuotaError(
                "Invalid entity filter component combination. IP filter component should not "
                "be used with user or clientId filter component."
            )
        out = []
        for entity, values in self.quotas.items():
            names = dict(entity)
            if strict and len(names) != len(components):
                continue
            if all(_matches(names, *c) for c in components):
                out.append((entity, dict(values)))
        return out

    # -- rates ------------------------------------------------------------------------------

    def quota_for(self, key: str, user: str, client_id: str) -> Charge | None:
        """The entity ``key`` charges a request of ``user`` (principal name) and
        ``client_id`` to, in Kafka's order, or None if no entity sets ``key``."""
        if key not in self.keys:
            return None
        q = self.quotas
        order: tuple[tuple[Entity, str, str], ...] = (
            (((CLIENT_ID, client_id), (USER, user)), user, client_id),
            (((CLIENT_ID, None), (USER, user)), user, client_id),
            (((USER, user),), user, ""),
            (((CLIENT_ID, client_id), (USER, None)), user, client_id),
            (((CLIENT_ID, None), (USER, None)), user, client_id),
            (((USER, None),), user, ""),
            (((CLIENT_ID, client_id),), "", client_id),
            (((CLIENT_ID, None),), "", client_id),
        )
        for entity, tag_user, tag_client in order:
            values = q.get(entity)
            if values is not None and key in values:
                return Charge(key, tag_user, tag_client, values[key])
        return None

    def connection_quota(self, ip: str) -> Charge | None:
        """``connection_creation_rate`` of an address: its own, else the default IP's."""
        if CONNECTION not in self.keys:
            return None
        for name in (ip, None):
            values = self.quotas.get(((IP, name),))
            if values is not None and CONNECTION in values:
                return Charge(CONNECTION, ip, "", values[CONNECTION])
        return None

    def record(self, charge: Charge, value: float, now: float) -> int:
        """Charge ``value`` (bytes, or percent-seconds of handler time) and return the
        throttle time in ms it earns (0 within the bound)."""
        tags = (charge.key, charge.user, charge.client_id)
        rates = self._rates
        rate = rates.get(tags)
        if rate is None:
            rate = rates[tags] = Rate(self.window_num, self.window_s, now)
            if len(rates) > self.max_sensors:
                rates.popitem(last=False)
        else:
            rates.move_to_end(tags)
        rate.record(value, now)
        observed = rate.measure(now)
        if observed <= charge.bound:
            return 0
        window = rate.window_size(now)
        if charge.bound <= 0:
            throttle_s = window
        else:
            throttle_s = (observed - charge.bound) / charge.bound * window
            if charge.key in (REQUEST, CONNECTION):  # bounded, as Kafka bounds these
                throttle_s = min(throttle_s, self.window_s)
        return min(round(throttle_s * 1000), INT32_MAX)  # throttle_time_ms is an int32

    @property
    def tracked(self) -> int:
        return len(self._rates)


def _sort_key(entity: Entity) -> tuple[tuple[str, str], ...]:
    return tuple((t, "" if n is None else "\0" + n) for t, n in entity)  # defaults first


def _matches(
    names: Mapping[str, str | None], etype: str, match_type: int, match: str | None
) -> bool:
    if etype not in names:
        return False
    name = names[etype]
    if match_type == 0:
        return name == match
    if match_type == 1:
        return name is None
    return name is not None


def user_name(principal: str) -> str:
    """A principal's name, as quota entities name users (``User:alice`` -> ``alice``)."""
    return principal.partition(":")[2] or principal


__all__ = [
    "CLIENT_QUOTAS_FILE",
    "CONNECTION",
    "ENTITY_TYPES",
    "FETCH",
    "PRODUCE",
    "QUOTA_TYPES",
    "REQUEST",
    "Charge",
    "ClientQuotas",
    "Entity",
    "Muting",
    "QuotaError",
    "Rate",
    "check_value",
    "entity_of",
    "user_name",
]
