"""The Learning and Comparison tabs of the served dashboard in a real headless Chromium."""

from __future__ import annotations

import json
import os
import pathlib
import re
import time

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import Browser, Page

from tests.processes import wait_for, wait_until
from tests.ui.browser import (
    POINTS_JS,
    START_DEADLINE,
    open_page,
    page_texts,
    page_wait,
    serve_dashboard,
    wait_text,
)

pytestmark = [pytest.mark.ui, pytest.mark.timeout(1200)]

#: Seconds a served page is given to read and draw its first round of plots before live updates are timed.
PAGE_SETTLE_S = 8
#: The most seconds from a metric row's write to its point on the page.
MAX_DELAY_S = 2.0

_VISIBLE = """(name) => {
  for (const doc of (window.Bokeh ? Bokeh.documents : [])) {
    const m = doc.get_model_by_name(name);
    if (m) return m.visible;
  }
  return null;
}"""

_Y_SCALE = """(name) => {
  for (const doc of (window.Bokeh ? Bokeh.documents : [])) {
    const m = doc.get_model_by_name(name);
    if (m) return m.y_scale.type;
  }
  return null;
}"""

def _wait_points(page: Page, name: str, least: int, timeout: float) -> int:
    """The points of figure ``name`` once it has ``least`` (or as many as it has after ``timeout`` seconds)."""
    seen = [0]

    def enough() -> bool:
        seen[0] = int(page.evaluate(POINTS_JS, name))
        return seen[0] >= least

    wait_until(enough, timeout, interval=0.05, sleep=page_wait(page))
    return seen[0]


def test_learning_tab_shows_curves_that_grow_within_2s_of_each_write(
    chromium: Browser, writing_run: pathlib.Path, tmp_path: pathlib.Path, artifacts_dir: pathlib.Path
) -> None:
    with serve_dashboard([writing_run], tmp_path / "panel.log") as url:
        page, errors = open_page(chromium, url)
        wait_text(page, r"refreshed \d\d:\d\d:\d\d", START_DEADLINE)
        assert _wait_points(page, "learning-trainer-loss/loss", 1, 60) >= 1, "no loss curve on the page after 60 s"
        for name in ("learning-trainer-eval/val_acc", "learning-maker-staleness_s/labeller"):
            assert _wait_points(page, name, 1, 30) >= 1, f"no points in {name} after 30 s"
        time.sleep(PAGE_SETTLE_S)

        # The writer appends one metric row per write (steps 20, 30, ...) and then notes its step.
        progress = writing_run / "writer.progress"
        delays: list[float] = []
        last = None

        def timed_write() -> bool:
            """Time the next write the run makes until the page shows it; true once four were timed."""
            nonlocal last
            step = int(progress.read_text().split()[0])
            if step != last:
                written = progress.stat().st_mtime
                rows = (step - 10) // 10
                shown = _wait_points(page, "learning-trainer-loss/loss", rows, 10)
                assert shown >= rows, f"the page shows {shown} loss points 10 s after the run wrote its row {rows}"
                delays.append(time.time() - written)
                last = step
            return len(delays) >= 4

        wait_until(timed_write, 90, interval=0.02)
        (artifacts_dir / "dashboard-learning-delays.json").write_text(
            json.dumps({"metric_write_to_page_s": delays, "load_average": os.getloadavg()}, indent=1)
        )
        assert len(delays) == 4, f"saw only {len(delays)} metric writes on the page in 90 s"
        assert max(delays) <= MAX_DELAY_S, f"new metric points reached the page after {[round(d, 2) for d in delays]} s"
        page.screenshot(path=str(artifacts_dir / "dashboard-learning.png"), full_page=True)
        assert page_texts(page).count("Learning") >= 1 and page.locator("canvas").count() >= 3

        # The log-scale toggle swaps in the figures with a log y axis (same lines, same x range).
        assert page.evaluate(_VISIBLE, "learning-trainer-loss-log") is False
        page.locator("input[type=checkbox]").first.click()  # the only checkbox of the tab: "log y"
        wait_for(lambda: page.evaluate(_VISIBLE, "learning-trainer-loss-log") is True, "the log-scale figure shown", 10,
                 sleep=page_wait(page))
        assert page.evaluate(_VISIBLE, "learning-trainer-loss") is False
        assert page.evaluate(_Y_SCALE, "learning-trainer-loss-log") == "LogScale"
        assert errors == [], f"browser console errors: {errors}"
        page.close()


def test_comparison_of_three_runs_shows_a_curve_per_run_and_mean_std_per_variant(
    chromium: Browser, semi_runs: list[pathlib.Path], tmp_path: pathlib.Path, artifacts_dir: pathlib.Path
) -> None:
    labels = ["bank+pseudo seed 0", "bank+pseudo seed 1", "base seed 0"]
    with serve_dashboard(semi_runs, tmp_path / "panel.log") as url:
        page, errors = open_page(chromium, url)
        wait_text(page, r"refreshed \d\d:\d\d:\d\d", START_DEADLINE)
        wait_text(page, r"Final figures: mean ± std", 60)
        for figure in ("compare-0", "compare-1"):  # test accuracy and loss
            for label in labels:
                assert _wait_points(page, f"{figure}/{label}", 2, 60) >= 2, f"no curve of {label} in {figure}"
        wait_text(page, r"^\d\.\d+ ± \d", 30)
        texts = page_texts(page)
        assert "bank+pseudo" in texts and "base" in texts, texts[:80]
        assert any(re.fullmatch(r"0\.\d+ ± 0\.\d+", t) for t in texts), "no mean ± std cell in the table"
        page.screenshot(path=str(artifacts_dir / "dashboard-comparison.png"), full_page=True)
        assert errors == [], f"browser console errors: {errors}"
        page.close()
