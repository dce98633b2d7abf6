"""The offline data sets the tests read: where one is not present, the test that needs it skips and says why."""

from __future__ import annotations

import pathlib

import pytest

from carls_dask.errors import StoreNotFoundError
from carls_dask.paradigms.data.planetoid import find_data_dir


def planetoid_dir() -> pathlib.Path:
    """The folder of the Planetoid files (Cora, CiteSeer); skips the calling test or fixture where they are not
    present (a clone with no ``../shared/data`` beside it and no ``carls.data.dir`` / ``$CARLS_DATA_DIR``)."""
    try:
        return find_data_dir()
    except StoreNotFoundError as exc:
        pytest.skip(f"the Planetoid files are not present: {exc}")
