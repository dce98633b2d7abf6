"""Embedding drift logic: per-shard change, neighbour churn, aligned projections."""

from __future__ import annotations

import numpy as np
import pytest

from carls_dask.dashboards.bankdata import stable_sample
from carls_dask.dashboards.drift import (
    aligned_projection,
    drift_over_snapshots,
    drift_stats,
    knn,
    neighbour_churn,
)
from carls_dask.errors import InvalidShapeError, UnknownColumnError
from tests.dashboards.tables import make_table


def _table(n: int = 200, d: int = 8, seed: int = 0, shift: float = 0.0, keys_from: int = 0):
    rng = np.random.default_rng(seed)
    keys = np.arange(keys_from, keys_from + n)
    emb = rng.normal(size=(n, d)) + shift
    return make_table(keys, emb, bucket=keys % 16, n_shards=2)


def test_drift_stats_measures_a_known_shift_per_shard() -> None:
    before = _table()
    moved = before.copy(deep=True)
    delta = np.zeros(8)
    delta[:2] = [3.0, 4.0]  # every row moves by exactly 5 in L2
    moved["embedding"] = moved["embedding"] + delta.astype(np.float32)
    out = drift_stats(before, moved)
    assert list(out["shard"].values) == [-1, 0, 1]
    np.testing.assert_allclose(out["l2_mean"].values, 5.0, rtol=1e-5)
    np.testing.assert_allclose(out["l2_p99"].values, 5.0, rtol=1e-5)
    assert out["rows"].values.tolist() == [200.0, 100.0, 100.0]
    assert (out["cos_mean"].values > 0).all()


def test_drift_stats_scaling_changes_l2_but_not_cosine() -> None:
    before = _table()
    scaled = before.copy(deep=True)
    scaled["embedding"] = scaled["embedding"] * 2
    out = drift_stats(before, scaled).sel(shard=-1)
    norms = np.linalg.norm(before["embedding"].values.astype(np.float64), axis=1)
    assert float(out["l2_mean"]) == pytest.approx(norms.mean(), rel=1e-5)
    assert float(out["cos_p99"]) == pytest.approx(0.0, abs=1e-6)


def test_drift_stats_matches_rows_by_key_and_ignores_unmatched_rows() -> None:
    before = _table(n=100)
    after = before.isel(key=slice(None, None, -1)).copy(deep=True)  # same rows, reversed order
    after = after.isel(key=slice(0, 60))  # and 40 rows gone
    out = drift_stats(before, after).sel(shard=-1)
    assert float(out["rows"]) == 60
    assert float(out["l2_p99"]) == pytest.approx(0.0, abs=1e-6)


def test_drift_stats_rejects_snapshots_of_different_width() -> None:
    with pytest.raises(InvalidShapeError, match=r"'embedding'.*\(8,\) before and \(4,\) after"):
        drift_stats(_table(d=8), _table(d=4))


def test_drift_stats_names_a_missing_column() -> None:
    with pytest.raises(UnknownColumnError, match=r"no column 'vectors'.*embedding"):
        drift_stats(_table(), _table(), column_name="vectors")


def test_drift_over_snapshots_indexes_by_the_later_step() -> None:
    snaps = [(10, _table(shift=0)), (20, _table(shift=1)), (30, _table(shift=1))]
    out = drift_over_snapshots(snaps)
    assert out is not None
    assert out["step"].values.tolist() == [20, 30]
    assert float(out["l2_mean"].sel(step=20, shard=-1)) == pytest.approx(np.sqrt(8), rel=1e-5)
    assert float(out["l2_mean"].sel(step=30, shard=-1)) == pytest.approx(0.0, abs=1e-6)
    assert drift_over_snapshots(snaps[:1]) is None


def test_knn_agrees_with_a_full_sort() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(50, 5))
    q = np.array([0, 7, 49])
    got = knn(x, q, k=4, block=2)
    for row, qi in zip(got, q, strict=True):
        d = np.linalg.norm(x - x[qi], axis=1)
        d[qi] = np.inf
        assert set(row.tolist()) == set(np.argsort(d)[:4].tolist())


def test_neighbour_churn_is_zero_for_isometries_and_high_for_shuffles() -> None:
    before = _table(n=300)
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    rotated = before.copy(deep=True)
    rotated["embedding"] = (("key", "dim"), (before["embedding"].values @ q).astype(np.float32))
    assert neighbour_churn(before, rotated, k=5, queries=100) == pytest.approx(0.0, abs=1e-9)
    shuffled = before.copy(deep=True)
    shuffled["embedding"] = (("key", "dim"), before["embedding"].values[rng.permutation(300)])
    assert neighbour_churn(before, shuffled, k=5, queries=100) > 0.8


def test_neighbour_churn_needs_more_shared_rows_than_k() -> None:
    assert np.isnan(neighbour_churn(_table(n=5), _table(n=5), k=10))


def test_stable_sample_keeps_the_same_keys_across_snapshots() -> None:
    a = np.arange(0, 10_000)
    b = np.arange(100, 10_100)
    sa, sb = set(a[stable_sample(a, 500)]), set(b[stable_sample(b, 500)])
    assert len(sa) == len(sb) == 500
    assert len(sa & sb) >= 480


def test_projection_is_aligned_to_the_previous_one() -> None:
    ds = _table(n=400, d=16)
    first = aligned_projection(ds, sample=300)
    assert first.sizes["key"] == 300
    # Turn the previous map by 90 degrees: the next map of the same data must follow it, not spin back.
    turned = first.copy(deep=True)
    turned["x"], turned["y"] = -first["y"], first["x"].copy()
    again = aligned_projection(ds, previous=turned, sample=300)
    np.testing.assert_allclose(again["x"].values, turned["x"].values, atol=1e-8)
    np.testing.assert_allclose(again["y"].values, turned["y"].values, atol=1e-8)
    unaligned = aligned_projection(ds, sample=300)
    assert np.abs(unaligned["x"].values - turned["x"].values).max() > 0.5


def test_projection_of_a_rotated_bank_stays_put() -> None:
    ds = _table(n=400, d=16)
    first = aligned_projection(ds, sample=400)
    rng = np.random.default_rng(2)
    q, _ = np.linalg.qr(rng.normal(size=(16, 16)))
    rotated = ds.copy(deep=True)
    rotated["embedding"] = (("key", "dim"), ds["embedding"].values.astype(np.float64) @ q)
    second = aligned_projection(rotated, previous=first, sample=400)
    np.testing.assert_allclose(second["x"].values, first["x"].values, atol=1e-4)
    np.testing.assert_allclose(second["y"].values, first["y"].values, atol=1e-4)
    assert (second["label"].values == -1).all()


def test_neighbour_churn_of_a_big_table_is_measured_among_a_stable_sample_of_its_rows() -> None:
    before, after = _table(n=600, seed=1), _table(n=600, seed=2)
    rows = stable_sample(np.asarray(before["key"].values), 250)
    # the sampled measure is the full measure of the sampled rows (the same rows in both snapshots)
    assert neighbour_churn(before, after, k=5, queries=50, candidates=250) == pytest.approx(
        neighbour_churn(before.isel(key=rows), after.isel(key=rows), k=5, queries=50)
    )
    assert neighbour_churn(before, after, k=5, queries=50, candidates=600) == neighbour_churn(before, after, k=5, queries=50)
