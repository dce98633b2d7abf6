"""Paradigm 1, semi-supervised learning: graph regularization through the bank, and pseudo labels.

- :mod:`~carls_dask.paradigms.semi_supervised.core`: the pure trainer core (:class:`SemiSupervisedConfig`,
  :class:`NodeClassifierCore`) with the ``base``, ``in-graph`` and ``bank`` variants;
- :mod:`~carls_dask.paradigms.semi_supervised.loss`, :mod:`~carls_dask.paradigms.semi_supervised.pseudo_labels`,
  :mod:`~carls_dask.paradigms.semi_supervised.neighbours`, :mod:`~carls_dask.paradigms.semi_supervised.model`: its parts;
- :mod:`~carls_dask.paradigms.semi_supervised.loops`: the bank-backed trainer and the two knowledge makers;
- :mod:`~carls_dask.paradigms.semi_supervised.paradigm`: :class:`SemiSupervised`, the paradigm ``carls-dask run semi-supervised``
  (and :func:`carls_dask.runtime.run_paradigm` or :func:`carls_dask.runtime.run_inline`) runs.
"""

from __future__ import annotations

from carls_dask.paradigms.semi_supervised.core import NodeClassifierCore, SemiSupervisedConfig
from carls_dask.paradigms.semi_supervised.paradigm import SemiSupervised

__all__ = ["NodeClassifierCore", "SemiSupervised", "SemiSupervisedConfig"]
