"""Embedding drift view: change between snapshots per shard, neighbour churn, aligned 2-D map."""

from __future__ import annotations

import numpy as np
import panel as pn
import param
import xarray as xr

from carls_dask.dashboards import plots
from carls_dask.dashboards.bankdata import has_column
from carls_dask.dashboards.drift import aligned_projection, drift_stats, neighbour_churn
from carls_dask.dashboards.figures import LiveCurves, LiveImage
from carls_dask.dashboards.views.base import RunView, in_background, series

__all__ = ["DriftView"]


class DriftView(RunView):
    """How the bank's embeddings move between snapshots.

    Shows, per snapshot step, the mean and percentiles of the per-row change (L2 and cosine distance)
    overall and per shard, the churn of the ``k`` nearest neighbours, and a 2-D projection of a sample
    of rows coloured by label, aligned snapshot to snapshot, with a slider over snapshots.
    """

    column = param.String(default="embedding", doc="Vector column of the table whose drift is shown.")
    k = param.Integer(default=10, bounds=(1, 100), doc="Neighbours compared by the churn measure.")
    queries = param.Integer(default=500, bounds=(10, 10_000), doc="Rows whose neighbourhoods the churn measure compares.")
    sample = param.Integer(
        default=100_000, bounds=(100, 2_000_000), doc="Rows drawn (by a stable hash of the key) for the 2-D projection."
    )
    label = param.String(default="pseudo_label", doc="Column that colours the projection; rows without it get -1.")
    max_snapshots = param.Integer(default=20, bounds=(2, 10_000), doc="Most recent snapshots kept in the drift curves.")

    def __init__(self, **params: object) -> None:
        params.setdefault("title", "Embedding drift")
        super().__init__(**params)
        self._stats: dict[int, xr.Dataset] = {}  # by version of the later snapshot
        self._churn: dict[int, float] = {}
        self._proj: dict[int, xr.Dataset] = {}
        self._steps: dict[int, int] = {}
        self._versions: list[int] = []
        self._quiet = False
        self._map_due: int | None = None  # snapshot step whose map the last read left to draw
        self.slider = pn.widgets.DiscreteSlider(label="snapshot step", options=[0], value=0, width=400, disabled=True)
        self.slider.param.watch(self._on_slider, "value")
        wait = "waiting for two snapshots"
        self._l2 = LiveCurves("L2 change between snapshots", wait, ylabel="L2", name="drift-l2")
        self._cos = LiveCurves("cosine distance between snapshots", wait, ylabel="1 - cos", name="drift-cos")
        self._shards = LiveCurves("mean L2 change per shard", wait, ylabel="L2", name="drift-shards")
        self._churn_plot = LiveCurves("neighbour churn", wait, ylabel="fraction changed", name="drift-churn")
        self._map = LiveImage("projection", "waiting for a snapshot", name="drift-map")

    # ------------------------------------------------------------------ data

    def _update(self) -> None:
        assert self.reader is not None
        snaps = self.reader.snapshots()
        if not snaps:
            self._set_message("No bank snapshot yet: drift appears once the run commits snapshots of its bank.")
            return
        versions = [int(s["version"]) for s in snaps][-self.max_snapshots :]
        steps = {int(s["version"]): int(s["step"]) for s in snaps}
        new = [v for v in versions if v not in self._proj]
        for v in new:
            self._add_snapshot(v, versions)
        self._steps.update(steps)
        self._versions = versions
        kept = set(versions)
        for cache in (self._stats, self._churn, self._proj):
            for v in [v for v in cache if v not in kept]:
                del cache[v]
        if not has_column(self.reader.snapshot(versions[-1]), self.column):
            self._set_message(f"Table {self.reader.table!r} has no column {self.column!r}; nothing to show.")
            return
        msg = "" if len(versions) >= 2 else "One snapshot so far: drift needs two; the map shows the first."
        self._set_message(msg)
        if new:
            self._redraw_curves()
            self._set_slider()

    def _add_snapshot(self, version: int, versions: list[int]) -> None:
        assert self.reader is not None
        cur = self.reader.snapshot(version)
        if not has_column(cur, self.column):
            return
        idx = versions.index(version)
        prev_v = versions[idx - 1] if idx > 0 else None
        prev_proj = self._proj.get(prev_v) if prev_v is not None else None
        self._proj[version] = aligned_projection(
            cur, previous=prev_proj, sample=self.sample, column_name=self.column, label=self.label
        )
        if prev_v is not None:
            prev = self.reader.snapshot(prev_v)
            if has_column(prev, self.column):
                self._stats[version] = drift_stats(prev, cur, self.column)
                self._churn[version] = neighbour_churn(prev, cur, k=self.k, queries=self.queries, column_name=self.column)

    def drift(self) -> xr.Dataset | None:
        """The drift statistics over snapshot steps (``step`` x ``shard``), or ``None`` before two snapshots."""
        vs = [v for v in self._versions if v in self._stats]
        if not vs:
            return None
        return xr.concat([self._stats[v].expand_dims(step=[self._steps[v]]) for v in vs], dim="step", join="outer")

    def churn(self) -> xr.DataArray | None:
        """Neighbour churn over snapshot steps, or ``None`` before two snapshots."""
        vs = [v for v in self._versions if v in self._churn]
        if not vs:
            return None
        return xr.DataArray([self._churn[v] for v in vs], dims="step", coords={"step": [self._steps[v] for v in vs]})

    def projection(self, step: int | None = None) -> xr.Dataset | None:
        """The aligned projection at a snapshot step (the newest when ``None``)."""
        vs = [v for v in self._versions if v in self._proj]
        if not vs:
            return None
        if step is None:
            return self._proj[vs[-1]]
        for v in vs:
            if self._steps[v] == step:
                return self._proj[v]
        return None

    # ------------------------------------------------------------------ drawing

    def _redraw_curves(self) -> None:
        d = self.drift()
        if d is not None:
            overall = d.sel(shard=-1)
            stats = ("mean", "p50", "p90", "p99")
            self._l2.set([series(q, overall[f"l2_{q}"]) for q in stats])
            self._cos.set([series(q, overall[f"cos_{q}"]) for q in stats])
            shards = [int(s) for s in d["shard"].values if s >= 0]
            self._shards.set([series(f"shard {s}", d["l2_mean"].sel(shard=s)) for s in shards])
        c = self.churn()
        if c is not None:
            self._churn_plot.set([series(f"top-{self.k}", c)])

    def _set_slider(self) -> None:
        steps = [self._steps[v] for v in self._versions if v in self._proj]
        if not steps:
            return
        at_end = self.slider.value == self.slider.options[-1] if self.slider.options else True
        self._quiet = True  # one redraw below, not one per slider change
        try:
            self.slider.options = steps
            self.slider.disabled = len(steps) < 2
            if at_end or self.slider.value not in steps:
                self.slider.value = steps[-1]
        finally:
            self._quiet = False
        self._map_due = self.slider.value

    def finish(self) -> bool:
        """Rasterise the map a read left due (datashader: the slow part, done after the curves are shown)."""
        with self._read_lock:
            step, self._map_due = self._map_due, None
            if step is None:
                return False
            self._draw_map(int(step))
            return True

    def _on_slider(self, event: param.parameterized.Event) -> None:
        if not self._quiet:
            # Rasterise in a worker thread; the new image replaces the old one on the event loop.
            in_background(lambda: self._draw_map(int(event.new)), self._map.flush)

    def _draw_map(self, step: int) -> None:
        proj = self.projection(step)
        if proj is not None:
            n_labels = int(np.unique(proj["label"].values).size)
            raster = plots.render_projection(proj, f"step {step}: {n_labels} label(s)")
            if raster is None:
                self._map.set_note("no rows to project", title=f"step {step}")
            else:
                self._map.set(*raster)

    def _layout(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.Row(self._l2.pane, self._cos.pane),
            pn.Row(self._shards.pane, self._churn_plot.pane),
            self.slider,
            self._map.pane,
        )
