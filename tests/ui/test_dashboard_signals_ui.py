"""A SIGTERM stops `carls-dask dashboard` while a page is open in Chromium and the run is being read."""

from __future__ import annotations

import pathlib
import signal

import pytest
from playwright.sync_api import Browser

from tests.dashboards.runfolder import snapshot_run
from tests.processes import stop_process
from tests.served_dashboard import START_DEADLINE, assert_stops, start_dashboard
from tests.ui.browser import open_page

pytestmark = [pytest.mark.ui, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A run folder with a committed bank snapshot and held-out labels."""
    return snapshot_run(tmp_path_factory.mktemp("signals") / "run")


def test_sigterm_stops_the_dashboard_while_a_page_is_open_and_reading(
    chromium: Browser, run: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    log = tmp_path / "dashboard.log"
    proc, port = start_dashboard(run, log)
    try:
        page, _errors = open_page(chromium, f"http://127.0.0.1:{port}/app")
        page.get_by_text("refreshed").first.wait_for(timeout=START_DEADLINE * 1000)
        page.wait_for_timeout(3000)  # periodic reads of the run under way
        assert_stops(proc, port, signal.SIGTERM, log)
        page.context.close()
    finally:
        stop_process(proc, group=True)
