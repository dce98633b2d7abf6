"""Candidate sampling for sampled softmax: uniform and log-uniform (Zipf) over frequency rank.

The candidate universe is a table's keys. ``log_uniform`` ranks keys by frequency (most frequent
first, ties by key), so rank ``k`` has ``P(k) = (log(k + 2) - log(k + 1)) / log(R + 1)``, like
TensorFlow's ``log_uniform_candidate_sampler`` (CARLS ranks by insertion order and never uses its
counts; here the counts kept by ``lookup(insert=True)`` are the ranking). Expected counts, for the
logQ correction of sampled logits, follow TensorFlow: ``n * P(k)`` when sampling with replacement,
and ``-expm1(num_tries * log1p(-P(k)))`` for unique sampling, where ``num_tries`` is how many draws
it took to collect ``n`` distinct candidates.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from carls_dask.errors import ConfigError, InvalidBatchError

__all__ = ["SAMPLERS", "NegativeSample", "candidate_probabilities", "order_by_frequency", "sample_candidates"]

SAMPLERS = ("uniform", "log_uniform")
_MAX_TRIES = 50_000_000


@dataclasses.dataclass(frozen=True)
class NegativeSample:
    """Result of ``sample_negatives``.

    Attributes
    ----------
    keys
        ``int64[n]`` sampled keys.
    expected_count
        ``float64[n]``: expected number of times each sampled key occurs in a sample like this one.
    true_expected_count
        ``float64[t]``: the same for each of ``true_keys`` (0 for keys not in the table).
    num_tries
        Draws taken (equals ``n`` unless ``unique``).
    """

    keys: np.ndarray
    expected_count: np.ndarray
    true_expected_count: np.ndarray
    num_tries: int


def order_by_frequency(keys: np.ndarray, frequency: np.ndarray) -> np.ndarray:
    """Keys sorted by frequency (descending), ties broken by key (ascending)."""
    order = np.lexsort((keys, -np.asarray(frequency, dtype=np.int64)))
    return np.asarray(keys, dtype=np.int64)[order]


def candidate_probabilities(sampler: str, n_candidates: int, ranks: np.ndarray) -> np.ndarray:
    """Probability of drawing the candidates at ``ranks`` in one draw."""
    ranks = np.asarray(ranks, dtype=np.float64)
    if sampler == "uniform":
        return np.full(ranks.shape, 1.0 / n_candidates)
    if sampler == "log_uniform":
        return (np.log(ranks + 2.0) - np.log(ranks + 1.0)) / np.log(n_candidates + 1.0)
    raise ConfigError(f"unknown sampler {sampler!r}; expected one of {SAMPLERS}")


def _unique_expected(num_tries: int, p: np.ndarray) -> np.ndarray:
    """``1 - (1 - p) ** num_tries`` (TensorFlow's expected count of unique sampling), as ``-expm1(num_tries * log1p(-p))``.

    A candidate drawn with certainty (``p == 1``: a table of one key) counts 1, without taking ``log(0)``.
    """
    p = np.asarray(p, dtype=np.float64)
    out = np.ones(p.shape, dtype=np.float64)
    np.negative(np.expm1(num_tries * np.log1p(-p, where=p < 1, out=np.zeros_like(p))), out=out, where=p < 1)
    return out


def _draw(sampler: str, n_candidates: int, size: int, rng: np.random.Generator) -> np.ndarray:
    if sampler == "uniform":
        return rng.integers(0, n_candidates, size=size)
    u = rng.random(size)
    ranks = np.floor(np.exp(u * np.log(n_candidates + 1.0))).astype(np.int64) - 1
    return np.clip(ranks, 0, n_candidates - 1)


def sample_candidates(
    table: str,
    ordered_keys: np.ndarray,
    n: int,
    *,
    sampler: str = "uniform",
    unique: bool = True,
    true_keys: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
) -> NegativeSample:
    """Draw ``n`` candidates from ``ordered_keys`` (rank order) with expected counts.

    Raises
    ------
    InvalidBatchError
        If ``n`` is not positive, the table is empty, or ``unique`` asks for more keys than exist.
    """
    if sampler not in SAMPLERS:
        raise InvalidBatchError(f"table {table!r}: sampler {sampler!r} is unknown; expected one of {SAMPLERS}")
    r = int(ordered_keys.shape[0])
    if n <= 0:
        raise InvalidBatchError(f"table {table!r}: sample size must be positive, got n={n}")
    if r == 0:
        raise InvalidBatchError(f"table {table!r}: cannot sample from an empty table")
    if unique and n > r:
        raise InvalidBatchError(
            f"table {table!r}: asked for {n} unique candidates but the table holds only {r} keys"
        )
    rng = rng if rng is not None else np.random.default_rng()
    if unique:
        chosen: list[np.ndarray] = []
        seen = np.zeros(r, dtype=bool)
        have = 0
        tries = 0
        while have < n:
            if tries > _MAX_TRIES:
                raise InvalidBatchError(
                    f"table {table!r}: unique {sampler} sampling of {n} of {r} keys did not finish in {_MAX_TRIES} draws"
                )
            m = max(2 * (n - have), 256)
            draws = _draw(sampler, r, m, rng)
            uniq, first = np.unique(draws, return_index=True)
            new = ~seen[uniq]
            first_new = np.sort(first[new])
            take = first_new[: n - have]
            ranks_taken = draws[take]
            seen[ranks_taken] = True
            chosen.append(ranks_taken)
            have += int(take.size)
            tries += int(take[-1]) + 1 if have == n and take.size else m
        ranks = np.concatenate(chosen)
        num_tries = tries
        p = candidate_probabilities(sampler, r, ranks)
        expected = _unique_expected(num_tries, p)
    else:
        ranks = _draw(sampler, r, n, rng)
        num_tries = n
        expected = n * candidate_probabilities(sampler, r, ranks)
    true_expected = np.zeros(0, dtype=np.float64)
    if true_keys is not None:
        tk = np.asarray(true_keys, dtype=np.int64)
        sorter = np.argsort(ordered_keys, kind="stable")
        pos = np.searchsorted(ordered_keys, tk, sorter=sorter)
        pos = np.clip(pos, 0, r - 1)
        rank_of = sorter[pos]
        present = ordered_keys[rank_of] == tk
        pt = np.where(present, candidate_probabilities(sampler, r, rank_of), 0.0)
        true_expected = _unique_expected(num_tries, pt) if unique else n * pt
    return NegativeSample(
        keys=ordered_keys[ranks].astype(np.int64),
        expected_count=np.asarray(expected, dtype=np.float64),
        true_expected_count=np.asarray(true_expected, dtype=np.float64),
        num_tries=int(num_tries),
    )
