"""carls-dask: trainers, knowledge makers and a sharded knowledge bank on Dask.

Importing the package registers the ``carls`` namespace of :mod:`dask.config` and nothing more: the
names a notebook needs load their module on first use, so ``import carls_dask`` stays light::

    from carls_dask import KnowledgeBank, TableSpec, Column, Workbench, open_bank

Everything installs inside this package (``docs/architecture.md`` maps the layers):

- the system: :mod:`carls_dask.bank` (the sharded knowledge bank), :mod:`carls_dask.runtime` (trainers,
  makers, the Workbench, the runner), :mod:`carls_dask.nn` (PyTorch layers over the bank),
  :mod:`carls_dask.memory` (CARLS's dynamic Gaussian memory), :mod:`carls_dask.loading` (node-local
  shared loading), :mod:`carls_dask.examples`, :mod:`carls_dask.config` (the ``carls.*`` settings) and
  :mod:`carls_dask.errors` (every error class);
- :mod:`carls_dask.storage` (Zarr snapshots, delta log, metric series, xarray views);
- :mod:`carls_dask.paradigms` (semi-supervised, curriculum, multimodal and node embeddings);
- :mod:`carls_dask.dashboards` (the Panel app) and the ``carls-dask`` command (:mod:`carls_dask.cli`).
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from carls_dask import config as config
from carls_dask.errors import CarlsError, UnknownAttributeError

if TYPE_CHECKING:
    from carls_dask.bank import Column, KnowledgeBank, LookupResult, TableSpec
    from carls_dask.dashboards import Dashboard
    from carls_dask.runtime import KnowledgeMaker, Trainer, Workbench
    from carls_dask.storage import MetricWriter, open_bank, open_metrics

__version__ = "0.1.0"

#: Public name -> the module that defines it (imported on first access).
_WHERE = {
    "Column": "carls_dask.bank",
    "KnowledgeBank": "carls_dask.bank",
    "LookupResult": "carls_dask.bank",
    "TableSpec": "carls_dask.bank",
    "KnowledgeMaker": "carls_dask.runtime",
    "Trainer": "carls_dask.runtime",
    "Workbench": "carls_dask.runtime",
    "MetricWriter": "carls_dask.storage",
    "open_bank": "carls_dask.storage",
    "open_metrics": "carls_dask.storage",
    "Dashboard": "carls_dask.dashboards",
}

__all__ = [
    "CarlsError",
    "Column",
    "Dashboard",
    "KnowledgeBank",
    "KnowledgeMaker",
    "LookupResult",
    "MetricWriter",
    "TableSpec",
    "Trainer",
    "Workbench",
    "__version__",
    "config",
    "open_bank",
    "open_metrics",
]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise UnknownAttributeError(f"module 'carls_dask' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


logging.getLogger(__name__).addHandler(logging.NullHandler())
