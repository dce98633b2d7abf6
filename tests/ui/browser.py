"""What the browser tests share besides their fixtures: Chromium's settings, opening a page and reading it,
a served dashboard and a run being written (small real runs: :func:`tests.dashboards.runfolder.inline_run`)."""

from __future__ import annotations

import contextlib
import pathlib
import re
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator, Sequence

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import Browser, ConsoleMessage, Page

from tests.processes import CARLS_DASK, console_env, free_port, stop_process, wait_for, wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
#: Seconds for a server to answer and a page to draw (2 shared cores, cold imports).
START_DEADLINE = 400.0
#: Steps of the small real runs the page tests look at.
RUN_STEPS = 40


def open_page(browser: Browser, url: str, *, offline: bool = False, width: int = 1500) -> tuple[Page, list[str]]:
    """Open ``url`` in a new page; returns the page and a list that collects its console errors and failed requests."""
    context = browser.new_context(viewport={"width": width, "height": 1100}, offline=offline)
    page = context.new_page()
    errors: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            errors.append(msg.text)

    page.on("console", on_console)
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url}"))
    page.goto(url, timeout=START_DEADLINE * 1000)
    return page, errors


#: Points of a line in the page: the ColumnDataSource named FIGURE/LINE in its Bokeh documents (-1 when absent).
POINTS_JS = """(name) => {
  for (const doc of (window.Bokeh ? Bokeh.documents : [])) {
    const m = doc.get_model_by_name(name);
    if (m) return m.data.x.length;
  }
  return -1;
}"""

_ALL_TEXT = """() => {
  const out = [];
  const walk = (root) => {
    for (const el of root.querySelectorAll('*')) {
      if (el.shadowRoot) walk(el.shadowRoot);
      if (el.children.length === 0 && el.textContent.trim()) out.push(el.textContent.trim());
    }
  };
  walk(document);
  return out;
}"""


def page_texts(page: Page) -> list[str]:
    """Text of every leaf element, through the shadow roots Panel renders into."""
    return list(page.evaluate(_ALL_TEXT))


def page_wait(page: Page) -> Callable[[float], None]:
    """A ``sleep`` for :func:`~tests.processes.wait_for` that lets the page run while the test waits (seconds)."""
    return lambda seconds: page.wait_for_timeout(seconds * 1000)


def wait_text(page: Page, pattern: str, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for text matching ``pattern``; the failure lists what the page shows."""
    try:
        page.get_by_text(re.compile(pattern)).first.wait_for(timeout=timeout * 1000)
    except Exception as exc:
        shown = [s for s in page_texts(page) if len(s) < 200][:80]
        raise AssertionError(f"{pattern!r} not on the page after {timeout} s; the page shows {shown}") from exc


@contextlib.contextmanager
def serve_dashboard(runs: Sequence[pathlib.Path], log: pathlib.Path, **env_overrides: str) -> Iterator[str]:
    """Serve the dashboard of ``runs`` as a user does: the installed ``carls-dask dashboard`` command, from a folder
    outside the checkout, without PYTHONPATH; yields the page's URL, stops the server after."""
    port = free_port()
    env = console_env(DASK_CARLS__DASHBOARD__REFRESH="0.5s", **env_overrides)
    cmd = [CARLS_DASK, "dashboard", *[str(r) for r in runs], "--address", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}/app"
    try:

        def answers() -> bool:
            assert proc.poll() is None, f"carls-dask dashboard exited with {proc.returncode}: {log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(url, timeout=60) as answer:
                    return bool(answer.status == 200)
            except OSError:
                return False

        wait_for(answers, lambda: f"carls-dask dashboard did not answer in {START_DEADLINE} s: {log.read_text()[-3000:]}",
                 START_DEADLINE, interval=0.5)
        yield url
    finally:
        stop_process(proc, group=True)  # the server and anything it started


def start_writer(tmp_path: pathlib.Path, *args: str) -> tuple[pathlib.Path, subprocess.Popen[bytes]]:
    """Start ``python -m tests.dashboards.runfolder`` writing ``tmp_path/run`` (a metric row and a bank delta
    every 0.7 s, snapshots now and then; ``args`` go to it); returns the run folder and the process once it wrote."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.dashboards.runfolder", str(run), "--period", "0.7", *args],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(tmp_path / "writer.log").open("wb"),
    )
    progress = run / "writer.progress"
    if not wait_until(lambda: progress.exists() or proc.poll() is not None, 120, interval=0.2) or not progress.exists():
        stop_process(proc)
        raise AssertionError(f"the run writer wrote nothing (status {proc.returncode}): {(tmp_path / 'writer.log').read_text()[-3000:]}")
    return run, proc
