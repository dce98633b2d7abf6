"""Every tab of the served dashboard of a real paradigm run, in headless Chromium: the tabs the run has, each plot drawn, full width."""

from __future__ import annotations

import pathlib

import dask
import pytest
from playwright.sync_api import Browser, Page

from tests.processes import wait_for, wait_until
from tests.ui.browser import inline_run, open_page, page_wait, serve_dashboard

pytestmark = [pytest.mark.ui, pytest.mark.timeout(1200)]

#: The views' tabs, by label, and the prefix of their figures' names (a dashboard may have more tabs, e.g. "Learning").
TABS = {"Bank health": "health-", "Embedding drift": "drift-", "Pseudo labels": "pl-", "Curriculum": "cur-"}
#: Seconds a tab is given to read the run and draw every plot (the first map compiles datashader's aggregation).
DRAW_DEADLINE = 120.0
#: Viewport width of the page, pixels.
PAGE_WIDTH = 1500

# Points held by the glyphs of every figure whose name starts with the prefix (0 while its "no data" note shows).
_FIGURE_POINTS = """(prefix) => {
  const out = {};
  for (const doc of (window.Bokeh ? Bokeh.documents : [])) {
    for (const m of doc.all_models) {
      if (!m.name || !m.name.startsWith(prefix) || !Array.isArray(m.renderers)) continue;
      let n = 0;
      for (const r of m.renderers) {
        const data = r.data_source ? r.data_source.data : null;
        if (!data) continue;
        const cols = data instanceof Map ? [...data.values()] : Object.values(data);
        if (cols.length) n += cols[0].length;
      }
      const note = (m.center || []).some((a) => typeof a.text === "string" && a.visible);
      out[m.name] = note ? 0 : n;
    }
  }
  return out;
}"""


def _snapshotting(paradigm: str, variant: str, root: pathlib.Path, steps: int, **overrides: object) -> pathlib.Path:
    """A real run that publishes a model and snapshots its bank every 20 steps, so that every plot has data."""
    with dask.config.set({"carls.run.snapshot-every": 20, "carls.runtime.publish-every": 20}):
        return inline_run(root, paradigm, variant, 0, steps, **overrides)


@pytest.fixture(scope="module")
def semi_run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Semi-supervised bank+pseudo on Cora, 60 steps: three snapshots, pseudo labels from step 40."""
    return _snapshotting("semi-supervised", "bank+pseudo", tmp_path_factory.mktemp("tabs-semi"), 60)


@pytest.fixture(scope="module")
def paced_run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Curriculum with label cleaning on the digits, 120 steps: scores before the warm-up ends, six snapshots."""
    return _snapshotting(
        "curriculum", "curriculum+clean", tmp_path_factory.mktemp("tabs-curriculum"), 120,
        dataset="digits", n_train=None, n_test=None, batch_size=64, hidden=32, publish_every=20, refresh_every=5,
        warmup=0.25, threads=1,
    )


def _tabs(page: Page) -> list[str]:
    """The labels of the views' tabs the page shows."""
    return [t for t in TABS if page.get_by_text(t, exact=True).count()]


def _wait_drawn(page: Page, prefix: str) -> dict[str, int]:
    """Wait until every figure of a tab holds data; returns the points per figure."""
    points: dict[str, int] = {}

    def drawn() -> bool:
        points.clear()
        points.update(page.evaluate(_FIGURE_POINTS, prefix))
        return bool(points) and min(points.values()) >= 1

    wait_until(drawn, DRAW_DEADLINE, interval=0.5, sleep=page_wait(page))
    return points


def _plot_widths(page: Page) -> list[float]:
    """Widths (pixels) of the plot canvases shown now."""
    widths = []
    for canvas in page.locator("canvas").all():
        box = canvas.bounding_box()
        if box is not None and canvas.is_visible() and box["height"] > 100:
            widths.append(box["width"])
    return widths


def _check_every_tab(browser: Browser, run: pathlib.Path, tmp_path: pathlib.Path, artifacts_dir: pathlib.Path,
                     expected: set[str], name: str) -> None:
    with serve_dashboard([run], tmp_path / "panel.log") as url:
        page, errors = open_page(browser, url, width=PAGE_WIDTH)
        page.get_by_text("Bank health", exact=True).first.wait_for(timeout=400_000)
        # A tab appears once its view has read the run and found what it plots (the first read of each view).
        shown = wait_for(lambda: (tabs if set(tabs := _tabs(page)) == expected else None),
                         lambda: f"tabs of the {name} run: {_tabs(page)}; expected {sorted(expected)}",
                         DRAW_DEADLINE, interval=0.5, sleep=page_wait(page))
        for tab in shown:
            page.get_by_text(tab, exact=True).first.click()
            points = _wait_drawn(page, TABS[tab])
            page.screenshot(path=str(artifacts_dir / f"dashboard-{name}-{tab.lower().replace(' ', '-')}.png"), full_page=True)
            assert points and min(points.values()) >= 1, f"{tab}: figures without data after {DRAW_DEADLINE} s: {points}"
            widths = _plot_widths(page)
            # Two plots side by side share the page: none is left at a fixed 460 pixels.
            assert widths and min(widths) > 0.4 * PAGE_WIDTH, f"{tab}: plot widths {widths} on a {PAGE_WIDTH}-pixel page"
        assert errors == [], f"browser console errors: {errors}"
        page.context.close()


def test_semi_supervised_run_shows_its_tabs_each_plot_drawn(
    chromium: Browser, semi_run: pathlib.Path, tmp_path: pathlib.Path, artifacts_dir: pathlib.Path
) -> None:
    _check_every_tab(chromium, semi_run, tmp_path, artifacts_dir, {"Bank health", "Embedding drift", "Pseudo labels"}, "semi")


def test_curriculum_run_shows_its_tabs_each_plot_drawn(
    chromium: Browser, paced_run: pathlib.Path, tmp_path: pathlib.Path, artifacts_dir: pathlib.Path
) -> None:
    _check_every_tab(chromium, paced_run, tmp_path, artifacts_dir, {"Bank health", "Pseudo labels", "Curriculum"}, "curriculum")
