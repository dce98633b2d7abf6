"""Fixtures of the browser tests: headless Chromium, run folders of real paradigm runs and a run being written
(their helpers: :mod:`tests.ui.browser`, :mod:`tests.dashboards.runfolder`)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import Browser, sync_playwright

from tests.dashboards.runfolder import inline_run
from tests.processes import stop_process
from tests.ui.browser import CHROMIUM, CHROMIUM_ARGS, RUN_STEPS, start_writer


@pytest.fixture(scope="session")
def chromium() -> Iterator[Browser]:
    """One headless Chromium for the session's page tests."""
    if not pathlib.Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install the Debian package 'chromium' (system-packages.txt)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def semi_runs(tmp_path_factory: pytest.TempPathFactory) -> list[pathlib.Path]:
    """Three small real semi-supervised runs on Cora (in process, deterministic): base, bank+pseudo seeds 0 and 1."""
    root = tmp_path_factory.mktemp("semi-runs")
    return [
        inline_run(root, "semi-supervised", "bank+pseudo", 0, RUN_STEPS),
        inline_run(root, "semi-supervised", "bank+pseudo", 1, RUN_STEPS),
        inline_run(root, "semi-supervised", "base", 0, RUN_STEPS),
    ]


@pytest.fixture(scope="session")
def curriculum_run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A small real curriculum run (in process, deterministic)."""
    return inline_run(tmp_path_factory.mktemp("curriculum-run"), "curriculum", "curriculum", 0, RUN_STEPS * 2)


@pytest.fixture
def writing_run(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A run being written (see :func:`start_writer`), stopped after the test."""
    run, proc = start_writer(tmp_path)
    try:
        yield run
    finally:
        stop_process(proc)
