"""Comparison of real runs: overlaid curves per run and mean ± std of final figures per variant."""

from __future__ import annotations

import json
import pathlib
import shutil
import statistics

import numpy as np
import pytest

from carls_dask.dashboards.dashboard import Dashboard
from carls_dask.dashboards.learning import final_figures, run_info, summary_table
from carls_dask.dashboards.views.compare import default_metrics
from carls_dask.storage.metrics import open_metrics
from tests.dashboards.runfolder import real_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A folder of three real semi-supervised runs: bank+pseudo seeds 0 and 1, base seed 0."""
    root = tmp_path_factory.mktemp("compare")
    for variant, seed in (("bank+pseudo", 0), ("bank+pseudo", 1), ("base", 0)):
        real_run(root, variant, seed)
    return root


def _figures(run: pathlib.Path) -> dict[str, object]:
    return json.loads((run / "result.json").read_text())["figures"]


def test_labels_come_from_the_result_or_the_request_or_the_folder(runs: pathlib.Path, tmp_path: pathlib.Path) -> None:
    run = runs / "semi-supervised-bank+pseudo-1"
    assert run_info(run).label == "bank+pseudo seed 1" and run_info(run).group == ("semi-supervised", "bank+pseudo")
    going = tmp_path / "going"
    going.mkdir()
    shutil.copy(run / "request.json", going / "request.json")
    info = run_info(going)
    assert info.result is None and info.label == "bank+pseudo seed 1"  # the seed from the request's settings
    assert run_info(tmp_path / "bare").label == "bare"


def test_mean_and_std_over_seeds_match_the_results(runs: pathlib.Path) -> None:
    paths = sorted(p for p in runs.iterdir())
    infos = [run_info(p) for p in paths]
    table = summary_table([(i, final_figures(i)) for i in infos])
    assert table[["variant", "n", "running"]].values.tolist() == [["bank+pseudo", 2, 0], ["base", 1, 0]]
    assert list(table.columns[4:6]) == ["test_acc", "best_val_acc"]  # the headline figures first
    seeds = [_figures(runs / f"semi-supervised-bank+pseudo-{s}") for s in (0, 1)]
    for key in ("test_acc", "best_val_acc", "lookup_ms"):
        values = [float(f[key]) for f in seeds]  # type: ignore[arg-type]
        mean, std = statistics.mean(values), statistics.stdev(values)
        assert table.attrs["mean"].loc[("semi-supervised", "bank+pseudo"), key] == pytest.approx(mean)
        assert table.attrs["std"].loc[("semi-supervised", "bank+pseudo"), key] == pytest.approx(std)
        assert table.loc[0, key] == f"{mean:.4g} ± {std:.2g}"
    base = _figures(runs / "semi-supervised-base-0")
    assert table.loc[1, "test_acc"] == f"{float(base['test_acc']):.4g}"  # type: ignore[arg-type]
    assert "seed" not in table.columns and "pseudo_labels" not in table.columns  # not measurements


def test_a_run_still_going_counts_with_the_last_values_of_its_evaluation_series(runs: pathlib.Path, tmp_path: pathlib.Path) -> None:
    going = tmp_path / "going"
    shutil.copytree(runs / "semi-supervised-base-0", going)
    (going / "result.json").unlink()
    ds = open_metrics(going / "metrics.zarr")
    figures = final_figures(run_info(going), ds)
    val = ds["trainer.val_acc"].values
    assert figures["val_acc"] == pytest.approx(val[np.isfinite(val)][-1])
    assert set(figures) == {"loss", "train_acc", "val_acc", "test_acc"}
    table = summary_table([(run_info(going), figures), (run_info(runs / "semi-supervised-base-0"), _figures_numeric(runs))])
    assert table.loc[0, "n"] == 2 and table.loc[0, "running"] == 1
    finished = float(_figures(runs / "semi-supervised-base-0")["test_acc"])  # type: ignore[arg-type]
    assert table.attrs["mean"].iloc[0]["test_acc"] == pytest.approx((finished + figures["test_acc"]) / 2)


def _figures_numeric(runs: pathlib.Path) -> dict[str, float]:
    return final_figures(run_info(runs / "semi-supervised-base-0"))


def test_default_metrics_are_the_headline_accuracy_and_the_loss() -> None:
    assert default_metrics(["trainer.loss", "trainer.val_acc"]) == ["trainer.val_acc", "trainer.loss"]
    assert default_metrics(["classifier.loss", "classifier.top1", "trainer.loss", "trainer.i2t_r@1"]) == [
        "classifier.top1", "trainer.loss",
    ]
    assert default_metrics([]) == []


def test_comparison_tab_overlays_one_curve_per_chosen_run(runs: pathlib.Path) -> None:
    d = Dashboard(runs)
    d.refresh()
    view = d.comparison
    assert view is not None and d.tab_names[0] == "Comparison"
    assert not view._error.visible, view._error.object
    assert list(view.metrics.value) == ["trainer.test_acc", "trainer.loss"]
    labels = ["bank+pseudo seed 0", "bank+pseudo seed 1", "base seed 0"]
    assert view.labels == labels and view.runs.value == labels
    for chart, metric in zip(view.charts[:2], ("trainer.test_acc", "trainer.loss"), strict=True):
        n = [int(np.isfinite(open_metrics(runs / f"semi-supervised-{r}/metrics.zarr")[metric].values).sum())
             for r in ("bank+pseudo-0", "bank+pseudo-1", "base-0")]
        assert chart.points() == dict(zip(labels, n, strict=True)) and min(n) >= 2
        assert chart.figure.title.text == metric and chart.pane.visible
    assert not view.charts[2].pane.visible
    colours = {r.glyph.line_color for r in view.charts[0].figure.renderers}
    assert len(colours) == 3  # one colour per run
    assert "±" in view.table.object.to_string()

    view.runs.value = labels[:2]  # the base run left out: its curve empties, the table loses its row
    view.refresh()
    assert view.charts[0].points()["base seed 0"] == 0
    assert view.summary["variant"].tolist() == ["bank+pseudo"]
    view.metrics.value = ["trainer.val_acc"]
    view.refresh()
    assert view.charts[0].figure.title.text == "trainer.val_acc" and not view.charts[1].pane.visible
