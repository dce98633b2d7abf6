"""The static HTML report of real runs, opened in a real headless Chromium with the network off."""

from __future__ import annotations

import html.parser
import itertools
import json
import pathlib
import re

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import Browser, Page

from carls_dask.cli import main
from carls_dask.storage.manifest import list_snapshots
from carls_dask.storage.snapshots import read_snapshot
from tests.ui.browser import open_page

pytestmark = [pytest.mark.ui, pytest.mark.timeout(900)]

#: Seconds for the file's scripts to draw the page (2 shared cores; a few MB of inline JavaScript).
DRAW_DEADLINE = 120.0
#: URL schemes a page opened from a file may load from: itself, inline data, and blobs its scripts make.
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")

_WALK = """() => {
  const texts = [], cells = [];
  let figures = 0, visible = 0;
  const walk = (root) => {
    for (const el of root.querySelectorAll('*')) {
      if (el.shadowRoot) walk(el.shadowRoot);
      if (el.classList.contains('bk-Figure')) {
        figures += 1;
        const r = el.getBoundingClientRect();
        if (r.width > 0 && r.height > 0) visible += 1;
      }
      if (el.tagName === 'TD' && el.dataset.column) cells.push([el.dataset.column, el.textContent.trim()]);
      if (el.children.length === 0 && el.textContent.trim() && !['STYLE', 'SCRIPT'].includes(el.tagName)) {
        texts.push(el.textContent.trim());
      }
    }
  };
  walk(document);
  return {texts, cells, figures, visible};
}"""


class _Links(html.parser.HTMLParser):
    """Every ``src`` and ``href`` attribute value of an HTML file."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.values += [v or "" for k, v in attrs if k in ("src", "href")]


def _assert_self_contained(report: pathlib.Path) -> None:
    """No attribute, stylesheet or Bokeh model of the file points at the network."""
    text = report.read_text(encoding="utf-8")
    parser = _Links()
    parser.feed(text)
    remote = [v for v in parser.values if re.match(r"\s*(https?:)?//", v, re.IGNORECASE)]
    assert not remote, f"the report links resources on the network: {remote}"
    assert not re.findall(r"url\(\s*\\?['\"]?(?:https?:)?//[^)]{0,80}", text), "a stylesheet loads from the network"
    assert not re.findall(r"@import\s+(?:url\()?\s*['\"]?(?:https?:)?//[^;]{0,80}", text), "a stylesheet imports from the network"
    assert '"name":"ImportedStyleSheet"' not in text, "a component links its stylesheet instead of holding it"


def _bank_rows(run: pathlib.Path) -> int:
    """Rows of every table of the run's bank (the figure covers them all), read from its newest snapshot (0 without
    a bank)."""
    if not (run / "bank").exists():
        return 0
    return sum(len(t["keys"]) for t in read_snapshot(run / "bank", names=["keys"]).values())


def _write(runs: list[pathlib.Path], out: pathlib.Path) -> None:
    assert main(["report", *map(str, runs), "-o", str(out)]) == 0
    assert out.is_file() and out.stat().st_size > 100_000


def _open_report(chromium: Browser, report: pathlib.Path) -> tuple[Page, list[str], list[str], dict[str, object]]:
    page, errors = open_page(chromium, report.as_uri(), offline=True)
    requests: list[str] = []
    page.on("request", lambda req: None if req.url.startswith(LOCAL_SCHEMES) else requests.append(req.url))
    page.get_by_text("bank rows").first.wait_for(timeout=DRAW_DEADLINE * 1000)
    page.wait_for_timeout(1000)  # the figures' canvases draw after the text
    return page, errors, requests, page.evaluate(_WALK)


def _shown_bank_rows(texts: list[str]) -> list[int]:
    return [int(value.replace(",", "")) for label, value in itertools.pairwise(texts) if label == "bank rows"]


def test_report_of_a_run_opens_offline_with_the_runs_figures(
    semi_runs: list[pathlib.Path], chromium: Browser, tmp_path: pathlib.Path, artifacts_dir: pathlib.Path
) -> None:
    run = semi_runs[0]
    report = tmp_path / "report.html"
    _write([run], report)
    _assert_self_contained(report)

    page, errors, requests, shown = _open_report(chromium, report)
    try:
        result = json.loads((run / "result.json").read_text())
        cells = dict(shown["cells"])  # type: ignore[arg-type]
        assert cells["run"] == run.name
        assert cells["test_acc"] == f"{result['figures']['test_acc']:.4g}"  # the run's own figures, by their names
        assert cells["best_val_acc"] == f"{result['figures']['best_val_acc']:.4g}"
        assert cells["steps"] == str(result["settings"]["steps"])

        texts: list[str] = shown["texts"]  # type: ignore[assignment]
        rows = _bank_rows(run)
        assert rows > 0
        assert _shown_bank_rows(texts) == [rows], f"the report shows bank rows {_shown_bank_rows(texts)}; the bank holds {rows}"
        snapshots = [int(v.replace(",", "")) for label, v in itertools.pairwise(texts) if label == "snapshots"]
        assert snapshots == [len(list_snapshots(run / "bank"))]
        assert shown["visible"] > 0, "no figure drawn on the first tab"
        page.screenshot(path=str(artifacts_dir / "report.png"), full_page=True)

        # every tab was saved with its figures, and switching tabs needs no server
        tabs = page.locator(".bk-tab")
        names = [tabs.nth(i).inner_text().strip() for i in range(tabs.count())]
        assert len(names) >= 4, f"tabs of the report: {names}"
        for i, name in enumerate(names):
            tabs.nth(i).click()
            page.wait_for_timeout(500)
            assert page.evaluate(_WALK)["visible"] > 0, f"tab {name!r} shows no figure"
        assert not errors, f"console errors or failed requests: {errors}"
        assert not requests, f"the report asked the network for {requests}"
    finally:
        page.context.close()


def test_report_of_a_folder_of_runs_shows_each_run(
    semi_runs: list[pathlib.Path], chromium: Browser, tmp_path: pathlib.Path, artifacts_dir: pathlib.Path
) -> None:
    folder = semi_runs[0].parent
    assert sorted(semi_runs) == sorted(p for p in folder.iterdir() if p.is_dir())
    report = tmp_path / "runs.html"
    _write([folder], report)  # a folder of runs: each run in it
    _assert_self_contained(report)

    page, errors, requests, shown = _open_report(chromium, report)
    try:
        cells: list[list[str]] = shown["cells"]  # type: ignore[assignment]
        by_run: dict[str, dict[str, str]] = {}
        current = ""
        for column, value in cells:
            if column == "run":
                current = value
            by_run.setdefault(current, {})[column] = value
        assert sorted(by_run) == sorted(p.name for p in semi_runs)
        for run in semi_runs:
            result = json.loads((run / "result.json").read_text())
            assert by_run[run.name]["test_acc"] == f"{result['figures']['test_acc']:.4g}", run.name
            assert by_run[run.name]["variant"] == result["variant"]
            assert by_run[run.name]["seed"] == str(result["seed"])

        rows = {run.name: _bank_rows(run) for run in semi_runs}
        shown_rows = _shown_bank_rows(shown["texts"])  # type: ignore[arg-type]
        assert shown_rows, "no bank rows figure in the report"
        assert set(shown_rows) <= set(rows.values()), f"the report shows bank rows {shown_rows}; the banks hold {rows}"
        assert max(shown_rows) == max(rows.values())
        assert shown["visible"] > 0
        page.screenshot(path=str(artifacts_dir / "report-runs.png"), full_page=True)
        assert not errors, f"console errors or failed requests: {errors}"
        assert not requests, f"the report asked the network for {requests}"
    finally:
        page.context.close()
