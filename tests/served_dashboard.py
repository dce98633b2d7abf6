"""``carls-dask dashboard`` served in a session of its own: started on a free port, signalled, seen to stop.

Shared by the signal tests with and without a browser page open.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time

import pytest

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

#: Seconds for the server to import Panel and answer (2 shared cores, cold imports).
START_DEADLINE = 180.0
#: Seconds the server is given to close its port and end, and everything it started with it, after the signal.
STOP_DEADLINE = 20.0


def start_dashboard(run: pathlib.Path, log: pathlib.Path) -> tuple[subprocess.Popen[bytes], int]:
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


def assert_stops(proc: subprocess.Popen[bytes], port: int, sig: signal.Signals, log: pathlib.Path) -> float:
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
