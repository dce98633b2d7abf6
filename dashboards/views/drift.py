"""Embedding drift view: change between snapshots per shard, neighbour churn, aligned 2-D map."""

from __future__ import annotations

import numpy as np
import panel as pn
import param
import xarray as xr

from carls_dask.dashboards import plots
from carls_dask.dashboards.bankdata import column, has_column, keys_of, stable_sample
from carls_dask.dashboards.drift import (
    COLOURINGS,
    aligned_projection,
    attach,
    drift_stats,
    neighbour_churn,
    predictions,
)
from carls_dask.dashboards.figures import LiveCurves, LiveMap
from carls_dask.dashboards.runreader import default_column
from carls_dask.dashboards.views.base import RunView, in_background, series

__all__ = ["DriftView"]

#: What hovering a point of the map shows: (label, column of the points).
_HOVER = (
    ("key", "key"), ("true class", "truth"), ("pseudo label", "pseudo_label"), ("prediction", "prediction"),
    ("maker", "maker"), ("model step", "model_step"), ("age (s)", "age"),
)


class DriftView(RunView):
    """How the bank's embeddings move between snapshots.

    Shows, for one float vector column of one table (selectors offer every table that has one, and
    its vector columns), per snapshot step, the mean and percentiles of the per-row change (L2 and
    cosine distance) overall and per shard, the churn of the ``k`` nearest neighbours, and a 2-D
    projection of a sample of rows, aligned snapshot to snapshot, with a slider over snapshots. The
    table shown first is the one asked for (``table=``, ``--table``), else the reader's table when it
    has a vector column, else the first table (in the order the bank was created with them) that has
    one; the column shown first is ``embedding`` when the table has one, else its first vector column. The map is coloured by what
    the run has of true class (its truth file), pseudo label, model prediction (a ``prediction``
    column or the arg-max of ``logits``) and difficulty, from the embedding's table or any other
    table of the bank (matched by key); hovering one of a bounded sample of its points shows the
    row's key, classes and provenance (maker, model step, age).
    """

    column = param.String(
        default=None, allow_None=True,
        doc="Float vector column whose drift is shown; None: 'embedding' when the table has one, else its first.",
    )
    table = param.String(
        default=None, allow_None=True,
        doc="Bank table whose vectors are shown; None: the reader's table when it has a float vector column, "
            "else the first table that has one.",
    )
    k = param.Integer(default=10, bounds=(1, 100), doc="Neighbours compared by the churn measure.")
    queries = param.Integer(default=500, bounds=(10, 10_000), doc="Rows whose neighbourhoods the churn measure compares.")
    sample = param.Integer(
        default=100_000, bounds=(100, 2_000_000), doc="Rows drawn (by a stable hash of the key) for the 2-D projection."
    )
    colour_by: param.Selector = param.Selector(
        default="true class", objects=list(COLOURINGS), doc="What colours the map (only what the run has is offered)."
    )
    hover_points = param.Integer(
        default=2000, bounds=(0, 20_000), doc="Rows of the map drawn as points to hover (a stable sample)."
    )
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
        self._map = LiveMap("projection", "waiting for a snapshot", name="drift-map", hover=_HOVER)
        self.colour_select = pn.widgets.Select(label="colour by", options=[self.colour_by], value=self.colour_by, width=200)
        self.colour_select.param.watch(self._on_colour, "value")
        self.table_select = pn.widgets.Select(label="table", options=[], width=200, disabled=True)
        self.column_select = pn.widgets.Select(label="vector column", options=[], width=200, disabled=True)
        self.table_select.param.watch(self._on_table, "value")
        self.column_select.param.watch(self._on_column, "value")
        #: The table and column shown (chosen when the run has them).
        self.shown: tuple[str, str] | None = None
        #: What colours the map drawn last, and the names of its colour categories.
        self.map_colour: str | None = None
        self.map_categories: list[str] = []

    # ------------------------------------------------------------------ data

    def _update(self) -> None:
        assert self.reader is not None
        shown = self._choose()
        if shown is None:
            why = ("No bank snapshot yet" if not self.reader.tables()
                   else "No bank table has a float vector column")
            self._set_absent(f"{why}: drift appears once the run commits snapshots of a table with one.", "drift")
            return
        table, col = shown
        snaps = self.reader.snapshots()
        if not snaps:
            self._set_absent("No bank snapshot yet: drift appears once the run commits snapshots of its bank.", "drift")
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
        if not has_column(self.reader.snapshot(versions[-1], table), col):
            self._set_message(f"Table {table!r} has no column {col!r} in its newest snapshot; nothing to show.")
            return
        drawn = [v for v in versions if v in self._proj]
        msg = ("" if len(drawn) >= 2 else "One snapshot so far: drift needs two; the map shows the first." if drawn
               else f"No snapshot of table {table!r} holds rows yet: drift appears once two do.")
        self._set_message(msg)
        new = [v for v in new if v in self._proj]
        if new:
            self._redraw_curves()
            self._set_colourings()
            self._set_slider()

    def _add_snapshot(self, version: int, versions: list[int]) -> None:
        assert self.reader is not None and self.shown is not None
        table, col = self.shown
        try:
            cur = self.reader.snapshot(version, table)
        except KeyError:  # a snapshot from before the table was written
            return
        if not has_column(cur, col) or cur.sizes.get("key", 0) < 2:
            return  # nothing to project yet (the table's rows come in a later snapshot)
        idx = versions.index(version)
        prev_v = versions[idx - 1] if idx > 0 else None
        prev_proj = self._proj.get(prev_v) if prev_v is not None else None
        proj = aligned_projection(cur, previous=prev_proj, sample=self.sample, column_name=col, label=None)
        self._proj[version] = self._with_colours(proj, cur, version)
        if prev_v is not None and prev_v in self._proj:
            prev = self.reader.snapshot(prev_v, table)
            if has_column(prev, col):
                self._stats[version] = drift_stats(prev, cur, col)
                self._churn[version] = neighbour_churn(prev, cur, k=self.k, queries=self.queries, column_name=col)

    def _choose(self) -> tuple[str, str] | None:
        """The table and column to show (see the class notes); offers the others in the selectors.

        Changing the table or column shown forgets what was computed for the previous one.
        """
        assert self.reader is not None
        vectors = self.reader.vector_tables()
        if not vectors:
            return None
        table = self.table if self.table in vectors else None
        if table is None:
            reader_table = self.reader.table
            table = reader_table if reader_table in vectors else next(iter(vectors))
        columns = self.reader.table_columns()[table]
        col = self.column if self.column in vectors[table] else default_column(columns)
        assert col is not None
        if self.shown != (table, col):
            self._forget()
            self.shown = (table, col)
        self._offer(list(vectors), table, vectors[table], col)
        return self.shown

    def _forget(self) -> None:
        """Drop what was computed for the table and column shown before."""
        for cache in (self._stats, self._churn, self._proj):
            cache.clear()
        self._versions = []
        self._last_inputs = None
        if self.shown is not None:  # the figures showed another table's vectors
            for fig in self.figures():
                fig.set_note(fig.empty_note)

    def _offer(self, tables: list[str], table: str, columns: list[str], col: str) -> None:
        self._quiet = True
        try:
            if list(self.table_select.options) != tables:
                self.table_select.options = tables
            if self.table_select.value != table:
                self.table_select.value = table
            self.table_select.disabled = len(tables) < 2
            if list(self.column_select.options) != columns:
                self.column_select.options = columns
            if self.column_select.value != col:
                self.column_select.value = col
            self.column_select.disabled = len(columns) < 2
        finally:
            self._quiet = False

    def _on_table(self, event: param.parameterized.Event) -> None:
        if not self._quiet and event.new and event.new != self.table:
            self.table, self.column = str(event.new), None
            in_background(self._reread, self.flush)

    def _on_column(self, event: param.parameterized.Event) -> None:
        if not self._quiet and event.new and event.new != self.column:
            self.column = str(event.new)
            in_background(self._reread, self.flush)

    def _reread(self) -> None:
        """Read the run again for a newly chosen table or column, and draw its map."""
        self._last_inputs = None
        self.read()
        self.finish()

    def _with_colours(self, proj: xr.Dataset, cur: xr.Dataset, version: int) -> xr.Dataset:
        """``proj`` with what can colour it: truth, pseudo label, prediction and difficulty, where the run has them.

        Each is taken from the embedding's table when it has it, else from the first other table of the
        snapshot that has it, matched by key.
        """
        assert self.reader is not None
        truth = self.reader.truth()
        if truth is not None:
            proj = attach(proj, "truth", truth["key"].values, truth.values)
        tables = self.reader.tables()
        for var, wanted in (("pseudo_label", {"pseudo_label"}), ("prediction", {"prediction", "logits"}),
                            ("difficulty", {"difficulty"})):
            found = self._values(cur, var)
            if found is None:
                for t, cols in tables.items():
                    if t != cur.attrs.get("table") and wanted & set(cols):
                        try:
                            found = self._values(self.reader.snapshot(version, t), var)
                        except KeyError:  # that table was not in this snapshot
                            continue
                        if found is not None:
                            break
            if found is not None:
                proj = attach(proj, var, *found)
        return proj

    @staticmethod
    def _values(ds: xr.Dataset, var: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The keys of a table and its values of ``var`` (a prediction is worked out of logits), or ``None``."""
        values = predictions(ds) if var == "prediction" else (column(ds, var) if has_column(ds, var) else None)
        return None if values is None else (keys_of(ds), np.asarray(values))

    def colourings(self) -> list[str]:
        """What the newest map can be coloured by (labels of :data:`~carls_dask.dashboards.drift.COLOURINGS`)."""
        proj = self.projection()
        if proj is None:
            return []
        out = []
        for label, var in COLOURINGS.items():
            if var in proj:
                v = np.asarray(proj[var].values)
                if (np.isfinite(v).any() if v.dtype.kind == "f" else (v >= 0).any()):
                    out.append(label)
        return out

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
            self._l2.set([series(q, overall[f"l2_{q}"]) for q in stats], title=f"L2 change between snapshots{self._of()}")
            self._cos.set([series(q, overall[f"cos_{q}"]) for q in stats],
                          title=f"cosine distance between snapshots{self._of()}")
            shards = [int(s) for s in d["shard"].values if s >= 0]
            self._shards.set([series(f"shard {s}", d["l2_mean"].sel(shard=s)) for s in shards],
                             title=f"mean L2 change per shard{self._of()}")
        c = self.churn()
        if c is not None:
            self._churn_plot.set([series(f"top-{self.k}", c)], title=f"neighbour churn{self._of()}")

    def _of(self) -> str:
        """`` (TABLE.COLUMN)`` of the vectors shown, for the figures' titles."""
        return f" ({self.shown[0]}.{self.shown[1]})" if self.shown is not None else ""

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

    def _set_colourings(self) -> None:
        """Offer what the run has to colour the map by; keep the choice when it is still offered."""
        have = self.colourings()
        self.colour_select.disabled = not have
        if not have:
            have = [self.colour_by]
        self._quiet = True
        try:
            self.colour_select.options = have
            if self.colour_by not in have:
                self.colour_by = have[0]
            self.colour_select.value = self.colour_by
        finally:
            self._quiet = False

    def _on_slider(self, event: param.parameterized.Event) -> None:
        if not self._quiet:
            # Rasterise in a worker thread; the new image replaces the old one on the event loop.
            in_background(lambda: self._draw_map(int(event.new)), self._map.flush)

    def _on_colour(self, event: param.parameterized.Event) -> None:
        if self._quiet or event.new == self.colour_by:
            return
        self.colour_by = event.new
        step = self.slider.value
        in_background(lambda: self._draw_map(int(step)), self._map.flush)

    def _draw_map(self, step: int) -> None:
        proj = self.projection(step)
        if proj is None:
            return
        label = self.colour_by
        by = COLOURINGS[label]
        colours = plots.map_colours(proj, by)
        codes, names, hexes = colours
        where = f"{self.shown[0]}.{self.shown[1]} " if self.shown is not None else ""
        title = (f"{where}step {step}: colour {label} ({len(names)} values)" if names
                 else f"{where}step {step}: nothing in the run to colour by")
        raster = plots.render_projection(proj, title, by=by, colours=colours)
        if raster is None:
            self._map.set_note("no rows to project", title=f"step {step}")
            return
        self._map.set_map(*raster[:2], self._hover_points(proj, codes, names, hexes), title=raster[2])
        self.map_colour, self.map_categories = label, names

    def _hover_points(self, proj: xr.Dataset, codes: np.ndarray, names: list[str], hexes: list[str]) -> dict[str, object]:
        """The points drawn over the map: a stable sample of its rows with their colour and what hovering shows."""
        assert self.reader is not None
        n = proj.sizes["key"]
        rows = stable_sample(keys_of(proj), self.hover_points) if self.hover_points else np.zeros(0, np.int64)
        rows = rows[np.argsort(codes[rows], kind="stable")]  # the legend lists the categories in order, "none" first
        c = codes[rows]
        palette = np.asarray([*hexes, plots.NONE_COLOUR])
        names_none = np.asarray([*(str(n) for n in names), "none"], dtype=str)
        pts: dict[str, object] = {
            "x": proj["x"].values[rows], "y": proj["y"].values[rows],
            "colour": palette[np.where(c >= 0, c, len(hexes))].tolist(),
            "category": names_none[np.where(c >= 0, c, len(names))].tolist(),
            "key": np.asarray(proj["key"].values)[rows],
        }
        for var in ("truth", "pseudo_label", "prediction", "maker", "model_step"):
            if var in proj:
                v = np.asarray(proj[var].values)[rows]
                pts[var] = [("none" if x < 0 else str(x)) if v.dtype.kind in "iu" else str(x) for x in v.tolist()]
            else:
                pts[var] = ["n/a"] * rows.size
        if "wall_time" in proj and n:
            age = self.reader.age_reference() - np.asarray(proj["wall_time"].values, np.float64)[rows]
            pts["age"] = [f"{a:.1f}" for a in np.maximum(age, 0.0)]
        else:
            pts["age"] = ["n/a"] * rows.size
        return pts

    def applies(self) -> bool:
        """Whether a table of the run's bank has a float vector column."""
        return self.reader is not None and bool(self.reader.vector_tables())

    def _layout(self) -> pn.viewable.Viewable:
        wide = {"sizing_mode": "stretch_width"}
        return pn.Column(
            pn.Row(self._l2.pane, self._cos.pane, **wide),
            pn.Row(self._shards.pane, self._churn_plot.pane, **wide),
            pn.Row(self.table_select, self.column_select, self.slider, self.colour_select),
            self._map.pane,
            **wide,
        )
