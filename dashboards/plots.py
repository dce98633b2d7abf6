"""Server-side rendering of 2-D projections with datashader (run off the event loop)."""

from __future__ import annotations

import colorcet
import numpy as np
import pandas as pd
import xarray as xr

__all__ = ["LABEL_SLOTS", "Raster", "render_projection", "warm_up"]

#: Labels drawn in their own colour; -1 ("no label") and 0 .. LABEL_SLOTS - 2, the rest share "other".
LABEL_SLOTS = 32
_CATEGORIES = [str(i) for i in range(-1, LABEL_SLOTS - 1)] + ["other"]

#: An RGBA image (``uint8``, shape ``(h, w, 4)``, first row at the bottom), its ``(x0, y0, x1, y1)``
#: bounds in data units, and a title.
Raster = tuple[np.ndarray, tuple[float, float, float, float], str]


def _label_categories(labels: np.ndarray) -> pd.Categorical:
    """Labels as one fixed categorical type, so datashader compiles its aggregation once per process."""
    labels = np.asarray(labels, dtype=np.int64)
    names = np.where((labels >= -1) & (labels < LABEL_SLOTS - 1), labels.astype(str), "other")
    return pd.Categorical(names, categories=_CATEGORIES)


def render_projection(proj: xr.Dataset, title: str, size: int = 420) -> Raster | None:
    """Rasterise a projection (``x``, ``y``, ``label`` over ``key``) with datashader.

    Points are counted per pixel and per label and shaded with one colour per label, so the cost and
    the page size do not grow with the number of points. Returns ``None`` when there are no points.
    """
    import datashader as ds  # imported here: it compiles with numba on first use, views without a map skip that
    import datashader.transfer_functions as tf

    n = proj.sizes.get("key", 0)
    if n == 0:
        return None
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
    ys = img.coords["y"].values
    if ys[0] > ys[-1]:  # first row must be the bottom one
        rgba = rgba[::-1]
    present = sorted({int(v) for v in np.unique(labels)})
    legend = ", ".join(map(str, present[:12])) + (" ..." if len(present) > 12 else "")
    return rgba, (x_range[0], y_range[0], x_range[1], y_range[1]), f"{title} ({n} points; labels {legend})"


def warm_up() -> None:
    """Compile datashader's aggregation once (a few seconds), e.g. in a thread when a server starts."""
    proj = xr.Dataset({"x": ("key", [0.0, 1.0]), "y": ("key", [0.0, 1.0]), "label": ("key", [0, 1])})
    render_projection(proj, "warm-up", size=8)
