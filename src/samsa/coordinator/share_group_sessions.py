"""Share sessions (KIP-932): what a share consumer fetches from one broker, and the epochs of
its ShareFetch / ShareAcknowledge requests. Pure: no I/O, no clock.

A session is keyed by (group, member). Epoch 0 opens it (replacing an older one of the
member), -1 closes it (the last acknowledgements, and the member's acquired records go back),
and every other request must carry the epoch the session expects next, which then moves on
(1, 2, ..., wrapping to 1 as Kafka's ``ShareRequestMetadata.nextEpoch``). A fetch adds its
partitions to the session and drops the forgotten ones. Bounded: at most ``max_sessions``
sessions on the broker (``group.share.max.share.sessions``), else SHARE_SESSION_LIMIT_REACHED.
A session also closes when the connection that opened it does (:meth:`close_connection`) and
when its member leaves the share group or is expired from it: the broker then releases what
the member held, so nothing stays locked for a consumer that is gone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from samsa.protocol.errors import ErrorCode

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
_MAX_EPOCH = 2**31 - 1

SharePartitionKey = tuple[uuid.UUID, int]  # topic id, partition


def next_epoch(epoch: int) -> int:
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == _MAX_EPOCH else epoch + 1


@dataclass(slots=True)
class ShareSession:
    group_id: str
    member_id: str
    epoch: int = 1  # the epoch the next request must carry
    partitions: dict[SharePartitionKey, None] = field(default_factory=dict)  # ordered set
    connection: str = ""  # the client connection that opened it (its peer address)


@dataclass(frozen=True, slots=True)
class SessionContext:
    """What one request may do: its error (none: go on), the session it runs in (None for a
    final request, whose session is already gone), and whether it closes the session."""

    error: ErrorCode
    session: ShareSession | None = None
    closing: bool = False


class ShareSessionCache:
    def __init__(self, max_sessions: int = 2000) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[tuple[str, str], ShareSession] = {}
        # The sessions each connection opened: a disconnect (every client's, share consumer
        # or not) looks up its own instead of scanning every session.
        self._by_connection: dict[str, dict[tuple[str, str], None]] = {}  # ordered sets

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, group_id: str, member_id: str) -> ShareSession | None:
        return self._sessions.get((group_id, member_id))

    def for_fetch(
        self,
        group_id: str,
        member_id: str,
        epoch: int,
        added: Iterable[SharePartitionKey],
        forgotten: Iterable[SharePartitionKey],
        connection: str = "",
    ) -> SessionContext:
        """ShareFetch: open, use or close the member's session."""
        key = (group_id, member_id)
        if epoch == INITIAL_EPOCH:
            if key not in self._sessions and len(self._sessions) >= self.max_sessions:
                return SessionContext(ErrorCode.SHARE_SESSION_LIMIT_REACHED)
            self._drop(key)
            session = self._sessions[key] = ShareSession(group_id, member_id, connection=connection)
            self._by_connection.setdefault(connection, {})[key] = None
        else:
            context = self._advance(key, epoch)
            if context.error != ErrorCode.NONE or context.closing:
                return context
            assert context.session is not None
            session = context.session
        for tp in forgotten:
            session.partitions.pop(tp, None)
        for tp in added:
            session.partitions[tp] = None
        return SessionContext(ErrorCode.NONE, session)

    def for_acknowledge(self, group_id: str, member_id: str, epoch: int) -> SessionContext:
        """ShareAcknowledge: needs an open session (epoch 0 opens none)."""
        if epoch == INITIAL_EPOCH:
            return SessionContext(ErrorCode.INVALID_SHARE_SESSION_EPOCH)
        return self._advance((group_id, member_id), epoch)

    def _advance(self, key: tuple[str, str], epoch: int) -> SessionContext:
        session = self._sessions.get(key)
        if session is None:
            return SessionContext(ErrorCode.SHARE_SESSION_NOT_FOUND)
        if epoch == FINAL_EPOCH:
            self._drop(key)
            return SessionContext(ErrorCode.NONE, session, closing=True)
        if epoch != session.epoch:
            return SessionContext(ErrorCode.INVALID_SHARE_SESSION_EPOCH)
        session.epoch = next_epoch(session.epoch)
        return SessionContext(ErrorCode.NONE, session)

    def close_member(self, group_id: str, member_id: str) -> bool:
        return self._drop((group_id, member_id)) is not None

    def close_connection(self, connection: str) -> list[tuple[str, str]]:
        """The client connection is gone: the sessions it opened close, as Kafka's cache does
        on a disconnect (a session opened again from another connection is not its own any
        more). Returns their (group, member) keys."""
        gone = list(self._by_connection.pop(connection, ()))
        for key in gone:
            del self._sessions[key]
        return gone

    def _drop(self, key: tuple[str, str]) -> ShareSession | None:
        session = self._sessions.pop(key, None)
        if session is not None:
            keys = self._by_connection.get(session.connection)
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self._by_connection[session.connection]
        return session
