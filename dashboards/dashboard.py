"""The whole dashboard of a run, or of several runs compared: views in tabs, refreshed on throttled periodic callbacks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import panel as pn
import param
from bokeh.document import Document
from panel.io.state import set_curdoc

from carls_dask.dashboards.notebook import in_live_kernel, load_notebook_extension
from carls_dask.dashboards.runreader import RunReader
from carls_dask.dashboards.runs import find_runs
from carls_dask.dashboards.views import (
    CompareView,
    CurriculumView,
    DriftView,
    HealthView,
    LearningView,
    PseudoLabelView,
)
from carls_dask.dashboards.views.base import RunView, on_page, served
from carls_dask.errors import ConfigError

__all__ = ["RUN_TABS", "Dashboard", "RunsArg", "run_path_from", "run_paths_from", "table_from"]

logger = logging.getLogger(__name__)

#: Environment variable naming the run folder when none is given on the command line.
RUN_ENV = "CARLS_RUN"
#: Environment variable naming the bank table shown first when ``--table`` is not given.
TABLE_ENV = "CARLS_TABLE"
#: The option of ``panel serve ... --args`` naming the bank table shown first.
TABLE_OPTION = "--table"


def _split_args(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv[1:]`` without ``--table NAME`` (or ``--table=NAME``), and that name."""
    rest: list[str] = []
    table = None
    args = iter(argv[1:])
    for a in args:
        if a == TABLE_OPTION:
            table = next(args, None)
        elif a.startswith(TABLE_OPTION + "="):
            table = a.split("=", 1)[1]
        else:
            rest.append(a)
    return rest, table or None


def run_path_from(argv: list[str], environ: dict[str, str] | None = None) -> pathlib.Path | None:
    """The run folder from ``panel serve ... --args RUN_PATH`` (``argv[1]``) or the ``CARLS_RUN`` variable."""
    env = os.environ if environ is None else environ
    rest, _ = _split_args(argv)
    if rest and rest[0]:
        return pathlib.Path(rest[0])
    if env.get(RUN_ENV):
        return pathlib.Path(env[RUN_ENV])
    return None


def run_paths_from(argv: list[str], environ: dict[str, str] | None = None) -> list[pathlib.Path]:
    """Every run path from ``panel serve ... --args [--table NAME] RUN [RUN ...]``, else the ``CARLS_RUN`` variable."""
    paths = [pathlib.Path(a) for a in _split_args(argv)[0] if a]
    if paths:
        return paths
    one = run_path_from(argv, environ)
    return [one] if one is not None else []


def table_from(argv: list[str], environ: dict[str, str] | None = None) -> str | None:
    """The bank table shown first from ``panel serve ... --args --table NAME ...``, else the ``CARLS_TABLE``
    variable; ``None`` (the default rule's table) when neither names one."""
    env = os.environ if environ is None else environ
    return _split_args(argv)[1] or env.get(TABLE_ENV) or None


#: What :class:`Dashboard` accepts as its runs: a path, a reader, or a sequence of them.
RunsArg = str | os.PathLike[str] | RunReader | Sequence[str | os.PathLike[str] | RunReader]


#: Niceness of the threads that read the run for the plots: when the machine is busy, the thread
#: serving the page (and the headline figures and widget changes) gets the CPU first.
PLOT_READER_NICENESS = 10

_PLOT_READERS: list[concurrent.futures.ThreadPoolExecutor] = []
_PLOT_READERS_LOCK = threading.Lock()


def _lower_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PLOT_READER_NICENESS)  # this thread only (Linux)
    except (AttributeError, OSError) as exc:  # not Linux, or not allowed: run at normal priority
        logger.debug("plot reader keeps its priority: %s", exc)


def _plot_readers() -> concurrent.futures.ThreadPoolExecutor:
    """The threads (shared by every page of this server) that read the run for the plots, at low priority."""
    with _PLOT_READERS_LOCK:
        if not _PLOT_READERS:
            _PLOT_READERS.append(
                concurrent.futures.ThreadPoolExecutor(
                    max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="carls-plot-read", initializer=_lower_priority
                )
            )
        return _PLOT_READERS[0]


def _readers(runs: RunsArg, table: str | None = None) -> list[RunReader]:
    """Readers of the runs named by ``runs`` (see :class:`Dashboard`); a path's reader reads bank table ``table``."""
    if isinstance(runs, RunReader):
        return [runs]
    if isinstance(runs, str | os.PathLike):
        return [RunReader(p, table=table) for p in find_runs(runs)]
    if not isinstance(runs, Sequence):
        raise ConfigError(
            f"Dashboard runs: got {type(runs).__name__} {runs!r}; expected a run folder (path or str), a RunReader, "
            "a folder of runs, or a sequence of them"
        )
    readers: list[RunReader] = []
    paths: list[str | os.PathLike[str]] = []
    for item in runs:
        if isinstance(item, RunReader):
            readers.append(item)
        elif isinstance(item, str | os.PathLike):
            paths.append(item)
        else:
            raise ConfigError(
                f"Dashboard runs: item {item!r} is a {type(item).__name__}; expected a path, a str or a RunReader"
            )
    if paths:
        readers.extend(RunReader(p, table=table) for p in find_runs(paths))
    if not readers:
        raise ConfigError("Dashboard runs: the sequence is empty; expected at least one run folder")
    return readers


#: The tabs of one run, in order: (title, attribute of the Dashboard holding the view).
RUN_TABS = (
    ("Learning", "learning"),
    ("Bank health", "health"),
    ("Embedding drift", "drift"),
    ("Pseudo labels", "pseudo_labels"),
    ("Curriculum", "curriculum"),
)
#: Tabs shown before the run was first read (the others appear once their view says it applies).
_SHOWN_UNREAD = {"Comparison", "Learning", "Bank health"}


class _RunViews:
    """The views of one run (built when the run is first chosen)."""

    def __init__(self, reader: RunReader) -> None:
        self.learning = LearningView(reader=reader)
        self.health = HealthView(reader=reader)
        self.drift = DriftView(reader=reader)
        self.pseudo_labels = PseudoLabelView(reader=reader)
        self.curriculum = CurriculumView(reader=reader)
        self.all: tuple[RunView, ...] = (self.learning, self.health, self.drift, self.pseudo_labels, self.curriculum)
        for view in self.all:
            view.eager = False  # read in the background by start(), never while the page is built
        #: Tab title to whether its view applies (``None``: not read yet).
        self.applies: dict[str, bool | None] = {title: None for title, _ in RUN_TABS}


class Dashboard(pn.viewable.Viewer):
    """Every view of a run, or a comparison of several runs, plus a status line; inline in a notebook or served.

    Parameters
    ----------
    runs
        A run folder (``str`` or path; it may not exist yet: the page waits for it), a
        :class:`RunReader`, a folder of run folders, or a sequence of these. With several runs the
        first tab compares them, and the run tabs show the run chosen in the run selector.
    **params
        Parameters below; ``reader=RunReader(path)`` instead of ``runs`` shows one run.
    table
        The bank table the views of a run given as a path show first (a :class:`RunReader` says its
        own); ``None``: the first table, in the order the bank was created with them, that has a float
        vector column (:func:`~carls_dask.dashboards.runreader.default_table`). Bank health covers every
        table, and the drift tab offers every table with a float vector column.

    Call :meth:`refresh` to read what is new, or :meth:`start` to refresh periodically (in a served
    app or a live notebook). Periodic refreshes read the runs in worker threads and update the figures
    in place (data patches, no new plots), so the server's event loop stays free. The learning curves
    and the comparison are read on every tick (:attr:`period`) while their tab shows, the other plots
    (and those two while hidden) at most every :attr:`plot_period`. A tab shows only when its view applies to the run (re-checked as it writes).
    """

    reader = param.ClassSelector(class_=RunReader, doc="Reader of the run whose tabs are shown.")
    readers = param.List(default=[], item_type=RunReader, doc="Readers of every run of the dashboard.")
    period = param.Number(default=1.0, bounds=(0.1, 3600.0), doc="Seconds between refreshes of the headline figures.")
    plot_period = param.Number(
        default=10.0, bounds=(0.1, 3600.0), doc="Least seconds between redraws of the plots (they cost far more)."
    )
    last_refresh = param.Number(default=0.0, doc="Unix time the last refresh finished.", constant=False)
    refresh_seconds = param.Number(default=0.0, doc="How long the last refresh took, in seconds.")
    ticks = param.Integer(default=0, doc="Refreshes of the headline figures so far.")
    plot_refreshes = param.Integer(default=0, doc="Refreshes of the plots so far.")

    def __init__(self, runs: RunsArg | None = None, *, table: str | None = None, **params: Any) -> None:
        if runs is not None and params.get("reader") is not None:
            raise ConfigError("Dashboard: got both runs and reader=; give one of them")
        if runs is not None:
            params["readers"] = _readers(runs, table)
        elif params.get("reader") is not None and not params.get("readers"):
            params["readers"] = [params["reader"]]
        if params.get("readers") and params.get("reader") is None:
            params["reader"] = params["readers"][0]
        super().__init__(**params)
        self.comparison: CompareView | None = CompareView(readers=list(self.readers)) if len(self.readers) > 1 else None
        labels = self.comparison.labels if self.comparison is not None else [str(r.path) for r in self.readers]
        self.run_select = pn.widgets.Select(
            label="Run shown in the tabs after Comparison", options=dict(zip(labels, range(len(labels)), strict=True)),
            value=0 if labels else None, visible=len(self.readers) > 1, width=420,
        )
        self._run_views: dict[int, _RunViews] = {}
        index = self.readers.index(self.reader) if self.reader in self.readers else 0
        self._use_run(self.reader, index)
        self.status = pn.pane.Markdown("", sizing_mode="stretch_width")
        self.tabs = pn.Tabs(dynamic=True, sizing_mode="stretch_width")  # only the visible tab is rendered in the browser
        #: Titles of the tabs shown, in order.
        self.tab_names: list[str] = []
        self._sync_tabs()
        self._slow_task: asyncio.Future[None] | None = None
        self._fast_task: asyncio.Future[None] | None = None
        self._learn_task: asyncio.Future[None] | None = None
        self._view_tasks: dict[int, asyncio.Future[None]] = {}
        self._slow_started = -float("inf")
        self._callback: pn.io.PeriodicCallback | None = None
        self.run_select.param.watch(self._on_run, "value")

    # ------------------------------------------------------------------ the run shown

    def _use_run(self, reader: RunReader | None, index: int) -> None:
        views = self._run_views.get(index)
        if views is None:
            views = self._run_views[index] = _RunViews(reader)  # type: ignore[arg-type]
            # Which views apply is known from the run's manifest and metric index (cheap), so a run that
            # has its data already gets its tabs at once: a tab added later re-renders the tab bar.
            for title, attr in RUN_TABS:
                views.applies[title] = self._check(getattr(views, attr))
        self._current = views
        self.learning = views.learning
        self.health = views.health
        self.drift = views.drift
        self.pseudo_labels = views.pseudo_labels
        self.curriculum = views.curriculum
        #: The views of the run shown, the learning view first.
        self.views: tuple[RunView, ...] = views.all

    def _on_run(self, event: param.parameterized.Event) -> None:
        index = int(event.new)
        self.reader = self.readers[index]
        self._use_run(self.reader, index)
        self._sync_tabs(force=True)
        self._slow_started = -float("inf")  # read the new run's plots on the next tick
        if self._callback is None:  # no periodic refresh: read it here
            self.refresh()

    def _tab_list(self) -> list[tuple[str, pn.viewable.Viewer]]:
        tabs: list[tuple[str, pn.viewable.Viewer]] = []
        if self.comparison is not None:
            tabs.append(("Comparison", self.comparison))
        for title, attr in RUN_TABS:
            ok = self._current.applies[title]
            if ok or (ok is None and title in _SHOWN_UNREAD):
                tabs.append((title, getattr(self, attr)))
        return tabs

    def _sync_tabs(self, force: bool = False) -> None:
        """Show the tabs whose views apply (call where the page may change); keeps the tab the user is on."""
        wanted = self._tab_list()
        names = [t for t, _ in wanted]
        if not force and names == self.tab_names:
            return
        active = self._active_tab()
        self.tabs[:] = wanted
        self.tab_names = names
        self.tabs.active = names.index(active) if active in names else 0

    def _check(self, view: RunView) -> bool:
        """Whether ``view`` applies to its run (a failing check shows the tab, whose view reports the problem)."""
        try:
            return bool(view.applies())
        except Exception as exc:
            logger.warning("%s.applies() failed: %s", type(view).__name__, exc)
            return True

    def _note_applies(self, views: _RunViews, view: RunView, ok: bool) -> bool:
        """Record whether ``view`` applies; returns whether that changed."""
        for title, attr in RUN_TABS:
            if getattr(views, attr) is view:
                changed = views.applies[title] != ok
                views.applies[title] = ok
                return changed
        return False

    # ------------------------------------------------------------------ refreshing

    def refresh(self) -> None:
        """Read what is new in the runs and update every view in place, one after the other (here, at once)."""
        t0 = time.perf_counter()
        if self.comparison is not None:
            self.comparison.refresh()
        views = self._current
        for view in views.all:
            view.refresh()
            self._note_applies(views, view, self._check(view))
        self._sync_tabs()
        self._done(time.perf_counter() - t0)
        self._push_notebook()

    def _done(self, seconds: float) -> None:
        self.refresh_seconds = seconds
        self.last_refresh = time.time()
        self.ticks += 1
        path = self.reader.path if self.reader is not None else "(none)"
        runs = f"{len(self.readers)} runs; " if len(self.readers) > 1 else ""
        damage = self.reader.damage() if self.reader is not None else []
        self.status.object = (
            f"{runs}run `{path}` &nbsp; refreshed {time.strftime('%H:%M:%S', time.localtime(self.last_refresh))} "
            f"in {self.refresh_seconds * 1000:.0f} ms, every {self.period:g} s"
            + (f" &nbsp; **finished, but {'; '.join(damage)}**" if damage else "")
        )

    def _on_page(self, doc: Document | None, job: Callable[[], object]) -> None:
        """Run ``job`` where ``doc`` may change (see :func:`~carls_dask.dashboards.views.base.on_page`).

        Without a served page (a notebook), the Bokeh changes ``job`` made are then pushed to the
        notebook's views of the dashboard (Panel sends its own widgets' changes itself, not those made
        to Bokeh models directly).
        """
        on_page(doc, job)
        if not served(doc):
            self._push_notebook()

    def _push_notebook(self) -> None:
        """Send the Bokeh changes made outside a served page to the notebook's views of the dashboard (if any)."""
        if self._panel is not None and self._panel._models:
            pn.io.push_notebook(self._panel)

    async def _read_view(self, doc: Document | None, views: _RunViews, view: RunView) -> None:
        """Read one view in the plot-reader threads, then apply its figure updates and its tab on the page."""
        loop = asyncio.get_running_loop()

        def read() -> tuple[bool, bool]:
            with set_curdoc(doc):
                return view.read(), self._check(view)

        def finish() -> bool:
            with set_curdoc(doc):
                return view.finish()

        def show() -> None:
            view.flush()
            if tab_changed and views is self._current:
                self._sync_tabs()

        new, ok = await loop.run_in_executor(_plot_readers(), read)
        tab_changed = self._note_applies(views, view, ok)
        if new or tab_changed:
            self._on_page(doc, show)
        if await loop.run_in_executor(_plot_readers(), finish):
            self._on_page(doc, view.flush)

    async def _refresh_plots(self, doc: Document | None) -> None:
        """Read each plot view on its own in the plot-reader threads, then apply its queued figure updates on the page.

        A view still reading from an earlier round is left to finish (a slow drift computation does not
        hold back the other views); the round ends when the views it started are done.
        """
        views = self._current
        started = []
        for view in views.all:
            if view is views.learning:
                continue  # read on every tick (see _refresh_learning)
            task = self._view_tasks.get(id(view))
            if task is None or task.done():
                self._view_tasks[id(view)] = task = asyncio.ensure_future(self._read_view(doc, views, view))
                started.append(task)
        await asyncio.gather(*started)
        self.plot_refreshes += 1

    def _active_tab(self) -> str | None:
        names = self.tab_names
        return names[self.tabs.active] if names and 0 <= self.tabs.active < len(names) else None

    async def _refresh_learning(self, doc: Document | None, everything: bool = True) -> None:
        """Read the learning curves and the comparison in a worker thread; stream their new points to the page.

        With ``everything`` false only the tab on show is read (reading ten runs' metric stores every
        second while another tab shows would load the machine for nothing).
        """
        active = self._active_tab()
        if everything or active == "Learning" or "Learning" not in self.tab_names:
            await self._read_view(doc, self._current, self._current.learning)
        if self.comparison is not None and (everything or active == "Comparison"):
            comparison = self.comparison

            def read() -> bool:
                with set_curdoc(doc):
                    return comparison.read()

            if await asyncio.get_running_loop().run_in_executor(_plot_readers(), read):
                self._on_page(doc, comparison.flush)

    async def _refresh_numbers(self, doc: Document | None) -> None:
        """Read the headline figures in a worker thread and show them on the page."""
        t0 = time.perf_counter()
        health = self.health
        figures = await asyncio.to_thread(health.read_numbers)

        def show() -> None:
            if figures is None:
                health.refresh()
            else:
                health.show_numbers(figures)
            self._done(time.perf_counter() - t0)

        self._on_page(doc, show)

    def _tick(self) -> None:
        """The periodic callback: start the due refreshes as tasks and return at once.

        The callback itself does no work and awaits nothing, so the page's document lock is free while
        the run is read: the server goes on answering the browser, and updates land as small patches.
        The headline figures, and the learning curves or the comparison when their tab shows, refresh
        on every tick (new metric points show within a tick of their write); the other plots (and those
        two tabs while hidden) at most every :attr:`plot_period`. A refresh
        (of the figures, of the curves, or of one view's plots) still running when the next is due is skipped.
        """
        doc = pn.state.curdoc
        now = time.monotonic()
        slow = now - self._slow_started >= self.plot_period
        if slow:
            self._slow_started = now
            self._slow_task = asyncio.ensure_future(self._refresh_plots(doc))
        if self._fast_task is None or self._fast_task.done():
            self._fast_task = asyncio.ensure_future(self._refresh_numbers(doc))
        if self._learn_task is None or self._learn_task.done():
            self._learn_task = asyncio.ensure_future(self._refresh_learning(doc, everything=slow))

    def start(self) -> pn.io.PeriodicCallback:
        """Refresh every :attr:`period` seconds from the Panel event loop, reading in worker threads.

        The plots are read at once (the page shows empty figures until then), then at most every
        :attr:`plot_period`.
        """
        if self._callback is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # no event loop running here: the periodic callback starts the reads
                pass
            else:
                self._tick()
            self._callback = pn.state.add_periodic_callback(self._tick, period=int(self.period * 1000))
        return self._callback

    def stop(self) -> None:
        """Stop the periodic refresh."""
        if self._callback is not None:
            self._callback.stop()
            self._callback = None

    # ------------------------------------------------------------------ showing

    def __panel__(self) -> pn.viewable.Viewable:
        if self._panel is None:
            self._panel = pn.Column(self.status, self.run_select, self.tabs, sizing_mode="stretch_width")
        return self._panel

    _panel: pn.viewable.Viewable | None = None

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Any:
        """Show inline in Jupyter with one call: load Panel's notebook extension if nobody did (resources
        inline), draw what the runs hold now into the output itself, then refresh live while a run goes on.

        The output carries every figure as read here, so it does not depend on anything that runs after
        the cell (a next cell that closes the cluster and keeps the kernel busy, a kernel that stops). For
        runs that have finished every tab is in the output, the hidden ones included (a tab chosen later
        needs no kernel to draw it), and nothing is read again; while one still writes, the tabs render as
        they are chosen and the live kernel refreshes the views periodically.
        """
        load_notebook_extension()
        if not self.ticks:
            self.refresh()  # what the runs hold now, in the output itself
        finished = all(r.finished() for r in self.readers)
        if finished:  # every tab in the output: a tab chosen later needs no kernel to draw it
            self.tabs.dynamic = False
        elif in_live_kernel():
            self.start()  # keeps the views current while the run writes
        return super()._repr_mimebundle_(include, exclude)
