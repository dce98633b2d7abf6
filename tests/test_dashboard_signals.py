"""A signal to the process ``carls-dask dashboard`` started stops the whole server: port closed, nothing left."""

from __future__ import annotations

import pathlib
import signal
import urllib.request

import pytest

from tests.dashboards.runfolder import snapshot_run
from tests.processes import stop_process
from tests.served_dashboard import assert_stops, start_dashboard


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A run folder with a committed bank snapshot and held-out labels."""
    return snapshot_run(tmp_path_factory.mktemp("signals") / "run")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_dashboard_closes_its_port_and_leaves_no_process(
    run: pathlib.Path, tmp_path: pathlib.Path, sig: signal.Signals
) -> None:
    log = tmp_path / "dashboard.log"
    proc, port = start_dashboard(run, log)
    try:
        # a page is built (app.py reads its arguments) before the signal comes
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/app", timeout=120) as resp:
            assert resp.status == 200
            assert b"carls-dask run" in resp.read()
        assert_stops(proc, port, sig, log)
    finally:
        stop_process(proc, group=True)
