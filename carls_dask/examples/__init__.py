"""Worked examples small enough to run in seconds on a CPU, used by the notebooks, the docs, the benchmarks and the
tests.

- :mod:`carls_dask.examples.digits`: a digits classifier trainer and a maker that writes its outputs to the bank.
"""

from __future__ import annotations

__all__: list[str] = []
