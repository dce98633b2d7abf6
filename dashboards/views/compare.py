"""Comparison of runs: the same metric of every chosen run overlaid, and mean ± std of the final figures per variant."""

from __future__ import annotations

import dataclasses
import logging
import threading
import traceback
from collections.abc import Sequence
from typing import Any

import pandas as pd
import panel as pn
import param
from bokeh.models import DataRange1d

from carls_dask.dashboards.figures import LiveLogCurves
from carls_dask.dashboards.learning import RunInfo, curve, discover, final_figures, run_info, summary_table
from carls_dask.dashboards.runreader import RunReader
from carls_dask.dashboards.views.base import in_background
from carls_dask.dashboards.views.learning import LearningControls, read_result

__all__ = ["MAX_METRICS", "CompareView", "default_metrics"]

logger = logging.getLogger(__name__)

#: Metrics drawn at once (one figure each).
MAX_METRICS = 4


def default_metrics(options: Sequence[str]) -> list[str]:
    """The headline accuracy (test, else validation, else the first evaluation metric) and the loss, of the
    trainer called ``trainer`` when there is one.

    Examples
    --------
    >>> default_metrics(["trainer.loss", "trainer.train_acc", "trainer.val_acc", "trainer.test_acc"])
    ['trainer.test_acc', 'trainer.loss']
    """
    def pick(suffixes: Sequence[str]) -> str | None:
        for suffix in suffixes:
            for prefix in ("trainer.", ""):
                for o in options:
                    if o.startswith(prefix) and o.endswith(suffix):
                        return o
        return None

    acc = pick(["test_acc", "val_acc", "test_accuracy", "top1", "acc", "r@1"])
    evals = [o for o in options if not o.endswith("loss")]
    chosen = [acc or (evals[0] if evals else None), pick(["loss"])]
    return [c for c in chosen if c]


class CompareView(pn.viewable.Viewer):
    """Overlaid curves of several runs (one colour per run) and a table of mean ± std over seeds per variant.

    The same two halves as a :class:`~carls_dask.dashboards.views.base.RunView`: :meth:`read` (any
    thread) reads every run's metric store incrementally and queues the curves and the table;
    :meth:`flush` applies them on the page.
    """

    readers = param.List(default=[], item_type=RunReader, doc="Readers of the runs compared.")
    controls = param.ClassSelector(class_=LearningControls, doc="The x axis, smoothing and y scale of the curves.")
    message = param.String(default="", doc="Why (part of) the view is empty.")

    def __init__(self, **params: Any) -> None:
        params.setdefault("controls", LearningControls())
        super().__init__(**params)
        assert isinstance(self.controls, LearningControls)
        self._ctl: LearningControls = self.controls
        self.infos: list[RunInfo] = [run_info(r.path) for r in self.readers]
        labels = [i.label for i in self.infos]
        self.labels = [lab if labels.count(lab) == 1 else f"{lab} ({i.path.name})" for lab, i in zip(labels, self.infos, strict=True)]
        self.runs = pn.widgets.MultiChoice(label="Runs", options=list(self.labels), value=list(self.labels), sizing_mode="stretch_width")
        self.metrics = pn.widgets.MultiChoice(label="Metrics", options=[], value=[], max_items=MAX_METRICS, sizing_mode="stretch_width")
        self.x_range = DataRange1d()
        self.charts = [
            LiveLogCurves("", "no points yet", ylabel="value", name=f"compare-{i}", x_range=self.x_range, sizing_mode="stretch_width")
            for i in range(MAX_METRICS)
        ]
        self.table = pn.pane.DataFrame(pd.DataFrame(), index=False, sizing_mode="stretch_width", float_format="{:.4g}".format)
        self._alert = pn.pane.Alert("", alert_type="info", visible=False, sizing_mode="stretch_width")
        self._error = pn.pane.Alert("", alert_type="danger", visible=False, sizing_mode="stretch_width")
        self._read_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[str, Any] = {}
        self._results: list[dict[str, Any]] = [{} for _ in self.readers]
        self._last_inputs: tuple[object, ...] | None = None
        self._settings = object()
        self._metrics_chosen = False  # the user (or the first read) chose metrics: keep them
        self._drawn: list[str] = []
        self._xlabel = "step"
        self.summary: pd.DataFrame = pd.DataFrame()
        self._panel: pn.viewable.Viewable | None = None
        self.runs.param.watch(self._on_settings, "value")
        self.metrics.param.watch(self._on_metrics, "value")
        self._ctl.param.watch(self._on_settings, ["x_axis", "smoothing", "amount"])
        self._ctl.param.watch(self._on_log, ["log_y"])
        self._flushing = False

    # ------------------------------------------------------------------ controls

    def _on_metrics(self, *_: object) -> None:
        if not self._flushing:
            self._metrics_chosen = True
            self._on_settings()

    def _on_settings(self, *_: object) -> None:
        self._settings = object()
        if self._panel is not None and not self._flushing:
            in_background(self.read, self.flush)

    def _on_log(self, event: param.parameterized.Event) -> None:
        for chart in self.charts:
            chart.set_log(bool(event.new))

    def applies(self) -> bool:
        """Always: a comparison shows whatever its runs have written."""
        return True

    def figures(self) -> list[LiveLogCurves]:
        """The curve figures (one per chosen metric)."""
        return list(self.charts)

    # ------------------------------------------------------------------ reading

    def refresh(self) -> None:
        """Read what is new and update the page (here, at once)."""
        self.read()
        self.flush()

    def read(self) -> bool:
        """Read every run and queue the curves and the table (safe in a worker thread); whether anything changed."""
        with self._read_lock:
            try:
                return self._read()
            except Exception as exc:  # the view must stay up
                logger.warning("comparison refresh failed: %s", "".join(traceback.format_exception(exc)))
                with self._lock:
                    self._pending["error"] = f"Could not update the comparison: {type(exc).__name__}: {exc}"
                return True
            finally:
                for chart in self.charts:
                    chart.settle()  # read once: a figure of no metric (hidden) no longer says "loading"

    def _read(self) -> bool:
        datasets = [r.metrics() if r.problem() is None else None for r in self.readers]
        results = [read_result(r.path, c) for r, c in zip(self.readers, self._results, strict=True)]
        inputs = (*datasets, *results, self._settings)
        if self._last_inputs is not None and all(a is b for a, b in zip(inputs, self._last_inputs, strict=True)):
            return False
        infos = [
            info if info.result is res else dataclasses.replace(run_info(info.path), result=res)
            for info, res in zip(self.infos, results, strict=True)
        ]
        self.infos = infos
        options: list[str] = []
        for ds, res in zip(datasets, results, strict=True):
            if ds is not None:
                options.extend(s for s in discover([str(v) for v in ds.data_vars], res).trainer_series() if s not in options)
        chosen = list(self.metrics.value) if self._metrics_chosen else default_metrics(options)
        c = self._ctl
        chosen_runs = set(self.runs.value)
        curves = []
        for metric in chosen[:MAX_METRICS]:
            lines = []
            for label, ds in zip(self.labels, datasets, strict=True):
                if ds is not None and label in chosen_runs and metric in ds:
                    lines.append((label, *curve(ds, metric, c.x_axis, c.smoothing, c.amount)))
            curves.append((metric, lines))
        chosen_infos = [(i, ds) for i, ds, lab in zip(infos, datasets, self.labels, strict=True) if lab in chosen_runs]
        table = summary_table([(i, final_figures(i, ds)) for i, ds in chosen_infos])
        missing = [lab for lab, ds in zip(self.labels, datasets, strict=True) if ds is None]
        for chart, (metric, lines) in zip(self.charts, curves, strict=False):
            chart.set(lines, title=metric)
        with self._lock:
            self._pending.update(
                options=options, chosen=chosen, table=table, n_curves=len(curves),
                xlabel="step" if c.x_axis == "step" else "seconds since each run's first metric",
                message=("No metrics yet from: " + ", ".join(missing)) if missing else "",
            )
            self._pending.pop("error", None)
        self._last_inputs = inputs
        return True

    def flush(self) -> int:
        """Apply the queued curves, metric choices and table on the page; returns how many figures changed."""
        with self._lock:
            pending, self._pending = self._pending, {}
        self._flushing = True
        try:
            if "error" in pending:
                self._error.object, self._error.visible = pending["error"], True
            elif pending:
                self._error.visible = False
            if "options" in pending:
                if list(self.metrics.options) != pending["options"]:
                    self.metrics.options = pending["options"]
                if not self._metrics_chosen and list(self.metrics.value) != pending["chosen"]:
                    self.metrics.value = pending["chosen"]
                self._xlabel = pending["xlabel"]
                n = pending["n_curves"]
                for i, chart in enumerate(self.charts):
                    if chart.pane.visible != (i < n):
                        chart.pane.visible = i < n
                table: pd.DataFrame = pending["table"]
                if not table.equals(self.summary):
                    self.summary = table
                    shown = table.copy()
                    shown.attrs = {}  # the numbers' frames stay with the summary
                    self.table.object = shown
                text = pending["message"]
                self._alert.object, self._alert.visible = text, bool(text)
                self.message = text
            changed = 0
            for chart in self.charts:
                if chart.flush():
                    changed += 1
                    chart.set_xlabel(self._xlabel)
            return changed
        finally:
            self._flushing = False

    def __panel__(self) -> pn.viewable.Viewable:
        if self._panel is None:
            self._panel = pn.Column(
                "## Comparison",
                self._alert,
                self._error,
                pn.Row(self.runs, self.metrics, sizing_mode="stretch_width"),
                self._ctl.widgets(),
                pn.GridBox(*[c.pane for c in self.charts], ncols=2, sizing_mode="stretch_width"),
                "### Final figures: mean ± std over the runs of each variant",
                self.table,
                sizing_mode="stretch_width",
            )
        return self._panel
