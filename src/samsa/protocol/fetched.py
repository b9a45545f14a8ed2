"""Which batches of a fetched partition hand out records: one selection for every decoder.

A Fetch response carries, per partition, whole record batches (and often a partial one at
the end, cut by the fetch size) from the fetch offset on, and with ``read_committed`` the
aborted transactions of the range. :class:`KeptBatches` walks them as Kafka's
``CompletedFetch`` does and yields the data batches whose records are to be handed out:

* batches ending before the position are skipped (a fetch may start inside a batch; the
  decoder drops the records below the position of the first one it keeps);
* each kept batch must have magic 2 and, with ``check_crcs``, a valid CRC-32C (the CRC does
  not cover the magic byte, so a damaged one is caught on its own);
* with ``READ_COMMITTED``, a producer id becomes aborted when a batch at or after its first
  offset is reached, its transactional batches are skipped until its ABORT marker, and the
  marker clears it again;
* control batches are never handed out.

``next_offset`` follows: past each skipped batch at once, past a kept batch once the caller
asks for the next one, so a caller that stops early (a record limit) keeps the position
after what it took. Bad bytes raise :class:`InvalidBatchError`.

This module is pure.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from samsa.protocol.constants import READ_COMMITTED, READ_UNCOMMITTED
from samsa.protocol.errors import ErrorCode
from samsa.protocol.records import (
    HEADER_SIZE,
    MAGIC_V2,
    MIN_BATCH_LENGTH,
    ControlType,
    InvalidBatchError,
    RecordBatchView,
    control_type_of,
    decompress,
)


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int


def corrupt(message: str) -> InvalidBatchError:
    return InvalidBatchError(ErrorCode.CORRUPT_MESSAGE, message)


def whole_batches(buf: memoryview, name: str) -> Iterator[RecordBatchView]:
    """The whole batches of ``buf``; a partial one at the end is normal (the fetch size cut
    it), a length shorter than a batch header is not (it would walk backwards)."""
    pos, end = 0, len(buf)
    while end - pos >= HEADER_SIZE:
        view = RecordBatchView(buf, pos)
        if view.batch_length < MIN_BATCH_LENGTH:
            raise corrupt(f"{name} at byte {pos}: batch length {view.batch_length}")
        if pos + view.size > end:
            return
        yield view
        pos += view.size


def _first_and_producer(txn: Any) -> tuple[int, int]:
    """(first offset, producer id) of an aborted transaction given as a (producer id, first
    offset) pair or as an object with those attributes (kio's, :class:`AbortedTxn`)."""
    if hasattr(txn, "producer_id"):
        return int(txn.first_offset), int(txn.producer_id)
    pid, first = txn
    return int(first), int(pid)


class KeptBatches:
    """The data batches of one fetched partition to hand records from (see the module)."""

    def __init__(
        self,
        data: bytes | bytearray | memoryview | None,
        position: int,
        *,
        name: str,
        isolation_level: int = READ_UNCOMMITTED,
        aborted: Iterable[Any] = (),
        check_crcs: bool = True,
    ) -> None:
        self.data = memoryview(data or b"").cast("B")
        self.position = position
        self.next_offset = position  # after what was kept (once past it) or skipped
        self.name = name
        self.read_committed = isolation_level == READ_COMMITTED
        self.aborted = [_first_and_producer(a) for a in aborted]
        self.check_crcs = check_crcs

    def __iter__(self) -> Iterator[RecordBatchView]:
        pending = self.aborted[:]
        heapq.heapify(pending)
        aborted_pids: set[int] = set()
        for batch in whole_batches(self.data, self.name):
            if batch.next_offset <= self.position:
                continue
            where = f"{self.name} at offset {batch.base_offset}"
            if batch.magic != MAGIC_V2:
                raise InvalidBatchError(
                    ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT, f"{where}: magic {batch.magic}"
                )
            if self.check_crcs and not batch.crc_is_valid():
                raise corrupt(f"{where}: record batch CRC-32C mismatch")
            if self.read_committed and batch.has_producer_id:
                while pending and pending[0][0] <= batch.last_offset:
                    aborted_pids.add(heapq.heappop(pending)[1])
                if batch.is_control:
                    if control_type_of(batch) == ControlType.ABORT:
                        aborted_pids.discard(batch.producer_id)
                elif batch.is_transactional and batch.producer_id in aborted_pids:
                    self.next_offset = batch.next_offset
                    continue
            if batch.is_control:
                self.next_offset = batch.next_offset
                continue
            yield batch
            self.next_offset = batch.next_offset

    def records(self, batch: RecordBatchView) -> bytes | memoryview:
        """One kept batch's records section, inflated if it is compressed; a batch its codec
        cannot read is corrupt."""
        section = self.data[batch.pos + HEADER_SIZE : batch.pos + batch.size]
        if not batch.compression:
            return section
        try:
            return decompress(batch.compression, section)
        except Exception as exc:  # cramjam's errors, an unknown codec
            where = f"{self.name} at offset {batch.base_offset}"
            raise corrupt(f"{where}: cannot decompress the batch ({exc})") from None
