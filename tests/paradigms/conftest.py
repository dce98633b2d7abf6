"""Fixtures shared by the paradigm tests."""

from __future__ import annotations

import pathlib

import pytest

from tests.datasets import planetoid_dir


@pytest.fixture(scope="module")
def data_dir() -> pathlib.Path:
    """The folder of the Planetoid files; the test is skipped where they are not present."""
    return planetoid_dir()
