"""Paradigm 1, semi-supervised learning: graph regularization through the bank, and pseudo labels.

- :mod:`~carls_dask.paradigms.semi_supervised.settings`: :class:`SemiSupervisedSettings`, what one run is, with
  its groups :class:`PseudoLabelSettings` (``pseudo.*``) and the graph teacher's settings (``graph_teacher.*``);
- :mod:`~carls_dask.paradigms.semi_supervised.paradigm`: :class:`SemiSupervised`, the paradigm
  ``carls-dask run semi-supervised`` (and :func:`carls_dask.runtime.run_paradigm` or
  :func:`carls_dask.runtime.run_inline`) runs;
- :mod:`~carls_dask.paradigms.semi_supervised.loops`: the bank-backed trainer and the two knowledge makers;
- :mod:`~carls_dask.paradigms.semi_supervised.models`: the MLP every variant trains;
- :mod:`~carls_dask.paradigms.semi_supervised.data`: the graph a run reads;
- :mod:`~carls_dask.paradigms.semi_supervised.tables`: the bank tables (``nodes``, ``pseudo_labels``);
- topic modules: :mod:`~carls_dask.paradigms.semi_supervised.core` (the pure trainer core,
  :class:`NodeClassifierCore`, with the ``base``, ``in-graph`` and ``bank`` variants),
  :mod:`~carls_dask.paradigms.semi_supervised.loss`, :mod:`~carls_dask.paradigms.semi_supervised.neighbours`,
  :mod:`~carls_dask.paradigms.semi_supervised.pseudo_labels` and :mod:`~carls_dask.paradigms.semi_supervised.teacher`.
"""

from __future__ import annotations

from carls_dask.paradigms.semi_supervised.core import NodeClassifierCore
from carls_dask.paradigms.semi_supervised.paradigm import SemiSupervised
from carls_dask.paradigms.semi_supervised.settings import (
    PseudoLabelSettings,
    SemiSupervisedConfig,
    SemiSupervisedSettings,
)

__all__ = ["NodeClassifierCore", "PseudoLabelSettings", "SemiSupervised", "SemiSupervisedConfig",
           "SemiSupervisedSettings"]
