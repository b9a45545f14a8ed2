"""A durable producer-id allocator (rule 9): ids are never handed out twice.

Ids are taken in blocks (Kafka's controller hands out blocks of 1000 the same way). Before
the first id of a block is used, the block's end is written to ``producer-ids`` and
fsynced, so after any crash the allocator resumes past every id it may have handed out.
A crash wastes at most the rest of one block, which is fine: 2**63 ids.
"""

from __future__ import annotations

from pathlib import Path

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
            text = self._path.read_text().strip()
        except FileNotFoundError:
            return 0
        try:
            value = int(text)
        except ValueError:
            raise RuntimeError(
                f"{self._path} is corrupt ({text!r}); refusing to risk reusing producer ids"
            ) from None
        if value < 0:
            raise RuntimeError(f"{self._path} holds a negative producer id block end")
        return value

    def _reserve_block(self) -> None:
        end = self._block_end + self._block_size
        write_durably(self._path, f"{end}\n")
        self._block_end = end

    def allocate(self) -> int:
        if self._next >= self._block_end:
            self._reserve_block()
        pid = self._next
        self._next += 1
        return pid
