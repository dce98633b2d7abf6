"""A vectorized int64 -> row index: NumPy open addressing with linear probing.

The index holds only ``int32`` row numbers in a power-of-two slot array; keys are compared by
looking them up in the owner's key column (passed in), so the index costs 4 bytes per slot (8-16
bytes per key at a load factor between 1/4 and 1/2). All operations work on whole batches: each
probe round is one NumPy pass over the keys still unresolved, so there is no Python loop per key.
"""

from __future__ import annotations

import numpy as np

from carls_dask.bank.hashing import splitmix64

__all__ = ["KeyIndex"]

EMPTY = np.int32(-1)
TOMBSTONE = np.int32(-2)
_WINDOW = 8
_SINGLE_ROUNDS = 6
_WINDOW_BELOW = 64


class KeyIndex:
    """Open-addressing hash index from int64 keys to int32 row numbers.

    Parameters
    ----------
    capacity
        Number of keys to hold before the first resize.
    max_load
        Largest fraction of slots in use (live or deleted) before the slot array doubles.
    """

    def __init__(self, capacity: int = 1024, max_load: float = 0.5) -> None:
        self.max_load = float(max_load)
        bits = max(4, int(np.ceil(np.log2(max(capacity, 1) / self.max_load))))
        self._alloc(bits)

    def _alloc(self, bits: int) -> None:
        self.bits = bits
        self.slots = np.full(1 << bits, EMPTY, dtype=np.int32)
        self.live = 0
        self.dead = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the slot array."""
        return int(self.slots.nbytes)

    def _home(self, keys: np.ndarray, hashes: np.ndarray | None = None) -> np.ndarray:
        """Home slot of each key: the top ``bits`` bits of ``splitmix64(key)``.

        ``hashes`` (``uint64``, the same ``splitmix64(key)`` the bank's buckets take their low bits
        from) saves recomputing them; buckets use the low bits, so the two stay independent.
        """
        h = splitmix64(keys.view(np.uint64)) if hashes is None else hashes
        return (h >> np.uint64(64 - self.bits)).astype(np.int64)

    def find(self, keys: np.ndarray, key_column: np.ndarray, hashes: np.ndarray | None = None) -> np.ndarray:
        """Row of each key, or -1 where the key is absent.

        Parameters
        ----------
        keys
            ``int64[n]`` keys to look up.
        key_column
            The owner's key of each row (``key_column[row]``).
        hashes
            ``splitmix64(keys)`` when the caller has them already.
        """
        return self.find_slots(keys, key_column, hashes)[1]

    def insert(self, keys: np.ndarray, rows: np.ndarray, key_column: np.ndarray) -> None:
        """Insert keys known to be absent and unique, mapping them to ``rows``.

        ``key_column`` must already hold the new keys at ``rows`` (it is used if the index grows).
        """
        keys = np.asarray(keys, dtype=np.int64)
        if keys.size == 0:
            return
        if (self.live + self.dead + keys.size) > self.max_load * self.slots.size:
            self.rebuild(self.live + keys.size, key_column, extra_rows=None)
        self._place(keys, np.asarray(rows, dtype=np.int32))
        self.live += int(keys.size)

    def _place(self, keys: np.ndarray, rows: np.ndarray) -> None:
        mask = np.int64((1 << self.bits) - 1)
        pos = self._home(keys)
        pending = np.arange(keys.shape[0])
        while pending.size:
            p = pos[pending]
            free = self.slots[p] == EMPTY
            cand = pending[free]
            if cand.size:
                uniq, first = np.unique(p[free], return_index=True)
                winners = cand[first]
                self.slots[uniq] = rows[winners]
                won = np.zeros(keys.shape[0], dtype=bool)
                won[winners] = True
                pending = pending[~won[pending]]
            pos[pending] = (pos[pending] + 1) & mask

    def remove(self, keys: np.ndarray, key_column: np.ndarray) -> np.ndarray:
        """Remove present keys; returns their former rows (-1 for absent keys)."""
        rows = self.find_slots(keys, key_column)
        hit = rows[1] >= 0
        self.slots[rows[0][hit]] = TOMBSTONE
        self.live -= int(hit.sum())
        self.dead += int(hit.sum())
        return rows[1]

    def find_slots(
        self, keys: np.ndarray, key_column: np.ndarray, hashes: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Slot and row of each key (both -1 where absent).

        The first probe looks at each key's home slot; the keys still unresolved then scan windows
        of ``_WINDOW`` consecutive slots at once (see :meth:`_probe`).
        """
        keys = np.asarray(keys, dtype=np.int64)
        slot_out = np.full(keys.shape[0], -1, dtype=np.int64)
        row_out = np.full(keys.shape[0], -1, dtype=np.int64)
        if keys.size == 0 or self.live == 0:
            return slot_out, row_out
        home = self._home(keys, hashes)
        s = self.slots[home]
        match = (s >= 0) & (key_column[np.maximum(s, 0)] == keys)
        slot_out[match] = home[match]
        row_out[match] = s[match]
        rest = np.flatnonzero((s != EMPTY) & ~match)
        if rest.size:
            slot_out[rest], row_out[rest] = self._probe(keys[rest], home[rest] + 1, key_column)
        return slot_out, row_out

    def _probe(self, keys: np.ndarray, start: np.ndarray, key_column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slot and row (-1 where absent) of ``keys``, probing from slot ``start`` on.

        While many keys are unresolved each round probes one slot per key (one key read per key);
        the long tail then scans windows of ``_WINDOW`` consecutive slots at once, so long probe
        chains cost few NumPy passes.
        """
        mask = np.int64((1 << self.bits) - 1)
        n = keys.shape[0]
        slot_out = np.full(n, -1, dtype=np.int64)
        row_out = np.full(n, -1, dtype=np.int64)
        pending = np.arange(n)
        kp = keys
        start = start & mask
        for _ in range(_SINGLE_ROUNDS):
            if pending.size <= _WINDOW_BELOW:
                break
            s = self.slots[start]
            match = (s >= 0) & (key_column[np.maximum(s, 0)] == kp)
            if match.any():
                slot_out[pending[match]] = start[match]
                row_out[pending[match]] = s[match]
            keep = (s != EMPTY) & ~match
            pending = pending[keep]
            kp = kp[keep]
            start = (start[keep] + 1) & mask
        window = np.arange(_WINDOW, dtype=np.int64)
        while pending.size:
            pos = (start[:, None] + window) & mask
            sw = self.slots[pos]
            hit = (sw >= 0) & (key_column[np.maximum(sw, 0)] == kp[:, None])
            stop = hit | (sw == EMPTY)
            any_stop = stop.any(axis=1)
            first = stop.argmax(axis=1)
            rows_i = np.arange(pending.size)
            found = any_stop & hit[rows_i, first]
            fi = pending[found]
            slot_out[fi] = pos[rows_i[found], first[found]]
            row_out[fi] = sw[rows_i[found], first[found]]
            keep = ~any_stop
            pending = pending[keep]
            kp = kp[keep]
            start = (start[keep] + _WINDOW) & mask
        return slot_out, row_out

    def find_with_rows(
        self, keys: np.ndarray, row_data: np.ndarray, hashes: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``keys`` together with their gathered ``row_data`` (whose column 0 holds the key).

        The key check of the first probe reads the same row the caller needs anyway, so a lookup
        touches each row's cache line once. ``row_data`` rows of absent keys are unspecified.
        """
        keys = np.asarray(keys, dtype=np.int64)
        if keys.size == 0 or self.live == 0:
            return np.full(keys.shape[0], -1, dtype=np.int64), np.zeros((keys.shape[0], *row_data.shape[1:]), row_data.dtype)
        home = self._home(keys, hashes)
        s = self.slots[home].astype(np.int64)
        data = np.take(row_data, np.maximum(s, 0), axis=0)
        hit = (s >= 0) & (data[:, 0] == keys)
        rows = np.where(hit, s, -1)
        rest = np.flatnonzero(~hit & (s != EMPTY))
        if rest.size:
            more = self._probe(keys[rest], home[rest] + 1, row_data[:, 0])[1]
            rows[rest] = more
            ok = more >= 0
            data[rest[ok]] = np.take(row_data, more[ok], axis=0)
        return rows, data

    def set_rows(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Point existing slots at new rows (after rows were moved)."""
        self.slots[np.asarray(slots, dtype=np.int64)] = np.asarray(rows, dtype=np.int32)

    def rebuild(self, n_keys: int, key_column: np.ndarray, extra_rows: np.ndarray | None) -> None:
        """Re-create the slot array sized for ``n_keys`` from the live rows (drops tombstones)."""
        live_rows = self.slots[self.slots >= 0]
        bits = max(4, int(np.ceil(np.log2(max(n_keys, 1) / self.max_load))))
        if (1 << bits) * self.max_load < n_keys:
            bits += 1
        self._alloc(bits)
        if live_rows.size:
            self._place(key_column[live_rows], live_rows.astype(np.int32))
        self.live = int(live_rows.size)

    @classmethod
    def build(cls, key_column: np.ndarray, capacity: int | None = None, max_load: float = 0.5) -> KeyIndex:
        """An index over rows ``0..len(key_column)-1`` (keys must be unique)."""
        n = int(key_column.shape[0])
        idx = cls(max(capacity or 0, n, 1), max_load=max_load)
        if n:
            idx._place(np.asarray(key_column, dtype=np.int64), np.arange(n, dtype=np.int32))
            idx.live = n
        return idx
