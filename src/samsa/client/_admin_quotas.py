"""The admin client's client-quota calls (KIP-546): DescribeClientQuotas and
AlterClientQuotas, to any broker (quotas are cluster-wide), as Java's AdminClient."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from samsa.client._cluster import Cluster
from samsa.client._errors import KafkaError
from samsa.protocol.messages import ApiKey, make_request

_DESCRIBE = ApiKey.DESCRIBE_CLIENT_QUOTAS
_ALTER = ApiKey.ALTER_CLIENT_QUOTAS


@dataclass(frozen=True, slots=True)
class ClientQuotaEntity:
    """Who a quota is for (Java's ``ClientQuotaEntity``): (type, name) pairs of ``user``,
    ``client-id`` or ``ip``, in type order; a name of None is that type's default."""

    entries: tuple[tuple[str, str | None], ...]

    USER: ClassVar[str] = "user"
    CLIENT_ID: ClassVar[str] = "client-id"
    IP: ClassVar[str] = "ip"

    @classmethod
    def of(cls, pairs: Mapping[str, str | None]) -> ClientQuotaEntity:
        return cls(tuple(sorted(pairs.items())))


@dataclass(frozen=True, slots=True)
class ClientQuotaFilterComponent:
    """One part of a DescribeClientQuotas filter: entities of ``entity_type`` named ``match``
    (EXACT), its default (DEFAULT) or any but the default (SPECIFIED)."""

    entity_type: str
    match: str | None = None
    match_type: int = 0

    EXACT: ClassVar[int] = 0
    DEFAULT: ClassVar[int] = 1
    SPECIFIED: ClassVar[int] = 2


class QuotaAdmin:
    """Client-quota calls of :class:`AsyncAdmin`, on its cluster."""

    def __init__(self, cluster: Cluster, api_timeout: float) -> None:
        self.cluster = cluster
        self.api_timeout = api_timeout

    async def describe_client_quotas(
        self, components: Iterable[ClientQuotaFilterComponent] = (), *, strict: bool = False
    ) -> dict[ClientQuotaEntity, dict[str, float]]:
        """The quotas of every entity that matches all ``components`` (strict: and has no
        other entity type); a refused filter raises KafkaError."""
        parts = list(components)

        def fields(v: int) -> dict[str, Any]:
            return {
                "components": tuple(
                    make_request(
                        _DESCRIBE,
                        v,
                        "ComponentData",
                        entity_type=c.entity_type,
                        match_type=c.match_type,
                        match=c.match,
                    )
                    for c in parts
                ),
                "strict": strict,
            }

        async def attempt() -> Any:
            return await self.cluster.send(
                None, _DESCRIBE, (0, 1), "DescribeClientQuotasRequest", fields
            )

        resp = await self.cluster.retry(attempt, what="DescribeClientQuotas")
        if int(resp.error_code):
            raise KafkaError(int(resp.error_code), resp.error_message or "DescribeClientQuotas")
        return {
            ClientQuotaEntity(tuple(sorted((e.entity_type, e.entity_name) for e in x.entity))): {
                v.key: float(v.value) for v in x.values
            }
            for x in resp.entries or ()
        }

    async def alter_client_quotas(
        self,
        alterations: Mapping[ClientQuotaEntity, Mapping[str, float | None]],
        *,
        validate_only: bool = False,
    ) -> dict[ClientQuotaEntity, KafkaError | None]:
        """Set (a value) or remove (None) quota keys of each entity; each entity's outcome."""
        todo = list(alterations.items())

        def fields(v: int) -> dict[str, Any]:
            return {
                "entries": tuple(
                    make_request(
                        _ALTER,
                        v,
                        "EntryData",
                        entity=tuple(
                            make_request(_ALTER, v, "EntityData", entity_type=t, entity_name=n)
                            for t, n in entity.entries
                        ),
                        ops=tuple(
                            make_request(
                                _ALTER,
                                v,
                                "OpData",
                                key=key,
                                value=0.0 if value is None else float(value),
                                remove=value is None,
                            )
                            for key, value in ops.items()
                        ),
                    )
                    for entity, ops in todo
                ),
                "validate_only": validate_only,
            }

        async def attempt() -> Any:
            return await self.cluster.send(None, _ALTER, (0, 1), "AlterClientQuotasRequest", fields)

        resp = await self.cluster.retry(attempt, what="AlterClientQuotas")
        out: dict[ClientQuotaEntity, KafkaError | None] = {}
        for (entity, _ops), result in zip(todo, resp.entries, strict=True):
            code = int(result.error_code)
            out[entity] = (
                KafkaError(code, result.error_message or "AlterClientQuotas") if code else None
            )
        return out
