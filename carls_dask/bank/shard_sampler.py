"""Negative sampling from one shard at O(sample) per call: a lazily rebuilt frequency-rank order.

Both samplers draw ranks of a :class:`RankOrder`, never row numbers: ``uniform`` draws live ranks
uniformly, ``log_uniform`` draws ranks from ``P(r) ∝ log(r + 2) - log(r + 1)`` by inverse CDF (one ``exp``
per draw). Drawing ranks makes the sample independent of where the rows sit: a shard restored from a
snapshot (its rows laid out by bucket) draws the keys the shard it replaces would have drawn, which is
what makes a resumed run equal an uninterrupted one. The order is the table's rows sorted by frequency
(descending, ties by key) as of its last rebuild, with

* rows appended since the rebuild taking the tail ranks in insertion (row) order;
* rows deleted since the rebuild leaving a *tombstone* at their rank: a draw landing on one is
  rejected and drawn again, so the distribution actually sampled is the uniform or log-uniform one over the
  ``m`` ranks conditioned on a live rank, ``P(r) = (log(r + 2) - log(r + 1)) / (log(m + 1) - L)`` where
  ``L`` sums ``log(r + 2) - log(r + 1)`` over the tombstones. Tombstone draws are not counted as tries;
* frequency changes since the rebuild not moving any rank.

The probabilities and expected counts returned are those of that distribution, exactly. The order is
rebuilt (a full sort, ``O(n log n)``) only when it is *stale* -- appended, deleted and re-counted rows
since the rebuild exceed ``rebuild_fraction`` of the rows it was built over -- and at least
``rebuild_draws * n`` candidates have been drawn from it since (so a rebuild's sort is shared by
``rebuild_draws * n / sample`` calls: the amortised cost of a call is ``O(sample * log n / rebuild_draws)``,
not ``O(n)``), or when tombstones hold half of the probability mass (draws would mostly be rejected).
The first call builds the order. A snapshot drops it (see ``ShardCore.freeze_changes``), and a restored
shard starts without one, so both build it from the same rows on their next draw.

Unique sampling keeps drawing until ``n`` distinct candidates are found; the duplicates are found by
sorting the draws, never with a table-sized mask, and ``num_tries`` counts the draws it took (as in
TensorFlow's samplers, see :mod:`carls_dask.bank.sampling`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from carls_dask.bank.sampling import SAMPLERS
from carls_dask.errors import ConfigError, InvalidArgumentError, InvalidBatchError

__all__ = [
    "RankOrder",
    "SamplingSettings",
    "ShardDraw",
    "describe",
    "draw_from_shard",
    "expected_counts",
    "log_uniform_weight",
    "split_quota",
]

logger = logging.getLogger(__name__)

_MAX_TRIES = 50_000_000


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """When a shard's frequency-rank order is rebuilt (``carls.bank.sampling.*``).

    Attributes
    ----------
    rebuild_fraction
        The order is stale once appended + deleted + re-counted rows since its rebuild exceed this
        fraction of the rows it was built over.
    rebuild_draws
        A stale order is rebuilt only after ``rebuild_draws * rows`` candidates were drawn from it since its
        last rebuild (bounds the rebuild's share of the sampling cost).
    """

    rebuild_fraction: float = 0.05
    rebuild_draws: float = 1.0

    def __post_init__(self) -> None:
        for name in ("rebuild_fraction", "rebuild_draws"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v) or v < 0:
                raise ConfigError(f"SamplingSettings.{name} must be a finite number >= 0, got {v!r}")


@dataclasses.dataclass(frozen=True)
class ShardDraw:
    """What one shard sampled, with per-draw probabilities under the distribution it sampled.

    Attributes
    ----------
    keys
        ``int64[n]`` sampled keys.
    prob
        ``float64[n]``: probability of each key in one draw from this shard.
    true_prob
        ``float64[t]``: the same for each true key (0 for keys not in this shard).
    num_tries
        Draws taken (``n`` unless unique).
    rows
        Live rows of the shard when it sampled.
    """

    keys: np.ndarray
    prob: np.ndarray
    true_prob: np.ndarray
    num_tries: int
    rows: int


def log_uniform_weight(ranks: np.ndarray) -> np.ndarray:
    """``log(r + 2) - log(r + 1)`` (unnormalised log-uniform mass of rank ``r``)."""
    r = np.asarray(ranks, dtype=np.float64)
    return np.log1p(1.0 / (r + 1.0))


class RankOrder:
    """Rows of one table in frequency-rank order, kept current incrementally and rebuilt lazily.

    Parameters
    ----------
    settings
        The rebuild policy.
    """

    def __init__(self, settings: SamplingSettings) -> None:
        self.settings = settings
        self.rank_row = np.zeros(0, dtype=np.int64)  # rank -> row, -1 for a tombstone
        self.rank_key = np.zeros(0, dtype=np.int64)  # rank -> key (checks that rows did not move unseen)
        self.row_rank = np.zeros(0, dtype=np.int64)  # row -> rank
        self.m = 0  # ranks held (tombstones included)
        self.synced = 0  # rows 0..synced-1 hold a rank
        self.built_rows = 0
        self.changes = 0
        self.dead = 0
        self.dead_mass = 0.0
        self.draws = 0
        self.rebuilds = 0
        self.built = False

    # -- maintenance ---------------------------------------------------------------------------------
    def rebuild(self, keys: np.ndarray, frequency: np.ndarray) -> None:
        """Sort the live rows by frequency (descending), ties by key: ``O(n log n)``."""
        n = int(keys.shape[0])
        order = np.lexsort((keys, -np.asarray(frequency, dtype=np.int64))).astype(np.int64)
        self.rank_row = order
        self.rank_key = np.asarray(keys, dtype=np.int64)[order]
        self.row_rank = np.empty(n, dtype=np.int64)
        self.row_rank[order] = np.arange(n, dtype=np.int64)
        self.m = self.synced = self.built_rows = n
        self.changes = self.dead = self.draws = 0
        self.dead_mass = 0.0
        self.rebuilds += 1
        self.built = True
        logger.debug("rank order rebuilt over %d rows (rebuild %d)", n, self.rebuilds)

    def _grow(self, arr: np.ndarray, size: int) -> np.ndarray:
        if arr.shape[0] >= size:
            return arr
        out = np.empty(max(size, int(arr.shape[0] * 1.5) + 16), dtype=arr.dtype)
        out[: arr.shape[0]] = arr
        return out

    def sync(self, keys: np.ndarray, n: int) -> None:
        """Give the rows appended since the last sync the tail ranks, in row order (``O(appended)``).

        ``keys`` is the table's per-row key array (only rows ``synced..n-1`` are read).
        """
        if not self.built or n <= self.synced:
            return
        new = np.arange(self.synced, n, dtype=np.int64)
        ranks = np.arange(self.m, self.m + new.size, dtype=np.int64)
        self.rank_row = self._grow(self.rank_row, self.m + new.size)
        self.rank_key = self._grow(self.rank_key, self.m + new.size)
        self.row_rank = self._grow(self.row_rank, n)
        self.rank_row[ranks] = new
        self.rank_key[ranks] = keys[self.synced:n]
        self.row_rank[new] = ranks
        self.m += int(new.size)
        self.changes += int(new.size)
        self.synced = n

    def note_changes(self, rows: int) -> None:
        """Count ``rows`` rows whose frequency changed (they keep their rank until the next rebuild)."""
        self.changes += int(rows)

    def on_delete(self, keys: np.ndarray, n: int, dead: np.ndarray, movers: np.ndarray, holes: np.ndarray) -> None:
        """Before ``dead`` rows are removed and ``movers`` rows are moved into ``holes`` (``O(deleted)``).

        ``n`` is the row count before the delete.
        """
        if not self.built:
            return
        self.sync(keys, n)
        if self.synced != n:  # rows moved without this order being told: start again on the next draw
            self.built = False
            return
        dr = self.row_rank[dead]
        self.rank_row[dr] = -1
        self.dead += int(dr.size)
        self.dead_mass += float(log_uniform_weight(dr).sum())
        if movers.size:
            mr = self.row_rank[movers]
            self.rank_row[mr] = holes
            self.row_rank[holes] = mr
        self.synced = n - int(dead.size)

    def live_mass(self) -> float:
        """``log(m + 1) - L``: the normaliser of the live ranks."""
        return float(np.log(self.m + 1.0) - self.dead_mass)

    def wants_rebuild(self, n: int) -> bool:
        """Whether the next draw should rebuild first (see the module notes)."""
        if not self.built or self.synced != n:
            return True
        if self.m and self.dead_mass > 0.5 * np.log(self.m + 1.0):
            return True
        stale = self.changes + self.dead > self.settings.rebuild_fraction * max(self.built_rows, 1)
        return stale and self.draws >= self.settings.rebuild_draws * n

    # -- drawing --------------------------------------------------------------------------------------
    def draw_ranks(self, size: int, rng: np.random.Generator, uniform: bool = False) -> np.ndarray:
        """``size`` live ranks from the conditioned log-uniform distribution, or uniformly over the live
        ranks with ``uniform`` (tombstones redrawn)."""
        out: list[np.ndarray] = []
        have = 0
        log_m = np.log(self.m + 1.0)
        live = max(self.m - self.dead, 1)
        while have < size:
            want = size - have
            if uniform:
                r = rng.integers(0, self.m, size=int(want * self.m / live) + 8)
            else:
                # expected live fraction is live_mass / log_m; overdraw accordingly
                m = int(want * log_m / max(self.live_mass(), 1e-12)) + 8
                u = rng.random(m)
                r = np.minimum(np.floor(np.exp(u * log_m)).astype(np.int64) - 1, self.m - 1)
            r = r[self.rank_row[r] >= 0] if self.dead else r
            out.append(r[:want])
            have += int(min(want, r.size))
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def prob(self, ranks: np.ndarray, uniform: bool = False) -> np.ndarray:
        """Probability of each (live) rank in one draw (log-uniform, or uniform over the live ranks)."""
        if uniform:
            return np.full(np.shape(ranks), 1.0 / max(self.m - self.dead, 1), dtype=np.float64)
        return log_uniform_weight(ranks) / self.live_mass()


def _unique_draws(table: str, sampler: str, n: int, draw: Callable[[int], np.ndarray]) -> tuple[np.ndarray, int]:
    """The first ``n`` distinct values of the stream ``draw`` yields, and how many draws that took.

    Duplicates are found by sorting (``O(sample log sample)``), never with a mask the size of the table.
    """
    chosen: list[np.ndarray] = []
    seen = np.zeros(0, dtype=np.int64)
    have = 0
    tries = 0
    while have < n:
        if tries > _MAX_TRIES:
            raise InvalidBatchError(
                f"table {table!r}: unique {sampler} sampling of {n} candidates did not finish in {_MAX_TRIES} draws"
            )
        m = max(2 * (n - have), 256)
        d = draw(m)
        uniq, first = np.unique(d, return_index=True)
        new = ~np.isin(uniq, seen, assume_unique=True)
        take = np.sort(first[new])[: n - have]
        got = d[take]
        chosen.append(got)
        seen = np.union1d(seen, got)
        have += int(take.size)
        tries += int(take[-1]) + 1 if have == n and take.size else int(d.size)
    return np.concatenate(chosen), tries


def draw_from_shard(
    table: str,
    keys: np.ndarray,
    frequency: np.ndarray,
    n_rows: int,
    order: RankOrder | None,
    n: int,
    *,
    sampler: str,
    unique: bool,
    true_rows: np.ndarray | None,
    rng: np.random.Generator,
    exclude_true: bool = False,
) -> ShardDraw:
    """Draw ``n`` candidates from a shard's live rows ``0..n_rows-1``.

    Parameters
    ----------
    table
        Table name (for errors).
    keys, frequency
        The table's per-row key and frequency arrays (views; read at the drawn rows only, and in full
        only when ``order`` is rebuilt).
    n_rows
        Live rows.
    order
        The table's :class:`RankOrder` (both samplers draw ranks of it).
    n
        Candidates wanted (validated positive by the caller).
    sampler
        ``"uniform"`` or ``"log_uniform"``.
    unique
        Whether the candidates are distinct.
    true_rows
        Rows of the true keys (-1 for a key not in this shard), or None.
    rng
        Random source.
    exclude_true
        Never return the true keys: draws landing on one are rejected (not counted as tries), so the
        distribution sampled is the sampler's conditioned on not a true key, and ``prob`` is divided by
        ``1 - (the true keys' mass)``; the true keys' own ``true_prob`` is then 0.

    Raises
    ------
    InvalidBatchError
        An unknown sampler, an empty table, or more unique candidates than rows.
    """
    if sampler not in SAMPLERS:
        raise InvalidBatchError(f"table {table!r}: sampler {sampler!r} is unknown; expected one of {SAMPLERS}")
    if n_rows == 0:
        raise InvalidBatchError(f"table {table!r}: cannot sample from an empty table")
    if unique and n > n_rows:
        raise InvalidBatchError(
            f"table {table!r}: asked for {n} unique candidates but the table holds only {n_rows} keys"
        )
    # Both samplers draw ranks of the order (rows sorted by frequency, then key; rows added since take
    # the tail ranks in row order), not rows: what is drawn then does not depend on where the rows sit,
    # so a shard restored from a snapshot (rows laid out by bucket) draws what the shard it replaces drew.
    if order is None:
        raise InvalidArgumentError("sampling needs the table's RankOrder")
    order.sync(keys, n_rows)
    if order.wants_rebuild(n_rows):
        order.rebuild(keys[:n_rows], frequency[:n_rows])
    rank_order = order
    uniform = sampler == "uniform"

    def draw(size: int) -> np.ndarray:
        return rank_order.draw_ranks(size, rng, uniform)
    excl_mass = 0.0
    if exclude_true and true_rows is not None and (true_rows >= 0).any():
        present_rows = np.unique(true_rows[true_rows >= 0])
        excl = np.unique(order.row_rank[present_rows])
        excl_mass = float(order.prob(excl, uniform).sum())
        if excl_mass >= 1.0 - 1e-12 or (unique and n > n_rows - excl.size):
            raise InvalidBatchError(f"table {table!r}: asked for {n} {'unique ' if unique else ''}candidates but "
                                    f"only {n_rows - excl.size} of {n_rows} keys are not true keys")
        inner = draw

        def draw(size: int) -> np.ndarray:
            parts, have = [], 0
            while have < size:
                d = inner(int((size - have) / (1.0 - excl_mass)) + 8)
                d = d[~np.isin(d, excl)][: size - have]
                parts.append(d)
                have += int(d.size)
            return np.concatenate(parts)
    if unique:
        ids, tries = _unique_draws(table, sampler, n, draw)
    else:
        ids, tries = draw(n), n
    true_prob = np.zeros(0, dtype=np.float64)
    order.draws += int(tries)
    rows = order.rank_row[ids]
    if not np.array_equal(keys[rows], order.rank_key[ids]):  # rows moved behind the order's back
        order.built = False
        return draw_from_shard(table, keys, frequency, n_rows, order, n, sampler=sampler, unique=unique,
                               true_rows=true_rows, rng=rng, exclude_true=exclude_true)
    prob = order.prob(ids, uniform)
    if true_rows is not None:
        present = true_rows >= 0
        true_prob = np.zeros(true_rows.shape, dtype=np.float64)
        true_prob[present] = order.prob(order.row_rank[true_rows[present]], uniform)
    if excl_mass:
        prob = prob / (1.0 - excl_mass)
        true_prob = np.zeros(true_prob.shape, dtype=np.float64)
    return ShardDraw(keys=keys[rows].astype(np.int64), prob=np.asarray(prob, dtype=np.float64),
                     true_prob=np.asarray(true_prob, dtype=np.float64), num_tries=int(tries), rows=int(n_rows))


def expected_counts(n: int, unique: bool, num_tries: int, prob: np.ndarray) -> np.ndarray:
    """Expected occurrences of candidates of one-draw probability ``prob`` in a sample like this one.

    ``n * prob`` with replacement; TensorFlow's ``-expm1(num_tries * log1p(-prob))`` when unique.
    """
    p = np.asarray(prob, dtype=np.float64)
    if not unique:
        return n * p
    out = np.ones(p.shape, dtype=np.float64)
    np.negative(np.expm1(num_tries * np.log1p(-p, where=p < 1, out=np.zeros_like(p))), out=out, where=p < 1)
    return out


def split_quota(n: int, rows: list[int], unique: bool, rng: np.random.Generator) -> np.ndarray:
    """How many of ``n`` candidates each shard draws: multinomial in proportion to its rows.

    With ``unique``, a shard's quota is capped at its rows and the excess is drawn again over the shards
    with rows to spare (in proportion to their spare rows).
    """
    r = np.asarray(rows, dtype=np.int64)
    total = int(r.sum())
    if total == 0:
        return np.zeros(r.shape, dtype=np.int64)
    q = rng.multinomial(n, r / total).astype(np.int64)
    if unique:
        while True:
            over = np.maximum(q - r, 0)
            excess = int(over.sum())
            if excess == 0:
                break
            q -= over
            spare = r - q
            q += rng.multinomial(excess, spare / spare.sum()).astype(np.int64)
    return q


def describe(order: RankOrder | None) -> dict[str, Any]:
    """Counters of a rank order (for stats and tests)."""
    if order is None:
        return {"built": False, "rebuilds": 0}
    return {"built": order.built, "rebuilds": order.rebuilds, "ranks": order.m, "tombstones": order.dead,
            "changes": order.changes, "draws": order.draws}

