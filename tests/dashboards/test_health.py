"""Bank and cluster health logic: shard sizes, rates, staleness, maker versions."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from carls_dask.dashboards.health import (
    bank_summary,
    counter_rate,
    maker_versions,
    shard_sizes,
    staleness,
    steps_per_second,
)
from tests.dashboards.tables import make_table


def test_shard_sizes_from_buckets() -> None:
    ds = make_table(np.arange(10), np.zeros((10, 2)), bucket=np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 10]), n_shards=3)
    out = shard_sizes(ds)
    assert out["shard"].values.tolist() == [0, 1, 2]
    assert out["rows"].values.tolist() == [3, 4, 3]  # 10 % 3 == 1


def test_counter_rate_and_steps_per_second_from_wall_time() -> None:
    m = xr.Dataset(
        {"wall_time": ("step", [100.0, 101.0, 103.0, 103.0]), "bank_lookups": ("step", [0.0, 500.0, 1500.0, 1600.0])},
        coords={"step": [0, 10, 30, 40]},
    )
    r = counter_rate(m, "bank_lookups")
    assert r is not None
    assert r["step"].values.tolist() == [10, 30]  # no time passed before step 40: dropped
    np.testing.assert_allclose(r.values, [500.0, 500.0])
    sps = steps_per_second(m)
    assert sps is not None
    np.testing.assert_allclose(sps.values, [10.0, 10.0])
    assert counter_rate(m, "bank_updates") is None
    written = xr.Dataset({"steps_per_s": ("step", [3.0, np.nan])}, coords={"step": [1, 2]})
    assert steps_per_second(written).values.tolist() == [3.0]  # type: ignore[union-attr]


def test_staleness_distribution() -> None:
    ds = make_table(np.arange(4), np.zeros((4, 2)), wall_time=np.array([90.0, 95.0, 99.0, 100.0]))
    out = staleness(ds, now=100.0, bins=2)
    assert out is not None
    assert out["count"].values.tolist() == [2, 2]
    assert out.attrs["max"] == 10.0 and out.attrs["median"] == pytest.approx(3.0)


def test_maker_versions_counts_rows_per_maker_and_model_step() -> None:
    ds = make_table(
        np.arange(5),
        np.zeros((5, 2)),
        maker=np.array(["pl", "pl", "nbr", "pl", "nbr"]),
        model_step=np.array([100, 200, 100, 200, 100]),
    )
    out = maker_versions(ds)
    assert out is not None
    assert list(zip(out["maker"].values.tolist(), out["model_step"].values.tolist(), out["rows"].values.tolist(), strict=True)) == [
        ("nbr", 100, 2),
        ("pl", 100, 1),
        ("pl", 200, 2),
    ]


def test_bank_summary() -> None:
    ds = make_table(np.arange(3), np.zeros((3, 2)), version=np.array([1, 5, 2]), model_step=np.array([0, 7, 3]))
    s = bank_summary(ds)
    assert s["rows"] == 3 and s["version"] == 5 and s["model_step"] == 7
    assert bank_summary(None)["rows"] == 0
