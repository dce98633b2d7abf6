"""Learning view: each trainer's loss and evaluation metrics, and what each knowledge maker did, over steps or time."""

from __future__ import annotations

import json
import logging
import pathlib
import threading
from typing import Any

import panel as pn
import param
from bokeh.models import DataRange1d

from carls_dask.dashboards.figures import LiveCurves, LiveLogCurves
from carls_dask.dashboards.learning import MAKER_METRICS, SMOOTHING, X_AXES, Loops, curve, discover
from carls_dask.dashboards.views.base import RunView, in_background
from carls_dask.storage.runfolder import RunFolder

__all__ = ["LearningControls", "LearningView", "read_result"]

logger = logging.getLogger(__name__)

#: Height (pixels) of the figure of one series of a loop.
SMALL_HEIGHT = 200
#: Figures of a loop's own series side by side.
SERIES_COLUMNS = 3


def _set_xlabel(chart: LiveCurves, label: str) -> None:
    """Name the x axis of a chart (both figures of a :class:`LiveLogCurves`)."""
    if isinstance(chart, LiveLogCurves):
        chart.set_xlabel(label)
        return
    for axis in chart.figure.xaxis:
        if axis.axis_label != label:
            axis.axis_label = label

_MAKER_TITLES = {
    "staleness_s": ("makers: age of the model version used", "staleness (s)"),
    "round": ("makers: rounds", "round"),
    "rows": ("makers: rows written", "rows"),
    "coverage": ("makers: share of the rows re-scored (change feed)", "coverage"),
    "feed_keys": ("makers: keys the change feed gave per round", "keys"),
}


def read_result(path: pathlib.Path, cache: dict[str, Any]) -> dict[str, Any] | None:
    """``result.json`` of the run in ``path`` (``None`` while it runs); re-read only when the file changed.

    ``cache`` keeps the file's stamp and content between calls (one dict per caller).
    """
    p = RunFolder(path).result
    try:
        st = p.stat()
        stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    if stamp != cache.get("stamp"):
        result = None
        if stamp is not None:
            try:
                loaded = json.loads(p.read_text())
                result = loaded if isinstance(loaded, dict) else None
            except (OSError, ValueError) as exc:  # being written: try again next time
                logger.debug("result %s not readable yet: %s", p, exc)
                stamp = None
        cache.update(stamp=stamp, result=result)
    return cache.get("result")


class LearningControls(param.Parameterized):
    """How curves are drawn: the x axis, the smoothing and the y scale."""

    x_axis: param.Selector = param.Selector(default="step", objects=list(X_AXES), doc="What the x axis shows.")
    smoothing: param.Selector = param.Selector(default="EMA", objects=list(SMOOTHING), doc="How curves are smoothed.")
    amount = param.Integer(default=0, bounds=(0, 500), doc="Points the smoothing spans (0: raw values).")
    log_y = param.Boolean(default=False, doc="Log scale on the y axis.")

    def widgets(self) -> pn.Row:
        """The controls as Panel widgets."""
        return pn.Row(
            pn.widgets.RadioButtonGroup.from_param(self.param.x_axis, label="x axis"),
            pn.widgets.Select.from_param(self.param.smoothing, label="smoothing", width=110),
            pn.widgets.IntInput.from_param(self.param.amount, label="over points (0 = raw)", width=150),
            pn.widgets.Checkbox.from_param(self.param.log_y, label="log y"),
            sizing_mode="stretch_width",
        )


class LearningView(RunView):
    """Every series the run's loops write, grouped by loop, on one x axis.

    Trainers and makers are found in the metric store (see :func:`~carls_dask.dashboards.learning.discover`):
    each trainer's loss and evaluation metrics, the makers' staleness, rounds and rows side by side, then
    every other series of each loop in a figure of its own (named ``learning-series-LOOP.metric``), loop
    by loop. A figure is added when its series is first written. All figures share one x range: zooming
    one zooms all.
    """

    controls = param.ClassSelector(class_=LearningControls, doc="The x axis, smoothing and y scale of the curves.")

    def __init__(self, **params: object) -> None:
        params.setdefault("title", "Learning")
        params.setdefault("controls", LearningControls())
        super().__init__(**params)
        assert isinstance(self.controls, LearningControls)
        self._ctl: LearningControls = self.controls
        self.x_range = DataRange1d()
        self.charts: dict[str, LiveCurves] = {}
        self._charts_lock = threading.Lock()
        self._grid = pn.GridBox(ncols=2, sizing_mode="stretch_width")
        self._series_grid = pn.Column(sizing_mode="stretch_width")
        self._shown: list[str] = []
        self._result_cache: dict[str, Any] = {}
        self.loops: Loops | None = None
        self._has_metrics = False
        self._settings = object()  # replaced when a control changes: the next read redraws
        self._xlabel = "step"
        self._ctl.param.watch(self._on_settings, ["x_axis", "smoothing", "amount"])
        self._ctl.param.watch(self._on_log, ["log_y"])

    # ------------------------------------------------------------------ controls

    def _on_settings(self, *_: object) -> None:
        self._settings = object()
        if self._built:
            in_background(self.read, self.flush)

    def _on_log(self, event: param.parameterized.Event) -> None:
        for chart in list(self.charts.values()):
            if isinstance(chart, LiveLogCurves):
                chart.set_log(bool(event.new))

    # ------------------------------------------------------------------ reading

    def applies(self) -> bool:
        """Whether the run has learning curves: a trainer or maker in its metric store (or nothing read yet)."""
        return self.loops is None or bool(self.loops) or not self._has_metrics

    def figures(self) -> list[LiveCurves]:  # type: ignore[override]
        with self._charts_lock:
            return list(self.charts.values())

    def _chart(self, key: str, title: str, ylabel: str, small: bool = False) -> LiveCurves:
        chart = self.charts.get(key)
        if chart is None:
            if small:  # one series of a loop: a plain figure, smaller
                chart = LiveCurves(title, "no points yet", xlabel=self._xlabel, ylabel=ylabel, name=f"learning-{key}",
                                   x_range=self.x_range, height=SMALL_HEIGHT)
            else:
                chart = LiveLogCurves(title, "no points yet", xlabel=self._xlabel, ylabel=ylabel,
                                      name=f"learning-{key}", x_range=self.x_range, sizing_mode="stretch_width")
            with self._charts_lock:
                self.charts[key] = chart
        return chart

    def _inputs(self) -> tuple[object, ...]:
        assert self.reader is not None
        return (self.reader.metrics(), read_result(self.reader.path, self._result_cache), self._settings)

    def _update(self) -> None:
        assert self.reader is not None
        ds = self.reader.metrics()
        self._has_metrics = ds is not None
        if ds is None:
            self.loops = Loops()
            self._set_absent("No metric store yet: the curves appear when the run writes its first metrics.",
                             "the curves")
            return
        c = self._ctl
        loops = discover([str(v) for v in ds.data_vars], read_result(self.reader.path, self._result_cache))
        self.loops = loops
        self._xlabel = "step" if c.x_axis == "step" else "seconds since the run's first metric"
        for trainer, series in loops.trainers.items():
            losses = {m: s for m, s in series.items() if m == "loss" or m.endswith("_loss")}
            evals = {m: s for m, s in series.items() if m not in losses}
            for key, title, ylabel, group in (
                (f"{trainer}-loss", f"{trainer}: loss", "loss", losses),
                (f"{trainer}-eval", f"{trainer}: evaluation", "metric", evals),
            ):
                if group:
                    self._chart(key, title, ylabel).set(
                        [(m, *curve(ds, s, c.x_axis, c.smoothing, c.amount)) for m, s in group.items()]
                    )
        for metric in MAKER_METRICS:
            lines = [(maker, s[metric]) for maker, s in loops.makers.items() if metric in s]
            if lines:
                title, ylabel = _MAKER_TITLES[metric]
                self._chart(f"maker-{metric}", title, ylabel).set(
                    [(maker, *curve(ds, s, c.x_axis, c.smoothing, c.amount)) for maker, s in lines]
                )
        for loop, series in loops.others.items():
            for metric, name in series.items():
                if ds[name].ndim != 1:
                    continue  # a vector per step (a histogram): not a curve
                x, y = curve(ds, name, c.x_axis, c.smoothing, c.amount)
                if not x.size and f"series-{name}" not in self.charts:
                    continue  # no value written yet: its figure comes with the first
                label = f"{loop}: {metric}" if loop else f"run: {metric}"
                self._chart(f"series-{name}", label, metric, small=True).set([(metric, x, y)])
        self._set_message("" if loops else "This run's metric store has no series yet.")

    def flush(self) -> int:
        """Apply the queued curve updates, and add the figures of loops that appeared; call on the page.

        The figures are updated before the grid shows new ones, so a new figure reaches the page whole.
        """
        charts = self.figures()
        changed = 0
        for chart in charts:
            if chart.flush():
                changed += 1
                _set_xlabel(chart, self._xlabel)
        keys = list(self.charts)
        if keys != self._shown:
            main = [chart for key, chart in self.charts.items() if not key.startswith("series-")]
            for chart in main:
                if isinstance(chart, LiveLogCurves):
                    chart.set_log(self._ctl.log_y)
            self._grid.objects = [chart.pane for chart in main]
            self._series_grid.objects = self._loop_panes()
            self._shown = keys
        return changed

    def _loop_panes(self) -> list[pn.viewable.Viewable]:
        """Each loop's own series, under a heading naming the loop (in the order the loops were found)."""
        by_loop: dict[str, list[LiveCurves]] = {}
        loops = self.loops or Loops()
        for key, chart in self.charts.items():
            if key.startswith("series-"):
                name = key[len("series-"):]
                loop = next((lp for lp, series in loops.others.items() if name in series.values()), "")
                by_loop.setdefault(loop, []).append(chart)
        rank = {"trainer": 0, "maker": 1}
        panes: list[pn.viewable.Viewable] = []
        for loop in sorted(by_loop, key=lambda lp: (not lp, rank.get(loops.kinds.get(lp, ""), 2))):
            charts = by_loop[loop]
            kind = loops.kinds.get(loop, "")
            heading = f"#### {loop} ({kind})" if loop and kind else f"#### {loop}" if loop else "#### run"
            panes.append(pn.pane.Markdown(heading, sizing_mode="stretch_width"))
            fill = [pn.Spacer(sizing_mode="stretch_width") for _ in range(-len(charts) % SERIES_COLUMNS)]
            panes.append(pn.GridBox(*[c.pane for c in charts], *fill, ncols=SERIES_COLUMNS, sizing_mode="stretch_width"))
        return panes

    def _layout(self) -> pn.viewable.Viewable:
        return pn.Column(self._ctl.widgets(), self._grid, self._series_grid, sizing_mode="stretch_width")
