"""Small and degenerate tables answer without numpy warnings: one key, a sample as large as the table."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, ShardCore, TableSpec
from carls_dask.bank.sampling import candidate_probabilities, sample_candidates


def spec(optimizer: str | None = "adam") -> TableSpec:
    return TableSpec("one", columns=(Column("embedding", shape=(3,)),), optimizer=optimizer, learning_rate=0.1,
                     initializer="normal", init_scale=0.1)


@pytest.fixture(autouse=True)
def strict_numpy() -> Iterator[None]:
    """Every warning, and every numpy division by zero, invalid value or overflow, fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(divide="raise", invalid="raise", over="raise"):
            yield


@pytest.mark.parametrize("sampler", ["uniform", "log_uniform"])
def test_one_key_table_lookup_sample_and_top_k(sampler: str) -> None:
    core = ShardCore([spec()])
    core.lookup("one", np.array([42, 42]), insert=True)
    r = core.lookup("one", np.array([42, 7]))
    assert r.found.tolist() == [True, False] and r.frequency.tolist() == [2, 0]
    for unique in (True, False):
        s = core.sample_negatives("one", 1, sampler=sampler, unique=unique, true_keys=np.array([42, 7]), seed=0)
        assert s.keys.tolist() == [42] and s.num_tries == 1
        assert s.expected_count.tolist() == [1.0]  # the only key is drawn with certainty
        assert s.true_expected_count.tolist() == [1.0, 0.0]
    s = core.sample_negatives("one", 3, sampler=sampler, unique=False, seed=0)
    assert s.keys.tolist() == [42] * 3 and s.expected_count.tolist() == [3.0] * 3
    emb = r.values["embedding"][:1]
    for metric in ("dot", "cosine"):
        keys, scores = core.top_k("one", emb, 5, metric=metric)
        assert keys.tolist() == [[42]] and scores.shape == (1, 1) and np.isfinite(scores).all()
        keys, scores = core.top_k("one", np.zeros((2, 3)), 1, metric=metric)  # a zero query
        assert keys.tolist() == [[42], [42]] and scores.tolist() == [[0.0], [0.0]]
    core.apply_gradients("one", np.array([42]), np.zeros((1, 3)))
    core.delete("one", np.array([42]))
    assert core.size("one") == 0
    for metric in ("dot", "cosine"):  # an empty shard answers no rows
        keys, scores = core.top_k("one", emb, 2, metric=metric)
        assert keys.shape == scores.shape == (1, 0)


@pytest.mark.parametrize("sampler", ["uniform", "log_uniform"])
@pytest.mark.parametrize("r", [1, 2, 17])
def test_a_unique_sample_as_large_as_the_table_takes_every_key(sampler: str, r: int) -> None:
    core = ShardCore([spec(None)])
    keys = np.arange(r, dtype=np.int64) * 3 + 1
    core.lookup("one", np.repeat(keys, np.arange(r, 0, -1)), insert=True)
    s = core.sample_negatives("one", r, sampler=sampler, unique=True, true_keys=keys[:1], seed=1)
    assert sorted(s.keys.tolist()) == keys.tolist()
    assert s.num_tries >= r and np.all((s.expected_count > 0) & (s.expected_count <= 1))
    ordered = core.keys_and_frequency("one")[0]
    assert ordered.size == r
    p = candidate_probabilities(sampler, r, np.arange(r))
    assert np.isclose(p.sum(), 1.0)


def test_sample_candidates_with_certain_draws_keeps_expected_counts_finite() -> None:
    s = sample_candidates("t", np.array([5], np.int64), 1, unique=True, true_keys=np.array([5, 6]),
                          rng=np.random.default_rng(0))
    assert s.expected_count.tolist() == [1.0] and s.true_expected_count.tolist() == [1.0, 0.0]


def test_one_key_table_on_a_two_shard_bank(client: Any) -> None:
    bank = KnowledgeBank.create(client, [spec()], n_shards=2, buckets=8)
    try:
        bank.lookup("one", np.array([42]), insert=True)  # one shard holds the key, the other nothing
        r = bank.lookup("one", np.array([42, 43]))
        assert r.found.tolist() == [True, False]
        s = bank.sample_negatives("one", 1, unique=True, sampler="log_uniform", true_keys=np.array([42]), seed=0)
        assert s.keys.tolist() == [42] and s.expected_count.tolist() == [1.0]
        keys, scores = bank.top_k("one", r.values["embedding"][:1], 1, metric="cosine")
        assert keys.tolist() == [[42]] and np.isfinite(scores).all()
        assert bank.apply_gradients("one", np.array([42, 42]), np.zeros((2, 3))).all()
    finally:
        bank.close()
