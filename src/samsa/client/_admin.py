"""The asyncio admin client: topics, producers, groups, transactions, cluster.

Every call retries lost connections and retriable errors until ``default.api.timeout.ms``
(see ``_retry.py``), as Java's AdminClient. Two requests are not idempotent: a CreateTopics
or DeleteTopics whose answer was lost may have been carried out, so the resent request can
answer TOPIC_ALREADY_EXISTS / UNKNOWN_TOPIC_OR_PARTITION; the error then says so.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from samsa.client._admin_configs import (
    AlterConfigOp,
    ConfigAdmin,
    ConfigEntry,
    ConfigResource,
    ConfigSynonym,
)
from samsa.client._admin_groups import GroupAdmin, GroupDescription, GroupListing, GroupMember
from samsa.client._admin_quotas import ClientQuotaEntity, ClientQuotaFilterComponent, QuotaAdmin
from samsa.client._admin_txns import TransactionAdmin
from samsa.client._cluster import Cluster
from samsa.client._config import ADMIN, Config
from samsa.client._errors import KafkaConnectionError, KafkaError
from samsa.client._retry import RetryLater
from samsa.client._types import (
    NewTopic,
    PartitionMetadata,
    ProducerInfo,
    TopicMetadata,
    TopicPartition,
    TransactionDescription,
    TransactionListing,
)
from samsa.protocol.constants import LATEST
from samsa.protocol.errors import ErrorCode
from samsa.protocol.messages import ApiKey, api_name, make_request

# The records of the collaborators' calls are the admin API's too.
__all__ = [
    "AlterConfigOp",
    "AsyncAdmin",
    "ClientQuotaEntity",
    "ClientQuotaFilterComponent",
    "ConfigEntry",
    "ConfigResource",
    "ConfigSynonym",
    "DeletedRecords",
    "FeatureMetadata",
    "FeatureUpdate",
    "GroupDescription",
    "GroupListing",
    "GroupMember",
    "UpgradeType",
]


@dataclass(frozen=True, slots=True)
class DeletedRecords:
    """A partition's answer to DeleteRecords: its new log start offset, or its error."""

    low_watermark: int
    error: KafkaError | None = None


class UpgradeType(enum.IntEnum):
    """How an UpdateFeatures change may move a level (Java's ``FeatureUpdate.UpgradeType``)."""

    UPGRADE = 1
    SAFE_DOWNGRADE = 2  # refused if metadata would be lost
    UNSAFE_DOWNGRADE = 3


@dataclass(frozen=True, slots=True)
class FeatureUpdate:
    """One feature's new level (Java's ``FeatureUpdate``); level 0 disables the feature."""

    level: int
    upgrade_type: UpgradeType = UpgradeType.UPGRADE


@dataclass(frozen=True, slots=True)
class FeatureMetadata:
    """ApiVersions v3+'s features (Java's ``FeatureMetadata``): the finalized level of each
    enabled feature (Kafka 4 finalizes one level: min = max), their epoch (None when the
    broker reports none) and the level range this broker supports."""

    finalized: Mapping[str, int]
    finalized_epoch: int | None
    supported: Mapping[str, tuple[int, int]]


class AsyncAdmin:
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = c = Config(ADMIN, config)
        self.request_timeout = c.seconds("request.timeout.ms")
        self.api_timeout = c.seconds("default.api.timeout.ms")
        self.cluster = Cluster.from_config(c, api_timeout=self.api_timeout)
        # One collaborator per family of calls, sharing the cluster; the methods below that
        # only forward to them keep this the one public admin class.
        self.groups = GroupAdmin(self.cluster, self.api_timeout)
        self.configs = ConfigAdmin(self.cluster, self.api_timeout)
        self.transactions = TransactionAdmin(self.cluster, self.api_timeout)
        self.quotas = QuotaAdmin(self.cluster, self.api_timeout)

    async def start(self) -> None:
        await self.cluster.refresh([])

    async def __aenter__(self) -> AsyncAdmin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.cluster.close()

    async def _controller(self) -> int | None:
        """The controller's node id (None: unknown, any broker will do)."""
        if self.cluster.controller_id < 0 or self.cluster.controller_id not in self.cluster.brokers:
            await self.cluster.refresh([])
        if self.cluster.controller_id in self.cluster.brokers:
            return self.cluster.controller_id
        return None

    async def _controller_call(
        self,
        names: list[str],
        api_key: int,
        versions: tuple[int, int],
        cls: str,
        fields: Any,
        results: Any,
        already_done: int,
    ) -> dict[str, KafkaError | None]:
        """CreateTopics / DeleteTopics to the controller, per name: resent for the names
        that got NOT_CONTROLLER or THROTTLING_QUOTA_EXCEEDED (as Java's AdminClient) or whose
        answer was lost. ``already_done`` is the code a resent request may get for a name
        the lost attempt handled; it is reported with that explanation."""
        out: dict[str, KafkaError | None] = {}
        unknown: set[str] = set()  # sent in an attempt whose answer was lost

        async def attempt() -> None:
            todo = [n for n in names if n not in out]
            try:
                resp = await self.cluster.send(
                    await self._controller(),
                    api_key,
                    versions,
                    cls,
                    lambda v: fields(v, todo),
                )
            except KafkaConnectionError:
                unknown.update(todo)
                raise
            again = 0
            for name, code, message in results(resp):
                if code in (ErrorCode.NOT_CONTROLLER, ErrorCode.THROTTLING_QUOTA_EXCEEDED):
                    again = code
                    continue
                if code == already_done and name in unknown:
                    message = (message + "; " if message else "") + (
                        "an earlier attempt whose answer was lost may have done it"
                    )
                out[name] = KafkaError(code, message) if code else None
            if again:
                raise RetryLater(again, api_name(api_key))

        async def react(exc: KafkaError) -> None:
            if exc.code == ErrorCode.NOT_CONTROLLER:
                await self.cluster.refresh([])

        await self.cluster.retry(attempt, what=api_name(api_key), on_retriable=react)
        return out

    # --- topics ----------------------------------------------------------------------------

    async def create_topics(
        self, topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> dict[str, KafkaError | None]:
        """CreateTopics; maps each name to None (created) or its error."""
        by_name = {t.name: t for t in topics}

        def fields(v: int, names: list[str]) -> dict[str, Any]:
            return {
                "topics": tuple(
                    make_request(
                        ApiKey.CREATE_TOPICS,
                        v,
                        "CreatableTopic",
                        name=t.name,
                        num_partitions=t.num_partitions,
                        replication_factor=t.replication_factor,
                        assignments=(),
                        configs=tuple(
                            make_request(
                                ApiKey.CREATE_TOPICS, v, "CreatableTopicConfig", name=k, value=val
                            )
                            for k, val in t.config.items()
                        ),
                    )
                    for t in (by_name[n] for n in names)
                ),
                "timeout": int(self.request_timeout * 1000),
                "validate_only": validate_only,
            }

        return await self._controller_call(
            list(by_name),
            ApiKey.CREATE_TOPICS,
            (2, 7),
            "CreateTopicsRequest",
            fields,
            lambda resp: [
                (t.name, int(t.error_code), getattr(t, "error_message", None) or "")
                for t in resp.topics
            ],
            ErrorCode.TOPIC_ALREADY_EXISTS,
        )

    async def create_topic(self, name: str, num_partitions: int = 1, **config: str) -> None:
        """Create one topic, raising its error (TOPIC_ALREADY_EXISTS included)."""
        err = (await self.create_topics([NewTopic(name, num_partitions, config=config)]))[name]
        if err is not None:
            raise err
        await self._wait_for_topics([name], present=True)

    async def delete_topics(self, names: Iterable[str]) -> dict[str, KafkaError | None]:
        names = list(dict.fromkeys(names))

        def fields(v: int, todo: list[str]) -> dict[str, Any]:
            return {
                "topic_names": tuple(todo),
                "topics": tuple(
                    make_request(ApiKey.DELETE_TOPICS, v, "DeleteTopicState", name=n, topic_id=None)
                    for n in todo
                ),
                "timeout": int(self.request_timeout * 1000),
            }

        out = await self._controller_call(
            names,
            ApiKey.DELETE_TOPICS,
            (1, 6),
            "DeleteTopicsRequest",
            fields,
            lambda resp: [
                (r.name, int(r.error_code), getattr(r, "error_message", None) or "")
                for r in resp.responses
            ],
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        )
        await self._wait_for_topics([n for n, e in out.items() if e is None], present=False)
        return out

    async def _wait_for_topics(self, names: list[str], *, present: bool) -> None:
        """Metadata may lag a create or delete a little; wait (bounded) until it agrees."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(self.request_timeout, 10.0)
        while names and loop.time() < deadline:
            await self.cluster.refresh(names, timeout=max(0.0, deadline - loop.time()))
            if all((n in self.cluster.topics) == present for n in names):
                return
            await asyncio.sleep(0.05)

    async def list_topics(self, *, internal: bool = False) -> list[str]:
        await self.cluster.refresh(None)
        return sorted(n for n, t in self.cluster.topics.items() if internal or not t.internal)

    async def describe_topics(self, names: Iterable[str] | None = None) -> list[TopicMetadata]:
        wanted = None if names is None else list(names)
        await self.cluster.refresh(wanted)
        out: list[TopicMetadata] = []
        for name in sorted(wanted if wanted is not None else self.cluster.topics):
            info = self.cluster.topics.get(name)
            if info is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name)
            out.append(
                TopicMetadata(
                    name,
                    tuple(
                        PartitionMetadata(p.partition, p.leader, p.replicas, p.isr, p.error)
                        for _, p in sorted(info.partitions.items())
                    ),
                    str(info.topic_id) if info.topic_id else None,
                    info.internal,
                    info.error,
                )
            )
        return out

    async def list_offsets(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], timestamp: int = LATEST
    ) -> dict[TopicPartition, int]:
        """ListOffsets for each partition at its leader: ``LATEST`` (-1) the log end offset,
        ``EARLIEST`` (-2) the log start offset, else the first offset at or after a
        timestamp (-1 in the result: none)."""
        tps = list(dict.fromkeys(TopicPartition(*tp) for tp in partitions))
        await self._known(tps)
        return await self.cluster.list_offsets(tps, timestamp)

    async def _known(
        self, tps: list[TopicPartition], *, errors_in_result: bool = False
    ) -> dict[TopicPartition, KafkaError]:
        """The metadata of ``tps`` refreshed; a partition that does not exist raises (or with
        ``errors_in_result`` is returned with its error)."""
        out: dict[TopicPartition, KafkaError] = {}
        await self.cluster.refresh(sorted({tp.topic for tp in tps}))
        for tp in tps:
            info = self.cluster.topics.get(tp.topic)
            if info is None or tp.partition not in info.partitions:
                err = KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp.topic}-{tp.partition}")
                if not errors_in_result:
                    raise err
                out[tp] = err
        return out

    # --- configs, partitions, records ------------------------------------------------------

    async def create_partitions(
        self, new_counts: dict[str, int], *, validate_only: bool = False
    ) -> dict[str, KafkaError | None]:
        """CreatePartitions: grow each topic to ``new_counts[topic]`` partitions; maps each
        topic to None (done) or its error (INVALID_PARTITIONS when the count would not grow)."""

        def fields(v: int, names: list[str]) -> dict[str, Any]:
            return {
                "topics": tuple(
                    make_request(
                        ApiKey.CREATE_PARTITIONS,
                        v,
                        "CreatePartitionsTopic",
                        name=n,
                        count=new_counts[n],
                        assignments=None,
                    )
                    for n in names
                ),
                "timeout": int(self.request_timeout * 1000),
                "validate_only": validate_only,
            }

        out = await self._controller_call(
            list(new_counts),
            ApiKey.CREATE_PARTITIONS,
            (0, 3),
            "CreatePartitionsRequest",
            fields,
            lambda resp: [
                (r.name, int(r.error_code), getattr(r, "error_message", None) or "")
                for r in resp.results
            ],
            ErrorCode.INVALID_PARTITIONS,
        )
        done = [n for n, e in out.items() if e is None and not validate_only]
        await self._wait_for_partitions({n: new_counts[n] for n in done})
        return out

    async def _wait_for_partitions(self, counts: dict[str, int]) -> None:
        """Metadata may lag a CreatePartitions a little; wait (bounded) until it agrees."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(self.request_timeout, 10.0)
        names = list(counts)
        while names and loop.time() < deadline:
            await self.cluster.refresh(names, timeout=max(0.0, deadline - loop.time()))
            topics = self.cluster.topics
            if all(n in topics and len(topics[n].partitions) >= c for n, c in counts.items()):
                return
            await asyncio.sleep(0.05)

    async def delete_records(
        self, offsets: dict[TopicPartition, int]
    ) -> dict[TopicPartition, DeletedRecords]:
        """DeleteRecords at each partition's leader: records below ``offsets[tp]`` (-1: the
        high watermark) go; each partition gets its new low watermark or its error
        (OFFSET_OUT_OF_RANGE beyond the high watermark, POLICY_VIOLATION on a compacted
        topic, ...)."""
        wanted = {TopicPartition(*tp): int(o) for tp, o in offsets.items()}
        k = ApiKey.DELETE_RECORDS

        def fields(v: int, topics: dict[str, list[int]]) -> dict[str, Any]:
            return {
                "topics": tuple(
                    make_request(
                        k,
                        v,
                        "DeleteRecordsTopic",
                        name=t,
                        partitions=tuple(
                            make_request(
                                k,
                                v,
                                "DeleteRecordsPartition",
                                partition_index=p,
                                offset=wanted[TopicPartition(t, p)],
                            )
                            for p in ps
                        ),
                    )
                    for t, ps in topics.items()
                ),
                "timeout": int(self.request_timeout * 1000),
            }

        unknown = await self._known(list(wanted), errors_in_result=True)
        found: dict[TopicPartition, Any] = dict(unknown)
        found |= await self.cluster.leader_call(
            [tp for tp in wanted if tp not in unknown],
            k,
            (0, 2),
            "DeleteRecordsRequest",
            fields,
            lambda resp: [
                (
                    TopicPartition(t.name, int(p.partition_index)),
                    int(p.error_code),
                    int(p.low_watermark),
                )
                for t in resp.topics
                for p in t.partitions
            ],
            errors_in_result=True,
        )
        return {
            tp: DeletedRecords(-1, v) if isinstance(v, KafkaError) else DeletedRecords(int(v))
            for tp, v in found.items()
        }

    # --- groups, configs, producers and transactions (forwarded) ----------------------------

    async def list_groups(self) -> list[GroupListing]:
        return await self.groups.list_groups()

    async def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        return await self.groups.describe_groups(group_ids)

    async def list_group_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        return await self.groups.list_group_offsets(group_id)

    async def describe_configs(
        self, resources: Iterable[ConfigResource], *, include_synonyms: bool = True
    ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        return await self.configs.describe_configs(resources, include_synonyms=include_synonyms)

    async def incremental_alter_configs(
        self, changes: dict[ConfigResource, Iterable[AlterConfigOp]], *, validate_only: bool = False
    ) -> dict[ConfigResource, KafkaError | None]:
        return await self.configs.incremental_alter_configs(changes, validate_only=validate_only)

    async def alter_configs(
        self, configs: dict[ConfigResource, dict[str, str]], *, validate_only: bool = False
    ) -> dict[ConfigResource, KafkaError | None]:
        return await self.configs.alter_configs(configs, validate_only=validate_only)

    async def describe_client_quotas(
        self, components: Iterable[ClientQuotaFilterComponent] = (), *, strict: bool = False
    ) -> dict[ClientQuotaEntity, dict[str, float]]:
        return await self.quotas.describe_client_quotas(components, strict=strict)

    async def alter_client_quotas(
        self,
        alterations: Mapping[ClientQuotaEntity, Mapping[str, float | None]],
        *,
        validate_only: bool = False,
    ) -> dict[ClientQuotaEntity, KafkaError | None]:
        return await self.quotas.alter_client_quotas(alterations, validate_only=validate_only)

    async def describe_producers(
        self, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, list[ProducerInfo]]:
        return await self.transactions.describe_producers(partitions)

    async def abort_transaction(
        self, tp: TopicPartition, producer_id: int, producer_epoch: int, coordinator_epoch: int
    ) -> None:
        await self.transactions.abort_transaction(
            tp, producer_id, producer_epoch, coordinator_epoch
        )

    async def list_transactions(
        self, *, states: Iterable[str] = (), producer_ids: Iterable[int] = ()
    ) -> list[TransactionListing]:
        return await self.transactions.list_transactions(states=states, producer_ids=producer_ids)

    async def describe_transactions(
        self, transactional_ids: Iterable[str]
    ) -> dict[str, TransactionDescription]:
        return await self.transactions.describe_transactions(transactional_ids)

    # --- features --------------------------------------------------------------------------

    async def describe_features(self) -> FeatureMetadata:
        """The cluster's features, from ApiVersions v3+ sent to any broker (as Java's
        ``describeFeatures``); v4 also lists supported features whose minimum is 0."""

        async def attempt() -> FeatureMetadata:
            resp = await self.cluster.send(
                None,
                ApiKey.API_VERSIONS,
                (3, 4),
                "ApiVersionsRequest",
                lambda v: {"client_software_name": "samsa", "client_software_version": "0.1"},
            )
            if resp.error_code:
                raise KafkaError(int(resp.error_code), "ApiVersions")
            epoch = int(resp.finalized_features_epoch)
            return FeatureMetadata(
                {str(f.name): int(f.max_version_level) for f in resp.finalized_features},
                epoch if epoch >= 0 else None,
                {
                    str(f.name): (int(f.min_version), int(f.max_version))
                    for f in resp.supported_features
                },
            )

        return await self.cluster.retry(attempt, what="DescribeFeatures")

    async def update_features(
        self, updates: Mapping[str, FeatureUpdate], *, validate_only: bool = False
    ) -> None:
        """UpdateFeatures to the controller: all updates are applied or none. A refusal
        raises KafkaError with the broker's message (INVALID_UPDATE_VERSION for a level the
        broker will not take, CLUSTER_AUTHORIZATION_FAILED without Alter on the cluster)."""
        if not updates:
            raise ValueError("update_features needs at least one feature update")
        for name, u in updates.items():
            if not name:
                raise ValueError("a feature name cannot be empty")
            if u.level < 0:
                raise ValueError(f"feature {name}: level {u.level} is below 0")

        def fields(v: int) -> dict[str, Any]:
            # v0 can say neither; sending it anyway would do something else than asked
            unsafe = any(u.upgrade_type == UpgradeType.UNSAFE_DOWNGRADE for u in updates.values())
            if v == 0 and (unsafe or validate_only):
                raise KafkaError(
                    ErrorCode.UNSUPPORTED_VERSION,
                    "UpdateFeatures v0 has no unsafe downgrade and no validate_only",
                )
            return {
                "timeout": int(self.request_timeout * 1000),
                "feature_updates": tuple(
                    make_request(
                        ApiKey.UPDATE_FEATURES,
                        v,
                        "FeatureUpdateKey",
                        feature=name,
                        max_version_level=u.level,
                        allow_downgrade=u.upgrade_type != UpgradeType.UPGRADE,
                        upgrade_type=int(u.upgrade_type),
                    )
                    for name, u in updates.items()
                ),
                "validate_only": validate_only,
            }

        async def attempt() -> None:
            resp = await self.cluster.send(
                await self._controller(),
                ApiKey.UPDATE_FEATURES,
                (0, 2),
                "UpdateFeaturesRequest",
                fields,
            )
            if resp.error_code:
                raise KafkaError(int(resp.error_code), resp.error_message or "UpdateFeatures")
            for r in getattr(resp, "results", ()):  # v0-1 answer per feature
                if r.error_code:
                    raise KafkaError(int(r.error_code), f"{r.feature}: {r.error_message or ''}")

        async def react(exc: KafkaError) -> None:
            if exc.code == ErrorCode.NOT_CONTROLLER:
                await self.cluster.refresh([])

        await self.cluster.retry(attempt, what="UpdateFeatures", on_retriable=react)

    # --- cluster ---------------------------------------------------------------------------

    async def describe_cluster(self) -> dict[str, Any]:
        await self.cluster.refresh([])
        return {
            "cluster_id": self.cluster.cluster_id,
            "controller_id": self.cluster.controller_id,
            "brokers": [
                {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
                for b in self.cluster.brokers.values()
            ],
        }
