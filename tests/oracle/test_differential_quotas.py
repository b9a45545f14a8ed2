"""Differential scenarios of client quotas (KIP-546): AlterClientQuotas with valid and
refused entities, and DescribeClientQuotas filters, answered by samsa as by Apache Kafka."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from samsa.protocol.messages import ApiKey, make_request
from samsa.testing.oracle import Outcome, Side

Run = Callable[..., Outcome]
ALTER, DESCRIBE = ApiKey.ALTER_CLIENT_QUOTAS, ApiKey.DESCRIBE_CLIENT_QUOTAS


def _entry(entity: dict[str, str | None], **ops: float | None) -> Any:
    v = 1
    return make_request(
        ALTER, v, "EntryData",
        entity=tuple(make_request(ALTER, v, "EntityData", entity_type=t, entity_name=n)
                     for t, n in entity.items()),
        ops=tuple(make_request(ALTER, v, "OpData", key=key, value=0.0 if x is None else x,
                               remove=x is None) for key, x in ops.items()),
    )  # fmt: skip


def _entity(entity: Any) -> list[list[str | None]]:
    return sorted([e.entity_type, e.entity_name] for e in entity)


def alter(s: Side, label: str, *entries: Any, validate_only: bool = False) -> None:
    """Each entity's outcome, in entity order (Kafka answers in hash-map order)."""
    req = make_request(ALTER, 1, "AlterClientQuotasRequest", entries=entries,
                       validate_only=validate_only)  # fmt: skip
    resp = s.conn.request(ALTER, 1, req)
    s.note(label, sorted(
        [_entity(e.entity), int(e.error_code), e.error_message] for e in resp.entries
    ))  # fmt: skip


def describe(
    s: Side, label: str, components: list[tuple[str, int, str | None]], strict: bool, want: int
) -> None:
    comps = tuple(make_request(DESCRIBE, 1, "ComponentData", entity_type=t, match_type=m,
                               match=x) for t, m, x in components)  # fmt: skip
    req = make_request(DESCRIBE, 1, "DescribeClientQuotasRequest", components=comps,
                       strict=strict)  # fmt: skip
    # Kafka applies an alteration through its metadata log: a describe may lag a moment.
    deadline = time.monotonic() + 10
    while True:
        resp = s.conn.request(DESCRIBE, 1, req)
        if len(resp.entries or ()) == want or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    entries = sorted(
        [_entity(e.entity), sorted([v.key, v.value] for v in e.values)] for e in resp.entries or ()
    )
    s.note(label, [int(resp.error_code), resp.error_message, entries])


def test_alter_and_describe_client_quotas(differential: Run) -> None:
    def scenario(s: Side) -> None:
        user, client = s.unique("u"), s.unique("c")
        alter(s, "set", _entry({"user": user}, producer_byte_rate=1024.0),
              _entry({"user": user, "client-id": client}, consumer_byte_rate=2048.0,
                     request_percentage=12.5))  # fmt: skip
        alter(s, "validate-only", _entry({"client-id": client}, producer_byte_rate=1.0),
              validate_only=True)  # fmt: skip
        alter(s, "refused",
              _entry({"user": user, "ip": "10.0.0.1"}, producer_byte_rate=1.0),
              _entry({"group": "g"}, producer_byte_rate=1.0),
              _entry({"user": ""}, producer_byte_rate=1.0),
              _entry({"ip": "10.0.0.2"}, producer_byte_rate=1.0),
              _entry({}, producer_byte_rate=1.0))  # fmt: skip
        describe(s, "exact-user", [("user", 0, user)], strict=True, want=1)
        describe(s, "user-any-client", [("user", 0, user)], strict=False, want=2)
        describe(s, "exact-client", [("client-id", 0, client)], strict=False, want=1)
        describe(s, "duplicate-type", [("user", 0, user), ("user", 1, None)], False, want=0)
        describe(s, "ip-with-user", [("ip", 1, None), ("user", 0, user)], False, want=0)
        alter(s, "remove", _entry({"user": user}, producer_byte_rate=None))
        describe(s, "after-remove", [("user", 0, user)], strict=True, want=0)

    differential(scenario)
