"""Data sets the paradigms train on, read from local files (never downloaded at run time).

Import loaders from their modules, e.g. :func:`carls_dask.paradigms.data.planetoid.load_planetoid`.
"""

from __future__ import annotations

__all__: list[str] = []
