"""The data a semi-supervised run reads: its graph (:mod:`carls_dask.paradigms.data.graphs` loads every one)."""

from __future__ import annotations

import os

from carls_dask.paradigms.data.graphs import graph_data_dir, load_graph
from carls_dask.paradigms.data.planetoid import PlanetoidGraph
from carls_dask.paradigms.semi_supervised.settings import SemiSupervisedSettings

__all__ = ["load_data", "resolve_data_dir"]


def resolve_data_dir(settings: SemiSupervisedSettings) -> str | None:
    """The data folder of ``settings`` as the loops get it: resolved once, on the client."""
    return graph_data_dir(settings.dataset, settings.data_dir)


def load_data(settings: SemiSupervisedSettings, data_dir: str | os.PathLike[str] | None = None) -> PlanetoidGraph:
    """The graph of ``settings``, read from ``data_dir`` (default: ``settings.data_dir``)."""
    return load_graph(settings.dataset, settings.data_dir if data_dir is None else data_dir)
