"""Bounded tables: the admission sketch, victim choice of each eviction policy, and time-to-live expiry.

Everything here is pure NumPy (no Dask, no I/O); :class:`~carls_dask.bank.core.ShardCore` calls it at
its write hooks. Semantics (per table and shard, see :class:`~carls_dask.bank.schema.TableSpec`):

* **Admission** (``min_frequency > 1``): every ``lookup(insert=True)`` adds its keys' counts to a
  count-min sketch (:class:`CountMinSketch`, fixed memory ``sketch_depth x sketch_width`` int32). A
  missing key gets a row only once the sketch's estimate of its sightings reaches ``min_frequency``;
  until then it costs no row and the lookup reports it not found and ``rejected``. A newly admitted
  row's frequency starts at that estimate (an upper bound of its true count), so LFU compares it fairly
  with rows admitted earlier. ``update`` always writes (makers decide what exists; only the training
  path's lookup-with-insert is filtered), and a restore replays rows, never admission. The sketch is
  not part of the persisted state: a restored shard starts counting afresh.
* **Cap** (``max_rows``): when a write (``lookup(insert=True)`` or ``update``) leaves more than
  ``max_rows`` rows, rows are evicted down to ``low_water(max_rows)`` (``ceil(0.95 * max_rows)``), so
  one O(rows) selection (``np.argpartition``, no sort) pays for about ``0.05 * max_rows`` later
  allocations. In ``lookup(insert=True)`` the batch's own rows compete with the rest (under LFU a new
  key keeps its row only if it is not among the least frequent: the batch's answer then reports it
  ``rejected``); ``update`` always keeps the rows it wrote (they are evicted last, only when they alone
  exceed the mark). Policies: ``"lfu"`` lowest frequency first, ``"oldest"`` lowest ``wall_time`` (last write:
  allocation, ``update``, ``apply_gradients``) first, ``"lru"`` the same clock, but in an ``"lru"``
  table ``lookup(insert=True)`` also sets ``wall_time`` of the rows it touches (so there ``age`` is the
  time since last use). Ties are broken by a bijective hash of the key, so the victims depend only on
  the rows' contents, never on their order in memory (a restored shard evicts the same keys).
* **Time-to-live** (``ttl``): rows with ``now - wall_time > ttl`` are evicted by a sweep at the start of
  a write, at most once every ``ttl / 16`` seconds (so a row may be read up to that long after it
  expired), and by an explicit ``ShardCore.expire(table)``.

Evictions are deletes: the actor logs them to the delta log, so a snapshot plus the log restores the
exact rows.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from carls_dask.bank.hashing import mix_seed, splitmix64
from carls_dask.bank.schema import EVICTIONS, TableSpec, check_keys
from carls_dask.errors import ConfigError, InvalidBatchError

__all__ = [
    "LOW_WATER",
    "TTL_SWEEP_FRACTION",
    "CountMinSketch",
    "TableBounds",
    "choose_victims",
    "expired_rows",
    "low_water",
    "victim_scores",
]

#: Fraction of ``max_rows`` an eviction round goes down to.
LOW_WATER = 0.95
#: A TTL sweep runs at most once every ``ttl * TTL_SWEEP_FRACTION`` seconds of the shard's clock.
TTL_SWEEP_FRACTION = 1.0 / 16.0
_COUNT_MAX = np.iinfo(np.int32).max


def low_water(max_rows: int) -> int:
    """Rows an eviction round leaves: ``ceil(LOW_WATER * max_rows)``, at least 1 and at most ``max_rows``."""
    return min(int(max_rows), max(1, math.ceil(LOW_WATER * int(max_rows))))


class CountMinSketch:
    """A count-min sketch with conservative update: ``depth x width`` int32 counters, fixed memory.

    ``estimate(key)`` is never below the key's true count, and (for a stream of total count ``N``) it
    exceeds it by more than ``e * N / width`` with probability at most ``exp(-depth)``; the conservative
    update (raise each counter only to the new estimate) makes the excess much smaller in practice.

    Parameters
    ----------
    width
        Counters per row (a power of two).
    depth
        Rows (independent hashes).
    seed
        Seed of the row hashes (deterministic).
    """

    def __init__(self, width: int, depth: int, seed: int = 0) -> None:
        if width < 1 or width & (width - 1):
            raise ConfigError(f"CountMinSketch width must be a power of two >= 1, got {width!r}")
        if depth < 1:
            raise ConfigError(f"CountMinSketch depth must be >= 1, got {depth!r}")
        self.width = int(width)
        self.depth = int(depth)
        self.counts = np.zeros((self.depth, self.width), dtype=np.int32)
        self._seeds = splitmix64(np.arange(1, self.depth + 1, dtype=np.uint64) ^ np.uint64(int(seed) % (1 << 64)))
        self._flat = (np.arange(self.depth, dtype=np.int64) * self.width)[:, None]

    @property
    def nbytes(self) -> int:
        """Bytes of the counters."""
        return int(self.counts.nbytes)

    def _cells(self, keys: np.ndarray) -> np.ndarray:
        """``int64[depth, n]``: flat counter index of each key in each row."""
        k = keys.view(np.uint64)
        mask = np.uint64(self.width - 1)
        cells = np.empty((self.depth, k.shape[0]), dtype=np.int64)
        for j in range(self.depth):
            cells[j] = (splitmix64(k ^ self._seeds[j]) & mask).view(np.int64)
        cells += self._flat
        return cells

    def estimate(self, keys: np.ndarray) -> np.ndarray:
        """``int64[n]``: estimated count of each key (never below the true count)."""
        k = check_keys("sketch", keys, allow_empty=True)
        if k.size == 0:
            return np.zeros(0, dtype=np.int64)
        return self.counts.reshape(-1)[self._cells(k)].min(axis=0).astype(np.int64)

    def add(self, keys: np.ndarray, counts: np.ndarray | int = 1, *, assume_unique: bool = False) -> np.ndarray:
        """Add ``counts`` sightings of ``keys``; returns each key's new estimate (``int64[n]``).

        Duplicate keys are summed first unless ``assume_unique`` (then they must be unique: the
        conservative update reads each key's estimate once).
        """
        k = check_keys("sketch", keys, allow_empty=True)
        c = np.broadcast_to(np.asarray(counts, dtype=np.int64), k.shape)
        if k.size == 0:
            return np.zeros(0, dtype=np.int64)
        if (c < 0).any():
            raise InvalidBatchError("CountMinSketch.add: counts must be >= 0")
        inverse = None
        if not assume_unique:
            k, inverse = np.unique(k, return_inverse=True)
            c = np.bincount(inverse, weights=c, minlength=k.shape[0]).astype(np.int64)
        flat = self.counts.reshape(-1)
        cells = self._cells(k)
        est = flat[cells].min(axis=0).astype(np.int64)
        new = np.minimum(est + c, _COUNT_MAX)
        np.maximum.at(flat, cells.reshape(-1), np.broadcast_to(new.astype(np.int32), cells.shape).reshape(-1))
        return new if inverse is None else new[inverse]

    def clear(self) -> None:
        """Forget every count."""
        self.counts[:] = 0


def victim_scores(policy: str, frequency: np.ndarray, wall_time: np.ndarray) -> np.ndarray:
    """``float64[rows]``: the eviction order of a policy (lowest goes first).

    Parameters
    ----------
    policy
        ``"lfu"``, ``"lru"`` or ``"oldest"``.
    frequency
        ``int64[rows]`` lookup-with-insert counts.
    wall_time
        ``float64[rows]`` time of each row's last write (in ``"lru"`` tables: last use).
    """
    if policy == "lfu":
        return frequency.astype(np.float64)
    if policy in ("lru", "oldest"):
        return np.array(wall_time, dtype=np.float64)
    raise ConfigError(f"eviction policy {policy!r} is not one of {EVICTIONS}")


def choose_victims(scores: np.ndarray, keys: np.ndarray, n_evict: int,
                   protected: np.ndarray | None = None) -> np.ndarray:
    """Rows of the ``n_evict`` lowest ``scores`` (O(rows): two ``np.argpartition``, no sort).

    Ties are broken by ``splitmix64(key)`` (a bijection, so the choice depends only on the rows'
    ``(score, key)`` pairs, not on their order). ``protected`` rows (``int64`` row numbers) go last.

    Returns
    -------
    numpy.ndarray
        ``int64[n_evict]`` row numbers, in no particular order.
    """
    n = scores.shape[0]
    n_evict = int(n_evict)
    if n_evict <= 0:
        return np.zeros(0, dtype=np.int64)
    if n_evict >= n:
        return np.arange(n, dtype=np.int64)
    s = np.array(scores, dtype=np.float64)
    if protected is not None and protected.size:
        s[protected] = np.inf
    kth = float(s[np.argpartition(s, n_evict - 1)[n_evict - 1]])
    below = np.flatnonzero(s < kth)
    ties = np.flatnonzero(s == kth)
    need = n_evict - below.shape[0]
    if need < ties.shape[0]:
        h = splitmix64(np.ascontiguousarray(keys[ties]).view(np.uint64))
        ties = ties[np.argpartition(h, need - 1)[:need]]
    return np.concatenate([below, ties]).astype(np.int64)


def expired_rows(wall_time: np.ndarray, now: float, ttl: float) -> np.ndarray:
    """``int64`` rows whose last write is more than ``ttl`` seconds before ``now``."""
    return np.flatnonzero(np.asarray(wall_time) < float(now) - float(ttl)).astype(np.int64)


@dataclasses.dataclass
class TableBounds:
    """The bounds state of one table in one shard: its sketch, counters and TTL sweep clock.

    Attributes
    ----------
    spec
        The table's spec.
    sketch
        Admission sketch (``None`` when ``min_frequency == 1``).
    admissions, rejections
        Keys given a row by ``lookup(insert=True)``, and distinct keys per batch refused one.
    evictions
        Rows evicted, by reason (``"cap"``, ``"ttl"``).
    last_sweep
        Clock time of the last TTL sweep.
    evicted
        Keys evicted since the owner last took them (kept only when ``record`` is set; the actor logs them).
    """

    spec: TableSpec
    sketch: CountMinSketch | None = None
    admissions: int = 0
    rejections: int = 0
    evictions: dict[str, int] = dataclasses.field(default_factory=lambda: {"cap": 0, "ttl": 0})
    last_sweep: float = -math.inf
    record: bool = False
    evicted: list[np.ndarray] = dataclasses.field(default_factory=list)

    @classmethod
    def for_spec(cls, spec: TableSpec) -> TableBounds | None:
        """The bounds of ``spec``, or ``None`` for an unbounded table (no cost on its hot paths)."""
        if not spec.is_bounded:
            return None
        sketch = None
        if spec.min_frequency > 1:
            sketch = CountMinSketch(spec.sketch_width, spec.sketch_depth, mix_seed(spec.name, "admission", spec.seed))
        return cls(spec=spec, sketch=sketch)

    def admit(self, keys: np.ndarray, counts: np.ndarray, missing: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Which missing keys of a lookup-with-insert batch get a row.

        Parameters
        ----------
        keys, counts
            The batch's unique keys and their occurrences.
        missing
            ``bool``: keys without a row.

        Returns
        -------
        tuple
            ``admit`` (``bool``, missing keys given a row) and the sketch estimates (``None`` without a sketch).
        """
        if self.sketch is None:
            self.admissions += int(missing.sum())
            return missing, None
        est = self.sketch.add(keys, counts, assume_unique=True)
        admit = missing & (est >= self.spec.min_frequency)
        n_admit = int(admit.sum())
        self.admissions += n_admit
        self.rejections += int(missing.sum()) - n_admit
        return admit, est

    def ttl_due(self, now: float) -> bool:
        """Whether a TTL sweep is due at ``now`` (and, if so, mark it done)."""
        ttl = self.spec.ttl
        if ttl is None or now < self.last_sweep + ttl * TTL_SWEEP_FRACTION:
            return False
        self.last_sweep = now
        return True

    def note_evicted(self, keys: np.ndarray, reason: str) -> None:
        """Count evicted keys (and keep them for the delta log when recording)."""
        self.evictions[reason] += int(keys.shape[0])
        if self.record and keys.size:
            self.evicted.append(np.array(keys, dtype=np.int64))

    def take_evicted(self) -> np.ndarray:
        """The keys evicted since the last call (and forget them)."""
        if not self.evicted:
            return np.zeros(0, dtype=np.int64)
        out = np.concatenate(self.evicted)
        self.evicted.clear()
        return out

    def stats(self) -> dict[str, Any]:
        """Counters of this table's bounds."""
        spec = self.spec
        return {
            "max_rows": spec.max_rows,
            "eviction": spec.eviction,
            "min_frequency": spec.min_frequency,
            "ttl": spec.ttl,
            "admissions": self.admissions,
            "rejections": self.rejections,
            "evictions": dict(self.evictions),
            "sketch_bytes": 0 if self.sketch is None else self.sketch.nbytes,
        }
