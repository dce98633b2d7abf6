"""The dashboards in a Jupyter notebook: resources inline (no CDN), and whether a live kernel runs the code.

A notebook opened in a browser without internet access (as on an air-gapped cluster) draws Bokeh figures
only when Bokeh's, Panel's and HoloViews' JavaScript and stylesheets are in the notebook itself, as
``panel serve`` pages carry them. :func:`inline_resources` sets that up for every figure of the notebook
(hvplot's and HoloViews' included); :class:`~carls_dask.dashboards.Dashboard` calls it when it is shown
and no extension was loaded yet.
"""

from __future__ import annotations

import sys
from typing import Any

import panel as pn

__all__ = ["in_live_kernel", "inline_resources", "load_notebook_extension"]

_HOOKED: list[bool] = []


def _inline_stylesheets(viewable: Any, root: Any) -> None:
    """A Panel preprocessing hook: the component stylesheets of a model rendered for a notebook (no served
    page) inlined instead of linked to Panel's CDN.

    Panel inlines them itself for the objects it displays; HoloViews' and hvplot's figures go through
    their own renderer, which links them. A served page (a Bokeh session) keeps its links to its own server.
    """
    if not pn.config.inline:
        return
    doc = getattr(root, "document", None)
    if doc is not None and getattr(doc, "session_context", None) is not None:
        return
    from bokeh.models.ui import UIElement
    from panel.io.notebook import patch_inline_stylesheets

    for model in root.select({"type": UIElement}):
        patch_inline_stylesheets(model)


def inline_resources() -> None:
    """Put Bokeh's, Panel's and HoloViews' JavaScript and CSS in the notebook itself, never fetched from a CDN.

    Call it in a notebook before the first figure (and before ``import hvplot.pandas``, which loads the
    HoloViews extension): a browser without internet access then draws the figures and the inline
    :class:`~carls_dask.dashboards.Dashboard`, as ``panel serve`` pages do. It sets ``panel.config.inline``
    and HoloViews' ``extension.inline`` (when HoloViews is installed), has the component stylesheets of
    every figure rendered for the notebook inlined (a Panel preprocessing hook), and loads Panel's
    notebook extension with the resources inline (which sets ``panel.config.inline``).
    """
    try:
        import holoviews as hv
    except ImportError:  # no HoloViews: Panel's extension alone
        pass
    else:
        hv.extension.inline = True
    if not _HOOKED:
        pn.viewable.Viewable._preprocessing_hooks.append(_inline_stylesheets)
        _HOOKED.append(True)
    pn.extension(inline=True)


def load_notebook_extension() -> None:
    """Load Panel's notebook extension with its resources inline (:func:`inline_resources`) unless a cell loaded
    it already."""
    from panel.config import panel_extension

    loaded = bool(panel_extension._loaded)
    if not loaded and "holoviews" in sys.modules:
        import holoviews as hv

        loaded = bool(getattr(hv.extension, "_loaded", False))
    if not loaded:
        inline_resources()


def in_live_kernel() -> bool:
    """Whether this code runs in a live IPython kernel (a notebook), where periodic callbacks run."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None
