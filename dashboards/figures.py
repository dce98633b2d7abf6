"""Live Bokeh figures: built once, then updated in place from data prepared off the event loop.

Every figure owns its Bokeh models and :class:`~bokeh.models.ColumnDataSource` objects. A view calls a
figure's ``set_*`` method from any thread (typically a worker thread that just read the run): the
method turns its arguments into plain column arrays and keeps them as the figure's *pending* update,
without touching a Bokeh model. :meth:`LiveFigure.flush`, called where the page's document may be
changed (the server's event loop, or directly in a notebook), moves the pending update into the
models: ``source.data = ...`` or, when a series only grew, ``source.stream(...)`` with the new rows
alone. So a refresh sends the browser a small data patch instead of a new plot, and the event loop
spends microseconds to milliseconds on it instead of seconds rebuilding figures.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import colorcet
import numpy as np
import panel as pn
from bokeh.models import ColumnDataSource, FactorRange, HoverTool, LinearColorMapper
from bokeh.models.annotations import Label, Legend, Title
from bokeh.plotting import figure

from carls_dask.errors import HookNotImplementedError, MissingKeyError

__all__ = [
    "HEIGHT", "LOADING", "MIN_WIDTH", "WIDTH", "LiveBars", "LiveCurves", "LiveFigure", "LiveHeatmap", "LiveImage", "LiveLogCurves",
    "LiveMap", "LiveStackedBars",
]

WIDTH = 460
HEIGHT = 260
#: Least width of a figure (pixels) when the page is narrow.
MIN_WIDTH = 320
_TOOLS = "pan,wheel_zoom,box_zoom,reset,save"
#: What an empty figure says until its view has read the run once (then its own note, or its data).
LOADING = "loading..."
_PALETTE = colorcet.palette["glasbey_category10"]


def _same(a: Any, b: Any) -> bool:
    """Whether two column values hold the same items (arrays or lists)."""
    if len(a) != len(b):
        return False
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


class LiveFigure:
    """A Bokeh figure with a note shown while it has nothing to draw, updated through :meth:`flush`.

    Parameters
    ----------
    title
        Title of the figure (an update may change it).
    note
        Text shown on the empty figure once its view has read the run and found nothing to draw
        (:meth:`settle`); until that first read it says :data:`LOADING`.
    xlabel, ylabel
        Axis labels.
    width, height
        Size in pixels; the width is the least the figure takes, since it stretches to the width of
        the page (or of its share of a row).
    name
        Name of the Bokeh figure model (lets a page script find it); a line's source of
        :class:`LiveCurves` is named ``<name>/<line>``.
    """

    def __init__(
        self,
        title: str,
        note: str = "no data yet",
        xlabel: str = "",
        ylabel: str = "",
        width: int = WIDTH,
        height: int = HEIGHT,
        name: str | None = None,
        **figure_kw: Any,
    ) -> None:
        figure_kw.setdefault("sizing_mode", "stretch_width")
        self.figure = figure(
            title=title, width=width, height=height, min_width=min(width, MIN_WIDTH), x_axis_label=xlabel, y_axis_label=ylabel,
            tools=_TOOLS, toolbar_location="above", name=name, **figure_kw,
        )
        #: The note shown while there is nothing to draw (after the first read).
        self.empty_note = note
        self.note = Label(
            x=10, y=height // 2 - 30, x_units="screen", y_units="screen", text=LOADING, text_color="#666666",
            text_font_size="11pt",
        )
        self.figure.add_layout(self.note)
        self._lock = threading.Lock()
        self._pending: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None  # the update applied last
        #: How many pending updates :meth:`flush` applied (one per ``set_*`` call that changed something).
        self.updates = 0
        self._pane: pn.pane.Bokeh | None = None

    @property
    def pane(self) -> pn.pane.Bokeh:
        """The Panel pane showing the figure (one per figure)."""
        if self._pane is None:
            self._pane = pn.pane.Bokeh(self.figure, sizing_mode="stretch_width", min_width=self.figure.min_width)
        return self._pane

    def __panel__(self) -> pn.pane.Bokeh:
        return self.pane

    def _queue(self, update: dict[str, Any]) -> None:
        with self._lock:
            self._pending = update

    def set_note(self, note: str, title: str | None = None) -> None:
        """Show ``note`` instead of data (safe from any thread; applied by :meth:`flush`)."""
        self._queue({"note": note, "title": title, "empty": True})

    def settle(self) -> bool:
        """After a read of the run: a figure that never got data or a note says its :attr:`empty_note`
        instead of :data:`LOADING` (safe from any thread; applied by :meth:`flush`). Returns whether it queued that."""
        with self._lock:
            if self._pending is None and self._last is None:
                self._pending = {"note": self.empty_note, "title": None, "empty": True}
                return True
            return False

    @property
    def pending(self) -> bool:
        """Whether an update waits for :meth:`flush`."""
        with self._lock:
            return self._pending is not None

    def flush(self) -> bool:
        """Apply the pending update to the Bokeh models; call where the document may change.

        Returns whether anything was applied.
        """
        with self._lock:
            update, self._pending = self._pending, None
        if update is None:
            return False
        self._last = update
        title = self.figure.title
        if update.get("title") is not None and isinstance(title, Title) and update["title"] != title.text:
            title.text = update["title"]
        if update.get("empty"):
            self._clear()
            self.note.text = update["note"]
            self.note.visible = True
        else:
            self._apply(update)
            if self.note.visible:
                self.note.visible = False
        self.updates += 1
        return True

    def _apply(self, update: dict[str, Any]) -> None:
        raise HookNotImplementedError(f"{type(self).__name__} must implement _apply()")

    def _clear(self) -> None:
        raise HookNotImplementedError(f"{type(self).__name__} must implement _clear()")


def _set_data(source: ColumnDataSource, data: dict[str, Any]) -> None:
    """Replace a source's columns unless they already hold the same values."""
    old = source.data
    if set(old) == set(data) and all(_same(old[k], v) for k, v in data.items()):
        return
    source.data = data


class LiveCurves(LiveFigure):
    """Named lines over a numeric x axis; a line that only grew is streamed (only its new points are sent)."""

    def __init__(self, title: str, note: str = "no data yet", xlabel: str = "step", ylabel: str = "value", **kw: Any) -> None:
        super().__init__(title, note, xlabel, ylabel, **kw)
        self.sources: dict[str, ColumnDataSource] = {}
        self.figure.add_tools(HoverTool(tooltips=[("series", "$name"), (xlabel, "@x"), (ylabel, "@y")]))
        #: Points sent by ``stream`` (new rows only) and by whole replacements, for tests and benchmarks.
        self.streamed_points = 0
        self.replaced_points = 0

    def set(self, series: Sequence[tuple[str, Any, Any]], title: str | None = None) -> None:
        """Queue lines ``(name, x, y)`` (arrays of equal length); no lines shows the note."""
        if not series:
            self.set_note(self.empty_note, title)
            return
        lines = {
            str(name): (np.asarray(x, dtype=np.float64).copy(), np.asarray(y, dtype=np.float64).copy()) for name, x, y in series
        }
        self._queue({"lines": lines, "title": title})

    def _apply(self, update: dict[str, Any]) -> None:
        lines: dict[str, tuple[np.ndarray, np.ndarray]] = update["lines"]
        for name, (x, y) in lines.items():
            src = self.sources.get(name)
            if src is None:
                fig_name = self.figure.name
                src = self.sources[name] = ColumnDataSource({"x": x, "y": y}, name=f"{fig_name}/{name}" if fig_name else None)
                colour = _PALETTE[(len(self.sources) - 1) % len(_PALETTE)]
                self.figure.line("x", "y", source=src, legend_label=name, color=colour, line_width=2, name=name)
                # Markers too: a line of one point (e.g. the first drift step) draws nothing on its own.
                self.figure.scatter("x", "y", source=src, legend_label=name, color=colour, size=4, name=name)
                self.figure.legend.location = "top_left"
                self.replaced_points += x.size
                continue
            old_x = np.asarray(src.data["x"])
            n = old_x.size
            if 0 < n < x.size and _same(old_x[[0, -1]], x[[0, n - 1]]) and _same(np.asarray(src.data["y"])[-1:], y[n - 1 : n]):
                src.stream({"x": x[n:], "y": y[n:]})
                self.streamed_points += x.size - n
            elif n != x.size or not (_same(old_x, x) and _same(src.data["y"], y)):
                src.data = {"x": x, "y": y}
                self.replaced_points += x.size
        for name, src in self.sources.items():
            if name not in lines and len(src.data["x"]):
                src.data = {"x": np.zeros(0), "y": np.zeros(0)}

    def _clear(self) -> None:
        for src in self.sources.values():
            if len(src.data["x"]):
                src.data = {"x": np.zeros(0), "y": np.zeros(0)}

    def points(self) -> dict[str, int]:
        """How many points each line holds now."""
        return {name: len(src.data["x"]) for name, src in self.sources.items()}


class LiveBars(LiveFigure):
    """Bars over categories (the categories may change between updates)."""

    def __init__(self, title: str, note: str = "no data yet", xlabel: str = "", ylabel: str = "", **kw: Any) -> None:
        self.x_range = FactorRange()
        super().__init__(title, note, xlabel, ylabel, x_range=self.x_range, **kw)
        self.source = ColumnDataSource({"x": [], "top": []})
        self.figure.vbar(x="x", top="top", width=0.8, source=self.source, color=_PALETTE[0])
        self.figure.add_tools(HoverTool(tooltips=[(xlabel or "x", "@x"), (ylabel or "value", "@top")]))
        self.figure.xaxis.major_label_orientation = 0.8

    def set(self, categories: Sequence[object] | np.ndarray, values: Any, title: str | None = None) -> None:
        """Queue bar heights ``values`` over ``categories`` (shown as text)."""
        cats = [str(c) for c in categories]
        self._queue({"x": cats, "top": np.nan_to_num(np.asarray(values, dtype=np.float64)), "title": title})

    def _apply(self, update: dict[str, Any]) -> None:
        if list(self.x_range.factors) != update["x"]:
            self.x_range.factors = update["x"]
        _set_data(self.source, {"x": update["x"], "top": update["top"]})

    def _clear(self) -> None:
        _set_data(self.source, {"x": [], "top": np.zeros(0)})


class LiveStackedBars(LiveFigure):
    """Bars over numeric bins stacked by part (e.g. right / wrong / unjudged rows per confidence bin)."""

    def __init__(self, title: str, note: str = "no data yet", xlabel: str = "", ylabel: str = "rows", **kw: Any) -> None:
        super().__init__(title, note, xlabel, ylabel, **kw)
        self.source = ColumnDataSource({"x": [], "width": [], "bottom": [], "top": [], "part": [], "color": []})
        self.figure.vbar(
            x="x", width="width", bottom="bottom", top="top", color="color", legend_field="part", source=self.source
        )
        self.figure.legend.location = "top_left"
        self.figure.add_tools(HoverTool(tooltips=[(xlabel or "bin", "@x"), ("part", "@part"), (ylabel, "@top")]))

    def set(self, centres: Any, parts: dict[str, Any], title: str | None = None) -> None:
        """Queue stacked counts: ``parts`` maps a part name to its counts over the bins at ``centres``."""
        x = np.asarray(centres, dtype=np.float64)
        width = float(np.min(np.diff(x))) * 0.9 if x.size > 1 else 1.0
        bottom = np.zeros(x.size)
        cols: dict[str, list[Any]] = {k: [] for k in ("x", "width", "bottom", "top", "part", "color")}
        for i, (name, counts) in enumerate(parts.items()):
            top = bottom + np.asarray(counts, dtype=np.float64)
            cols["x"].extend(x)
            cols["width"].extend([width] * x.size)
            cols["bottom"].extend(bottom)
            cols["top"].extend(top)
            cols["part"].extend([name] * x.size)
            cols["color"].extend([_PALETTE[i % len(_PALETTE)]] * x.size)
            bottom = top
        self._queue({"data": cols, "title": title})

    def _apply(self, update: dict[str, Any]) -> None:
        _set_data(self.source, update["data"])

    def _clear(self) -> None:
        _set_data(self.source, {k: [] for k in self.source.data})


class LiveHeatmap(LiveFigure):
    """Values over a grid of (x, y) cells, each cell drawn at its own width and height."""

    def __init__(self, title: str, note: str = "no data yet", xlabel: str = "", ylabel: str = "", **kw: Any) -> None:
        super().__init__(title, note, xlabel, ylabel, **kw)
        self.source = ColumnDataSource({"x": [], "y": [], "w": [], "h": [], "value": []})
        self.mapper = LinearColorMapper(palette=colorcet.palette["fire"][::-1], low=0.0, high=1.0)
        self.figure.rect(
            x="x", y="y", width="w", height="h", source=self.source, line_color=None,
            fill_color={"field": "value", "transform": self.mapper},
        )
        self.figure.add_tools(HoverTool(tooltips=[(xlabel or "x", "@x"), (ylabel or "y", "@y"), ("value", "@value")]))

    def set(self, x: Any, y: Any, values: Any, title: str | None = None) -> None:
        """Queue a grid: ``values[i, j]`` at ``x[i]``, ``y[j]`` (cell sizes from the spacing of x and y)."""
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        v = np.asarray(values, dtype=np.float64)

        def widths(c: np.ndarray) -> np.ndarray:
            if c.size < 2:
                return np.ones(c.size)
            d = np.diff(c)
            return np.concatenate([d, d[-1:]])

        gx, gy = np.meshgrid(x, y, indexing="ij")
        wx, wy = np.meshgrid(widths(x), widths(y), indexing="ij")
        high = float(np.nanmax(v)) if v.size and np.isfinite(v).any() else 1.0
        data = {"x": gx.ravel(), "y": gy.ravel(), "w": wx.ravel(), "h": wy.ravel(), "value": np.nan_to_num(v).ravel()}
        self._queue({"data": data, "high": high or 1.0, "title": title})

    def _apply(self, update: dict[str, Any]) -> None:
        if self.mapper.high != update["high"]:
            self.mapper.high = update["high"]
        _set_data(self.source, update["data"])

    def _clear(self) -> None:
        _set_data(self.source, {k: [] for k in self.source.data})


class LiveImage(LiveFigure):
    """An RGBA image (e.g. a datashader rendering) placed at data bounds."""

    def __init__(self, title: str, note: str = "no data yet", xlabel: str = "x", ylabel: str = "y", size: int = 420, **kw: Any) -> None:
        super().__init__(title, note, xlabel, ylabel, width=size + 60, height=size, match_aspect=False, **kw)
        self.source = ColumnDataSource({"image": [], "x": [], "y": [], "dw": [], "dh": []})
        self.figure.image_rgba(image="image", x="x", y="y", dw="dw", dh="dh", source=self.source)

    def set(self, rgba: np.ndarray, bounds: tuple[float, float, float, float], title: str | None = None) -> None:
        """Queue an image: ``rgba`` (rows bottom to top, ``uint8`` of shape ``(h, w, 4)``) over ``(x0, y0, x1, y1)``."""
        img = np.ascontiguousarray(rgba, dtype=np.uint8).view(np.uint32).reshape(rgba.shape[:2])
        x0, y0, x1, y1 = (float(b) for b in bounds)
        self._queue({"data": {"image": [img], "x": [x0], "y": [y0], "dw": [x1 - x0], "dh": [y1 - y0]}, "title": title})

    def _apply(self, update: dict[str, Any]) -> None:
        self.source.data = update["data"]

    def _clear(self) -> None:
        if len(self.source.data["image"]):
            self.source.data = {k: [] for k in self.source.data}


class LiveMap(LiveImage):
    """A datashaded map (an RGBA image) with a bounded sample of its points drawn on top, to hover and for the legend.

    The image shows every row at a cost that does not grow with their number; the points (a few
    thousand at most, as the caller samples them) carry the values the hover tool shows and a
    ``category`` that names their colour in the legend.

    Parameters
    ----------
    hover
        ``(label, column)`` pairs the hover tool shows for a point; every update gives these columns.
    """

    def __init__(
        self, title: str, note: str = "no data yet", xlabel: str = "x", ylabel: str = "y", size: int = 420,
        hover: Sequence[tuple[str, str]] = (("key", "key"),), **kw: Any,
    ) -> None:
        super().__init__(title, note, xlabel, ylabel, size=size, **kw)
        self.hover_columns = [c for _, c in hover]
        self.points = ColumnDataSource({k: [] for k in ("x", "y", "colour", "category", *self.hover_columns)})
        self.figure.add_layout(Legend(location="top_left", click_policy="hide"), "right")
        fig_name = self.figure.name
        self.points.name = f"{fig_name}/points" if fig_name else None
        renderer = self.figure.scatter(
            "x", "y", source=self.points, color="colour", size=5, alpha=0.9, legend_field="category", name="points"
        )
        self.figure.add_tools(HoverTool(renderers=[renderer], tooltips=[(label, f"@{{{c}}}") for label, c in hover]))

    def set_map(
        self, rgba: np.ndarray, bounds: tuple[float, float, float, float], points: dict[str, Any], title: str | None = None
    ) -> None:
        """Queue an image (see :meth:`LiveImage.set`) and the points drawn over it.

        ``points`` holds equal-length columns ``x``, ``y``, ``colour``, ``category`` and the hover columns.
        """
        missing = [c for c in ("x", "y", "colour", "category", *self.hover_columns) if c not in points]
        if missing:
            raise MissingKeyError(f"LiveMap {self.figure.name!r}: the points lack the columns {missing}; got {sorted(points)}")
        super().set(rgba, bounds, title)
        with self._lock:
            assert self._pending is not None
            self._pending["points"] = {k: list(v) if isinstance(v, list) else np.asarray(v) for k, v in points.items()}

    def _apply(self, update: dict[str, Any]) -> None:
        super()._apply(update)
        if "points" in update:
            self.points.data = update["points"]

    def _clear(self) -> None:
        super()._clear()
        if len(self.points.data["x"]):
            self.points.data = {k: [] for k in self.points.data}


class LiveLogCurves(LiveCurves):
    """:class:`LiveCurves` drawn on two figures that share their sources: a linear and a log y axis.

    :meth:`set_log` chooses which figure shows (a real Bokeh log axis, not transformed data); the data
    go to the browser once, as both figures draw the same sources. Extra keywords (``x_range`` to share
    an x axis, ``sizing_mode``) go to both figures.
    """

    def __init__(self, title: str, note: str = "no data yet", xlabel: str = "step", ylabel: str = "value", **kw: Any) -> None:
        super().__init__(title, note, xlabel, ylabel, **kw)
        name = kw.pop("name", None)
        kw.setdefault("x_range", self.figure.x_range)
        self.log_figure = figure(
            title=title, width=kw.pop("width", WIDTH), height=kw.pop("height", HEIGHT), x_axis_label=xlabel,
            y_axis_label=f"{ylabel} (log)", y_axis_type="log", tools=_TOOLS, toolbar_location="above",
            name=f"{name}-log" if name else None, visible=False, **kw,
        )
        self.log_note = Label(
            x=10, y=self.note.y, x_units="screen", y_units="screen", text=LOADING, text_color="#666666",
            text_font_size="11pt",
        )
        self.log_figure.add_layout(self.log_note)
        self.log_figure.add_tools(HoverTool(tooltips=[("series", "$name"), (xlabel, "@x"), (ylabel, "@y")]))
        self._log_lines: set[str] = set()
        self._log_pane: pn.pane.Bokeh | None = None
        self._layout: pn.Column | None = None

    @property
    def log(self) -> bool:
        """Whether the log-scale figure is the one shown."""
        return bool(self.log_figure.visible)

    def set_log(self, log: bool) -> None:
        """Show the log-scale figure (``True``) or the linear one; call where the document may change."""
        self.log_figure.visible = bool(log)
        self.figure.visible = not log

    @property
    def pane(self) -> pn.Column:  # type: ignore[override]
        """Both figures in one Panel layout (only one is visible)."""
        if self._layout is None:
            self._layout = pn.Column(
                pn.pane.Bokeh(self.figure, sizing_mode="stretch_width"),
                pn.pane.Bokeh(self.log_figure, sizing_mode="stretch_width"),
                sizing_mode="stretch_width",
            )
        return self._layout

    def set_xlabel(self, label: str) -> None:
        """Name the x axis of both figures; call where the document may change."""
        for f in (self.figure, self.log_figure):
            for axis in f.xaxis:
                if axis.axis_label != label:
                    axis.axis_label = label

    def flush(self) -> bool:
        changed = super().flush()
        if changed:
            title, log_title = self.figure.title, self.log_figure.title
            if isinstance(title, Title) and isinstance(log_title, Title) and log_title.text != title.text:
                log_title.text = title.text
            if self.log_note.text != self.note.text:
                self.log_note.text = self.note.text
            if self.log_note.visible != self.note.visible:
                self.log_note.visible = self.note.visible
        return changed

    def _apply(self, update: dict[str, Any]) -> None:
        super()._apply(update)
        for i, (name, src) in enumerate(self.sources.items()):
            if name not in self._log_lines:
                self._log_lines.add(name)
                colour = _PALETTE[i % len(_PALETTE)]
                self.log_figure.line("x", "y", source=src, legend_label=name, color=colour, line_width=2, name=name)
                self.log_figure.legend.location = "top_left"
