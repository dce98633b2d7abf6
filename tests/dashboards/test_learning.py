"""The learning curves: series discovery, smoothing, the Learning view and the run folders a dashboard takes."""

from __future__ import annotations

import asyncio
import json
import pathlib

import numpy as np
import pytest

from carls_dask.dashboards.dashboard import Dashboard, run_paths_from
from carls_dask.dashboards.figures import LiveLogCurves
from carls_dask.dashboards.learning import curve, discover, is_eval_metric, smooth
from carls_dask.dashboards.runreader import RunReader
from carls_dask.dashboards.runs import find_runs
from carls_dask.dashboards.views import LearningView
from carls_dask.errors import ConfigError
from carls_dask.storage.metrics import MetricWriter, open_metrics
from tests.dashboards.runfolder import nodes, real_run, write_snapshot


@pytest.fixture(scope="module")
def semi_run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A real bank+pseudo run: a trainer and two makers (neighbour-maker, pseudo-labeller)."""
    return real_run(tmp_path_factory.mktemp("learning"), "bank+pseudo", 0, steps=30)


def _writer_run(path: pathlib.Path, steps: range, **series: object) -> pathlib.Path:
    with MetricWriter(path / "metrics.zarr", run="learning") as w:
        for step in steps:
            w.append(step, **{k: f(step) for k, f in series.items()})  # type: ignore[operator]
    return path


# ---------------------------------------------------------------------------- discovery


def test_discovers_the_trainer_and_makers_of_a_real_run_and_ignores_aliases(semi_run: pathlib.Path) -> None:
    ds = open_metrics(semi_run / "metrics.zarr")
    result = json.loads((semi_run / "result.json").read_text())
    loops = discover(list(ds.data_vars), result)
    assert list(loops.trainers) == ["trainer"]
    trainer = loops.trainers["trainer"]
    assert next(iter(trainer)) == "loss"
    assert set(trainer) == {"loss", "train_acc", "val_acc", "test_acc"}
    assert all(s == f"trainer.{m}" for m, s in trainer.items())
    assert set(loops.makers) == {"neighbour-maker", "pseudo-labeller"}
    assert loops.makers["neighbour-maker"] == {m: f"neighbour-maker.{m}" for m in ("staleness_s", "round", "rows")}
    assert set(loops.makers["pseudo-labeller"]) == {"staleness_s", "round"}
    # The unprefixed aliases the runner also writes are in the store but not drawn.
    assert {"val_acc", "test_acc", "train_loss", "maker_staleness_s"} <= set(ds.data_vars)
    assert not {"val_acc", "test_acc", "train_loss", "maker_staleness_s"} & set(loops.series())
    # Without result.json (a run still going), the same loops are found from the series alone.
    assert discover(list(ds.data_vars), None).trainers == loops.trainers


def test_a_loop_is_a_trainer_by_its_loss_or_by_its_kind_in_the_result(tmp_path: pathlib.Path) -> None:
    run = _writer_run(
        tmp_path, range(1, 6),
        **{"student.top1": lambda s: s / 10, "student.steps_per_s": lambda s: 3.0, "teacher.loss": lambda s: 1 / s,
           "teacher.recall@5": lambda s: 0.5, "scorer.staleness_s": lambda s: 0.1 * s, "train_loss": lambda s: 2 / s},
    )
    names = list(open_metrics(run / "metrics.zarr").data_vars)
    loops = discover(names, None)
    assert set(loops.trainers) == {"teacher", "trainer"}  # "student" writes no loss: not known as a trainer here
    assert loops.trainers["teacher"] == {"loss": "teacher.loss", "recall@5": "teacher.recall@5"}
    assert loops.trainers["trainer"] == {"loss": "train_loss"}  # the unprefixed loss stands for "trainer"
    assert loops.makers == {"scorer": {"staleness_s": "scorer.staleness_s"}}
    loops = discover(names, {"loops": {"student": {"kind": "trainer"}, "scorer": {"kind": "maker"}}})
    assert loops.trainers["student"] == {"top1": "student.top1"}  # steps_per_s is no evaluation metric


def test_evaluation_metric_names() -> None:
    good = ["val_acc", "test_acc", "train_acc", "top1", "top5", "i2t_r@1", "t2i_r@5", "label_accuracy", "flag_recall", "f1"]
    bad = ["loss", "ce", "step", "steps_per_s", "neighbour_found", "temperature", "pseudo_used", "scores_age_s"]
    assert [m for m in good if not is_eval_metric(m)] == []
    assert [m for m in bad if is_eval_metric(m)] == []


# ---------------------------------------------------------------------------- smoothing


def test_smoothing_window_and_ema_against_a_plain_loop() -> None:
    y = np.random.default_rng(3).normal(size=50).cumsum()
    for n in (2, 5, 17):
        window = [np.mean(y[max(0, i - n + 1) : i + 1]) for i in range(y.size)]
        np.testing.assert_allclose(smooth(y, "window", n), window)
        alpha, ema, out = 2 / (n + 1), y[0], []
        for v in y:
            ema = alpha * v + (1 - alpha) * ema
            out.append(ema)
        np.testing.assert_allclose(smooth(y, "EMA", n), out)
    np.testing.assert_array_equal(smooth(y, "EMA", 0), y)
    np.testing.assert_array_equal(smooth(y, "window", 1), y)
    # Trailing only: points already drawn keep their value as points are added (a live curve just grows).
    np.testing.assert_allclose(smooth(y[:30], "EMA", 5), smooth(y, "EMA", 5)[:30])
    np.testing.assert_allclose(smooth(y[:30], "window", 5), smooth(y, "window", 5)[:30])
    with pytest.raises(ConfigError, match=r"smoothing kind 'median' is not known"):
        smooth(y, "median", 3)
    with pytest.raises(ConfigError, match=r"smoothing amount -1 is negative"):
        smooth(y, "EMA", -1)


def test_curve_over_steps_and_wall_time_skips_unwritten_steps(semi_run: pathlib.Path) -> None:
    ds = open_metrics(semi_run / "metrics.zarr")
    y = ds["trainer.val_acc"].values
    written = np.isfinite(y)
    x, v = curve(ds, "trainer.val_acc")
    np.testing.assert_array_equal(x, ds["step"].values[written])
    np.testing.assert_array_equal(v, y[written])
    x, _ = curve(ds, "trainer.val_acc", "wall time (s)")
    wall = ds["wall_time"].values
    np.testing.assert_allclose(x, (wall - wall.min())[written])
    with pytest.raises(ConfigError, match=r"x axis 'time' is not known"):
        curve(ds, "trainer.val_acc", "time")


# ---------------------------------------------------------------------------- the view


def test_learning_view_draws_every_trainer_and_maker_series_of_a_real_run(semi_run: pathlib.Path) -> None:
    view = LearningView(reader=RunReader(semi_run))
    view.refresh()
    assert view.message == "" and not view._error.visible, (view.message, view._error.object)
    ds = open_metrics(semi_run / "metrics.zarr")

    def n(name: str) -> int:
        return int(np.isfinite(ds[name].values).sum())

    main = {"trainer-loss", "trainer-eval", "maker-staleness_s", "maker-round", "maker-rows"}
    # Every other series of each loop has a figure of its own (the loops' own figures, e.g. the pseudo-labeller's
    # pl_count), but LOOP.step (the x axis) and the sink's unprefixed copies.
    assert view.loops is not None
    drawn = {s for group in (view.loops.trainers, view.loops.makers) for loop in group.values() for s in loop.values()}
    own = {str(v) for v in ds.data_vars if "." in str(v) and str(v) not in drawn and not str(v).endswith(".step")}
    assert own and {"pseudo-labeller.pl_count", "trainer.steps_per_s", "neighbour-maker.test_acc"} <= own
    assert set(view.charts) == main | {f"series-{s}" for s in own}
    assert all(view.charts[f"series-{s}"].points() == {s.rpartition(".")[2]: n(s)} for s in own)
    assert view.charts["trainer-loss"].points() == {"loss": n("trainer.loss")}
    assert view.charts["trainer-eval"].points() == {m: n(f"trainer.{m}") for m in ("train_acc", "val_acc", "test_acc")}
    assert view.charts["maker-staleness_s"].points() == {
        "neighbour-maker": n("neighbour-maker.staleness_s"), "pseudo-labeller": n("pseudo-labeller.staleness_s"),
    }
    assert n("trainer.loss") >= 3
    # One x axis for all: zooming one figure zooms them all.
    logs = [c for c in view.charts.values() if isinstance(c, LiveLogCurves)]
    assert len({id(c.figure.x_range) for c in view.charts.values()} | {id(c.log_figure.x_range) for c in logs}) == 1
    assert view.applies()

    src = view.charts["trainer-loss"].sources["loss"]
    raw = np.asarray(src.data["y"]).copy()
    view.controls.amount = 2
    view.controls.smoothing = "window"
    view.refresh()
    np.testing.assert_allclose(src.data["y"], smooth(raw, "window", 2))
    view.controls.x_axis = "wall time (s)"
    view.refresh()
    assert float(src.data["x"][0]) == pytest.approx(float(curve(ds, "trainer.loss", "wall time (s)")[0][0]))
    assert view.charts["trainer-loss"].figure.xaxis[0].axis_label == "seconds since the run's first metric"

    view.controls.log_y = True
    assert all(c.log and c.log_figure.visible and not c.figure.visible for c in logs)
    assert view.charts["trainer-loss"].log_figure.y_scale.__class__.__name__ == "LogScale"
    view.controls.log_y = False
    assert not any(c.log for c in logs)


def test_learning_view_streams_only_new_points_as_the_run_writes(tmp_path: pathlib.Path) -> None:
    with MetricWriter(tmp_path / "metrics.zarr", run="live", flush_rows=1) as w:
        for step in range(1, 21):
            w.append(step, **{"trainer.loss": 1 / step, "trainer.val_acc": step / 40, "maker.staleness_s": 0.2})
        w.flush()
        view = LearningView(reader=RunReader(tmp_path))
        view.refresh()
        loss = view.charts["trainer-loss"]
        assert loss.points() == {"loss": 20} and loss.streamed_points == 0
        for step in range(21, 24):
            w.append(step, **{"trainer.loss": 1 / step, "trainer.val_acc": step / 40, "maker.staleness_s": 0.2})
        w.flush()
        view.refresh()
    assert loss.points() == {"loss": 23} and loss.streamed_points == 3
    np.testing.assert_allclose(loss.sources["loss"].data["y"], 1 / np.arange(1, 24))


def test_learning_tab_only_for_runs_with_learning_series(tmp_path: pathlib.Path) -> None:
    keys, cols = nodes(50, 10)
    write_snapshot(tmp_path / "bank", 10, keys, cols)
    _writer_run(tmp_path, range(1, 4), pacing=lambda s: s / 10)
    d = Dashboard(tmp_path)
    d.refresh()
    assert not d.learning.applies() and "Learning" not in d.tab_names and "Bank health" in d.tab_names
    with MetricWriter(tmp_path / "metrics.zarr", run="learning") as w:
        w.append(5, **{"trainer.loss": 0.5})
    d.refresh()
    assert d.learning.applies() and d.tab_names[0] == "Learning"


# ---------------------------------------------------------------------------- which runs


def test_find_runs_expands_folders_of_runs_and_names_bad_paths(tmp_path: pathlib.Path) -> None:
    runs = tmp_path / "runs"
    for name in ("b", "a", "c"):
        (runs / name / "metrics.zarr").mkdir(parents=True)
    (runs / "notes").mkdir()  # not a run: skipped in a folder of runs
    (runs / "README").write_text("x")
    assert find_runs(runs) == [runs / "a", runs / "b", runs / "c"]
    assert find_runs([str(runs / "c"), runs]) == [runs / "c", runs / "a", runs / "b"]  # each once, in the order given
    assert find_runs(tmp_path / "later") == [tmp_path / "later"]  # one run that does not exist yet: waited for
    with pytest.raises(ConfigError, match=rf"run path {runs / 'README'} is a file"):
        find_runs([runs / "a", runs / "README"])
    with pytest.raises(ConfigError, match=rf"run path {runs / 'notes'} is neither a run folder .* nor a folder of run folders"):
        find_runs([runs / "a", runs / "notes"])
    assert find_runs([runs / "a", tmp_path / "nope"]) == [runs / "a", tmp_path / "nope"]  # not there yet: waited for
    with pytest.raises(ConfigError, match="no run given"):
        find_runs([])


def test_dashboard_takes_a_run_a_reader_a_list_or_a_folder_of_runs(tmp_path: pathlib.Path) -> None:
    for name in ("r1", "r2"):
        _writer_run(tmp_path / "runs" / name, range(1, 4), **{"trainer.loss": lambda s: 1 / s})
    one = Dashboard(tmp_path / "runs" / "r1")
    assert one.comparison is None and [r.path for r in one.readers] == [tmp_path / "runs" / "r1"]
    assert Dashboard(reader=RunReader(tmp_path / "runs" / "r2")).reader.path == tmp_path / "runs" / "r2"
    many = Dashboard(str(tmp_path / "runs"))
    assert [r.path.name for r in many.readers] == ["r1", "r2"] and many.comparison is not None
    assert many.tab_names[0] == "Comparison"
    mixed = Dashboard([RunReader(tmp_path / "runs" / "r2"), tmp_path / "runs" / "r1"])
    assert [r.path.name for r in mixed.readers] == ["r2", "r1"]
    many.run_select.value = 1  # the run tabs follow the chosen run
    assert many.reader.path.name == "r2" and many.learning.reader is many.reader
    with pytest.raises(ConfigError, match=r"item 3 is a int; expected a path"):
        Dashboard([tmp_path / "runs" / "r1", 3])
    with pytest.raises(ConfigError, match="both runs and reader="):
        Dashboard(tmp_path, reader=RunReader(tmp_path))
    assert run_paths_from(["app.py", "a", "b"], {}) == [pathlib.Path("a"), pathlib.Path("b")]
    assert run_paths_from(["app.py"], {"CARLS_RUN": "c"}) == [pathlib.Path("c")]
    assert run_paths_from(["app.py"], {}) == []


def test_learning_curves_grow_on_every_tick_not_only_on_plot_refreshes(tmp_path: pathlib.Path) -> None:
    with MetricWriter(tmp_path / "metrics.zarr", run="ticks", flush_rows=1) as w:
        for step in range(1, 6):
            w.append(step, **{"trainer.loss": 1 / step})
        w.flush()
        d = Dashboard(tmp_path, plot_period=3600)

        async def tick() -> None:
            d._tick()
            assert d._learn_task is not None
            await d._learn_task

        asyncio.run(tick())  # the first tick is also the plot round
        assert d.learning.charts["trainer-loss"].points() == {"loss": 5}
        w.append(6, **{"trainer.loss": 1 / 6})
        w.flush()
        asyncio.run(tick())  # no plot round due for an hour: the learning curves are read anyway
    assert d.plot_refreshes <= 1 and d.learning.charts["trainer-loss"].points() == {"loss": 6}
    assert d.learning.charts["trainer-loss"].streamed_points == 1


# ---------------------------------------------------------------------------- in a notebook

_KERNEL_CELLS = [
    # A Workbench runs a trainer and a maker in the background on a LocalCluster, writing RUN.
    """
import asyncio, json, pathlib
from distributed import Client, LocalCluster
from carls_dask import Workbench
from carls_dask.examples.digits import DigitsMaker, DigitsTrainer, digits_table
run = pathlib.Path(RUN)
cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0")
client = Client(cluster)
wb = Workbench(client, run_dir=run, progress=False).start()
wb.create_bank([digits_table()], n_shards=1)
wb.submit_trainer(DigitsTrainer("trainer", max_steps=None, publish_every=25))
wb.submit_maker(DigitsMaker("maker"))
def written():
    try:
        return "trainer.loss" in json.loads((run / "metrics.zarr" / "metrics.json").read_text())["series"]
    except (OSError, ValueError, KeyError):
        return False
for _ in range(900):
    if written():
        break
    await asyncio.sleep(0.2)
assert written(), "the Workbench wrote no trainer.loss in 180 s"
""",
    # Count the patches Panel sends to the notebook's views (no browser here to receive them).
    """
import panel.io.notebook as nb
from bokeh.document.events import DocumentPatchedEvent
patches = []
_push = nb.push
def counting_push(doc, comm, binary=True, msg=None):
    patches.append(sum(isinstance(e, DocumentPatchedEvent) for e in doc.callbacks._held_events))
    return _push(doc, comm, binary, msg)
nb.push = counting_push
""",
    # The one call a user makes: no pn.extension() anywhere in this notebook.
    """
from carls_dask.dashboards import Dashboard
dash = Dashboard(RUN, period=0.5)
dash
""",
    """
def seen():  # the loss chart appears with the first refresh that finds the series
    chart = dash.learning.charts.get("trainer-loss")
    return (dash.ticks, chart.points().get("loss", 0) if chart is not None else 0, sum(patches))
async def until(ok, seconds=120):  # the kernel's loop runs the dashboard's refresh while this waits
    for _ in range(int(seconds / 0.1)):
        if ok(seen()):
            break
        await asyncio.sleep(0.1)
    return seen()
before = await until(lambda s: s[0] >= 1 and s[1] > 0)
after = await until(lambda s: s[0] >= before[0] + 5 and s[1] > before[1] and s[2] > before[2])
wb.stop(timeout=60)
wb.close()
client.close()
cluster.close()
print(json.dumps({"before": before, "after": after, "tabs": dash.tab_names}))
""",
]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dashboard_shows_inline_and_updates_live_in_a_jupyter_kernel_while_a_workbench_runs(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(f"RUN = {str(tmp_path / 'run')!r}")]
    nb.cells += [nbformat.v4.new_code_cell(src.strip()) for src in _KERNEL_CELLS]
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=False,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    shown = nb.cells[3].outputs
    kinds = {k for o in shown for k in o.get("data", {})}
    warnings = "".join(o.get("text", "") for o in shown if o.get("output_type") == "stream")
    assert "application/vnd.holoviews_load.v0+json" in kinds, kinds  # the extension the Dashboard loaded itself
    assert "application/vnd.holoviews_exec.v0+json" in kinds, kinds  # the dashboard's view
    assert "pn.extension()" not in warnings, warnings
    out = json.loads(nb.cells[4].outputs[-1]["text"].strip().splitlines()[-1])
    (ticks0, points0, patches0), (ticks1, points1, patches1) = out["before"], out["after"]
    assert out["tabs"][0] == "Learning"
    assert ticks1 >= ticks0 + 5, out  # the periodic refresh runs in the kernel (every 0.5 s)
    assert points1 > points0 > 0, out  # the trainer's loss curve grows as the Workbench runs
    assert patches1 > patches0, out  # and the changes go to the notebook's view


def test_dashboard_of_a_path_reads_the_bank_table_it_is_told(tmp_path: pathlib.Path) -> None:
    keys, cols = nodes(40, 10)
    write_snapshot(tmp_path / "bank", 10, keys, cols)
    assert Dashboard(tmp_path).reader.table == "nodes"
    d = Dashboard(tmp_path, table="digits")
    assert d.reader.table == "digits"
    d.refresh()  # the bank has table "nodes" only: the views say so
    assert any("no table 'digits'" in str(v._error.object) + v.message for v in d.views)
