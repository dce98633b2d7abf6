"""The whole dashboard of a run: the four views in tabs, refreshed on a throttled periodic callback."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import time
from collections.abc import Callable

import panel as pn
import param
from panel.io.state import set_curdoc

from dashboards.runreader import RunReader
from dashboards.views import CurriculumView, DriftView, HealthView, PseudoLabelView

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


class Dashboard(pn.viewable.Viewer):
    """Every view of one run, plus a status line; usable inline in a notebook or served by ``panel serve``.

    Call :meth:`refresh` to read what is new, or :meth:`start` to refresh periodically (in a served
    app or a live notebook). A refresh that is still running when the next one is due is skipped.
    """

    reader = param.ClassSelector(class_=RunReader, doc="Reader of the run folder shown.")
    period = param.Number(default=1.0, bounds=(0.1, 3600.0), doc="Seconds between refreshes of the headline figures.")
    plot_period = param.Number(
        default=10.0, bounds=(0.1, 3600.0), doc="Least seconds between redraws of the plots (they cost far more)."
    )
    last_refresh = param.Number(default=0.0, doc="Unix time the last refresh finished.", constant=False)
    refresh_seconds = param.Number(default=0.0, doc="How long the last refresh took, in seconds.")

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        self.health = HealthView(reader=self.reader)
        self.drift = DriftView(reader=self.reader)
        self.pseudo_labels = PseudoLabelView(reader=self.reader)
        self.curriculum = CurriculumView(reader=self.reader)
        self.views = (self.health, self.drift, self.pseudo_labels, self.curriculum)
        self.status = pn.pane.Markdown("", sizing_mode="stretch_width")
        self._fast_busy = False
        self._slow_busy = False
        self._slow_task: asyncio.Future[None] | None = None
        self._slow_started = -float("inf")
        self._callback: pn.io.PeriodicCallback | None = None

    def refresh(self) -> None:
        """Read what is new in the run and update every view, one after the other."""
        t0 = time.perf_counter()
        for view in self.views:
            view.refresh()
        self._done(time.perf_counter() - t0)

    def _done(self, seconds: float) -> None:
        self.refresh_seconds = seconds
        self.last_refresh = time.time()
        path = self.reader.path if self.reader is not None else "(none)"
        self.status.object = (
            f"run `{path}` &nbsp; refreshed {time.strftime('%H:%M:%S', time.localtime(self.last_refresh))} "
            f"in {self.refresh_seconds * 1000:.0f} ms, every {self.period:g} s"
        )

    async def _refresh_in_thread(self, jobs: tuple[Callable[[], None], ...], flag: str) -> None:
        """Run refresh ``jobs`` in a worker thread (the server's event loop stays free); skip if still busy."""
        if getattr(self, flag):
            return
        setattr(self, flag, True)
        doc = pn.state.curdoc  # the thread must build models for this page (local resources, not the CDN)

        def in_doc(job: Callable[[], None]) -> None:
            with set_curdoc(doc):
                job()

        try:
            for job in jobs:
                await asyncio.to_thread(in_doc, job)
        finally:
            setattr(self, flag, False)

    async def _tick(self) -> None:
        # The headline figures (bank size, newest write) must keep up even while plots are redrawn or
        # a new snapshot's drift is computed, so they refresh on their own.
        now = time.monotonic()
        if (self._slow_task is None or self._slow_task.done()) and now - self._slow_started >= self.plot_period:
            self._slow_started = now
            slow = tuple(view.refresh for view in self.views)
            self._slow_task = asyncio.ensure_future(self._refresh_in_thread(slow, "_slow_busy"))
        if self._fast_busy:
            return
        self._fast_busy = True
        t0 = time.perf_counter()
        try:
            # Read in a worker thread, show on the event loop: the page gets the change at once.
            figures = await asyncio.to_thread(self.health.read_numbers)
        finally:
            self._fast_busy = False
        if figures is None:
            self.health.refresh()
        else:
            self.health.show_numbers(figures)
        self._done(time.perf_counter() - t0)

    def start(self) -> pn.io.PeriodicCallback:
        """Refresh every :attr:`period` seconds from the Panel event loop, reading in worker threads."""
        if self._callback is None:
            # The page was just drawn from fresh reads: the first plot redraw is due a plot period later,
            # not while the browser is still laying out the page it got.
            self._slow_started = time.monotonic()
            self._callback = pn.state.add_periodic_callback(self._tick, period=int(self.period * 1000))  # type: ignore[arg-type]
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
