"""One module per Kafka API; each handler translates a request into domain calls.

The table below is what ApiVersions advertises. Version ranges cover what today's clients
negotiate (confluent-kafka 2.16, kafka-python 3.0, aiokafka 0.14), bounded by what kio's
schemas define.
"""

from __future__ import annotations

from samsa.broker.handlers import (
    add_offsets_to_txn,
    add_partitions_to_txn,
    alter_client_quotas,
    alter_configs,
    alter_partition_reassignments,
    alter_share_group_offsets,
    alter_user_scram_credentials,
    api_versions,
    consumer_group_describe,
    consumer_group_heartbeat,
    create_acls,
    create_partitions,
    create_topics,
    delete_acls,
    delete_groups,
    delete_records,
    delete_share_group_offsets,
    delete_topics,
    describe_acls,
    describe_client_quotas,
    describe_cluster,
    describe_configs,
    describe_groups,
    describe_log_dirs,
    describe_producers,
    describe_share_group_offsets,
    describe_topic_partitions,
    describe_transactions,
    describe_user_scram_credentials,
    elect_leaders,
    end_txn,
    fetch,
    find_coordinator,
    get_telemetry_subscriptions,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    join_group,
    leave_group,
    list_config_resources,
    list_groups,
    list_offsets,
    list_partition_reassignments,
    list_transactions,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    offset_for_leader_epoch,
    produce,
    push_telemetry,
    sasl_authenticate,
    sasl_handshake,
    share_acknowledge,
    share_fetch,
    share_group_describe,
    share_group_heartbeat,
    sync_group,
    txn_offset_commit,
    update_features,
    write_txn_markers,
)
from samsa.broker.handlers._base import Api, RequestContext
from samsa.protocol.messages import ApiKey

APIS: dict[int, Api] = {
    a.key: a
    for a in (
        # v12: transactions v2 (rule 36); v13: topics by id (KIP-516).
        Api(ApiKey.PRODUCE, 3, 13, produce.handle),
        # v17-v18 add only followers' tagged fields (KIP-853, KIP-1166): a consumer's is v16's.
        Api(ApiKey.FETCH, 4, 18, fetch.handle),
        Api(ApiKey.LIST_OFFSETS, 1, 11, list_offsets.handle),
        # v2+, as Kafka 4 serves: consumers validate positions with v3+ (KIP-320).
        Api(ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, 4, offset_for_leader_epoch.handle),
        Api(ApiKey.METADATA, 0, 13, metadata.handle),
        Api(ApiKey.API_VERSIONS, 0, 4, api_versions.handle),
        Api(ApiKey.SASL_HANDSHAKE, 0, 1, sasl_handshake.handle),
        Api(ApiKey.SASL_AUTHENTICATE, 0, 2, sasl_authenticate.handle),
        Api(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0, describe_user_scram_credentials.handle),
        Api(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, 0, alter_user_scram_credentials.handle),
        # Client quotas (KIP-546, broker/quotas.py).
        Api(ApiKey.DESCRIBE_CLIENT_QUOTAS, 0, 1, describe_client_quotas.handle),
        Api(ApiKey.ALTER_CLIENT_QUOTAS, 0, 1, alter_client_quotas.handle),
        Api(ApiKey.CREATE_TOPICS, 2, 7, create_topics.handle),
        Api(ApiKey.DELETE_TOPICS, 1, 6, delete_topics.handle),
        Api(ApiKey.INIT_PRODUCER_ID, 0, 6, init_producer_id.handle),  # v6: KIP-939 (rule 37)
        Api(ApiKey.DESCRIBE_CONFIGS, 1, 4, describe_configs.handle),
        Api(ApiKey.ALTER_CONFIGS, 0, 2, alter_configs.handle),
        Api(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1, incremental_alter_configs.handle),
        Api(ApiKey.CREATE_PARTITIONS, 0, 3, create_partitions.handle),
        Api(ApiKey.DELETE_RECORDS, 0, 2, delete_records.handle),
        Api(ApiKey.DESCRIBE_CLUSTER, 0, 2, describe_cluster.handle),  # v2: never a fenced broker
        Api(ApiKey.ELECT_LEADERS, 0, 2, elect_leaders.handle),
        # One broker, one replica per partition: nothing to move (KIP-455, KIP-860).
        Api(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, 1, alter_partition_reassignments.handle),
        Api(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, 0, list_partition_reassignments.handle),
        Api(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, 0, describe_topic_partitions.handle),  # KIP-966
        Api(ApiKey.DESCRIBE_LOG_DIRS, 1, 5, describe_log_dirs.handle),  # v5: never cordoned
        Api(ApiKey.UPDATE_FEATURES, 0, 2, update_features.handle),  # rule 45
        Api(ApiKey.DESCRIBE_PRODUCERS, 0, 0, describe_producers.handle),
        Api(ApiKey.FIND_COORDINATOR, 0, 6, find_coordinator.handle),
        Api(ApiKey.JOIN_GROUP, 0, 9, join_group.handle),
        Api(ApiKey.SYNC_GROUP, 0, 5, sync_group.handle),
        Api(ApiKey.HEARTBEAT, 0, 4, heartbeat.handle),
        Api(ApiKey.LEAVE_GROUP, 0, 5, leave_group.handle),
        # v10: topics by id (KIP-516).
        Api(ApiKey.OFFSET_COMMIT, 2, 10, offset_commit.handle),
        Api(ApiKey.OFFSET_FETCH, 1, 10, offset_fetch.handle),
        Api(ApiKey.LIST_GROUPS, 0, 5, list_groups.handle),
        Api(ApiKey.DESCRIBE_GROUPS, 0, 6, describe_groups.handle),
        Api(ApiKey.DELETE_GROUPS, 0, 2, delete_groups.handle),
        Api(ApiKey.OFFSET_DELETE, 0, 0, offset_delete.handle),
        # Transactions: EndTxn v5 / TxnOffsetCommit v5 are transactions v2 (KIP-890 part 2,
        # rule 36); AddPartitionsToTxn v4+ is Kafka's batched, ClusterAction-only form.
        Api(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 5, add_partitions_to_txn.handle),
        Api(ApiKey.ADD_OFFSETS_TO_TXN, 0, 4, add_offsets_to_txn.handle),
        Api(ApiKey.END_TXN, 0, 5, end_txn.handle),
        Api(ApiKey.TXN_OFFSET_COMMIT, 0, 5, txn_offset_commit.handle),
        # kafka-transactions abort; Kafka 4 serves v1-v2 (v0 went with KIP-896).
        Api(ApiKey.WRITE_TXN_MARKERS, 1, 2, write_txn_markers.handle),
        Api(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0, describe_transactions.handle),
        Api(ApiKey.LIST_TRANSACTIONS, 0, 2, list_transactions.handle),
        # ACLs (rule 33): the versions kio defines, which Kafka 4 also serves.
        Api(ApiKey.DESCRIBE_ACLS, 1, 3, describe_acls.handle),
        Api(ApiKey.CREATE_ACLS, 1, 3, create_acls.handle),
        Api(ApiKey.DELETE_ACLS, 1, 3, delete_acls.handle),
        # KIP-848 consumer groups.
        Api(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, 1, consumer_group_heartbeat.handle),
        Api(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 1, consumer_group_describe.handle),
        # KIP-932 share groups: v1 is the first version Kafka 4.1+ serves.
        Api(ApiKey.SHARE_GROUP_HEARTBEAT, 1, 1, share_group_heartbeat.handle),
        Api(ApiKey.SHARE_GROUP_DESCRIBE, 1, 1, share_group_describe.handle),
        Api(ApiKey.SHARE_FETCH, 1, 1, share_fetch.handle),
        Api(ApiKey.SHARE_ACKNOWLEDGE, 1, 1, share_acknowledge.handle),
        Api(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, 1, describe_share_group_offsets.handle),
        Api(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, 0, alter_share_group_offsets.handle),
        Api(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, 0, delete_share_group_offsets.handle),
        # KIP-714 client telemetry; ListConfigResources v0 is kafka-client-metrics --list.
        Api(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, 0, 0, get_telemetry_subscriptions.handle),
        Api(ApiKey.PUSH_TELEMETRY, 0, 0, push_telemetry.handle),
        Api(ApiKey.LIST_CONFIG_RESOURCES, 0, 1, list_config_resources.handle),
    )
}
api_versions.SUPPORTED.update(APIS)

unsupported_api_versions_response = api_versions.unsupported_version_response

__all__ = ["APIS", "Api", "RequestContext", "unsupported_api_versions_response"]
