"""Small HoloViews builders shared by the views, and the datashader rendering of 2-D projections."""

from __future__ import annotations

from collections.abc import Sequence

import colorcet
import holoviews as hv
import holoviews.plotting.bokeh  # registers the bokeh backend, so options apply outside a notebook too
import numpy as np
import pandas as pd
import panel as pn
import xarray as xr

__all__ = ["LABEL_SLOTS", "bars", "curves", "empty", "heatmap", "pane", "render_projection", "stacked_bars", "warm_up"]



def _drop_unusable_dask_interface() -> None:
    """Stop HoloViews from probing dask.dataframe when it cannot import (it needs pyarrow, not installed).

    Otherwise every new plot logs an ImportError traceback while HoloViews looks for a data backend.
    """
    try:
        import dask.dataframe  # noqa: F401
    except ImportError:
        from holoviews.core import data as hv_data

        for name in ("dask", "dask_spatialpandas"):
            while name in hv_data.datatypes:
                hv_data.datatypes.remove(name)


_drop_unusable_dask_interface()

WIDTH = 460
HEIGHT = 260


def _opts(element: hv.Element, title: str, **extra: object) -> hv.Element:
    return element.opts(title=title, width=WIDTH, height=HEIGHT, tools=["hover"], **extra)


def empty(title: str, text: str) -> hv.Element:
    """A blank plot that says why it is blank."""
    return hv.Text(0.5, 0.5, text).opts(title=title, width=WIDTH, height=HEIGHT, xaxis=None, yaxis=None)


def curves(
    series: Sequence[tuple[str, xr.DataArray]], title: str, xlabel: str = "step", ylabel: str = ""
) -> hv.Element:
    """Overlay of named 1-D series over their single dimension."""
    items = []
    for name, arr in series:
        dim = arr.dims[0]
        x = np.asarray(arr[dim].values, dtype=np.float64)
        y = np.asarray(arr.values, dtype=np.float64)
        items.append(hv.Curve((x, y), kdims=[xlabel], vdims=[ylabel or "value"], label=name))
    if not items:
        return empty(title, "no data yet")
    return hv.Overlay(items).opts(title=title, width=WIDTH, height=HEIGHT, legend_position="top_left")


def bars(x: Sequence[object] | np.ndarray, y: Sequence[float] | np.ndarray, title: str, xlabel: str, ylabel: str) -> hv.Element:
    """A bar chart of ``y`` over categories ``x``."""
    df = pd.DataFrame({xlabel: [str(v) for v in x], ylabel: np.asarray(y, dtype=np.float64)})
    return _opts(hv.Bars(df, kdims=[xlabel], vdims=[ylabel]), title)


def stacked_bars(hist: xr.Dataset, dim: str, parts: Sequence[str], title: str, xlabel: str) -> hv.Element:
    """Bars over the bins of ``dim`` stacked by the variables ``parts`` of ``hist``."""
    frames = [
        pd.DataFrame({xlabel: np.round(hist[dim].values, 3).astype(str), "part": p, "rows": hist[p].values}) for p in parts
    ]
    df = pd.concat(frames, ignore_index=True)
    return _opts(hv.Bars(df, kdims=[xlabel, "part"], vdims=["rows"]), title, stacked=True, xrotation=45)


def heatmap(arr: xr.DataArray, title: str, xlabel: str, ylabel: str) -> hv.Element:
    """A 2-D array as a heat map (first dimension on x)."""
    xdim, ydim = arr.dims
    df = arr.to_dataframe(name="value").reset_index()
    df = df.rename(columns={xdim: xlabel, ydim: ylabel})
    df[ylabel] = np.round(df[ylabel].astype(float), 3)
    return _opts(hv.HeatMap(df, kdims=[xlabel, ylabel], vdims=["value"]), title, cmap="viridis", colorbar=True)


#: Labels drawn in their own colour; -1 ("no label") and 0 .. LABEL_SLOTS - 2, the rest share "other".
LABEL_SLOTS = 32
_CATEGORIES = [str(i) for i in range(-1, LABEL_SLOTS - 1)] + ["other"]


def _label_categories(labels: np.ndarray) -> pd.Categorical:
    """Labels as one fixed categorical type, so datashader compiles its aggregation once per process."""
    labels = np.asarray(labels, dtype=np.int64)
    names = np.where((labels >= -1) & (labels < LABEL_SLOTS - 1), labels.astype(str), "other")
    return pd.Categorical(names, categories=_CATEGORIES)


def render_projection(proj: xr.Dataset, title: str, size: int = 420) -> hv.Element:
    """Rasterise a projection (``x``, ``y``, ``label`` over ``key``) server-side with datashader.

    Points are counted per pixel and per label and shaded with one colour per label, so the cost and
    the page size do not grow with the number of points.
    """
    import datashader as ds  # imported here: it compiles with numba on first use, views without a map skip that
    import datashader.transfer_functions as tf

    n = proj.sizes.get("key", 0)
    if n == 0:
        return empty(title, "no rows to project")
    x = proj["x"].values.astype(np.float64)
    y = proj["y"].values.astype(np.float64)
    labels = np.asarray(proj["label"].values)
    df = pd.DataFrame({"x": x, "y": y, "label": _label_categories(labels)})
    pad_x = max(float(np.ptp(x)) * 0.05, 1e-6)
    pad_y = max(float(np.ptp(y)) * 0.05, 1e-6)
    x_range = (float(x.min()) - pad_x, float(x.max()) + pad_x)
    y_range = (float(y.min()) - pad_y, float(y.max()) + pad_y)
    canvas = ds.Canvas(plot_width=size, plot_height=size, x_range=x_range, y_range=y_range)
    agg = canvas.points(df, "x", "y", ds.count_cat("label"))
    palette = colorcet.palette["glasbey_category10"]  # hex strings
    key = {c: ("#bbbbbb" if c in ("-1", "other") else palette[i % len(palette)]) for i, c in enumerate(_CATEGORIES)}
    img = tf.dynspread(tf.shade(agg, color_key=key, how="eq_hist", min_alpha=80), threshold=0.5, max_px=2)
    rgba = img.to_numpy().view(np.uint8).reshape(*img.shape, 4)
    xs = img.coords["x"].values
    ys = img.coords["y"].values
    bounds = (xs[0], ys[0], xs[-1], ys[-1])
    element = hv.RGB(rgba[::-1] if ys[0] < ys[-1] else rgba, bounds=bounds, vdims=["R", "G", "B", "A"])
    present = sorted({int(v) for v in np.unique(labels)})
    legend = ", ".join(map(str, present[:12])) + (" ..." if len(present) > 12 else "")
    return element.opts(title=f"{title} ({n} points; labels {legend})", width=size + 60, height=size, xlabel="x", ylabel="y")


def warm_up() -> None:
    """Compile datashader's aggregation once (a few seconds), e.g. in a thread when a server starts."""
    proj = xr.Dataset({"x": ("key", [0.0, 1.0]), "y": ("key", [0.0, 1.0]), "label": ("key", [0, 1])})
    render_projection(proj, "warm-up", size=8)


def pane(element: hv.Element) -> pn.pane.HoloViews:
    """A HoloViews pane that does not link its axes to the other plots of the page (linking is slow)."""
    return pn.pane.HoloViews(element, linked_axes=False)
