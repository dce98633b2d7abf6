"""The views and the dashboard over real run folders (storage's snapshots and metric store), no browser."""

from __future__ import annotations

import asyncio
import math
import pathlib

import numpy as np
import pytest

from carls_dask.cli import main
from carls_dask.dashboard_cli import panel_command
from carls_dask.dashboards.dashboard import Dashboard, run_path_from
from carls_dask.dashboards.runreader import RunReader
from carls_dask.dashboards.views import DriftView, PseudoLabelView
from carls_dask.errors import ConfigError
from carls_dask.storage.metrics import MetricWriter, open_metrics
from tests.dashboards.runfolder import nodes, write_snapshot, write_truth


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Three snapshots of 600 rows with pseudo labels, held-out truth and curriculum metrics."""
    path = tmp_path_factory.mktemp("run")
    for step in (10, 20, 30):
        keys, cols = nodes(600, step)
        write_snapshot(path / "bank", step, keys, cols)
    write_truth(path, 600)
    with MetricWriter(path / "metrics.zarr", run="views") as w:
        for step in (10, 20, 30):
            w.append(step, pacing=step / 100, admitted_fraction=step / 110, bank_lookups=step * 50.0)
    return path


@pytest.fixture(scope="module")
def dashboard(run: pathlib.Path) -> Dashboard:
    d = Dashboard(reader=RunReader(run))
    d.refresh()
    return d


def test_health_view_shows_rows_versions_and_shards(dashboard: Dashboard) -> None:
    h = dashboard.health
    assert h.message == "" and not h._error.visible
    assert h.rows.value == 600 and h.model_step.value == 30 and h.snapshots.value == 3


def test_pseudo_label_view_judges_labels_against_truth(dashboard: Dashboard) -> None:
    v = dashboard.pseudo_labels
    assert not v._error.visible, v._error.object
    keys = np.arange(600)
    labelled = keys % 5 != 0
    wrong = labelled & (keys % 7 == 0)
    assert v.quality["coverage"] == pytest.approx(labelled.mean())
    assert v.quality["precision"] == pytest.approx(1 - wrong.sum() / labelled.sum())
    assert "precision** 0.8" in v.summary.object
    flips = v.flips()
    assert sorted(flips) == [20, 30] and all(f["flip_rate"] == 0 for f in flips.values())


def test_drift_view_has_drift_churn_and_aligned_maps(dashboard: Dashboard) -> None:
    v = dashboard.drift
    assert not v._error.visible, v._error.object
    d = v.drift()
    assert d is not None and d["step"].values.tolist() == [20, 30]
    assert sorted(int(s) for s in d["shard"].values) == [-1, 0, 1]
    assert (d["l2_mean"].values > 0).all()
    churn = v.churn()
    assert churn is not None and ((churn.values >= 0) & (churn.values <= 1)).all()
    assert v.slider.options == [10, 20, 30] and v.slider.value == 30
    p10, p30 = v.projection(10), v.projection(30)
    assert p10 is not None and p30 is not None
    # The clusters stay put between snapshots: aligned maps of the same rows are close.
    assert np.median(np.hypot(p10["x"] - p30["x"], p10["y"] - p30["y"])) < 1.0


def test_curriculum_view_reads_pacing_from_the_metric_store(dashboard: Dashboard) -> None:
    v = dashboard.curriculum
    assert v.message == "" and not v._error.visible, (v.message, v._error.object)
    assert v.pacing is not None
    np.testing.assert_allclose(v.pacing["gap"].values, [s / 110 - s / 100 for s in (10, 20, 30)])
    assert "admitted **27.3%**" in v.summary.object


def test_missing_and_empty_runs_give_messages(tmp_path: pathlib.Path) -> None:
    d = Dashboard(reader=RunReader(tmp_path / "nope"))
    d.refresh()
    for view in d.views:
        assert "does not exist (yet)" in view.message and not view._error.visible
    (tmp_path / "empty").mkdir()
    d = Dashboard(reader=RunReader(tmp_path / "empty"))
    d.refresh()
    assert all("is empty so far" in view.message for view in d.views)


def test_run_without_pseudo_labels_or_metrics(tmp_path: pathlib.Path) -> None:
    keys, cols = nodes(100, 10)
    write_snapshot(tmp_path / "bank", 10, keys, {"embedding": cols["embedding"]})
    d = Dashboard(reader=RunReader(tmp_path))
    d.refresh()
    assert d.pseudo_labels.message == "This run has no pseudo labels (no table of its bank has a pseudo_label column)."
    assert "no curriculum series" in d.curriculum.message and "no difficulty column" in d.curriculum.message
    assert d.health.rows.value == 100 and "no metric store yet" in d.health.message
    assert "One snapshot so far" in d.drift.message
    assert not any(view._error.visible for view in d.views)


def test_health_numbers_follow_new_snapshots(tmp_path: pathlib.Path) -> None:
    keys, cols = nodes(50, 10)
    write_snapshot(tmp_path / "bank", 10, keys, cols)
    d = Dashboard(reader=RunReader(tmp_path))
    d.health.refresh_numbers()
    assert d.health.rows.value == 50
    keys, cols = nodes(80, 20)
    write_snapshot(tmp_path / "bank", 20, keys, cols)
    d.health.refresh_numbers()
    assert d.health.rows.value == 80 and d.health.model_step.value == 20


def test_run_path_from_args_or_environment() -> None:
    assert run_path_from(["app.py", "runs/a"], {}) == pathlib.Path("runs/a")
    assert run_path_from(["app.py"], {"CARLS_RUN": "runs/b"}) == pathlib.Path("runs/b")
    assert run_path_from(["app.py"], {}) is None


def test_dashboard_command_binds_localhost_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", "runs/x", "--dry-run", "--port", "5123"]) == 0
    out = capsys.readouterr().out
    assert "panel serve" in out and out.rstrip().endswith("--args runs/x")
    cmd = panel_command(pathlib.Path("r"), port=5123)
    assert cmd[cmd.index("--address") + 1] == "127.0.0.1"
    assert "127.0.0.1:5123" in cmd and "--liveness" in cmd and cmd[-2:] == ["--args", "r"]
    with pytest.raises(ConfigError, match=r"port 70000 .* expected 1-65535"):
        panel_command(pathlib.Path("r"), port=70000)
    assert main(["dashboard", "runs/x", "--dry-run", "--refresh", "soon"]) == 1
    assert "'soon'" in capsys.readouterr().err


def test_nan_free_summary_numbers(dashboard: Dashboard) -> None:
    assert not math.isnan(dashboard.health.summary["wall_time"])


def test_ticks_refresh_figures_each_time_and_plots_at_most_once_per_plot_period(run: pathlib.Path) -> None:
    d = Dashboard(reader=RunReader(run), plot_period=3600)

    async def two_ticks() -> bool:
        d._tick()  # starts the refreshes as tasks and returns at once
        first, fast = d._slow_task, d._fast_task
        assert first is not None and fast is not None
        await first
        await fast
        d._tick()
        assert d._fast_task is not None and d._fast_task is not fast  # the figures refresh on every tick
        await d._fast_task
        return d._slow_task is first

    assert asyncio.run(two_ticks())  # the second tick did not start another plot refresh
    assert d.health.rows.value == 600 and d.drift.drift() is not None
    assert d.ticks == 2 and d.plot_refreshes == 1
    assert "refreshed" in d.status.object


def test_refreshes_update_the_same_figures_and_stream_only_new_metric_rows(tmp_path: pathlib.Path) -> None:
    keys, cols = nodes(300, 10)
    write_snapshot(tmp_path / "bank", 10, keys, cols)
    with MetricWriter(tmp_path / "metrics.zarr", run="live", flush_rows=1) as w:
        for step in range(1, 41):
            w.append(step, bank_lookups=step * 10.0, bank_updates=step * 4.0, pacing=step / 100)
        d = Dashboard(reader=RunReader(tmp_path))
        d.refresh()
        rates, pacing = d.health._rates, d.curriculum._pacing
        figures = [f.figure for v in d.views for f in v.figures()]
        sources = dict(rates.sources)
        assert rates.points() == {"bank_lookups": 39, "bank_updates": 39}  # a rate needs two rows
        assert d.reader.metric_rows_read == 40
        assert rates.streamed_points == 0

        for step in range(41, 46):
            w.append(step, bank_lookups=step * 10.0, bank_updates=step * 4.0, pacing=step / 100)
        w.flush()
        d.refresh()

    # Same Bokeh figures and sources, updated in place; only the five new rows were read and sent.
    assert [f.figure for v in d.views for f in v.figures()] == figures
    assert rates.sources == sources
    assert d.reader.metric_rows_read == 45
    assert rates.points() == {"bank_lookups": 44, "bank_updates": 44}
    assert rates.streamed_points == 2 * 5 and pacing.streamed_points == 5
    full = open_metrics(tmp_path / "metrics.zarr")
    cached = d.reader.metrics()
    assert cached is not None
    np.testing.assert_array_equal(cached["step"].values, full["step"].values)
    np.testing.assert_array_equal(cached["pacing"].values, full["pacing"].values)
    np.testing.assert_array_equal(cached["wall_time"].values, full["wall_time"].values)
    # Nothing new: the reader hands out the same object and the figures get no update.
    updates = sum(f.updates for v in d.views for f in v.figures())
    assert d.reader.metrics() is cached
    d.refresh()
    assert sum(f.updates for v in d.views for f in v.figures()) == updates


def test_reads_happen_off_the_page_and_updates_are_queued_until_flushed(run: pathlib.Path) -> None:
    view = DriftView(reader=RunReader(run))
    assert view.read()  # computes and queues: no Bokeh model changed yet
    assert view._l2.pending and len(view._l2.sources) == 0 and view._l2.note.visible
    assert view.flush() >= 4
    assert not view._l2.pending and not view._l2.note.visible
    assert view._l2.points() == {"mean": 2, "p50": 2, "p90": 2, "p99": 2}
    # The map is rasterised after the curves are out (datashader is the slow part).
    assert view._map.note.visible and not view._map.pending
    assert view.finish() and view._map.pending and view.flush() == 1
    assert not view.finish()  # nothing left to draw
    image = view._map.source.data["image"][0]
    assert image.dtype == np.uint32 and image.shape == (420, 420) and (image != 0).any()


def test_headline_counts_delta_rows_like_the_full_read(tmp_path: pathlib.Path) -> None:
    from carls_dask.storage.deltalog import DeltaLog
    from tests.dashboards.runfolder import N_SHARDS, delta_rows

    keys, cols = nodes(60, 10)
    write_snapshot(tmp_path / "bank", 10, keys[:50], {k: v[:50] for k, v in cols.items()})
    reader = RunReader(tmp_path)
    assert reader.headline()["rows"] == 50  # type: ignore[index]
    logs = [DeltaLog(tmp_path / "bank", s, sync=False) for s in range(N_SHARDS)]
    try:
        new = slice(45, 60)  # five rows already in the snapshot, ten new ones
        for s, log in enumerate(logs):
            log.append(30, "nodes", "upsert", delta_rows(keys[new], {k: v[new] for k, v in cols.items()}, 30, s))
        head = reader.headline()
        full = reader.latest()
        assert full is not None and head is not None
        assert head["rows"] == full.sizes["key"] == 60
        assert head["model_step"] == 30 and head["snapshots"] == 1
    finally:
        for log in logs:
            log.close()


def test_threshold_change_judges_the_shown_rows_again_without_reading_the_run(tmp_path: pathlib.Path) -> None:
    keys, cols = nodes(300, 10)
    write_snapshot(tmp_path / "bank", 10, keys, cols)
    write_truth(tmp_path, 600)
    view = PseudoLabelView(reader=RunReader(tmp_path))
    view.refresh()
    assert "of 300" in view.summary.object and view.quality["precision"] < 1.0
    keys, cols = nodes(600, 20)
    write_snapshot(tmp_path / "bank", 20, keys, cols)

    view.threshold = 0.65  # a widget change: answered from the rows on show, at once
    assert "of 300" in view.summary.object and ">= 0.65" in view.summary.object
    assert view.quality["precision"] == 1.0  # only right labels have confidence 0.9 in this table
    view.refresh()  # the next refresh brings the new rows
    assert "of 600" in view.summary.object and ">= 0.65" in view.summary.object


def test_pseudo_labels_kept_in_a_table_of_their_own_are_found(tmp_path: pathlib.Path) -> None:
    from tests.dashboards.runfolder import write_with_label_table

    keys, cols = nodes(400, 10)
    labelled = keys[keys % 5 != 0]
    labels = {"pseudo_label": cols["pseudo_label"][labelled], "confidence": cols["confidence"][labelled]}
    write_with_label_table(tmp_path / "bank", 10, {"embedding": cols["embedding"]}, keys, labelled, labels)
    write_truth(tmp_path, 400)

    view = PseudoLabelView(reader=RunReader(tmp_path))  # the reader's table is "nodes"
    view.refresh()
    assert view.message == "" and not view._error.visible, (view.message, view._error.object)
    wrong = labelled % 7 == 0
    assert view.quality["labelled"] == labelled.size
    assert view.quality["precision"] == pytest.approx(1 - wrong.mean())
    assert "labelled rows 320 of 320" in view.summary.object


def test_health_shows_the_bank_folders_snapshot_and_log_bytes(tmp_path: pathlib.Path) -> None:
    import os

    from carls_dask.bank import Column, KnowledgeBank, TableSpec

    nodes_spec = TableSpec("nodes", columns=(Column("embedding", shape=(4,)),), optimizer=None)
    keys = np.arange(300, dtype=np.int64)
    with KnowledgeBank.local([nodes_spec], n_shards=2, buckets=16, log_root=str(tmp_path / "bank")) as bank:
        bank.update("nodes", keys, {"embedding": np.ones((300, 4), np.float32)})
        bank.snapshot(str(tmp_path / "bank"), 10)
        bank.update("nodes", keys[:50], {"embedding": np.zeros((50, 4), np.float32)})  # after it: in the log
    d = Dashboard(reader=RunReader(tmp_path))
    d.health.refresh_numbers()
    bank_dir = tmp_path / "bank"
    log = sum(p.stat().st_size for p in bank_dir.glob("delta/shard-*/seg-*.log"))
    snaps = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(bank_dir / "snapshots") for f in fs)
    assert log > 0 and snaps > 0
    assert d.health.snapshot_mb.value == snaps / 1e6 and d.health.log_mb.value == log / 1e6
    assert d.health.rows.value == 300
