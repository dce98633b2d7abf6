"""Candidate samplers: TensorFlow/CARLS probabilities and expected counts against empirical frequencies."""

from __future__ import annotations

import numpy as np
import pytest

from carls_dask.bank.core import ShardCore
from carls_dask.bank.sampling import candidate_probabilities, order_by_frequency, sample_candidates
from carls_dask.bank.schema import Column, TableSpec
from carls_dask.bank.shard_sampler import SamplingSettings
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


def _table(name: str = "v", dim: int = 2) -> TableSpec:
    return TableSpec(name, columns=(Column("embedding", shape=(dim,)),), optimizer=None, learning_rate=0.1,
                     initializer="zeros", init_scale=0.0)


def _chi_square(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("sampler", ["uniform", "log_uniform"])
def test_shard_sampler_counts_pass_a_chi_square_test_against_its_expected_counts(sampler: str) -> None:
    """With replacement, counts over 2,000 calls of 16 draws from 60 keys (some deleted, some added after the
    order was built) are multinomial with the reported per-draw probabilities. The statistic has ~59 degrees
    of freedom (mean 59, sd ~11); 110 is about 4.6 sd above the mean (p < 1e-5), while a probability off by
    10 % on a top rank alone adds far more than that at these counts (see the shifted check below)."""
    core = ShardCore([_table()], sampling=SamplingSettings(rebuild_fraction=10.0))  # keep the order built here
    core.lookup("v", np.arange(50), insert=True)
    core.lookup("v", np.repeat(np.arange(10), np.arange(10, 0, -1) * 5), insert=True)
    core.sample_negatives("v", 1, sampler=sampler, seed=0)  # builds the rank order
    core.delete("v", np.array([3, 20, 41]))  # tombstones
    core.lookup("v", np.arange(100, 113), insert=True)  # tail ranks
    calls, n = 2000, 16
    counts: dict[int, int] = {}
    expected: dict[int, float] = {}
    for s in range(calls):
        smp = core.sample_negatives("v", n, sampler=sampler, unique=False, seed=1000 + s)
        for key, e in zip(smp.keys.tolist(), smp.expected_count.tolist(), strict=True):
            counts[key] = counts.get(key, 0) + 1
            expected[key] = e
    assert not {3, 20, 41} & set(counts)
    live = np.sort(core.keys("v"))
    # every live key's expected count, including keys never drawn, from the true-key probabilities
    probe = core.sample_negatives("v", n, sampler=sampler, unique=False, true_keys=live, seed=1)
    exp_all = probe.true_expected_count * calls
    assert abs(probe.true_expected_count.sum() - n) < 1e-9
    for key, e in expected.items():
        assert e == pytest.approx(probe.true_expected_count[np.searchsorted(live, key)])
    obs = np.array([counts.get(int(k), 0) for k in live], dtype=np.float64)
    assert _chi_square(obs, exp_all) < 110
    shifted = exp_all.copy()
    shifted[0] *= 1.1
    shifted[1:] *= (exp_all.sum() - shifted[0]) / exp_all[1:].sum()
    if sampler == "log_uniform":
        assert _chi_square(obs, shifted) > _chi_square(obs, exp_all)
    assert core.sampling_state("v")["rebuilds"] == 1  # both samplers draw ranks of one order, built once


@pytest.mark.parametrize("sampler", ["uniform", "log_uniform"])
def test_unique_draws_are_unique_and_true_keys_are_reported(sampler: str) -> None:
    core = ShardCore([_table()])
    core.lookup("v", np.arange(200), insert=True)
    for s in range(50):
        smp = core.sample_negatives("v", 150, sampler=sampler, unique=True, true_keys=np.array([5, 10**9]), seed=s)
        assert np.unique(smp.keys).size == 150 and np.isin(smp.keys, np.arange(200)).all()
        assert smp.num_tries >= 150 and smp.true_expected_count[1] == 0.0 and smp.true_expected_count[0] > 0
    with pytest.raises(InvalidBatchError, match=r"'v'.*only 200 keys"):
        core.sample_negatives("v", 201, sampler=sampler, unique=True)


def test_sampling_after_a_small_change_does_not_rebuild_the_rank_order() -> None:
    """The order is built once; a change of under 5 % of the rows (and fewer draws than rows) keeps it."""
    core = ShardCore([_table()], initial_capacity=1 << 14)
    core.lookup("v", np.arange(10_000), insert=True)
    core.sample_negatives("v", 64, sampler="log_uniform", seed=0)
    assert core.sampling_state("v")["rebuilds"] == 1
    core.lookup("v", np.arange(10_000, 10_100), insert=True)  # 1 % new rows: tail ranks
    core.lookup("v", np.arange(200), insert=True)  # 2 % re-counted
    core.delete("v", np.arange(500, 550))  # 0.5 % deleted
    for s in range(20):
        smp = core.sample_negatives("v", 64, sampler="log_uniform", seed=s)
        assert np.isin(smp.keys, core.keys("v")).all()
    st = core.sampling_state("v")
    assert st["rebuilds"] == 1 and st["tombstones"] == 50 and st["ranks"] == 10_100
    # past the staleness fraction and past rebuild_draws * rows draws: one more rebuild
    core.lookup("v", np.arange(2000), insert=True)
    for s in range(200):
        core.sample_negatives("v", 64, sampler="log_uniform", unique=False, seed=s)
    assert core.sampling_state("v")["rebuilds"] == 2
    # rows appended after the build rank last, in insertion order: the new key 10_100 has the lowest probability
    probe = core.sample_negatives("v", 1, sampler="log_uniform", unique=False, true_keys=np.array([0, 10_099]), seed=0)
    assert probe.true_expected_count[0] > probe.true_expected_count[1] > 0


def test_split_quota_is_proportional_and_capped() -> None:
    from carls_dask.bank.shard_sampler import split_quota

    rng = np.random.default_rng(0)
    q = np.array([split_quota(100, [100, 300, 0], False, rng) for _ in range(2000)])
    assert (q.sum(axis=1) == 100).all() and (q[:, 2] == 0).all()
    assert abs(q[:, 0].mean() - 25) < 0.5
    q = split_quota(10, [2, 8, 1], True, rng)
    assert q.sum() == 10 and (q <= np.array([2, 8, 1])).all()


@pytest.mark.parametrize("sampler", ["uniform", "log_uniform"])
def test_excluded_true_keys_are_never_returned_and_the_rest_is_renormalised(sampler: str) -> None:
    core = ShardCore([_table()])
    core.lookup("v", np.repeat(np.arange(30), np.arange(30, 0, -1)), insert=True)
    true = np.array([0, 1, 7, 999])
    plain = core.sample_negatives("v", 5, sampler=sampler, unique=False, true_keys=np.arange(30), seed=0)
    excl_mass = plain.true_expected_count[[0, 1, 7]].sum() / 5
    for s in range(200):
        smp = core.sample_negatives("v", 25, sampler=sampler, unique=True, true_keys=true, seed=s, exclude_true=True)
        assert not np.isin(smp.keys, true).any() and np.unique(smp.keys).size == 25
        assert (smp.true_expected_count == 0).all()
    smp = core.sample_negatives("v", 5, sampler=sampler, unique=False, true_keys=true, seed=1, exclude_true=True)
    p_plain = plain.true_expected_count[smp.keys] / 5
    np.testing.assert_allclose(smp.expected_count, 5 * p_plain / (1 - excl_mass))
    with pytest.raises(InvalidBatchError, match=r"only 27 of 30 keys are not true keys"):
        core.sample_negatives("v", 28, sampler=sampler, true_keys=true, exclude_true=True)


@pytest.mark.parametrize("sampler", ["uniform", "log_uniform"])
def test_the_client_merges_shards_as_a_mixture_weighted_by_rows(sampler: str) -> None:
    """Across 3 shards the expected counts of every key sum to ``n`` (with replacement) and the empirical
    counts pass the same chi-square test (~79 degrees of freedom: 150 is ~5.6 sd above the mean)."""
    from carls_dask.bank import KnowledgeBank

    bank = KnowledgeBank.local([_table()], n_shards=3, buckets=64)
    keys = np.arange(80)
    bank.lookup("v", np.repeat(keys, np.arange(80, 0, -1)), insert=True)
    n, calls = 10, 1500
    every = bank.sample_negatives("v", n, sampler=sampler, unique=False, true_keys=keys, seed=0)
    assert abs(every.true_expected_count.sum() - n) < 1e-9
    counts = np.zeros(80)
    for s in range(calls):
        smp = bank.sample_negatives("v", n, sampler=sampler, unique=False, seed=s + 1)
        np.testing.assert_allclose(smp.expected_count, every.true_expected_count[smp.keys])
        np.add.at(counts, smp.keys, 1)
    assert _chi_square(counts, every.true_expected_count * calls) < 150
    u = bank.sample_negatives("v", 79, sampler=sampler, unique=True, true_keys=np.array([3]), seed=2,
                              exclude_true=True)
    assert np.unique(u.keys).size == 79 and 3 not in u.keys.tolist()
