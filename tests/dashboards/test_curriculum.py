"""Curriculum progress logic: pacing vs realised, difficulty histograms, accuracy by difficulty."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from carls_dask.dashboards.curriculum import (
    accuracy_by_difficulty,
    admitted_fraction,
    difficulty_histograms,
    pacing_vs_realised,
)
from carls_dask.errors import InvalidBatchError
from tests.dashboards.tables import make_table


def test_pacing_vs_realised_over_steps() -> None:
    m = xr.Dataset(
        {"pacing": ("step", [0.1, 0.2, 0.4]), "admitted_fraction": ("step", [0.1, 0.25, 0.3])},
        coords={"step": [1, 2, 3]},
    )
    out = pacing_vs_realised(m)
    assert out is not None
    np.testing.assert_allclose(out["gap"].values, [0.0, 0.05, -0.1])
    assert "sampled" not in out
    m["sampled_fraction"] = ("step", [0.05, 0.15, 0.3])
    with_sampled = pacing_vs_realised(m)
    assert with_sampled is not None and with_sampled["sampled"].values.tolist() == [0.05, 0.15, 0.3]
    only = pacing_vs_realised(m[["pacing"]])
    assert only is not None and np.isnan(only["realised"].values).all()
    assert pacing_vs_realised(xr.Dataset({"loss": ("step", [1.0])})) is None
    assert pacing_vs_realised(None) is None


def test_admitted_fraction_takes_the_easiest_share() -> None:
    ds = make_table(np.arange(10), np.zeros((10, 2)), difficulty=np.arange(10) / 10)
    assert admitted_fraction(ds, 0.3) == pytest.approx(0.3)
    assert admitted_fraction(ds, 1.0) == 1.0
    assert admitted_fraction(ds, 0.0) == 0.0
    with pytest.raises(InvalidBatchError, match=r"pacing value in \[0, 1\], got 1.5"):
        admitted_fraction(ds, 1.5)


def test_difficulty_histograms_share_bins_across_snapshots() -> None:
    a = make_table(np.arange(4), np.zeros((4, 2)), difficulty=[0.0, 0.1, 0.2, 0.3])
    b = make_table(np.arange(4), np.zeros((4, 2)), difficulty=[0.7, 0.8, 0.9, 1.0])
    none = make_table(np.arange(4), np.zeros((4, 2)))
    out = difficulty_histograms([(1, a), (2, none), (3, b)], bins=2)
    assert out is not None
    assert out["step"].values.tolist() == [1, 3]
    assert out["count"].values.tolist() == [[4, 0], [0, 4]]
    np.testing.assert_allclose(out["density"].sum("difficulty").values, 1.0)
    assert difficulty_histograms([(1, none)]) is None


def test_accuracy_by_difficulty_bins_by_quantile() -> None:
    diff = np.arange(8, dtype=float)
    pred = np.array([1, 1, 1, 1, 1, 0, 0, 0])
    truth = np.ones(8, np.int64)
    ds = make_table(np.arange(8), np.zeros((8, 2)), difficulty=diff, pseudo_label=pred, label=truth)
    out = accuracy_by_difficulty(ds, bins=2)
    assert out is not None
    assert out["rows"].values.tolist() == [4, 4]
    np.testing.assert_allclose(out["accuracy"].values, [1.0, 0.25])
    assert accuracy_by_difficulty(make_table(np.arange(8), np.zeros((8, 2)), difficulty=diff, pseudo_label=pred)) is None
