"""The admin client's config calls: DescribeConfigs, and AlterConfigs /
IncrementalAlterConfigs sent to the broker a resource belongs to (any broker for the
cluster-wide ones)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

from samsa.client import _describe_configs as describe
from samsa.client._cluster import Cluster
from samsa.client._errors import KafkaError
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, api_name, make_request


@dataclass(frozen=True, slots=True)
class ConfigResource:
    """A topic's or a broker's configs (``name`` "" for a broker: the cluster defaults)."""

    type: int
    name: str

    TOPIC: ClassVar[int] = describe.TOPIC
    BROKER: ClassVar[int] = describe.BROKER


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: int


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One config as DescribeConfigs gives it; ``value`` None when sensitive or unset.
    ``source`` is Kafka's ConfigSource (1 DYNAMIC_TOPIC_CONFIG, 2 DYNAMIC_BROKER_CONFIG,
    4 STATIC_BROKER_CONFIG, 5 DEFAULT_CONFIG, ...)."""

    name: str
    value: str | None
    source: int
    read_only: bool
    sensitive: bool
    synonyms: tuple[ConfigSynonym, ...] = ()


@dataclass(frozen=True, slots=True)
class AlterConfigOp:
    """One change of IncrementalAlterConfigs (Java's ``AlterConfigOp``)."""

    name: str
    value: str | None
    op: int = 0

    SET: ClassVar[int] = 0
    DELETE: ClassVar[int] = 1
    APPEND: ClassVar[int] = 2
    SUBTRACT: ClassVar[int] = 3


class ConfigAdmin:
    """Config calls of :class:`AsyncAdmin`, on its cluster."""

    def __init__(self, cluster: Cluster, api_timeout: float) -> None:
        self.cluster = cluster
        self.api_timeout = api_timeout

    def _config_node(self, resource: ConfigResource) -> int | None:
        """A broker's own configs are asked of that broker (as Java's AdminClient does);
        topics' and the cluster defaults of any broker."""
        if resource.type == ConfigResource.BROKER and resource.name:
            try:
                return int(resource.name)
            except ValueError:
                raise KafkaError(
                    ErrorCode.INVALID_REQUEST, f"broker id {resource.name!r} is not a number"
                ) from None
        return None

    async def describe_configs(
        self, resources: Iterable[ConfigResource], *, include_synonyms: bool = True
    ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        """DescribeConfigs: every config of each resource by name; a resource's error
        (UNKNOWN_TOPIC_OR_PARTITION, ...) raises KafkaError."""
        out: dict[ConfigResource, dict[str, ConfigEntry]] = {}
        for r in dict.fromkeys(resources):
            node = self._config_node(r)
            if node is not None:
                await self.cluster.refresh([])

            async def attempt(r: ConfigResource = r, node: int | None = node) -> Any:
                return await self.cluster.send(
                    node,
                    ApiKey.DESCRIBE_CONFIGS,
                    describe.VERSIONS,
                    describe.REQUEST,
                    describe.describe_configs_body(
                        r.type, r.name, include_synonyms=include_synonyms
                    ),
                )

            result = (await self.cluster.retry(attempt, what="DescribeConfigs")).results[0]
            if int(result.error_code):
                raise KafkaError(int(result.error_code), result.error_message or r.name)
            out[r] = {
                c.name: ConfigEntry(
                    c.name,
                    c.value,
                    int(c.config_source),
                    bool(c.read_only),
                    bool(c.is_sensitive),
                    tuple(
                        ConfigSynonym(s.name, s.value, int(s.source))
                        for s in getattr(c, "synonyms", ()) or ()
                    ),
                )
                for c in result.configs
            }
        return out

    async def _alter_configs_call(
        self,
        api_key: int,
        versions: tuple[int, int],
        cls: str,
        resources: list[ConfigResource],
        build: Any,
        validate_only: bool,
    ) -> dict[ConfigResource, KafkaError | None]:
        """One AlterConfigs / IncrementalAlterConfigs per resource's broker; ``build(v, r)``
        is the request's entry for resource ``r``."""
        out: dict[ConfigResource, KafkaError | None] = {}
        by_node: dict[int | None, list[ConfigResource]] = {}
        for r in resources:
            by_node.setdefault(self._config_node(r), []).append(r)
        if any(n is not None for n in by_node):
            await self.cluster.refresh([])
        for node, group in by_node.items():

            async def attempt(node: int | None = node, group: list[ConfigResource] = group) -> Any:
                return await self.cluster.send(
                    node,
                    api_key,
                    versions,
                    cls,
                    lambda v: {
                        "resources": tuple(build(v, r) for r in group),
                        "validate_only": validate_only,
                    },
                )

            resp = await self.cluster.retry(attempt, what=api_name(api_key))
            for answer in resp.responses:
                r = ConfigResource(int(answer.resource_type), answer.resource_name)
                code = int(answer.error_code)
                out[r] = KafkaError(code, answer.error_message or r.name) if code else None
        return out

    async def incremental_alter_configs(
        self,
        changes: dict[ConfigResource, Iterable[AlterConfigOp]],
        *,
        validate_only: bool = False,
    ) -> dict[ConfigResource, KafkaError | None]:
        """IncrementalAlterConfigs: SET / DELETE / APPEND / SUBTRACT single configs, keeping
        the others; maps each resource to None (done) or its error."""
        ops = {r: list(c) for r, c in changes.items()}
        k = ApiKey.INCREMENTAL_ALTER_CONFIGS

        def build(v: int, r: ConfigResource) -> Any:
            return make_request(
                k,
                v,
                "AlterConfigsResource",
                resource_type=r.type,
                resource_name=r.name,
                configs=tuple(
                    make_request(
                        k, v, "AlterableConfig", name=o.name, config_operation=o.op, value=o.value
                    )
                    for o in ops[r]
                ),
            )

        return await self._alter_configs_call(
            k, (0, 1), "IncrementalAlterConfigsRequest", list(ops), build, validate_only
        )

    async def alter_configs(
        self, configs: dict[ConfigResource, dict[str, str]], *, validate_only: bool = False
    ) -> dict[ConfigResource, KafkaError | None]:
        """AlterConfigs (deprecated in Kafka for incremental_alter_configs): each resource's
        dynamic configs become exactly ``configs[resource]``, the others reset."""
        k = ApiKey.ALTER_CONFIGS

        def build(v: int, r: ConfigResource) -> Any:
            return make_request(
                k,
                v,
                "AlterConfigsResource",
                resource_type=r.type,
                resource_name=r.name,
                configs=tuple(
                    make_request(k, v, "AlterableConfig", name=n, value=val)
                    for n, val in configs[r].items()
                ),
            )

        return await self._alter_configs_call(
            k, (0, 2), "AlterConfigsRequest", list(configs), build, validate_only
        )
