"""Server-side rendering of 2-D projections with datashader (run off the event loop), and their colours."""

from __future__ import annotations

import colorcet
import numpy as np
import pandas as pd
import xarray as xr

from carls_dask.dashboards.drift import colour_categories

__all__ = ["LABEL_SLOTS", "NONE_COLOUR", "MapColours", "Raster", "map_colours", "render_projection", "warm_up"]

#: Categories drawn in their own colour: 0 .. LABEL_SLOTS - 2, and -1 ("none"); the rest share "other".
LABEL_SLOTS = 32
_CATEGORIES = [str(i) for i in range(-1, LABEL_SLOTS - 1)] + ["other"]
#: Colour of rows with no value of what colours the map (no class, no score).
NONE_COLOUR = "#bbbbbb"
_CLASS_PALETTE = colorcet.palette["glasbey_category10"]  # hex strings
_RAMP = colorcet.palette["bmy"]  # dark blue (low) to yellow (high)

#: An RGBA image (``uint8``, shape ``(h, w, 4)``, first row at the bottom), its ``(x0, y0, x1, y1)``
#: bounds in data units, and a title.
Raster = tuple[np.ndarray, tuple[float, float, float, float], str]
#: The colour category of every row (``-1``: none), the categories' names and their colours.
MapColours = tuple[np.ndarray, list[str], list[str]]


def map_colours(proj: xr.Dataset, by: str) -> MapColours:
    """Colour every row of a projection by its variable ``by`` (a class, or a score such as difficulty).

    Classes get distinct colours; a floating-point score falls into quantile bins coloured along a
    dark-to-light ramp (see :func:`~carls_dask.dashboards.drift.colour_categories`). A projection
    without ``by`` has every row in no category.
    """
    if by not in proj:
        return np.full(proj.sizes.get("key", 0), -1, np.int64), [], []
    values = np.asarray(proj[by].values)
    codes, names = colour_categories(values)
    if values.dtype.kind == "f":
        idx = np.linspace(0, len(_RAMP) - 1, max(len(names), 1)).round().astype(int)
        colours = [_RAMP[i] for i in idx[: len(names)]]
    else:
        colours = [_CLASS_PALETTE[i % len(_CLASS_PALETTE)] for i in range(len(names))]
    return codes, names, colours


def _slots(codes: np.ndarray) -> pd.Categorical:
    """Category codes as one fixed categorical type, so datashader compiles its aggregation once per process."""
    codes = np.asarray(codes, dtype=np.int64)
    names = np.where((codes >= -1) & (codes < LABEL_SLOTS - 1), codes.astype(str), "other")
    return pd.Categorical(names, categories=_CATEGORIES)


def render_projection(
    proj: xr.Dataset, title: str, size: int = 420, by: str = "label", colours: MapColours | None = None
) -> Raster | None:
    """Rasterise a projection (``x``, ``y`` over ``key``) with datashader, coloured by its variable ``by``.

    Points are counted per pixel and per colour category and shaded with the category's colour, so
    the cost and the page size do not grow with the number of points. ``colours`` (from
    :func:`map_colours`) saves working them out again. Returns ``None`` when there are no points.
    """
    import datashader as ds  # imported here: it compiles with numba on first use, views without a map skip that
    import datashader.transfer_functions as tf

    n = proj.sizes.get("key", 0)
    if n == 0:
        return None
    codes, _, hexes = colours if colours is not None else map_colours(proj, by)
    x = proj["x"].values.astype(np.float64)
    y = proj["y"].values.astype(np.float64)
    df = pd.DataFrame({"x": x, "y": y, "cat": _slots(codes)})
    pad_x = max(float(np.ptp(x)) * 0.05, 1e-6)
    pad_y = max(float(np.ptp(y)) * 0.05, 1e-6)
    x_range = (float(x.min()) - pad_x, float(x.max()) + pad_x)
    y_range = (float(y.min()) - pad_y, float(y.max()) + pad_y)
    canvas = ds.Canvas(plot_width=size, plot_height=size, x_range=x_range, y_range=y_range)
    agg = canvas.points(df, "x", "y", ds.count_cat("cat"))
    key = {c: NONE_COLOUR for c in _CATEGORIES}
    key.update({str(i): hexes[i] for i in range(min(len(hexes), LABEL_SLOTS - 1))})
    img = tf.dynspread(tf.shade(agg, color_key=key, how="eq_hist", min_alpha=80), threshold=0.5, max_px=2)
    rgba = img.to_numpy().view(np.uint8).reshape(*img.shape, 4)
    ys = img.coords["y"].values
    if ys[0] > ys[-1]:  # first row must be the bottom one
        rgba = rgba[::-1]
    return rgba, (x_range[0], y_range[0], x_range[1], y_range[1]), f"{title} ({n} points)"


def warm_up() -> None:
    """Compile datashader's aggregation once (a few seconds), e.g. in a thread when a server starts."""
    proj = xr.Dataset({"x": ("key", [0.0, 1.0]), "y": ("key", [0.0, 1.0]), "label": ("key", [0, 1])})
    render_projection(proj, "warm-up", size=8)
