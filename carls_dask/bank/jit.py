"""The one place the bank imports numba: the module when it is installed (it comes with the install), else ``None``.

Modules with compiled loops (:mod:`~carls_dask.bank.keyindex`, :mod:`~carls_dask.bank.segments`,
:mod:`~carls_dask.bank.gradsum`, :mod:`~carls_dask.bank.initializers`) define them only when ``numba`` is
not ``None`` and fall back to NumPy otherwise, with the same answers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["numba"]

numba: Any
try:
    import numba
except ImportError:  # pragma: no cover - numba comes with the install
    numba = None
