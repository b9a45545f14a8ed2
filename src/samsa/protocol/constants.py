"""Wire values that every layer names: the isolation levels of Fetch and ListOffsets, and
the special timestamps of ListOffsets. Defined once here (protocol/ may be imported by
every part of samsa) rather than re-typed next to each use.

This module is pure.
"""

from __future__ import annotations

READ_UNCOMMITTED = 0
READ_COMMITTED = 1  # only what is below the last stable offset, aborted transactions marked
LATEST = -1  # ListOffsets timestamp: the log end offset (the last stable one, read_committed)
EARLIEST = -2  # ListOffsets timestamp: the log start offset
