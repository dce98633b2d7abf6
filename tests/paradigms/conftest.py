"""Fixtures shared by the paradigm tests."""

from __future__ import annotations

import pathlib

import pytest

from carls_dask.errors import StoreNotFoundError
from carls_dask.paradigms.data.planetoid import find_data_dir


@pytest.fixture(scope="module")
def data_dir() -> pathlib.Path:
    """The folder of the Planetoid files; the test is skipped where they are not present."""
    try:
        return find_data_dir()
    except StoreNotFoundError as exc:
        pytest.skip(f"the Planetoid files are not present: {exc}")
