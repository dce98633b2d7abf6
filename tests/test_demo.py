"""The figures ``carls-dask demo`` prints about its run folder (real metric stores in tmp_path)."""

from __future__ import annotations

import pathlib

import numpy as np

from carls_dask import storage
from carls_dask.demo import run_figures


def test_run_figures_lists_the_last_accuracy_values_and_the_snapshots(tmp_path: pathlib.Path) -> None:
    run = tmp_path / "run"
    with storage.MetricWriter(run / "metrics.zarr", run="run") as writer:
        writer.append(10, **{"trainer.loss": 1.0, "trainer.test_acc": 0.5})
        writer.append(20, **{"trainer.loss": 0.5, "trainer.val_acc": 0.6, "maker.pl_precision": 0.9})
        writer.append(30, **{"trainer.loss": 0.25, "trainer.test_acc": 0.7, "maker.pl_coverage": np.nan})
    lines = run_figures(run)
    assert lines == [
        f"  {'maker.pl_precision':<32} last 0.9000 (step 20), highest 0.9000 (step 20)",
        f"  {'trainer.test_acc':<32} last 0.7000 (step 30), highest 0.7000 (step 30)",
        f"  {'trainer.val_acc':<32} last 0.6000 (step 20), highest 0.6000 (step 20)",
    ]


def test_run_figures_show_the_highest_value_beside_the_last(tmp_path: pathlib.Path) -> None:
    with storage.MetricWriter(tmp_path / "metrics.zarr", run="run") as writer:
        for step, acc in ((10, 0.4), (20, 0.8), (30, 0.6)):
            writer.append(step, **{"trainer.val_acc": acc})
    assert run_figures(tmp_path) == [f"  {'trainer.val_acc':<32} last 0.6000 (step 30), highest 0.8000 (step 20)"]


def test_run_figures_of_an_empty_folder_is_empty(tmp_path: pathlib.Path) -> None:
    assert run_figures(tmp_path) == []


def test_run_figures_list_a_series_written_twice_once_under_its_loop(tmp_path: pathlib.Path) -> None:
    with storage.MetricWriter(tmp_path / "metrics.zarr", run="run") as writer:
        writer.append(10, **{"trainer.test_acc": 0.5, "test_acc": 0.5, "val_acc": 0.4})
    assert run_figures(tmp_path) == [f"  {'trainer.test_acc':<32} last 0.5000 (step 10), highest 0.5000 (step 10)",
                                     f"  {'val_acc':<32} last 0.4000 (step 10), highest 0.4000 (step 10)"]
