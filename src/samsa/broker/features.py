"""The cluster's finalized features (KIP-584) and their changes by UpdateFeatures (rule 45).

Kafka's controller keeps one level per feature, changed by UpdateFeatures and reported by every
ApiVersions v3+ with an epoch that grows at each change. samsa serves two features:

- ``transaction.version`` 0..2 (KIP-890 part 2): 2 lets clients use transactions v2. Its
  initial level is the broker setting of that name; once changed, the finalized level lives in
  ``<data dir>/features.json`` (written atomically before the answer) and wins over the setting.
- ``group.version`` 0..1 (KIP-848): level 1 means the broker serves consumer groups of the
  consumer protocol, which samsa always does, so it is finalized at 1 and cannot be lowered.

``metadata.version`` and ``kraft.version`` describe a KRaft metadata log, which samsa has not:
they are not reported, and updating them is refused as for any unknown feature.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from samsa.log.durable import write_atomically
from samsa.protocol.errors import ErrorCode

FEATURES_FILE = "features.json"
TRANSACTION_VERSION = "transaction.version"
GROUP_VERSION = "group.version"
# name -> (min, max) level this broker supports, reported by ApiVersions v4+.
SUPPORTED: dict[str, tuple[int, int]] = {TRANSACTION_VERSION: (0, 2), GROUP_VERSION: (0, 1)}
# Levels samsa cannot leave, and why (Kafka accepts any supported level).
_FIXED = {
    GROUP_VERSION: (
        1,
        "samsa always serves KIP-848 consumer groups (ConsumerGroupHeartbeat) and cannot "
        "turn them off.",
    )
}
# Kafka's FeatureUpdate.UpgradeType codes.
UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


class FeaturesError(Exception):
    """The features file cannot be read: the broker refuses to start rather than guess."""


@dataclass(frozen=True, slots=True)
class FeatureUpdate:
    name: str
    level: int
    upgrade_type: int  # UPGRADE, SAFE_DOWNGRADE or UNSAFE_DOWNGRADE; anything else is refused


class Features:
    """The finalized levels (a feature at level 0 is absent, as in Kafka) and their epoch."""

    def __init__(self, path: Path, node_id: int, transaction_version: int) -> None:
        self.path = path
        self.node_id = node_id
        self.finalized: dict[str, int] = {TRANSACTION_VERSION: transaction_version}
        self.finalized.update({name: level for name, (level, _) in _FIXED.items()})
        # Kafka's epoch is a metadata log offset; here it counts changes, kept across restarts
        # so that a Java client (which keeps the highest epoch it saw) takes every change.
        self.epoch = 1
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:
            doc = json.loads(self.path.read_text())
            if not isinstance(doc, dict) or doc.get("version") != 1:
                raise ValueError("expected a JSON object with version 1")
            epoch, levels = doc["epoch"], doc["finalized"]
            if not isinstance(epoch, int) or epoch < 1 or not isinstance(levels, dict):
                raise ValueError("expected an epoch >= 1 and a map of finalized levels")
            for name, level in levels.items():
                lo, hi = SUPPORTED.get(name, (0, -1))
                if not isinstance(level, int) or not lo <= level <= hi:
                    raise ValueError(f"unsupported level {level!r} of feature {name!r}")
        except (OSError, ValueError, KeyError) as exc:
            raise FeaturesError(
                f"cannot read the finalized features from {self.path}: {exc}"
            ) from None
        self.finalized.update(levels)
        self.finalized.update({name: level for name, (level, _) in _FIXED.items()})
        self.epoch = epoch

    def level(self, name: str) -> int:
        return self.finalized.get(name, 0)

    def update(
        self, updates: Iterable[FeatureUpdate], validate_only: bool
    ) -> tuple[ErrorCode, str | None]:
        """Check every update, then apply them all or none (as Kafka 4's controller): the
        first refusal is the answer. Applied levels are on disk before this returns."""
        proposed = dict(self.finalized)
        for u in updates:
            reason = self._refusal(u)
            if reason is not None:
                return ErrorCode.INVALID_UPDATE_VERSION, (
                    f"Invalid update version {u.level} for feature {u.name}. {reason}"
                )
            proposed[u.name] = u.level
        if validate_only or proposed == self.finalized:
            return ErrorCode.NONE, None
        doc = {"version": 1, "epoch": self.epoch + 1, "finalized": proposed}
        write_atomically(self.path, json.dumps(doc, indent=1, sort_keys=True).encode())
        self.finalized, self.epoch = proposed, self.epoch + 1
        return ErrorCode.NONE, None

    def _refusal(self, u: FeatureUpdate) -> str | None:
        """Kafka's checks, in its order; None if the update may go ahead."""
        if u.upgrade_type not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
            return "The controller does not support the given upgrade type."
        if u.level < 0:
            return "A feature version cannot be less than 0."
        lo, hi = SUPPORTED.get(u.name, (0, 0))
        if not lo <= u.level <= hi:
            who = f"Local controller {self.node_id}"
            if hi == 0:
                return f"{who} does not support this feature."
            return f"{who} only supports versions {lo}-{hi}"
        current = self.level(u.name)
        if u.level < current and u.upgrade_type == UPGRADE:
            return (
                "Can't downgrade the version of this feature without setting the upgrade type "
                "to either safe or unsafe downgrade."
            )
        if u.level > current and u.upgrade_type != UPGRADE:
            return "Can't downgrade to a newer version."
        fixed = _FIXED.get(u.name)
        if fixed is not None and u.level != fixed[0]:
            return fixed[1]
        return None
