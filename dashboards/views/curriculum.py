"""Curriculum progress view: pacing vs realised sampling, difficulty over time, per-difficulty accuracy."""

from __future__ import annotations

import math

import panel as pn
import param
import xarray as xr

from carls_dask.dashboards import metricnames as mn
from carls_dask.dashboards.bankdata import has_column, keys_of, stable_sample
from carls_dask.dashboards.curriculum import accuracy_by_difficulty, difficulty_histograms, pacing_vs_realised
from carls_dask.dashboards.figures import LiveBars, LiveCurves, LiveHeatmap
from carls_dask.dashboards.views.base import RunView, series

__all__ = ["CurriculumView"]


class CurriculumView(RunView):
    """Whether the curriculum admits data as its pacing function plans, and how hard the data is."""

    bins = param.Integer(default=20, bounds=(2, 200), doc="Bins of the difficulty histograms.")
    accuracy_bins = param.Integer(default=5, bounds=(1, 50), doc="Quantile bins of difficulty for the accuracy plot.")
    prediction = param.String(default="pseudo_label", doc="Column holding the predictions judged by difficulty.")
    max_snapshots = param.Integer(default=20, bounds=(1, 10_000), doc="Most recent snapshots in the difficulty plot.")
    sample = param.Integer(default=20_000, bounds=(100, 10_000_000), doc="Rows per snapshot kept for the difficulty plot.")

    def __init__(self, **params: object) -> None:
        params.setdefault("title", "Curriculum progress")
        super().__init__(**params)
        self.summary = pn.pane.Markdown("", sizing_mode="stretch_width")
        self._pacing = LiveCurves(
            "pacing function vs realised sampling", "not written by this run", ylabel="fraction of data", name="cur-pacing"
        )
        self._difficulty = LiveHeatmap(
            "difficulty distribution over time", "no difficulty column", "step", "difficulty", name="cur-difficulty"
        )
        self._accuracy = LiveBars(
            "accuracy by difficulty", "needs difficulty, predictions and truth", "difficulty", "accuracy", name="cur-accuracy"
        )
        self.pacing: xr.Dataset | None = None
        self._samples: dict[int, tuple[int, xr.Dataset | None]] = {}

    def _difficulty_sample(self, ds: xr.Dataset) -> xr.Dataset | None:
        """The difficulty column of a stable sample of rows (kept per snapshot instead of the snapshot)."""
        if not has_column(ds, "difficulty"):
            return None
        rows = stable_sample(keys_of(ds), self.sample)
        return ds[["difficulty"]].isel(key=rows).load()

    def _difficulty_table(self) -> str | None:
        """The table with a ``difficulty`` column: the reader's table when it has one, else the first; ``None``
        while no table has one."""
        assert self.reader is not None
        have = [t for t, cols in self.reader.tables().items() if "difficulty" in cols]
        reader_table = self.reader.table if have else None
        return reader_table if reader_table in have else next(iter(have), None)

    def _inputs(self) -> tuple[object, ...]:
        assert self.reader is not None
        table = self._difficulty_table()
        return (self.reader.latest(table) if table is not None else None, self.reader.metrics(), self.reader.truth())

    def _update(self) -> None:
        assert self.reader is not None
        notes = []
        self.pacing = pacing_vs_realised(self.reader.metrics())
        if self.pacing is not None:
            self._pacing.set(
                [series(name, self.pacing[var].dropna("step")) for name, var in
                 (("pacing", "pacing"), ("admitted", "realised"), ("sampled", "sampled"), ("scored", "scored"))
                 if var in self.pacing and self.pacing[var].notnull().any()]
            )
            last = self.pacing.isel(step=-1)
            realised = float(last["realised"])
            self.summary.object = (
                f"step {int(last['step'])}: admitted **{'n/a' if math.isnan(realised) else f'{realised:.1%}'}** "
                f"of the data (pacing {float(last['pacing']):.1%})" + self._unscored_note()
            )
        else:
            notes.append(f"no curriculum series ({mn.PACING}, {mn.ADMITTED_FRACTION}) in the metric store")
        table = self._difficulty_table()
        snaps = self.reader.snapshots()[-self.max_snapshots :] if table is not None else []
        for s in snaps:
            v = int(s["version"])
            if v not in self._samples:
                try:
                    ds = self.reader.snapshot(v, table)
                except KeyError:  # a snapshot without the table
                    ds = None
                self._samples[v] = (int(s["step"]), self._difficulty_sample(ds) if ds is not None else None)
        kept = {int(s["version"]) for s in snaps}
        for v in [v for v in self._samples if v not in kept]:
            del self._samples[v]
        pairs = [(step, ds) for v, (step, ds) in sorted(self._samples.items()) if ds is not None]
        hist = difficulty_histograms(pairs, bins=self.bins)
        if hist is not None:
            dens = hist["density"]
            xdim, ydim = dens.dims
            self._difficulty.set(dens[xdim].values, dens[ydim].values, dens.values)
        latest = self.reader.latest(table) if table is not None else None
        if latest is None or not has_column(latest, "difficulty"):
            notes.append("no difficulty column in the bank")
        else:
            acc = accuracy_by_difficulty(latest, self.reader.truth(), bins=self.accuracy_bins, prediction=self.prediction)
            if acc is not None:
                self._accuracy.set([f"{d:.3g}" for d in acc["difficulty"].values], acc["accuracy"].fillna(0).values)
        self._set_message(("This run has " + "; ".join(notes) + ".") if notes else "")

    def _unscored_note(self) -> str:
        """Why admitted stays at 100 % early on: the steps before the sampler had any difficulty score."""
        if self.pacing is None or "scored" not in self.pacing:
            return ""
        scored = self.pacing["scored"].dropna("step")
        if not scored.sizes["step"] or float(scored[0]) > 0:
            return ""
        some = scored["step"].values[scored.values > 0]
        if some.size == 0:
            return "; no difficulty score has reached the sampler yet, so it admits all data"
        return f"; before step {int(some[0])} no difficulty score had reached the sampler, so it admitted all data"

    def applies(self) -> bool:
        """Whether the run has a curriculum: a ``difficulty`` column in its bank or pacing / admitted series."""
        return self.reader is not None and self.reader.has("difficulty", (mn.PACING, mn.ADMITTED_FRACTION))

    def _layout(self) -> pn.viewable.Viewable:
        wide = {"sizing_mode": "stretch_width"}
        return pn.Column(self.summary, pn.Row(self._pacing.pane, self._difficulty.pane, **wide), self._accuracy.pane, **wide)
