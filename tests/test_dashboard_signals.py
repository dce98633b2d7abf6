"""A signal to the process ``carls-dask dashboard`` started stops the whole server: port closed, nothing left."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time
import urllib.request

import pytest

from tests.dashboards.runfolder import nodes, write_snapshot, write_truth
from tests.processes import (
    CARLS_DASK,
    console_env,
    free_port,
    group_members,
    port_open,
    stop_process,
    wait_for,
    wait_until,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Seconds for the server to import Panel and answer (2 shared cores, cold imports).
START_DEADLINE = 180.0
#: Seconds the server is given to close its port and end, and everything it started with it, after the signal.
STOP_DEADLINE = 20.0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A run folder with a committed bank snapshot and held-out labels."""
    run = tmp_path_factory.mktemp("signals") / "run"
    keys, columns = nodes(300, step=10)
    write_snapshot(run / "bank", 10, keys, columns)
    write_truth(run, 300)
    return run


def _start(run: pathlib.Path, log: pathlib.Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``carls-dask dashboard RUN`` in a session of its own; returns it and its port once the port is open."""
    assert os.path.exists(CARLS_DASK), f"console script {CARLS_DASK} is missing: install the package (pip install -e .)"
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(CARLS_DASK), "dashboard", str(run), "--port", str(port), "--refresh", "0.5s"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env=console_env(DASK_CARLS__DASHBOARD__PLOT_REFRESH="1s"), cwd=log.parent,
        )
    if not wait_until(lambda: port_open(port) or proc.poll() is not None, START_DEADLINE, interval=0.2) \
            or not port_open(port):
        stop_process(proc, group=True)
        raise AssertionError(f"carls-dask dashboard did not open port {port} (status {proc.returncode}): {log.read_text()[-3000:]}")
    return proc, port


def _assert_stops(proc: subprocess.Popen[bytes], port: int, sig: signal.Signals, log: pathlib.Path) -> float:
    """Send ``sig`` to ``proc``; assert it ends, its port closes and its session empties within the deadline."""
    assert group_members(proc.pid) == [proc.pid], "the served dashboard is one process (exec, no child)"
    os.kill(proc.pid, sig)
    t0 = time.monotonic()
    try:
        code = proc.wait(timeout=STOP_DEADLINE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{sig.name}: the dashboard (pid {proc.pid}) still runs {STOP_DEADLINE} s later: {log.read_text()[-3000:]}")
    stopped_s = time.monotonic() - t0
    assert not port_open(port), f"{sig.name}: port {port} still accepts connections after the dashboard ended"
    wait_for(lambda: not group_members(proc.pid),
             lambda: f"{sig.name}: processes of the dashboard's session remain: {group_members(proc.pid)}",
             max(0.0, STOP_DEADLINE - (time.monotonic() - t0)))
    assert code in (0, -sig, 128 + sig), f"{sig.name}: unexpected exit status {code}: {log.read_text()[-3000:]}"
    return stopped_s


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_dashboard_closes_its_port_and_leaves_no_process(
    run: pathlib.Path, tmp_path: pathlib.Path, sig: signal.Signals
) -> None:
    log = tmp_path / "dashboard.log"
    proc, port = _start(run, log)
    try:
        # a page is built (app.py reads its arguments) before the signal comes
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/app", timeout=120) as resp:
            assert resp.status == 200
            assert b"carls-dask run" in resp.read()
        _assert_stops(proc, port, sig, log)
    finally:
        stop_process(proc, group=True)
