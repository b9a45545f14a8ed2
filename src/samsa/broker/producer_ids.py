"""A durable producer-id allocator (rule 9): ids are never handed out twice.

Ids are taken in blocks (Kafka's controller hands out blocks of 1000 the same way). Before
the first id of a block is used, the block's end is written to ``producer-ids`` and
fsynced, so after any crash the allocator resumes past every id it may have handed out.
A crash wastes at most the rest of one block, which is fine: 2**63 ids.

The file carries a CRC-32C of the number (``<end> <crc hex>``): one flipped digit would
otherwise turn it into a smaller valid number and hand out ids again. A file that fails the
check (or does not parse) stops the broker with an error rather than guess; a file of the
number alone (written before the checksum) is read as it is.
"""

from __future__ import annotations

from pathlib import Path

import crc32c

from samsa.log.durable import write_durably

BLOCK_SIZE = 1000


class ProducerIdAllocator:
    def __init__(self, data_dir: Path, block_size: int = BLOCK_SIZE) -> None:
        self._path = data_dir / "producer-ids"
        self._block_size = block_size
        self._next = self._read_reserved_end()
        self._block_end = self._next  # nothing reserved in this run yet

    def _read_reserved_end(self) -> int:
        try:
            text = self._path.read_bytes().decode("ascii", "replace").strip()
        except FileNotFoundError:
            return 0
        number, _, checksum = text.partition(" ")
        try:
            value = int(number)
            if checksum and int(checksum, 16) != _checksum(number):
                raise ValueError("checksum mismatch")
        except ValueError as exc:
            raise RuntimeError(
                f"{self._path} is corrupt ({text!r}: {exc}); refusing to risk reusing producer "
                "ids (an operator may write a number past every id ever handed out)"
            ) from None
        if value < 0:
            raise RuntimeError(f"{self._path} holds a negative producer id block end")
        return value

    def _reserve_block(self) -> None:
        end = self._block_end + self._block_size
        write_durably(self._path, f"{end} {_checksum(str(end)):08x}\n")
        self._block_end = end

    def issued(self, producer_id: int) -> bool:
        """Whether ``producer_id`` may have been handed out: below every id of this run and
        every block reserved before it (a crash may have lost which of those were used)."""
        return 0 <= producer_id < self._next

    def allocate(self) -> int:
        if self._next >= self._block_end:
            self._reserve_block()
        pid = self._next
        self._next += 1
        return pid


def _checksum(number: str) -> int:
    return int(crc32c.crc32c(number.encode()))
