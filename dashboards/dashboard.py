"""The whole dashboard of a run: the four views in tabs, refreshed on a throttled periodic callback."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable

import panel as pn
import param
from bokeh.document import Document
from panel.io.state import set_curdoc

from carls_dask.dashboards.runreader import RunReader
from carls_dask.dashboards.views import CurriculumView, DriftView, HealthView, PseudoLabelView
from carls_dask.dashboards.views.base import RunView

__all__ = ["Dashboard", "run_path_from"]

logger = logging.getLogger(__name__)

#: Environment variable naming the run folder when none is given on the command line.
RUN_ENV = "CARLS_RUN"


def run_path_from(argv: list[str], environ: dict[str, str] | None = None) -> pathlib.Path | None:
    """The run folder from ``panel serve ... --args RUN_PATH`` (``argv[1]``) or the ``CARLS_RUN`` variable."""
    env = os.environ if environ is None else environ
    if len(argv) > 1 and argv[1]:
        return pathlib.Path(argv[1])
    if env.get(RUN_ENV):
        return pathlib.Path(env[RUN_ENV])
    return None


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


class Dashboard(pn.viewable.Viewer):
    """Every view of one run, plus a status line; usable inline in a notebook or served by ``panel serve``.

    Call :meth:`refresh` to read what is new, or :meth:`start` to refresh periodically (in a served
    app or a live notebook). Periodic refreshes read the run in worker threads and update the figures
    in place (data patches, no new plots), so the server's event loop stays free.
    """

    reader = param.ClassSelector(class_=RunReader, doc="Reader of the run folder shown.")
    period = param.Number(default=1.0, bounds=(0.1, 3600.0), doc="Seconds between refreshes of the headline figures.")
    plot_period = param.Number(
        default=10.0, bounds=(0.1, 3600.0), doc="Least seconds between redraws of the plots (they cost far more)."
    )
    last_refresh = param.Number(default=0.0, doc="Unix time the last refresh finished.", constant=False)
    refresh_seconds = param.Number(default=0.0, doc="How long the last refresh took, in seconds.")
    ticks = param.Integer(default=0, doc="Refreshes of the headline figures so far.")
    plot_refreshes = param.Integer(default=0, doc="Refreshes of the plots so far.")

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        self.health = HealthView(reader=self.reader)
        self.drift = DriftView(reader=self.reader)
        self.pseudo_labels = PseudoLabelView(reader=self.reader)
        self.curriculum = CurriculumView(reader=self.reader)
        self.views = (self.health, self.drift, self.pseudo_labels, self.curriculum)
        self.status = pn.pane.Markdown("", sizing_mode="stretch_width")
        for view in self.views:
            view.eager = False  # read in the background by start(), never while the page is built
        self._slow_task: asyncio.Future[None] | None = None
        self._fast_task: asyncio.Future[None] | None = None
        self._view_tasks: dict[int, asyncio.Future[None]] = {}
        self._slow_started = -float("inf")
        self._callback: pn.io.PeriodicCallback | None = None

    def refresh(self) -> None:
        """Read what is new in the run and update every view in place, one after the other (here, at once)."""
        t0 = time.perf_counter()
        for view in self.views:
            view.refresh()
        self._done(time.perf_counter() - t0)

    def _done(self, seconds: float) -> None:
        self.refresh_seconds = seconds
        self.last_refresh = time.time()
        self.ticks += 1
        path = self.reader.path if self.reader is not None else "(none)"
        self.status.object = (
            f"run `{path}` &nbsp; refreshed {time.strftime('%H:%M:%S', time.localtime(self.last_refresh))} "
            f"in {self.refresh_seconds * 1000:.0f} ms, every {self.period:g} s"
        )

    @staticmethod
    def _on_page(doc: Document | None, job: Callable[[], object]) -> None:
        """Run ``job`` where ``doc`` may change: on its event loop with its lock held, or at once without a page."""
        if doc is not None and doc.session_context is not None:

            def run() -> None:
                job()

            doc.add_next_tick_callback(run)
        else:
            job()

    async def _refresh_plots(self, doc: Document | None) -> None:
        """Read each view on its own in the plot-reader threads, then apply its queued figure updates on the page.

        A view still reading from an earlier round is left to finish (a slow drift computation does not
        hold back the other views); the round ends when the views it started are done.
        """

        def read(view: RunView) -> bool:
            with set_curdoc(doc):
                return view.read()

        loop = asyncio.get_running_loop()

        def finish(view: RunView) -> bool:
            with set_curdoc(doc):
                return view.finish()

        async def one(view: RunView) -> None:
            if await loop.run_in_executor(_plot_readers(), read, view):
                self._on_page(doc, view.flush)
            if await loop.run_in_executor(_plot_readers(), finish, view):
                self._on_page(doc, view.flush)

        started = []
        for i, view in enumerate(self.views):
            task = self._view_tasks.get(i)
            if task is None or task.done():
                self._view_tasks[i] = task = asyncio.ensure_future(one(view))
                started.append(task)
        await asyncio.gather(*started)
        self.plot_refreshes += 1

    async def _refresh_numbers(self, doc: Document | None) -> None:
        """Read the headline figures in a worker thread and show them on the page."""
        t0 = time.perf_counter()
        figures = await asyncio.to_thread(self.health.read_numbers)

        def show() -> None:
            if figures is None:
                self.health.refresh()
            else:
                self.health.show_numbers(figures)
            self._done(time.perf_counter() - t0)

        self._on_page(doc, show)

    def _tick(self) -> None:
        """The periodic callback: start the due refreshes as tasks and return at once.

        The callback itself does no work and awaits nothing, so the page's document lock is free while
        the run is read: the server goes on answering the browser, and updates land as small patches.
        The headline figures refresh on every tick; the plots at most every :attr:`plot_period`. A
        refresh (of the figures, or of one view's plots) still running when the next is due is skipped.
        """
        doc = pn.state.curdoc
        now = time.monotonic()
        if now - self._slow_started >= self.plot_period:
            self._slow_started = now
            self._slow_task = asyncio.ensure_future(self._refresh_plots(doc))
        if self._fast_task is None or self._fast_task.done():
            self._fast_task = asyncio.ensure_future(self._refresh_numbers(doc))

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

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(
            self.status,
            pn.Tabs(
                ("Bank health", self.health),
                ("Embedding drift", self.drift),
                ("Pseudo labels", self.pseudo_labels),
                ("Curriculum", self.curriculum),
                dynamic=True,  # only the visible tab is rendered in the browser
            ),
            sizing_mode="stretch_width",
        )
