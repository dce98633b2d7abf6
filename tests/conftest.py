"""Shared fixtures: a small real LocalCluster, GPU skipping, artifact folders; a session that leaves no process."""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Iterator

import pytest

# The carls defaults enter dask.config when carls_dask is imported; imported here, before any test, so a
# test's `with dask.config.set({"carls....": ...})` entered before the first import cannot drop them on exit.
import carls_dask.config  # noqa: F401
from tests.processes import adopt_orphans, end_descendants, live_descendants

ARTIFACTS = pathlib.Path(os.environ.get("CARLS_TEST_ARTIFACTS", pathlib.Path(__file__).parent.parent / "test-artifacts"))


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


#: Seconds the processes a session started are given to end after its fixtures closed.
LEFT_PROCESS_GRACE = 5.0
_SESSION_PID = os.getpid()
_BEFORE: frozenset[int] = frozenset()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note the pytest process and what it already runs, and adopt orphans (so they stay its descendants)."""
    global _SESSION_PID, _BEFORE
    _SESSION_PID = os.getpid()
    _BEFORE = frozenset(pid for pid, _ in live_descendants())
    adopt_orphans()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a process it started outlives it (after the session fixtures closed).

    Every test and fixture must stop what it starts; a server left running holds its port and its
    files. What is still there after a short grace is named, killed, and fails the session.
    """
    if os.getpid() != _SESSION_PID:  # a forked child running pytest's hooks
        return
    left = end_descendants(LEFT_PROCESS_GRACE, exclude=_BEFORE)
    if not left:
        return
    lines = [f"  pid {pid}: {cmd[:300]}" for pid, cmd in left]
    message = (
        f"{len(left)} process(es) started by this test session still ran {LEFT_PROCESS_GRACE:g} s after it ended "
        "(now killed):\n" + "\n".join(lines)
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_sep("!", "processes left behind", red=True)
        reporter.write_line(message)
    else:
        sys.stderr.write(message + "\n")
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


#: Seconds a slurm test waits for the local Slurm while another test process's slurm test uses it.
SLURM_TURN_DEADLINE = 900.0


@pytest.fixture(autouse=True)
def one_slurm_test_at_a_time(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The slurm tests of the suite's parallel test processes take turns: the local Slurm has one node of 2 CPUs,
    and one test's jobs would leave the other's pending (or its node not idle). The turn is an exclusive lock on a
    file in the folder above the processes' temporary folders."""
    if request.node.get_closest_marker("slurm") is None:
        yield
        return
    import fcntl
    import time

    path = tmp_path_factory.getbasetemp().parent / "carls-slurm-tests.lock"
    with path.open("a") as lock:
        deadline = time.monotonic() + SLURM_TURN_DEADLINE
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the local Slurm was still used by another test process after {SLURM_TURN_DEADLINE:g} s "
                                f"(lock {path})")
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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


#: Steps between the bank snapshots (and checkpoints) of the small runs the tests read.
SMALL_RUN_SNAPSHOT_EVERY = 10


@pytest.fixture(scope="session")
def recsys_run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A finished run of the user paradigm :mod:`tests.recsys` (30 steps, snapshots at 10, 20, 30), started as a user
    starts it: ``carls-dask run tests.recsys:Recsys --inline``, by import path (nothing registers it)."""
    import dask

    from carls_dask.cli import main

    run = tmp_path_factory.mktemp("recsys") / "run"
    with dask.config.set({"carls.run.snapshot-every": SMALL_RUN_SNAPSHOT_EVERY}):
        assert main(["run", "tests.recsys:Recsys", "--inline", "--steps", "30", "--run-dir", str(run)]) == 0
    return run
