"""carls-dask: trainers, knowledge makers and a sharded knowledge bank on Dask.

Importing the package registers the ``carls`` namespace of :mod:`dask.config`.
"""

from __future__ import annotations

import logging

from carls_dask import config as config
from carls_dask.errors import CarlsError

__version__ = "0.1.0"

__all__ = ["CarlsError", "__version__", "config"]

logging.getLogger(__name__).addHandler(logging.NullHandler())
