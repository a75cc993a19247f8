"""De-duplication within one input: the task ids seen so far, in 16 bytes each."""

from __future__ import annotations

from array import array


class FingerprintSet:
    """A set of 64-bit fingerprints in one flat array: 16 bytes per entry instead of ~80 in a ``set``.

    Open addressing with linear probing over uniformly random keys (a sha256 prefix), kept at
    most half full. One million URLs cost 16 MiB; two different task ids share a 64-bit prefix
    with a probability of about 3e-8 in such a run.
    """

    def __init__(self, capacity: int = 1 << 16) -> None:
        size = 1 << max(capacity - 1, 1).bit_length()
        self._table = array("Q", bytes(8 * size))
        self._mask = size - 1
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, key: int) -> bool:
        """Add ``key``; True when it was not there yet."""
        key = key or 1  # 0 marks an empty slot
        table, mask = self._table, self._mask
        i = key & mask
        while True:
            current = table[i]
            if current == 0:
                table[i] = key
                self._count += 1
                if self._count * 2 > mask:
                    self._grow()
                return True
            if current == key:
                return False
            i = (i + 1) & mask

    def _grow(self) -> None:
        old = self._table
        self._table = array("Q", bytes(16 * len(old)))
        self._mask = len(self._table) - 1
        self._count = 0
        for key in old:
            if key:
                self.add(key)
