"""The dashboard and the report of a run unlike the shipped paradigms' (:mod:`tests.recsys`): every table, every
series its loops wrote, the drift table chosen by the stated rule, and a report with a clean log."""

from __future__ import annotations

import html
import pathlib
import re
import shutil
import subprocess

import numpy as np

from carls_dask.dashboards import Dashboard
from carls_dask.dashboards.report import run_summary
from carls_dask.dashboards.runreader import default_column, default_table, vector_columns
from carls_dask.storage import open_metrics
from tests.processes import CARLS_DASK, console_env


def test_the_default_table_and_column_rule() -> None:
    f4, i8 = np.dtype("float32"), np.dtype("int64")
    tables = {"stats": {"count": (i8, ())}, "hist": {"recent": (f4, (8,))}, "items": {"embedding": (f4, (8,))}}
    assert default_table(tables) == "hist"  # the first, in creation order, with a float vector column
    assert default_table({"stats": tables["stats"]}) == "stats" and default_table({}) is None
    cols = {"scale": (f4, ()), "logits": (f4, (7,)), "pair": (f4, (2, 2)), "one": (f4, (1,)), "embedding": (f4, (8,))}
    assert vector_columns(cols) == ["logits", "embedding"] and default_column(cols) == "embedding"
    assert default_column({"logits": (f4, (7,))}) == "logits" and default_column({"n": (i8, (3,))}) is None


def test_the_dashboard_shows_every_table_and_every_series_of_a_user_paradigm(recsys_run: pathlib.Path) -> None:
    d = Dashboard(recsys_run)
    d.refresh()
    assert d.tab_names == ["Learning", "Bank health", "Embedding drift"]  # no pseudo labels, no curriculum
    assert not any(v._error.visible for v in d.views), [v._error.object for v in d.views]
    # Tables in the order the paradigm created them; drift starts on the first with a float vector column.
    assert list(d.reader.tables()) == ["items", "users", "item_stats", "hist"] and d.reader.table == "items"
    assert d.drift.shown == ("items", "embedding") and d.drift.table_select.options == ["items", "users", "hist"]
    assert d.drift._l2.points() == {"mean": 2, "p50": 2, "p90": 2, "p99": 2}  # snapshots at 10, 20, 30
    assert d.drift._l2.figure.title.text == "L2 change between snapshots (items.embedding)"
    # Bank health covers every table: 48 items, 40 users, 48 item stats, 40 histories.
    assert d.health.rows.value == 176 and d.health.snapshots.value == 3
    cells = re.findall(r'<td data-column="(table|rows)">([^<]*)</td>', d.health.tables.object)
    assert cells == [("table", "items"), ("rows", "48"), ("table", "users"), ("rows", "40"),
                     ("table", "item_stats"), ("rows", "48"), ("table", "hist"), ("rows", "40")]
    assert set(d.health._shards.source.data["part"]) == {"items", "users", "item_stats", "hist"}
    # Every series the loops wrote, the maker's own figure too.
    m = open_metrics(recsys_run / "metrics.zarr")
    own = d.learning.charts["series-neighbours.nb_planted_cos"]
    assert own.points() == {"nb_planted_cos": int(np.isfinite(m["neighbours.nb_planted_cos"].values).sum())} == {
        "nb_planted_cos": 3}
    assert {"trainer-loss", "trainer-eval", "series-trainer.steps_per_s", "series-neighbours.same_group"} <= set(
        d.learning.charts)
    assert d.learning.charts["trainer-eval"].points() == {"recall@5": 3}  # at steps 10, 20 and 30 (the end)

    # Another table on the drift tab: chosen in its selector, or named for the whole dashboard.
    d.drift.table_select.value = "hist"
    assert d.drift.shown == ("hist", "recent") and d.drift._l2.points()["mean"] == 2
    assert d.drift._l2.figure.title.text == "L2 change between snapshots (hist.recent)"
    users = Dashboard(recsys_run, table="users")
    users.refresh()
    assert users.drift.shown == ("users", "embedding")
    wrong = Dashboard(recsys_run, table="nodes")
    wrong.refresh()
    assert all("its bank has no table 'nodes'; its tables are ['items', 'users', 'item_stats', 'hist']" in v.message
               for v in wrong.views)


def test_the_report_of_a_user_paradigm_has_its_tables_and_figures_and_a_clean_log(
    recsys_run: pathlib.Path, tmp_path: pathlib.Path, artifacts_dir: pathlib.Path
) -> None:
    row = run_summary(recsys_run)
    assert list(row) == ["run", "folder", "paradigm", "variant", "seed", "steps", "recall@5", "nb_planted_cos", "rounds",
                         "state"]
    assert (row["paradigm"], row["steps"], row["rounds"], row["state"]) == ("recsys", "30", "3", "finished")
    out = tmp_path / "report.html"
    done = subprocess.run([CARLS_DASK, "report", str(recsys_run), "-o", str(out), "--table", "users"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=console_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "", done.stderr  # no warning, no traceback
    assert done.stdout.startswith(f"carls-dask report: wrote {out}")
    page = html.unescape(html.unescape(out.read_text()))  # the table is HTML text inside the page's JSON
    heads = re.findall(r"<th>([^<]*)</th>", page.split('class="carls-runs"', 1)[1].split("</thead>", 1)[0])
    assert heads == list(row) and "test accuracy" not in page
    for text in ("users.embedding", "item_stats", "nb_planted_cos", "Embedding drift", "Bank health"):
        assert text in page, text
    for absent in ("Pseudo labels", "Curriculum", "Could not update this view"):
        assert absent not in page, absent
    shutil.copy(out, artifacts_dir / "report-user-paradigm.html")


def test_table_on_the_command_lines(recsys_run: pathlib.Path) -> None:
    from carls_dask.dashboard_cli import panel_command
    from carls_dask.dashboards.dashboard import run_paths_from, table_from

    cmd = panel_command([recsys_run], "127.0.0.1", 5006, table="users")
    assert cmd[cmd.index("--args"):] == ["--args", "--table", "users", str(recsys_run)]
    argv = ["app.py", *cmd[cmd.index("--args") + 1:]]  # what the served app reads
    assert run_paths_from(argv, {}) == [recsys_run] and table_from(argv, {}) == "users"
    assert table_from(["app.py", str(recsys_run)], {"CARLS_TABLE": "hist"}) == "hist"
    assert table_from(["app.py", "--table=items", str(recsys_run)], {"CARLS_TABLE": "hist"}) == "items"
    assert table_from(["app.py", str(recsys_run)], {}) is None
    done = subprocess.run([CARLS_DASK, "dashboard", str(recsys_run), "--table", "hist", "--dry-run"], capture_output=True,
                          text=True, timeout=300, env=console_env())
    assert done.returncode == 0 and done.stdout.rstrip().endswith(f"--args --table hist {recsys_run}"), done
