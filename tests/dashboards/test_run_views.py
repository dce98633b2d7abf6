"""The views over run folders written by real code: series of named loops, tabs that apply, row ages, map colours."""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np
import pytest

from carls_dask.dashboards import metricnames as mn
from carls_dask.dashboards.drift import attach, colour_categories
from carls_dask.dashboards.health import reference_time
from carls_dask.dashboards.runreader import RunReader
from carls_dask.dashboards.views import CurriculumView, DriftView, HealthView, PseudoLabelView
from carls_dask.storage.metrics import MetricWriter
from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, write_shard
from tests.dashboards.runfolder import (
    nodes,
    shard_states,
    write_snapshot,
    write_truth,
    write_with_label_table,
)


def _semi_like(path: pathlib.Path, n: int = 600, steps: tuple[int, ...] = (10, 20, 30)) -> pathlib.Path:
    """A run folder laid out as the semi-supervised paradigm writes it.

    Table ``nodes`` holds embeddings and logits, table ``pseudo_labels`` the labelled rows; the
    metric store has only series named by their loop (two makers write pseudo-label figures), and
    the truth file holds three classes.
    """
    for step in steps:
        keys, cols = nodes(n, step)
        truth = keys % 3
        logits = np.eye(3, dtype=np.float32)[(truth + (keys % 11 == 0)) % 3]  # a few wrong predictions
        labelled = keys[cols["pseudo_label"] >= 0]
        labels = {"pseudo_label": cols["pseudo_label"][labelled], "confidence": cols["confidence"][labelled]}
        write_with_label_table(path / "bank", step, {"embedding": cols["embedding"], "logits": logits}, keys, labelled, labels)
    write_truth(path, n)
    with MetricWriter(path / "metrics.zarr", run="semi-like") as w:
        for i, step in enumerate(steps):
            w.append(
                step,
                **{
                    "trainer.steps_per_s": 5.0 + i,
                    "trainer.loss": 1.0 / step,
                    "pseudo-labeller.pl_precision": 0.9,
                    "pseudo-labeller.pl_coverage": 0.1 * (i + 1),
                    "second-labeller.pl_precision": 0.8,
                    "second-labeller.pl_coverage": 0.05 * (i + 1),
                    "trainer.bank_lookups": 100.0 * step,
                },
            )
            time.sleep(0.02)  # rows at distinct times: the rates need time to pass between them
    return path


@pytest.fixture(scope="module")
def semi_like(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return _semi_like(tmp_path_factory.mktemp("semi-like"))


# ---------------------------------------------------------------------- series of named loops


def test_series_are_found_by_their_unprefixed_name_one_per_loop(semi_like: pathlib.Path) -> None:
    m = RunReader(semi_like).metrics()
    found = mn.find_series(m, mn.PL_PRECISION)
    assert sorted(found) == ["pseudo-labeller", "second-labeller"]
    assert found["second-labeller"].values.tolist() == [0.8, 0.8, 0.8]
    assert list(mn.find_series(m, "second-labeller.pl_coverage")) == ["second-labeller"]
    assert mn.find_series(m, "pacing") == {}
    speed = mn.first_series(m, mn.STEPS_PER_S)
    assert speed is not None and speed.values.tolist() == [5.0, 6.0, 7.0]


def test_an_unprefixed_copy_is_not_drawn_twice(tmp_path: pathlib.Path) -> None:
    with MetricWriter(tmp_path / "metrics.zarr", run="aliases") as w:
        w.append(1, **{"pl_precision": 0.5, "maker.pl_precision": 0.5})
        w.append(2, pl_coverage=0.25)
    m = RunReader(tmp_path).metrics()
    assert list(mn.find_series(m, "pl_precision")) == ["maker"]
    assert list(mn.find_series(m, "pl_coverage")) == [""]  # written without a loop's name only


def test_pseudo_label_view_draws_one_line_per_maker(semi_like: pathlib.Path) -> None:
    view = PseudoLabelView(reader=RunReader(semi_like))
    view.refresh()
    assert not view._error.visible, view._error.object
    assert view._series.points() == {
        "pseudo-labeller pl_precision": 3, "second-labeller pl_precision": 3,
        "pseudo-labeller pl_coverage": 3, "second-labeller pl_coverage": 3,
    }
    assert not view._series.note.visible


def test_health_view_reads_the_trainers_speed_and_counters_of_named_loops(semi_like: pathlib.Path) -> None:
    view = HealthView(reader=RunReader(semi_like))
    view.refresh()
    assert not view._error.visible, view._error.object
    assert view._speed.points() == {"steps/s": 3}
    assert view._rates.points() == {"trainer.bank_lookups": 2}
    assert (view._rates.sources["trainer.bank_lookups"].data["y"] > 0).all()


def test_without_counters_the_bank_write_rate_comes_from_the_snapshots(tmp_path: pathlib.Path) -> None:
    t0 = time.time() - 100
    for i, step in enumerate((10, 20, 30)):
        keys, cols = nodes(200 + 100 * i, step)
        write_snapshot(tmp_path / "bank", step, keys, {"embedding": cols["embedding"]}, wall_time=t0 + 10 * i)
    view = HealthView(reader=RunReader(tmp_path))
    view.refresh()
    # Each snapshot rewrote all its rows 10 s after the one before: 300 and 400 rows in 10 s.
    src = view._rates.sources["labeller"]
    assert src.data["x"].tolist() == [20.0, 30.0]
    np.testing.assert_allclose(src.data["y"], [30.0, 40.0])


# ---------------------------------------------------------------------- tabs that apply


def test_each_view_applies_only_where_the_run_has_its_data(semi_like: pathlib.Path, tmp_path: pathlib.Path) -> None:
    reader = RunReader(semi_like)
    assert HealthView(reader=reader).applies()
    assert DriftView(reader=reader).applies()
    assert PseudoLabelView(reader=reader).applies()  # pseudo labels in a table of their own
    assert not CurriculumView(reader=reader).applies()  # no difficulty, no pacing

    curriculum = tmp_path / "curriculum"
    keys, cols = nodes(100, 10)
    write_snapshot(curriculum / "bank", 10, keys, {"difficulty": cols["difficulty"], "pseudo_label": cols["pseudo_label"]})
    reader = RunReader(curriculum)
    assert CurriculumView(reader=reader).applies() and PseudoLabelView(reader=reader).applies()
    assert not DriftView(reader=reader).applies()  # no embedding column

    metrics_only = tmp_path / "metrics-only"
    with MetricWriter(metrics_only / "metrics.zarr", run="m") as w:
        w.append(1, **{"trainer.pacing": 0.3, "trainer.loss": 1.0})
    reader = RunReader(metrics_only)
    assert CurriculumView(reader=reader).applies() and not PseudoLabelView(reader=reader).applies()
    assert not DriftView(reader=reader).applies() and HealthView(reader=reader).applies()


# ---------------------------------------------------------------------- row ages


def _old_run(path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, t_end: float) -> pathlib.Path:
    """A run that ended at ``t_end`` (its last metric row), its bank rows written 30 s before."""
    keys, cols = nodes(300, 20)
    write_snapshot(path / "bank", 10, keys[:100], {k: v[:100] for k, v in cols.items()}, wall_time=t_end - 30)
    with monkeypatch.context() as m:  # the metric writer stamps its rows with the clock: an hour back
        m.setattr("carls_dask.storage.metrics.time.time", lambda: t_end)
        with MetricWriter(path / "metrics.zarr", run="old") as w:
            w.append(20, **{"trainer.loss": 0.5})
    write_snapshot(path / "bank", 20, keys, cols, wall_time=t_end - 30)
    return path


def test_a_finished_runs_row_ages_are_measured_to_its_last_write(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t_end = time.time() - 3600  # the run ended an hour ago
    run = _old_run(tmp_path / "run", monkeypatch, t_end)
    (run / "result.json").write_text(json.dumps({"schema": "carls-dask/result/2"}))
    reader = RunReader(run)
    assert reader.finished() and reader.last_write() == pytest.approx(t_end)
    view = HealthView(reader=reader)
    view.refresh()
    assert view.reference == pytest.approx(t_end)
    title = view._stale.figure.title.text
    assert "at the run's last write" in title and "median 30.0 s" in title, title
    ages = [float(a) for a in view._stale.source.data["x"]]
    assert max(ages) < 31.0  # not an hour


def test_a_run_that_wrote_nothing_for_a_while_counts_as_ended(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t_end = time.time() - 3600
    reader = RunReader(_old_run(tmp_path / "run", monkeypatch, t_end))
    assert not reader.finished()
    assert reader.age_reference(idle_s=600) == pytest.approx(t_end)
    assert reader.age_reference(idle_s=7200) == pytest.approx(time.time(), abs=5)  # within the idle time: still live


def test_a_live_runs_rows_age_against_now(tmp_path: pathlib.Path) -> None:
    keys, cols = nodes(100, 10)
    write_snapshot(tmp_path / "bank", 10, keys, cols, wall_time=time.time() - 20)
    with MetricWriter(tmp_path / "metrics.zarr", run="live") as w:
        w.append(10, **{"trainer.loss": 0.5})
    view = HealthView(reader=RunReader(tmp_path))
    view.refresh()
    assert view.reference == pytest.approx(time.time(), abs=5)
    assert "row age now (median 2" in view._stale.figure.title.text


def test_reference_time_rules() -> None:
    assert reference_time(1000.0, 900.0, finished=True, idle_s=300) == 900.0
    assert reference_time(1000.0, 900.0, finished=False, idle_s=300) == 1000.0
    assert reference_time(1000.0, 600.0, finished=False, idle_s=300) == 600.0
    assert reference_time(1000.0, None, finished=True, idle_s=300) == 1000.0


# ---------------------------------------------------------------------- the map's colours


def test_map_is_coloured_by_the_true_classes_and_offers_what_the_run_has(semi_like: pathlib.Path) -> None:
    view = DriftView(reader=RunReader(semi_like))
    view.refresh()
    assert not view._error.visible, view._error.object
    assert view.colourings() == ["true class", "pseudo label", "model prediction"]  # no difficulty in this run
    assert view.colour_select.options == view.colourings()
    assert view.map_colour == "true class" and view.map_categories == ["0", "1", "2"]
    proj = view.projection()
    assert proj is not None
    keys = proj["key"].values
    np.testing.assert_array_equal(proj["truth"].values, keys % 3)
    # pseudo labels come from their own table, matched by key (-1 where a row has none)
    expected = np.where(keys % 5 == 0, -1, np.where(keys % 7 == 0, (keys % 3 + 1) % 3, keys % 3))
    np.testing.assert_array_equal(proj["pseudo_label"].values, expected)
    np.testing.assert_array_equal(proj["prediction"].values, (keys % 3 + (keys % 11 == 0)) % 3)
    # hovering shows key, classes and provenance for a bounded sample drawn over the raster
    pts = view._map.points.data
    assert len(pts["x"]) == 600 and set(pts["category"]) == {"0", "1", "2"}
    i = 7
    k = int(pts["key"][i])
    assert pts["truth"][i] == str(k % 3) and pts["maker"][i] == "labeller" and pts["model_step"][i] == "30"
    assert float(pts["age"][i]) >= 0.0
    # colouring by another field redraws the map with its categories
    view.colour_select.value = "pseudo label"
    assert view.map_colour == "pseudo label" and view.map_categories == ["0", "1", "2"]
    assert "none" in set(view._map.points.data["category"])


def test_map_hover_points_stay_bounded(tmp_path: pathlib.Path) -> None:
    keys, cols = nodes(5000, 10)
    write_snapshot(tmp_path / "bank", 10, keys, cols)
    view = DriftView(reader=RunReader(tmp_path), hover_points=300)
    view.refresh()
    assert len(view._map.points.data["x"]) == 300
    assert view.colourings() == ["pseudo label", "difficulty"]  # no truth file, no logits
    assert view.map_colour == "pseudo label"
    view.colour_select.value = "difficulty"
    assert view.map_colour == "difficulty" and 2 <= len(view.map_categories) <= 6


def test_colour_categories_and_attach() -> None:
    codes, names = colour_categories(np.array([5, -1, 2, 5]))
    assert codes.tolist() == [1, -1, 0, 1] and names == ["2", "5"]
    codes, names = colour_categories(np.array([0.1, np.nan, 0.9, 0.5]))
    assert codes[1] == -1 and codes[0] < codes[3] < codes[2]
    import xarray as xr

    proj = xr.Dataset({"x": ("key", [0.0, 1.0, 2.0])}, coords={"key": [4, 9, 2]})
    out = attach(proj, "truth", np.array([2, 4]), np.array([7, 8]))
    assert out["truth"].values.tolist() == [8, -1, 7]


# ---------------------------------------------------------------------- a real curriculum run


@pytest.fixture(scope="module")
def curriculum_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, object]:
    """A small real curriculum run on the digits (in process): linear pacing, scores before the warm-up ends."""
    from carls_dask.paradigms.curriculum import Curriculum
    from carls_dask.runtime.runner import run_inline

    p = Curriculum()
    settings = p.settings("curriculum", dataset="digits", n_train=None, n_test=None, steps=120, batch_size=64,
                          hidden=32, publish_every=20, refresh_every=5, warmup=0.25, ramp=0.5, threads=1)
    run = tmp_path_factory.mktemp("curriculum") / "run"
    run_inline(p, settings, variant="curriculum", run_dir=run)
    return run, settings


def test_curriculum_pacing_and_admitted_are_recorded_at_every_report(curriculum_run: tuple[pathlib.Path, object]) -> None:
    import dask.config

    run, settings = curriculum_run
    every = int(dask.config.get("carls.run.metrics-every"))
    view = CurriculumView(reader=RunReader(run))
    assert view.applies()
    view.refresh()
    assert not view._error.visible, view._error.object
    pv = view.pacing
    assert pv is not None
    steps = pv["step"].values
    assert steps.size >= settings.steps // every  # a row per report, not a time-sampled few
    plan = settings.make_pacing()  # type: ignore[attr-defined]
    warmup = plan.warmup_steps
    # the row at step s holds the pacing planned for the trainer's step s - 1: 1 in the warm-up, then a linear ramp
    np.testing.assert_allclose(pv["pacing"].values, [plan.planned(int(s) - 1) for s in steps])
    ramp = pv["pacing"].values[steps > warmup]
    assert ramp.size >= 5 and (np.diff(ramp) >= 0).all() and ramp[-1] == 1.0
    # once the sampler has scores, it admits what the pacing plans (the easiest share of every class, rounded up)
    scored = pv["scored"].values == 1.0
    assert scored[steps > warmup].all(), pv["scored"].values
    gap = (pv["realised"] - pv["pacing"]).values[scored]
    assert (gap >= 0).all() and (gap < 0.02).all(), gap
    assert view._pacing.points() == {"pacing": steps.size, "admitted": steps.size, "sampled": steps.size, "scored": steps.size}


def test_drift_finds_embeddings_in_a_table_of_another_name(tmp_path: pathlib.Path) -> None:
    for step in (10, 20):
        keys, cols = nodes(300, step)
        handle = begin_snapshot(tmp_path / "bank", step)
        for state in shard_states(keys, {"embedding": cols["embedding"]}, model_step=step):
            meta = state["meta"]
            meta["tables"] = {"images": meta["tables"]["nodes"] | {"name": "images"}}  # type: ignore[index]
            state["tables"] = {"images": state["tables"]["nodes"]}  # type: ignore[index]
            write_shard(handle, state, delta_seq=0)
        commit_snapshot(handle)
    view = DriftView(reader=RunReader(tmp_path))  # the reader's table is "nodes"
    assert view.applies()
    view.refresh()
    assert view.message == "" and not view._error.visible, (view.message, view._error.object)
    d = view.drift()
    assert d is not None and d["step"].values.tolist() == [20]
    assert view.colourings() == [] and view.colour_select.disabled
    assert "nothing in the run to colour by" in view._map.figure.title.text
    health = HealthView(reader=RunReader(tmp_path))
    health.refresh()
    assert not health._error.visible, health._error.object
