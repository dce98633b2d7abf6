"""A vectorized int64 -> row index: NumPy open addressing with linear probing and hash tags.

Each slot is one ``uint64``: the low 32 bits hold the row (``int32``; -1 empty, -2 deleted), the high
32 bits a *tag*, the low 32 bits of ``splitmix64(key)``. The home slot of a key is taken from the top
bits of the same hash, so the tag is independent of it. Probing past the home slot compares tags only:
a window of consecutive slots is one contiguous read, and the owner's key column (passed in) is read
just once per key, for the row whose tag matched. The index costs 8 bytes per slot (16-32 bytes per key
at a load factor between 1/4 and 1/2). All operations work on whole batches: each probe round is one
NumPy pass over the keys still unresolved, so there is no Python loop per key.

When numba is installed, finding and placing keys run as compiled loops instead, with no temporary
arrays: a find reads every key's home slot first and checks the rows after, so that the cache misses
of different keys overlap instead of waiting on one another; the NumPy rounds are the fallback and give
the same answers.
"""

from __future__ import annotations

import sys

import numpy as np

from carls_dask.bank.hashing import bucket_of_hash, splitmix64
from carls_dask.bank.jit import numba

__all__ = ["KeyIndex"]

EMPTY = np.int32(-1)
TOMBSTONE = np.int32(-2)
_LOW = np.uint64(0xFFFFFFFF)
_HIGH = np.uint64(0xFFFFFFFF00000000)
_EMPTY_SLOT = np.uint64(0xFFFFFFFF)  # row -1, tag 0
_TOMBSTONE_ROW = np.uint64(0xFFFFFFFE)
_32 = np.uint64(32)
#: Position of the row half of a slot in its ``int32`` view.
_ROW = 0 if sys.byteorder == "little" else 1
#: Slots compared per key and round once the home slot did not hold the key.
_WINDOW = 8

if numba is not None:

    @numba.njit(cache=True, nogil=True)
    def _probe_compiled(table, shift, mask, h, key, key_column):
        # slot and row of one key from its home slot on; (-1, -1) at the first empty slot
        low = np.uint64(0xFFFFFFFF)
        pos = np.int64(h >> shift)
        tag = h & low
        while True:
            s = table[pos]
            r = np.int64(np.int32(np.uint32(s & low)))
            if r == -1:
                return np.int64(-1), np.int64(-1)
            if r >= 0 and (s >> np.uint64(32)) == tag and key_column[r] == key:
                return pos, r
            pos = (pos + 1) & mask

    @numba.njit(cache=True, nogil=True, inline="always")
    def _settle(table, shift, mask, h, key, key_column, home, s):
        # slot and row of a key whose home slot ``home`` holds ``s``: the home slot's row when it is the key's,
        # (-1, -1) when the home slot is empty, else probed on
        low = np.uint64(0xFFFFFFFF)
        r = np.int64(np.int32(np.uint32(s & low)))
        if r == -1:
            return np.int64(-1), np.int64(-1)
        if r >= 0 and (s >> np.uint64(32)) == (h & low) and key_column[r] == key:
            return home, r
        return _probe_compiled(table, shift, mask, h, key, key_column)

    @numba.njit(cache=True, nogil=True)
    def _find_compiled(table, shift, mask, keys, hashes, key_column, slot_out, row_out):
        # two passes: every key's home slot is read before any is checked, then the rows' keys; neither
        # pass waits on one read before issuing the next, so the cache misses overlap
        n = keys.shape[0]
        home_slot = np.empty(n, dtype=np.uint64)
        for i in range(n):
            pos = np.int64(hashes[i] >> shift)
            slot_out[i] = pos
            home_slot[i] = table[pos]
        for i in range(n):
            slot_out[i], row_out[i] = _settle(table, shift, mask, hashes[i], keys[i], key_column, slot_out[i],
                                              home_slot[i])

    @numba.njit(cache=True, nogil=True)
    def _read_compiled(table, shift, mask, keys, n_buckets, owned, check, row_data, rows_out, meta_out, missing):
        # a read in two passes (as _find_compiled): splitmix64, bucket ownership and the home slot of every
        # key; then each key's row and its provenance copied out
        nb = np.uint64(n_buckets)
        pow2 = n_buckets & (n_buckets - 1) == 0
        n = keys.shape[0]
        width = meta_out.shape[1]
        key_column = row_data[:, 0]
        hashes = np.empty(n, dtype=np.uint64)
        home_slot = np.empty(n, dtype=np.uint64)
        for i in range(n):
            z = np.uint64(keys[i]) + np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            h = z ^ (z >> np.uint64(31))
            if check and not owned[np.int64(h & (nb - np.uint64(1))) if pow2 else np.int64(h % nb)]:
                return i
            hashes[i] = h
            home_slot[i] = table[np.int64(h >> shift)]
        for i in range(n):
            h = hashes[i]
            r = _settle(table, shift, mask, h, keys[i], key_column, np.int64(h >> shift), home_slot[i])[1]
            rows_out[i] = r
            if r >= 0:
                for j in range(width):
                    meta_out[i, j] = row_data[r, j + 1]
            else:
                for j in range(width):
                    meta_out[i, j] = missing[j]
        return -1

    @numba.njit(cache=True, nogil=True)
    def _place_compiled(table, shift, mask, hashes, rows):
        low = np.uint64(0xFFFFFFFF)
        for i in range(hashes.shape[0]):
            h = hashes[i]
            pos = np.int64(h >> shift)
            while np.int32(np.uint32(table[pos] & low)) != -1:
                pos = (pos + 1) & mask
            table[pos] = ((h & low) << np.uint64(32)) | (np.uint64(np.uint32(rows[i])))


def _rows_of(slots: np.ndarray) -> np.ndarray:
    """The ``int32`` row half of each (contiguous) ``uint64`` slot value, as a view of shape ``slots.shape``."""
    return slots.view(np.int32)[..., _ROW::2]


def _pack(tags: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Slot values from ``uint64`` tags (low 32 bits used) and ``int32`` rows."""
    return (tags << _32) | (np.asarray(rows, dtype=np.int64).view(np.uint64) & _LOW)


class KeyIndex:
    """Open-addressing hash index from int64 keys to int32 row numbers.

    Parameters
    ----------
    capacity
        Number of keys to hold before the first resize.
    max_load
        Largest fraction of slots in use (live or deleted) before the slot array doubles.
    compiled
        Use the compiled loops (default: when numba is installed) or the NumPy rounds.
    """

    def __init__(self, capacity: int = 1024, max_load: float = 0.5, compiled: bool | None = None) -> None:
        self.max_load = float(max_load)
        self.compiled = numba is not None if compiled is None else bool(compiled) and numba is not None
        self._alloc(self._bits_for(capacity))

    def _bits_for(self, n_keys: int) -> int:
        bits = max(4, int(np.ceil(np.log2(max(n_keys, 1) / self.max_load))))
        if (1 << bits) * self.max_load < n_keys:
            bits += 1
        return bits

    def _alloc(self, bits: int) -> None:
        self.bits = bits
        self.table = np.full(1 << bits, _EMPTY_SLOT, dtype=np.uint64)
        self._shift = np.uint64(64 - bits)
        self._mask = np.int64((1 << bits) - 1)
        self.live = 0
        self.dead = 0

    @property
    def slots(self) -> np.ndarray:
        """Row of each slot (``int32``; -1 empty, -2 deleted), a view."""
        return _rows_of(self.table)

    @property
    def nbytes(self) -> int:
        """Bytes held by the slot array."""
        return int(self.table.nbytes)

    @staticmethod
    def hashes(keys: np.ndarray) -> np.ndarray:
        """``splitmix64`` of each key (the bank's buckets take their low bits, the index its home and tag)."""
        return splitmix64(np.asarray(keys, dtype=np.int64).view(np.uint64))

    def _home(self, h: np.ndarray) -> np.ndarray:
        """Home slot of each key: the top ``bits`` bits of its hash."""
        return (h >> self._shift).astype(np.intp)

    # -- reads --------------------------------------------------------------------------------------
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

    def find_slots(
        self, keys: np.ndarray, key_column: np.ndarray, hashes: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Slot and row of each key (both -1 where absent).

        The home slot is checked first (its key is read only when the tag matches); the keys still
        unresolved then compare tags over windows of consecutive slots (see :meth:`_probe`).
        """
        keys = np.asarray(keys, dtype=np.int64)
        n = keys.shape[0]
        if n == 0 or self.live == 0:
            return np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        h = self.hashes(keys) if hashes is None else hashes
        if self.compiled:
            slot_out = np.empty(n, dtype=np.int64)
            rows = np.empty(n, dtype=np.int64)
            _find_compiled(self.table, self._shift, self._mask, keys, h, key_column, slot_out, rows)
            return slot_out, rows
        home = self._home(h)
        s = self.table[home]
        r = _rows_of(s).astype(np.int64)
        cand = (r >= 0) & ((s >> _32) == (h & _LOW))
        rc = np.where(cand, r, 0)
        hit = cand & (key_column[rc] == keys)
        rows = np.where(hit, r, -1)
        slot_out = np.where(hit, home, -1)
        rest = np.flatnonzero(~hit & (r != EMPTY))
        if rest.size:
            slot_out[rest], rows[rest] = self._probe(keys[rest], h[rest] & _LOW, home[rest] + 1, key_column)
        return slot_out, rows

    def _find_with_rows(self, keys: np.ndarray, row_data: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """NumPy rounds of :meth:`read`: rows of ``keys`` and their gathered ``row_data`` (column 0: the key).

        The key check of the home slot reads the same row the caller needs anyway, so a lookup
        touches each row's cache line once. ``row_data`` rows of absent keys are unspecified.
        """
        n = keys.shape[0]
        if n == 0 or self.live == 0:
            return np.full(n, -1, dtype=np.int64), np.zeros((n, *row_data.shape[1:]), row_data.dtype)
        home = self._home(h)
        s = self.table[home]
        r = _rows_of(s).astype(np.int64)
        data = np.take(row_data, np.maximum(r, 0), axis=0)
        hit = (r >= 0) & (data[:, 0] == keys)
        rows = np.where(hit, r, -1)
        rest = np.flatnonzero(~hit & (r != EMPTY))
        if rest.size:
            more = self._probe(keys[rest], h[rest] & _LOW, home[rest] + 1, row_data[:, 0])[1]
            rows[rest] = more
            ok = more >= 0
            data[rest[ok]] = np.take(row_data, more[ok], axis=0)
        return rows, data

    def read(
        self,
        keys: np.ndarray,
        row_data: np.ndarray,
        buckets: int,
        owned: np.ndarray | None,
        rows_out: np.ndarray,
        meta_out: np.ndarray,
        missing: np.ndarray,
    ) -> int:
        """A whole read in one pass: hash, bucket check, probe and the rows' data after the key column.

        Parameters
        ----------
        keys
            ``int64[n]`` keys (already checked).
        row_data
            ``int64[rows, 1 + w]`` per-row data whose column 0 holds the key.
        buckets, owned
            Number of hash buckets and the ``bool[buckets]`` mask of buckets the caller owns (None:
            all of them).
        rows_out, meta_out
            Filled with each key's row (-1 where absent) and ``row_data[row, 1:]`` (``missing`` where
            absent).

        Returns
        -------
        int
            The position of the first key whose bucket is not owned (the outputs are then partly
            written), or -1.
        """
        n = keys.shape[0]
        if self.compiled and n:
            return int(_read_compiled(self.table, self._shift, self._mask, keys, np.int64(buckets),
                                      owned if owned is not None else np.ones(1, dtype=bool), owned is not None,
                                      row_data, rows_out, meta_out, missing))
        h = self.hashes(keys)
        if owned is not None:
            bad = ~owned[bucket_of_hash(h, buckets)]
            if bad.any():
                return int(np.flatnonzero(bad)[0])
        rows, data = self._find_with_rows(keys, row_data, h)
        rows_out[:] = rows
        meta_out[:] = data[:, 1:]
        meta_out[rows < 0] = missing
        return -1

    def _probe(
        self, keys: np.ndarray, tags: np.ndarray, start: np.ndarray, key_column: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Slot and row (-1 where absent) of ``keys``, probing from slot ``start`` on.

        Each round reads a window of ``_WINDOW`` consecutive slots per key and stops at the first slot
        whose tag matches (its key is then checked) or that is empty; a key whose window holds neither
        goes on with the next window, one whose tag matched another key (a tag collision) goes on after
        that slot.
        """
        mask = self._mask
        m = keys.shape[0]
        slot_out = np.full(m, -1, dtype=np.int64)
        row_out = np.full(m, -1, dtype=np.int64)
        window = np.arange(_WINDOW, dtype=np.int64)
        pending = np.arange(m)
        kp, tp = keys, tags[:, None]
        start = np.asarray(start, dtype=np.int64)
        while pending.size:
            pos = (start[:, None] + window) & mask
            sw = self.table[pos]
            rw = _rows_of(sw)
            cand = (rw >= 0) & ((sw >> _32) == tp)
            stop = cand | (rw == EMPTY)
            first = stop.argmax(axis=1)
            at = np.arange(pending.size)
            stopped = stop[at, first]
            row = rw[at, first].astype(np.int64)
            is_cand = cand[at, first]
            good = is_cand & (key_column[np.where(is_cand, row, 0)] == kp)
            fi = pending[good]
            slot_out[fi] = pos[at[good], first[good]]
            row_out[fi] = row[good]
            # go on: windows without a stop (next window) and tag collisions (the slot after it)
            collided = is_cand & ~good
            keep = ~stopped | collided
            nxt = np.where(collided, pos[at, first] + 1, start + _WINDOW)
            pending = pending[keep]
            kp = kp[keep]
            tp = tp[keep]
            start = nxt[keep] & mask
        return slot_out, row_out

    # -- writes -------------------------------------------------------------------------------------
    def insert(
        self, keys: np.ndarray, rows: np.ndarray, key_column: np.ndarray, hashes: np.ndarray | None = None
    ) -> None:
        """Insert keys known to be absent and unique, mapping them to ``rows``.

        ``key_column`` must already hold the new keys at ``rows`` (it is used if the index grows).
        """
        keys = np.asarray(keys, dtype=np.int64)
        if keys.size == 0:
            return
        if (self.live + self.dead + keys.size) > self.max_load * self.table.size:
            self.rebuild(self.live + keys.size, key_column, extra_rows=None)
        h = self.hashes(keys) if hashes is None else hashes
        rows = np.asarray(rows, dtype=np.int32)
        if self.compiled:
            _place_compiled(self.table, self._shift, self._mask, np.ascontiguousarray(h), rows)
        elif self.live + self.dead == 0:
            self._place_empty(h, rows)
        else:
            self._place(h, rows)
        self.live += int(keys.size)

    def _place_empty(self, h: np.ndarray, rows: np.ndarray) -> None:
        """Place keys into an empty slot array in one sorted pass.

        Sorted by home slot, key ``i`` goes to ``max(home[i], slot[i-1] + 1)``, which is
        ``i + max(home[j] - j for j <= i)``; the few that run past the last slot wrap around through
        :meth:`_place`.
        """
        home = self._home(h)
        order = np.argsort(home, kind="stable")
        hs = home[order]
        i = np.arange(hs.shape[0], dtype=np.intp)
        pos = np.maximum.accumulate(hs - i) + i
        if pos[-1] < self.table.size:
            self.table[pos] = _pack(h[order] & _LOW, rows[order])
            return
        inside = pos < self.table.size
        sel = order[inside]
        self.table[pos[inside]] = _pack(h[sel] & _LOW, rows[sel])
        over = order[~inside]
        self._place(h[over], rows[over])

    def _place(self, h: np.ndarray, rows: np.ndarray) -> None:
        """Place keys at the first empty slot from their home on (one vectorized round per probe step)."""
        mask = self._mask
        pos = self._home(h).astype(np.int64)
        packed = _pack(h & _LOW, rows)
        pending = np.arange(h.shape[0])
        while pending.size:
            p = pos[pending]
            free = _rows_of(self.table[p]) == EMPTY
            cand = pending[free]
            if cand.size:
                uniq, first = np.unique(p[free], return_index=True)
                winners = cand[first]
                self.table[uniq] = packed[winners]
                won = np.zeros(h.shape[0], dtype=bool)
                won[winners] = True
                pending = pending[~won[pending]]
            pos[pending] = (pos[pending] + 1) & mask

    def remove(self, keys: np.ndarray, key_column: np.ndarray) -> np.ndarray:
        """Remove present keys; returns their former rows (-1 for absent keys)."""
        slots, rows = self.find_slots(keys, key_column)
        hit = rows >= 0
        self.table[slots[hit]] = _TOMBSTONE_ROW
        self.live -= int(hit.sum())
        self.dead += int(hit.sum())
        return rows

    def set_rows(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """Point existing slots at new rows (after rows were moved); their tags stay."""
        slots = np.asarray(slots, dtype=np.int64)
        self.table[slots] = (self.table[slots] & _HIGH) | (
            np.asarray(rows, dtype=np.int64).view(np.uint64) & _LOW
        )

    def reserve(self, n_keys: int, key_column: np.ndarray) -> None:
        """Size the slot array for ``n_keys`` keys in all (rebuilt now if it is too small)."""
        if int(n_keys) > self.max_load * self.table.size - self.dead:
            self.rebuild(max(int(n_keys), self.live), key_column, None)

    def rebuild(self, n_keys: int, key_column: np.ndarray, extra_rows: np.ndarray | None) -> None:
        """Re-create the slot array sized for ``n_keys`` from the live rows (drops tombstones)."""
        live_rows = self.slots[self.slots >= 0].copy()
        self._alloc(self._bits_for(n_keys))
        if live_rows.size and self.compiled:
            _place_compiled(self.table, self._shift, self._mask, self.hashes(key_column[live_rows]), live_rows)
        elif live_rows.size:
            self._place_empty(self.hashes(key_column[live_rows]), live_rows)
        self.live = int(live_rows.size)

    @classmethod
    def build(
        cls, key_column: np.ndarray, capacity: int | None = None, max_load: float = 0.5, compiled: bool | None = None
    ) -> KeyIndex:
        """An index over rows ``0..len(key_column)-1`` (keys must be unique)."""
        n = int(key_column.shape[0])
        idx = cls(max(capacity or 0, n, 1), max_load=max_load, compiled=compiled)
        if n:
            idx.insert(np.asarray(key_column, dtype=np.int64), np.arange(n, dtype=np.int32), key_column)
        return idx
