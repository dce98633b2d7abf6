"""Shared fixtures: a small real LocalCluster, GPU skipping, artifact folders."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest

ARTIFACTS = pathlib.Path(os.environ.get("CARLS_TEST_ARTIFACTS", pathlib.Path(__file__).parent.parent / "test-artifacts"))


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def artifacts_dir() -> pathlib.Path:
    """Folder where tests leave artifacts (screenshots, logs) for CI to keep."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[object]:
    """A real two-worker LocalCluster (processes), shared by the tests of a session."""
    from distributed import LocalCluster

    with LocalCluster(
        n_workers=2,
        threads_per_worker=2,
        processes=True,
        host="127.0.0.1",
        dashboard_address=":0",
    ) as cluster:
        yield cluster


@pytest.fixture
def client(local_cluster: object) -> Iterator[object]:
    """A client of the session's LocalCluster, talking to workers directly."""
    from distributed import Client

    with Client(local_cluster, direct_to_workers=True) as c:  # type: ignore[arg-type]
        yield c
