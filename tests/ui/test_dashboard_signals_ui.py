"""A SIGTERM stops `carls-dask dashboard` while a page is open in Chromium and the run is being read."""

from __future__ import annotations

import pathlib
import signal

import pytest
from playwright.sync_api import Browser

from tests.processes import stop_process
from tests.test_dashboard_signals import START_DEADLINE, _assert_stops, _start, run  # noqa: F401 (run: a fixture)
from tests.ui.conftest import open_page

pytestmark = [pytest.mark.ui, pytest.mark.timeout(600)]


def test_sigterm_stops_the_dashboard_while_a_page_is_open_and_reading(
    chromium: Browser, run: pathlib.Path, tmp_path: pathlib.Path  # noqa: F811
) -> None:
    log = tmp_path / "dashboard.log"
    proc, port = _start(run, log)
    try:
        page, _errors = open_page(chromium, f"http://127.0.0.1:{port}/app")
        page.get_by_text("refreshed").first.wait_for(timeout=START_DEADLINE * 1000)
        page.wait_for_timeout(3000)  # periodic reads of the run under way
        _assert_stops(proc, port, signal.SIGTERM, log)
        page.context.close()
    finally:
        stop_process(proc, group=True)
