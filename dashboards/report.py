"""A static report of runs: the dashboard's figures in one self-contained HTML file (no server, works offline).

:func:`write_report` builds the dashboard of the runs, reads every view at once (in this thread), and
saves every tab with Panel's ``save`` and Bokeh's inline resources: all JavaScript and CSS are in the
file, which names no CDN or web font, so it opens from a shared file system or a mail attachment with
no network. Bokeh's own tools (pan, zoom, hover) and the tabs work in the file. Widgets that ask the
server for a new figure (the drift view's snapshot slider, the pseudo-label threshold) are not embedded
(each position would be another copy of the figures): they show the value read, disabled.
"""

from __future__ import annotations

import html
import logging
import os
import pathlib
import time
from collections.abc import Sequence

import panel as pn
from bokeh.document import Document
from bokeh.models import ImportedStyleSheet
from bokeh.models.ui import UIElement
from bokeh.resources import INLINE
from panel.io.model import add_to_doc
from panel.io.notebook import patch_inline_stylesheets
from pyviz_comms import Comm

from carls_dask import __version__
from carls_dask.dashboards.dashboard import Dashboard
from carls_dask.dashboards.runreader import RunReader
from carls_dask.dashboards.runs import find_runs
from carls_dask.dashboards.views.compare import CompareView
from carls_dask.errors import ConfigError, ReportError, StoreError
from carls_dask.storage.runcheck import run_damage
from carls_dask.storage.runfolder import REPORT, RESULT, RunFolder

__all__ = ["check_report_paths", "make_dashboards", "run_summary", "write_report"]

logger = logging.getLogger(__name__)

#: Page icons: none fetched (Panel's page template links its CDN's icons unless told otherwise).
NO_ICON_LINKS = {"app_favicon": "data:,", "apple_icon": ""}


def check_report_paths(runs: Sequence[pathlib.Path], out: pathlib.Path) -> None:
    """Check that every run folder exists and that ``out`` can be written as a file.

    Raises
    ------
    ConfigError
        If no run is given, a run folder is missing or not a folder, ``out`` is a folder, or the
        folder ``out`` goes in does not exist.
    """
    if not runs:
        raise ConfigError("report: no run folder given; expected at least one RUN")
    for run in runs:
        if not run.exists():
            raise ConfigError(f"report: run folder {run} does not exist; expected a folder written by `carls-dask run`")
        if not run.is_dir():
            raise ConfigError(f"report: run folder {run} is a file; expected a folder written by `carls-dask run`")
    if out.is_dir():
        raise ConfigError(f"report: output {out} is a folder; expected the path of an HTML file to write, e.g. {out / REPORT}")
    if not out.parent.is_dir():
        raise ConfigError(f"report: the folder of output {out} ({out.parent}) does not exist; create it first")


def make_dashboards(runs: Sequence[pathlib.Path], table: str | None = None) -> list[tuple[str, Dashboard | CompareView]]:
    """The parts of the report, each with its heading: the comparison of the runs (when there are several), then each run's dashboard.

    A file has no server to switch the run a dashboard shows, so each run gets its own tabs. ``table``
    is the bank table each run's views show first (``None``: the default rule's, see
    :func:`~carls_dask.dashboards.runreader.default_table`).
    """
    parts: list[tuple[str, Dashboard | CompareView]] = []
    if len(runs) > 1:
        parts.append((f"Comparison of {len(runs)} runs", CompareView(readers=[RunReader(r) for r in runs])))
    parts.extend((run.name if len(runs) > 1 else "", Dashboard(run, table=table)) for run in runs)
    return parts


def _shown(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def run_summary(run: pathlib.Path) -> dict[str, str]:
    """One row of the table of runs: the run's name, what it ran, and its own figures (named as it names them).

    The figures are those of its ``result.json`` (every number but the settings it repeats, see
    :func:`~carls_dask.dashboards.learning.final_figures`); while it runs, the last value of each
    trainer's loss and evaluation series. A finished run that lacks a part (see
    :func:`~carls_dask.storage.runcheck.run_damage`) says which.
    """
    from carls_dask.dashboards.learning import final_figures, run_info

    row = {"run": run.name, "folder": str(run)}
    try:
        result = RunFolder(run).read_json(RESULT)
    except StoreError as exc:
        return {**row, "state": f"unreadable {RESULT}: {exc}"}
    info = run_info(run)
    if result is None:
        figures = final_figures(info, RunReader(run).metrics())
        row.update(paradigm=info.paradigm, variant=info.variant, seed="" if info.seed is None else str(info.seed))
        row.update({k: _shown(v) for k, v in figures.items()})
        return {**row, "state": f"no {RESULT} (running, stopped or failed)"}
    row.update(
        paradigm=str(result.get("paradigm", "")),
        variant=str(result.get("variant", "")),
        seed=str(result.get("seed", "")),
        steps=str(result.get("settings", {}).get("steps", "")),
    )
    row.update({k: _shown(v) for k, v in final_figures(info).items()})
    damage = run_damage(run)
    return {**row, "state": f"finished, but {'; '.join(damage)}" if damage else "finished"}


def _runs_table(rows: list[dict[str, str]]) -> pn.pane.HTML:
    columns = list(dict.fromkeys(k for row in rows for k in row))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f'<td data-column="{html.escape(c)}">{html.escape(row.get(c, ""))}</td>' for c in columns) + "</tr>"
        for row in rows
    )
    return pn.pane.HTML(
        f'<table class="carls-runs"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>',
        stylesheets=["table.carls-runs {border-collapse: collapse} .carls-runs td, .carls-runs th "
                     "{border: 1px solid #ccc; padding: 2px 8px; text-align: left; font-size: 10pt}"],
        sizing_mode="stretch_width",
    )


def _static(dash: Dashboard | CompareView) -> pn.viewable.Viewable:
    """``dash``'s layout made for a file: every tab rendered, no live status line, server-bound widgets disabled."""
    layout = dash.__panel__()
    for tabs in layout.select(pn.Tabs):
        assert isinstance(tabs, pn.Tabs)
        tabs.dynamic = False  # a file has no server to render a tab when it is opened
    status = getattr(dash, "status", None)
    if status is not None:
        status.visible = False  # "refreshed ... every 1 s" is not true of a file
    for widget in layout.select(pn.widgets.Widget):
        assert isinstance(widget, pn.widgets.Widget)
        widget.disabled = True
    return layout


def _inline_document(page: pn.viewable.Viewable) -> Document:
    """A Bokeh document of ``page`` whose component stylesheets are in it, not links to Panel's CDN.

    Panel gives its components stylesheets by URL (``alerts.css``, ``markdown.css``, its theme); a file
    opened with no network needs their text. Those Panel ships are inlined as a notebook's inline mode
    does; any other linked stylesheet is an error (a file with no server or network could not load it).

    Raises
    ------
    RuntimeError
        If a component still links a stylesheet.
    """
    doc = Document()
    root = page.get_root(doc, Comm())
    add_to_doc(root, doc, True)
    with doc.models.freeze():  # one recount of the document's models, not one per stylesheet replaced
        for model in root.select({"type": UIElement}):
            patch_inline_stylesheets(model)
    linked = sorted({str(s.url) for s in doc.select({"type": ImportedStyleSheet}) if isinstance(s, ImportedStyleSheet)})
    if linked:
        raise ReportError(f"report: components link stylesheets {linked}; expected every stylesheet inlined")
    return doc


def write_report(
    runs: pathlib.Path | Sequence[pathlib.Path], out: str | os.PathLike[str], *, title: str | None = None,
    table: str | None = None,
) -> pathlib.Path:
    """Write the dashboard of ``runs`` (run folders, or folders of runs) as one self-contained HTML file.

    Parameters
    ----------
    runs
        Run folders written by ``carls-dask run`` (finished or not), or folders holding such runs.
    out
        HTML file to write (replaced if it exists); its folder must exist.
    title
        Title of the page; default: ``carls-dask report: `` and the runs' names.
    table
        The bank table each run's views show first (``None``: the default rule's; the drift tab's selector
        is fixed in a file, so this is the table its figures show).

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    ConfigError
        If a run folder or the output's folder is missing, or ``out`` is a folder.
    """
    paths = find_runs(runs)
    out = pathlib.Path(out)
    check_report_paths(paths, out)
    if title is None:
        names = ", ".join(p.name for p in paths) if len(paths) <= 3 else f"{len(paths)} runs in {paths[0].parent}"
        title = f"carls-dask report: {names}"
    t0 = time.perf_counter()
    sections: list[pn.viewable.Viewable] = []
    for heading, dash in make_dashboards(paths, table):
        dash.refresh()  # every view: read, draw, and finish (e.g. rasterise the drift map) here and now
        if heading:
            sections.append(pn.pane.Markdown(f"## {heading}"))
        sections.append(_static(dash))
    read_s = time.perf_counter() - t0
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    page = pn.Column(
        f"# {title}",
        pn.pane.Markdown(
            f"Static report written {stamp} by carls-dask {__version__}: the runs as they were then. "
            "Pan, zoom, hover and tabs work offline; sliders are fixed at the values shown "
            "(serve `carls-dask dashboard` to move them)."
        ),
        _runs_table([run_summary(p) for p in paths]),
        *sections,
        sizing_mode="stretch_width",
    )
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            pn.io.save.save(_inline_document(page), f, title=title, resources=INLINE, template_variables=NO_ICON_LINKS)
        tmp.replace(out)  # a reader never sees half a report
    finally:
        tmp.unlink(missing_ok=True)
    logger.info("report of %d run(s) written to %s in %.1f s (reading %.1f s)", len(paths), out, time.perf_counter() - t0, read_s)
    return out
