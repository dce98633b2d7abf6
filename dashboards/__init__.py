"""The Panel dashboard of a run: ``panel serve dashboards/app.py`` or ``carls-dask dashboard RUN``, and inline.

:class:`Dashboard` (the whole app over one run folder) and :class:`RunReader` (what the views read) load
Panel and Bokeh on first use, so importing this package stays light. The views live in
:mod:`carls_dask.dashboards.views`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from carls_dask.errors import UnknownAttributeError

if TYPE_CHECKING:
    from carls_dask.dashboards.dashboard import Dashboard
    from carls_dask.dashboards.notebook import inline_resources
    from carls_dask.dashboards.runreader import RunReader

_WHERE = {
    "Dashboard": "carls_dask.dashboards.dashboard",
    "RunReader": "carls_dask.dashboards.runreader",
    "inline_resources": "carls_dask.dashboards.notebook",
}

__all__ = ["Dashboard", "RunReader", "inline_resources"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise UnknownAttributeError(f"module 'carls_dask.dashboards' has no attribute {name!r}")
