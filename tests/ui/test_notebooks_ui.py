"""The notebooks as a researcher runs them: a real JupyterLab server, Run All in headless Chromium with no internet
access (every request outside the server is refused), every figure and every dashboard tab with content.

The notebooks run at the suite's sizes (``SUITE_SIZES`` of ``benchmarks/notebooks.py``, which runs them at their
committed sizes) in a kernel of this environment, and the figures each one's last cell prints are judged by that
script's checks (the learning effect each notebook shows). The browser's checks: Bokeh's and Panel's JavaScript and
stylesheets come with the notebook (no CDN), the inline ``Dashboard`` draws what its runs hold although the next
cell closes the cluster that wrote them, and no cell fails.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import nbformat
import pytest

pytest.importorskip("jupyterlab")
from playwright.sync_api import Browser, Page, Route

from benchmarks.notebooks import CHECKS, NAMES, NOTEBOOKS, SUITE_SIZES, figures, prepared
from carls_dask.dashboards.figures import LOADING
from tests.datasets import planetoid_dir
from tests.processes import free_port, stop_process, wait_for
from tests.ui.browser import page_wait

pytestmark = [pytest.mark.ui, pytest.mark.slow, pytest.mark.timeout(1800)]

#: Seconds the server is given to answer, and a notebook to run.
START_DEADLINE = 300.0
RUN_DEADLINE = 600.0
#: Seconds a dashboard tab is given to draw its figures once shown.
DRAW_DEADLINE = 120.0
#: The dashboard's tabs and the prefix of their figures' names.
TABS = {"Comparison": "compare-", "Learning": "learning-", "Bank health": "health-", "Embedding drift": "drift-",
        "Pseudo labels": "pl-", "Curriculum": "cur-"}

# Per Bokeh figure of the page (by document, then position): its name, the points its glyphs hold (0 while a
# note shows in place of data) and that note ("" for none). The notebook's own figures (hvplot) have no name.
_FIGURES = """() => {
  const out = [];
  (window.Bokeh ? Bokeh.documents : []).forEach((doc, d) => {
    for (const m of doc.all_models) {
      if (!Array.isArray(m.renderers) || !Array.isArray(m.center)) continue;
      if (m.name && m.name.endsWith("-log")) continue;
      let n = 0;
      for (const r of m.renderers) {
        const data = r.data_source ? r.data_source.data : null;
        if (!data) continue;
        const cols = data instanceof Map ? [...data.values()] : Object.values(data);
        if (cols.length) n += cols[0].length;
      }
      const note = m.center.find((a) => typeof a.text === "string" && a.visible);
      out.push([d, m.name || "", note ? 0 : n, note ? note.text : ""]);
    }
  });
  return out;
}"""

_NOTEBOOK = "() => window.jupyterapp.shell.currentWidget"
# Run All has ended: the kernel is idle and every code cell ran, or a cell failed (Run All stops there).
_FINISHED = """() => { const w = window.jupyterapp.shell.currentWidget;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  const code = w.content.widgets.filter((c) => c.model.type === 'code');
  const failed = code.some((c) => c.model.outputs.toJSON().some((o) => o.output_type === 'error'));
  return !!k && k.status === 'idle' && (failed || code.every((c) => c.model.executionCount)); }"""
_OUTPUTS = """() => window.jupyterapp.shell.currentWidget.content.widgets
  .filter((c) => c.model.type === 'code').map((c) => c.model.outputs.toJSON())"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, pathlib.Path, dict[str, dict[str, Any]]]]:
    """A JupyterLab server of this environment over a folder holding the notebooks at the suite's sizes (each with
    a last cell printing the kernel's ``sys.prefix``); yields its URL prefix (with the token), the folder and each
    notebook's parameters."""
    root = tmp_path_factory.mktemp("lab")
    work = root / "notebooks"
    work.mkdir()
    params: dict[str, dict[str, Any]] = {}
    for name in NAMES:
        nb, params[name] = prepared(NOTEBOOKS / f"{name}.ipynb", SUITE_SIZES.get(name))
        nbformat.write(nb, work / f"{name}.ipynb")
    # A notebook's cells stay attached while scrolled away (no windowing), so every output can be looked at.
    settings = root / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    notices = root / "settings" / "@jupyterlab" / "apputils-extension"  # no news or update check (no network)
    notices.mkdir(parents=True)
    (notices / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
           "JUPYTERLAB_SETTINGS_DIR": str(root / "settings"), "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
           "JUPYTER_CONFIG_DIR": str(root / "config")}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
           "--IdentityProvider.token=carls", f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = root / "lab.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        def answers() -> bool:
            assert proc.poll() is None, f"jupyter lab exited with {proc.returncode}: {log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{base}/api/status?token=carls", timeout=10) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for(answers, lambda: f"jupyter lab did not answer in {START_DEADLINE} s: {log.read_text()[-3000:]}",
                 START_DEADLINE, interval=0.5)
        yield base, work, params
    finally:
        stop_process(proc, group=True)  # the server and the kernels it started


def _open(browser: Browser, base: str, name: str) -> tuple[Page, list[str], list[str]]:
    """The notebook in JupyterLab, in a page that reaches only the server; returns it, its console errors and the
    requests it made elsewhere (refused)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    outside: list[str] = []

    def only_the_server(route: Route) -> None:
        url = route.request.url
        if url.startswith((base, base.replace("http", "ws"), "data:", "blob:")):
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    context.route("**/*", only_the_server)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    # A workspace of its own, reset: the page opens this notebook alone (not the ones opened before it).
    page.goto(f"{base}/lab/workspaces/{name}/tree/{name}.ipynb?reset&token=carls", timeout=START_DEADLINE * 1000)
    page.wait_for_function("() => { const a = window.jupyterapp, w = a && a.shell.currentWidget; "
                           "return !!(w && w.sessionContext); }", timeout=START_DEADLINE * 1000)
    page.evaluate(f"async () => {{ await ({_NOTEBOOK})().sessionContext.ready; }}")
    return page, errors, outside


def _tab_figures(page: Page, prefix: str) -> dict[str, tuple[int, str]]:
    """The dashboard figures of a tab: points and note by name."""
    return {n: (p, note) for _, n, p, note in page.evaluate(_FIGURES) if n.startswith(prefix)}


def _drawn(page: Page, prefix: str) -> bool:
    """Whether a tab's figures are drawn: some hold data, none says it is loading."""
    figures = _tab_figures(page, prefix)
    return bool(figures) and max(p for p, _ in figures.values()) >= 1 and all(
        note != LOADING for _, note in figures.values())


@pytest.mark.parametrize("name", NAMES)
def test_run_all_in_jupyterlab_offline_draws_every_figure_and_dashboard_tab(
    name: str, lab: tuple[str, pathlib.Path, dict[str, dict[str, Any]]], chromium: Browser, artifacts_dir: pathlib.Path
) -> None:
    if name == "semi_supervised":
        planetoid_dir()  # Cora; skips where it is not present
    base, work, sizes = lab
    params = sizes[name]
    page, errors, outside = _open(chromium, base, name)
    try:
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(_FINISHED, timeout=RUN_DEADLINE * 1000, polling=1000)
        outputs = page.evaluate(_OUTPUTS)
        failed = [o for cell in outputs for o in cell if o.get("output_type") == "error"]
        assert not failed, f"{name}: cells failed: {[(o['ename'], o['evalue']) for o in failed]}"

        # What the notebook computed: the learning effect it shows, at the suite's sizes, in this environment.
        result, prefix = figures(name, outputs)
        assert prefix == sys.prefix, f"{name}: the kernel ran in {prefix}, not in {sys.prefix}"
        assert result["notebook"] == name
        missed = [what for what, ok in CHECKS[name](result, params) if not ok]
        assert not missed, f"{name} at {params}: {missed}; figures {result}"
        assert any((work / "runs").iterdir())  # the run folders went to the notebook's folder

        # The notebook's own figures (hvplot): each holds data.
        own = [(d, p) for d, n, p, _ in page.evaluate(_FIGURES) if not n]
        assert own and min(p for _, p in own) >= 1, f"{name}: the notebook's figures hold {own}"

        # The dashboard: each tab it shows draws what the run has; no figure is left "loading" (a figure of what
        # the run lacks, say held-out truth, says so).
        shown = [t for t in TABS if page.get_by_text(t, exact=True).count()]
        assert "Bank health" in shown and "Learning" in shown, f"{name}: dashboard tabs {shown}"
        for tab in shown:
            def drawn(tab: str = tab) -> bool:
                if _drawn(page, TABS[tab]):
                    return True
                if not _tab_figures(page, TABS[tab]):  # not rendered yet: the kernel renders a tab when it is chosen
                    page.get_by_text(tab, exact=True).first.click()
                return False

            try:
                wait_for(drawn, lambda tab=tab: f"{name}, tab {tab}: {_tab_figures(page, TABS[tab])}; console errors {errors}",
                         DRAW_DEADLINE, interval=1.0, sleep=page_wait(page))
            finally:
                page.screenshot(path=str(artifacts_dir / f"jupyterlab-{name}-{tab.lower().replace(' ', '-')}.png"))
        assert outside == [], f"{name}: the page asked for {sorted(set(outside))}"
        assert errors == [], f"{name}: browser console errors: {errors}"
    finally:
        try:
            page.evaluate(f"async () => {{ await ({_NOTEBOOK})().sessionContext.shutdown(); }}")  # its kernel ends here
        finally:
            page.context.close()
        shutil.rmtree(work / "runs", ignore_errors=True)
