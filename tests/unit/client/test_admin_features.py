"""The samsa Admin's describe_features and update_features (rule 45) against a real broker,
in the sync and async forms: levels, epoch, dry run, and refusals raised with the broker's
message."""

from __future__ import annotations

import asyncio

import pytest

from _broker import BrokerProcess
from samsa.client import (
    Admin,
    AsyncAdmin,
    FeatureMetadata,
    FeatureUpdate,
    KafkaError,
    UpgradeType,
)
from samsa.protocol.errors import ErrorCode

TV = "transaction.version"


def test_sync_admin_describes_and_updates_features(broker: BrokerProcess) -> None:
    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        before = admin.describe_features()
        assert isinstance(before, FeatureMetadata)
        assert before.supported == {TV: (0, 2), "group.version": (0, 1)}
        assert before.finalized == {TV: 2, "group.version": 1}
        assert before.finalized_epoch is not None
        epoch = before.finalized_epoch

        down = {TV: FeatureUpdate(1, UpgradeType.SAFE_DOWNGRADE)}
        admin.update_features(down, validate_only=True)  # a dry run changes nothing
        assert admin.describe_features() == before

        admin.update_features(down)
        after = admin.describe_features()
        assert after.finalized[TV] == 1
        assert after.finalized_epoch == epoch + 1

        with pytest.raises(KafkaError, match="without setting the upgrade type") as info:
            admin.update_features({TV: FeatureUpdate(0)})  # a lower level needs a downgrade type
        assert info.value.code == ErrorCode.INVALID_UPDATE_VERSION
        with pytest.raises(KafkaError, match="does not support this feature"):
            admin.update_features({"no.such.feature": FeatureUpdate(1)})
        # all or nothing: the good update next to a refused one is not applied either
        with pytest.raises(KafkaError, match="cannot turn them off"):
            admin.update_features(
                {
                    TV: FeatureUpdate(2),
                    "group.version": FeatureUpdate(0, UpgradeType.UNSAFE_DOWNGRADE),
                }
            )
        assert admin.describe_features() == after

        admin.update_features({TV: FeatureUpdate(2)})
        assert admin.describe_features().finalized[TV] == 2
        with pytest.raises(ValueError, match="at least one"):
            admin.update_features({})


def test_async_admin_round_trip(broker: BrokerProcess) -> None:
    async def run() -> tuple[FeatureMetadata, FeatureMetadata]:
        async with AsyncAdmin({"bootstrap.servers": broker.bootstrap}) as admin:
            await admin.update_features({TV: FeatureUpdate(0, UpgradeType.UNSAFE_DOWNGRADE)})
            first = await admin.describe_features()
            await admin.update_features({TV: FeatureUpdate(1)})
            return first, await admin.describe_features()

    first, second = asyncio.run(run())
    assert TV not in first.finalized  # level 0 is the absence of the feature, as in Kafka
    assert second.finalized[TV] == 1
    assert second.finalized_epoch == (first.finalized_epoch or 0) + 1
