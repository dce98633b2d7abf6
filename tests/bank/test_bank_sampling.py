"""Candidate samplers: TensorFlow/CARLS probabilities and expected counts against empirical frequencies."""

from __future__ import annotations

import numpy as np
import pytest

from carls_dask.bank.core import ShardCore
from carls_dask.bank.sampling import candidate_probabilities, order_by_frequency, sample_candidates
from carls_dask.bank.schema import Column, TableSpec
from carls_dask.errors import InvalidBatchError


def test_log_uniform_probabilities_follow_the_zipf_formula() -> None:
    r = 50
    p = candidate_probabilities("log_uniform", r, np.arange(r))
    np.testing.assert_allclose(p.sum(), 1.0, rtol=1e-12)
    np.testing.assert_allclose(p[0], np.log(2) / np.log(51))
    np.testing.assert_allclose(p[9], (np.log(11) - np.log(10)) / np.log(51))
    assert np.all(np.diff(p) < 0)


def test_order_by_frequency_breaks_ties_by_key() -> None:
    keys = np.array([5, 3, 9, 1])
    freq = np.array([2, 7, 2, 0])
    assert order_by_frequency(keys, freq).tolist() == [3, 5, 9, 1]


@pytest.mark.parametrize("sampler", ["uniform", "log_uniform"])
def test_non_unique_expected_counts_match_empirical_counts(sampler: str) -> None:
    keys = np.arange(20, dtype=np.int64) * 10
    n, trials = 8, 4000
    rng = np.random.default_rng(0)
    counts = np.zeros(20)
    expected = np.zeros(20)
    for _ in range(trials):
        s = sample_candidates("t", keys, n, sampler=sampler, unique=False, rng=rng)
        assert s.keys.shape == (n,) and s.num_tries == n
        idx = s.keys // 10
        np.add.at(counts, idx, 1)
        expected[idx] = s.expected_count
    np.testing.assert_allclose(expected, n * candidate_probabilities(sampler, 20, np.arange(20)))
    np.testing.assert_allclose(counts / trials, expected, rtol=0.08, atol=0.01)


@pytest.mark.parametrize("sampler", ["uniform", "log_uniform"])
def test_unique_expected_counts_use_the_tf_formula_and_match_inclusion_rates(sampler: str) -> None:
    r, n, trials = 30, 10, 1500
    keys = np.arange(r, dtype=np.int64)
    rng = np.random.default_rng(1)
    hits = np.zeros(r)
    tries = []
    for _ in range(trials):
        s = sample_candidates("t", keys, n, sampler=sampler, unique=True, true_keys=np.array([0, 29]), rng=rng)
        assert np.unique(s.keys).size == n
        p = candidate_probabilities(sampler, r, s.keys)
        np.testing.assert_allclose(s.expected_count, -np.expm1(s.num_tries * np.log1p(-p)))
        pt = candidate_probabilities(sampler, r, np.array([0, 29]))
        np.testing.assert_allclose(s.true_expected_count, -np.expm1(s.num_tries * np.log1p(-pt)))
        hits[s.keys] += 1
        tries.append(s.num_tries)
    # the TF estimate is built from the realised num_tries; averaged over samples it tracks how often
    # each candidate actually appears
    rates = hits / trials
    p_all = candidate_probabilities(sampler, r, np.arange(r))
    est = np.mean([-np.expm1(t * np.log1p(-p_all)) for t in tries], axis=0)
    np.testing.assert_allclose(rates, est, atol=0.04)
    assert abs(rates.sum() - n) < 1e-9


def test_log_uniform_ranks_by_frequency_through_the_shard() -> None:
    spec = TableSpec("v", columns=(Column("embedding", shape=(2,)),), optimizer=None, learning_rate=0.1,
                     initializer="zeros", init_scale=0.0)
    core = ShardCore([spec])
    core.lookup("v", np.arange(10), insert=True)
    core.lookup("v", np.repeat(np.array([7]), 50), insert=True)  # key 7 becomes rank 0
    core.lookup("v", np.repeat(np.array([3]), 20), insert=True)  # key 3 rank 1
    draws = np.concatenate([
        core.sample_negatives("v", 5, sampler="log_uniform", unique=False, seed=s).keys for s in range(400)
    ])
    share = np.bincount(draws, minlength=10) / draws.size
    p = candidate_probabilities("log_uniform", 10, np.arange(10))
    assert abs(share[7] - p[0]) < 0.03 and abs(share[3] - p[1]) < 0.03
    s = core.sample_negatives("v", 3, sampler="log_uniform", true_keys=np.array([7, 12345]), seed=0)
    assert s.true_expected_count[1] == 0.0 and s.true_expected_count[0] > 0.5


def test_unique_uniform_over_all_keys_returns_every_key() -> None:
    keys = np.arange(5, dtype=np.int64)
    s = sample_candidates("t", keys, 5, sampler="uniform", unique=True, rng=np.random.default_rng(0))
    assert sorted(s.keys.tolist()) == [0, 1, 2, 3, 4]


def test_sampler_errors_name_the_table() -> None:
    with pytest.raises(InvalidBatchError, match=r"'items'.*only 3 keys"):
        sample_candidates("items", np.arange(3), 4, unique=True)
    with pytest.raises(InvalidBatchError, match=r"'items'.*empty"):
        sample_candidates("items", np.arange(0), 1, unique=False)
    with pytest.raises(InvalidBatchError, match="positive"):
        sample_candidates("items", np.arange(3), 0)
