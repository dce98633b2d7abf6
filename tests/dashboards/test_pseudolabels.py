"""Pseudo-label quality logic: precision/coverage, thresholds, histograms, per-class accuracy, flips."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from carls_dask.dashboards.pseudolabels import (
    QualityIndex,
    confidence_histogram,
    flip_rate,
    has_pseudo_labels,
    label_quality,
    per_class_accuracy,
    threshold_curve,
    truth_for,
)
from carls_dask.errors import UnknownColumnError
from tests.dashboards.tables import make_table

# ten rows: pseudo labels, confidences and held-out truth (-1: unknown / unlabelled)
PL = np.array([0, 0, 1, 1, 2, 2, -1, -1, 0, 1])
CONF = np.array([0.9, 0.8, 0.7, 0.6, 0.95, 0.3, 0.0, 0.0, 0.55, 0.99])
TRUTH = np.array([0, 1, 1, 1, 2, 0, 2, 0, -1, -1])


def _table(**kw: object) -> xr.Dataset:
    keys = np.arange(100, 110)
    return make_table(keys, np.zeros((10, 2)), pseudo_label=PL, confidence=CONF, **kw)  # type: ignore[arg-type]


def test_precision_and_coverage_at_zero_threshold() -> None:
    q = label_quality(_table(label=TRUTH))
    assert q["coverage"] == pytest.approx(0.8)  # 8 of 10 rows labelled
    # judged rows: 0..5 -> right: 0, 2, 3, 4 -> 4 of 6
    assert q["judged"] == 6
    assert q["precision"] == pytest.approx(4 / 6)


def test_threshold_raises_precision_and_lowers_coverage() -> None:
    q = label_quality(_table(label=TRUTH), threshold=0.65)
    # labelled with conf >= .65: rows 0, 1, 2, 4, 9 -> coverage .5; judged 0,1,2,4 -> right 0,2,4
    assert q["coverage"] == pytest.approx(0.5)
    assert q["precision"] == pytest.approx(3 / 4)
    curve = threshold_curve(_table(label=TRUTH), thresholds=np.array([0.0, 0.65, 1.0]))
    np.testing.assert_allclose(curve["coverage"].values, [0.8, 0.5, 0.0])
    np.testing.assert_allclose(curve["precision"].values[:2], [4 / 6, 3 / 4])
    assert np.isnan(curve["precision"].values[2])


def test_truth_from_a_separate_array_is_matched_by_key() -> None:
    truth = xr.DataArray(TRUTH[::-1], dims="key", coords={"key": np.arange(109, 99, -1)})
    np.testing.assert_array_equal(truth_for(_table(), truth), TRUTH)
    partial = xr.DataArray([1], dims="key", coords={"key": [103]})
    assert truth_for(_table(), partial).tolist() == [-1, -1, -1, 1, -1, -1, -1, -1, -1, -1]
    with pytest.raises(UnknownColumnError, match="'key' coordinate"):
        truth_for(_table(), xr.DataArray([1], dims="node"))


def test_without_truth_precision_is_nan_and_coverage_still_counts() -> None:
    q = label_quality(_table())
    assert np.isnan(q["precision"]) and q["coverage"] == pytest.approx(0.8)
    assert per_class_accuracy(_table()) is None


def test_confidence_histogram_splits_right_wrong_unjudged() -> None:
    h = confidence_histogram(_table(label=TRUTH), bins=10)
    assert int(h["right"].sum()) == 4 and int(h["wrong"].sum()) == 2 and int(h["unjudged"].sum()) == 2
    assert int(h["right"].sel(bin=0.95)) == 2  # 0.9 and 0.95 fall in [0.9, 1.0]
    assert h["bin"].size == 10


def test_per_class_accuracy() -> None:
    acc = per_class_accuracy(_table(label=TRUTH))
    assert acc is not None
    assert acc["class"].values.tolist() == [0, 1, 2]
    assert acc["support"].values.tolist() == [3, 3, 2]
    # class 0: rows 0 (right), 5 (wrong), 7 (unlabelled); class 1: 1 wrong, 2 and 3 right; class 2: 4 right
    np.testing.assert_allclose(acc["accuracy"].values, [0.5, 2 / 3, 1.0])


def test_flip_rate_counts_changed_labels_among_rows_labelled_twice() -> None:
    before = _table(version=np.ones(10, np.int64))
    after_pl = PL.copy()
    after_pl[[0, 2]] = [1, 0]  # two flips
    after_pl[6] = 1  # newly labelled row: not compared
    after_pl[9] = -1  # label withdrawn: not compared
    version = np.ones(10, np.int64)
    version[[0, 1, 2, 6, 9]] = 2
    after = make_table(np.arange(100, 110), np.zeros((10, 2)), pseudo_label=after_pl, version=version)
    out = flip_rate(before, after)
    assert out["compared"] == 7 and out["flips"] == 2
    assert out["flip_rate"] == pytest.approx(2 / 7)
    assert out["rewritten"] == 3


def test_has_pseudo_labels() -> None:
    assert has_pseudo_labels(_table())
    assert not has_pseudo_labels(make_table(np.arange(3), np.zeros((3, 2))))
    assert not has_pseudo_labels(make_table(np.arange(3), np.zeros((3, 2)), pseudo_label=np.full(3, -1)))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-1, 3), st.integers(-1, 3), st.sampled_from([0.0, 0.1, 0.5, 0.5, 0.9, 1.0])), min_size=0, max_size=40),
    st.sampled_from([0.0, 0.05, 0.1, 0.5, 0.55, 0.9, 1.0, 1.01]),
)
def test_quality_index_answers_every_threshold_as_counting_the_rows_does(rows: list[tuple[int, int, float]], threshold: float) -> None:
    pl = np.array([r[0] for r in rows], dtype=np.int64)
    truth = np.array([r[1] for r in rows], dtype=np.int64)
    conf = np.array([r[2] for r in rows], dtype=np.float64)
    ds = xr.Dataset(
        {"pseudo_label": ("key", pl), "confidence": ("key", conf), "label": ("key", truth)},
        coords={"key": np.arange(pl.size, dtype=np.int64)},
    )
    got = QualityIndex.of(ds).at(threshold)
    labelled = (pl >= 0) & (conf >= threshold)
    judged = labelled & (truth >= 0)
    assert got["labelled"] == labelled.sum() and got["judged"] == judged.sum() and got["rows"] == pl.size
    if judged.any():
        assert got["precision"] == pytest.approx((pl[judged] == truth[judged]).mean())
    else:
        assert np.isnan(got["precision"])
