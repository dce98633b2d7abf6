"""Paradigm 1, semi-supervised learning: graph regularization through the bank, and pseudo labels.

- :mod:`~carls_dask.paradigms.semi_supervised.core`: the pure trainer core (:class:`SemiSupervisedConfig`,
  :class:`NodeClassifierCore`) with the ``base``, ``in-graph`` and ``bank`` variants;
- :mod:`~carls_dask.paradigms.semi_supervised.loss`, :mod:`~carls_dask.paradigms.semi_supervised.pseudo_labels`,
  :mod:`~carls_dask.paradigms.semi_supervised.neighbours`, :mod:`~carls_dask.paradigms.semi_supervised.model`: its parts;
- :mod:`~carls_dask.paradigms.semi_supervised.loops`: the bank-backed trainer and the two knowledge makers;
- :mod:`~carls_dask.paradigms.semi_supervised.run`: :func:`run_semi_supervised` and ``carls-dask run semi-supervised``;
- :mod:`~carls_dask.paradigms.semi_supervised.inline`: :func:`run_inline`, the same loops in one process in lock step.
"""

from __future__ import annotations

from carls_dask.paradigms.semi_supervised.core import NodeClassifierCore, SemiSupervisedConfig

__all__ = ["NodeClassifierCore", "SemiSupervisedConfig"]
