"""The group memberships' state tables: a rejoin is asked for only by a member holding a
generation, and a state no path of the protocol reaches is refused loudly."""

from __future__ import annotations

import pytest

from samsa.client import AsyncConsumer
from samsa.client._membership import (
    ClassicMembership,
    ClassicState,
    ConsumerProtocolMembership,
    ConsumerState,
)


def test_classic_member_without_a_generation_cannot_become_stable() -> None:
    m = AsyncConsumer({"group.id": "g"}).membership
    assert isinstance(m, ClassicMembership) and m.state is ClassicState.UNJOINED
    m.request_rejoin()  # nothing held: stays unjoined (joins anyway when subscribed)
    assert m.state is ClassicState.UNJOINED and m.needs_join
    with pytest.raises(RuntimeError, match="UNJOINED -> STABLE"):
        m._to(ClassicState.STABLE)  # only a SyncGroup answer after a JoinGroup gets there
    m._to(ClassicState.COMPLETING_REBALANCE)
    m._to(ClassicState.STABLE)
    m.request_rejoin()
    assert m.state is ClassicState.REJOIN_NEEDED and m.needs_join


def test_consumer_protocol_member_joins_through_an_epoch() -> None:
    m = AsyncConsumer({"group.id": "g", "group.protocol": "consumer"}).membership
    assert isinstance(m, ConsumerProtocolMembership) and m.state is ConsumerState.UNJOINED
    with pytest.raises(RuntimeError, match="UNJOINED -> STABLE"):
        m._to(ConsumerState.STABLE)  # a heartbeat must have given it an epoch first
    m._to(ConsumerState.JOINING)
    m._to(ConsumerState.STABLE)
    assert not m.needs_join
