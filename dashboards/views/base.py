"""The common shell of every view: a reader, a message line, a guarded read and an in-place flush."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable

import numpy as np
import panel as pn
import param
import xarray as xr
from panel.io.state import set_curdoc

from carls_dask.dashboards.figures import LiveFigure
from carls_dask.dashboards.runreader import RunReader
from carls_dask.errors import HookNotImplementedError

__all__ = ["LOADING_RUN", "RunView", "in_background", "on_page", "series", "served"]

logger = logging.getLogger(__name__)

#: What a view says until it has read the run once.
LOADING_RUN = "Loading the run..."


def series(name: str, arr: xr.DataArray) -> tuple[str, np.ndarray, np.ndarray]:
    """A named 1-D series as ``(name, x, y)`` for :meth:`~carls_dask.dashboards.figures.LiveCurves.set`."""
    dim = arr.dims[0]
    return name, np.asarray(arr[dim].values, dtype=np.float64), np.asarray(arr.values, dtype=np.float64)


def served(doc: object) -> bool:
    """Whether ``doc`` is the document of a page served by ``panel serve`` (not a notebook or a script)."""
    return doc is not None and getattr(doc, "session_context", None) is not None


def on_page(doc: object, job: Callable[[], object]) -> None:
    """Run ``job`` (which changes Bokeh models and Panel layouts) where the page's document may change.

    In a served page, ``job`` runs on the server's event loop with the document lock held (a next-tick
    callback), and every change it makes reaches the browser in the order it was made: the document is
    held while ``job`` runs, so Panel's layout changes (a grid that shows a new figure, a tab that
    appears) go out in Bokeh's queue with the figure updates, instead of ahead of them on Panel's own
    direct write. (Out of order, an update of a figure could reach the page before the message that
    first sent the figure, and the page refuses it: "reference ... isn't known".) Without a served page
    (a notebook or a script), ``job`` runs at once.
    """
    if not served(doc):
        job()
        return

    def run() -> None:
        t0 = time.perf_counter()
        held = doc.callbacks.hold_value  # type: ignore[attr-defined]
        if held is None:
            doc.hold("collect")  # type: ignore[attr-defined]
        try:
            job()
        finally:
            if held is None:
                doc.unhold()  # type: ignore[attr-defined]
        took = time.perf_counter() - t0
        if took > 0.1:  # the page waited for it: worth knowing when a page feels slow
            logger.debug("page update %s held the event loop %.3f s", getattr(job, "__qualname__", job), took)

    doc.add_next_tick_callback(run)  # type: ignore[attr-defined]


def in_background(work: Callable[[], object], then: Callable[[], object]) -> None:
    """Run ``work`` off the event loop, then ``then`` where the page's document may change.

    In a served page, ``work`` runs in a worker thread (building models for this page's document) and
    ``then`` as :func:`on_page` runs it; with no served page (a notebook or a script) both run at once,
    in order.
    """
    doc = pn.state.curdoc
    if not served(doc):
        work()
        then()
        return

    def run() -> None:
        try:
            with set_curdoc(doc):
                work()
        finally:
            on_page(doc, then)

    threading.Thread(target=run, name="carls-dashboard-read", daemon=True).start()


class RunView(pn.viewable.Viewer):
    """Base class of the views: holds the reader, shows a message when there is nothing to plot.

    A refresh has two halves. :meth:`read` reads the run and computes what to draw (and
    :meth:`finish` any slow remainder, such as rasterising a map); they touch no Bokeh model, so
    they may run in a worker thread. :meth:`flush` moves what :meth:`read` queued into
    the view's live figures (in place: data patches, never new figures); call it where the page's
    document may change. :meth:`refresh` does both. Subclasses implement :meth:`_update`, which reads
    through :attr:`reader` and queues figure updates, and :meth:`_layout`.
    """

    reader = param.ClassSelector(class_=RunReader, doc="Reader of the run folder this view shows.")
    message = param.String(default="", doc="Why (part of) the view is empty; shown above the plots.")
    title = param.String(default="", doc="Heading of the view.")
    eager = param.Boolean(
        default=True, doc="Read the run when first shown (a notebook); a Dashboard reads in the background instead."
    )

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        self._alert = pn.pane.Alert(LOADING_RUN, alert_type="info", visible=True, sizing_mode="stretch_width")
        self.message = LOADING_RUN
        self._error = pn.pane.Alert("", alert_type="danger", visible=False, sizing_mode="stretch_width")
        self._built = False
        self._showing_problem = False
        self._last_inputs: tuple[object, ...] | None = None
        self._read_lock = threading.Lock()  # one read at a time (periodic refresh, widget changes)
        self._panel: pn.viewable.Viewable | None = None

    def _set_message(self, text: str) -> None:
        self.message = text
        self._alert.object = text
        self._alert.visible = bool(text)

    def _set_absent(self, waiting: str, what: str = "this view") -> None:
        """Say why the view has nothing: ``waiting`` while the run may still write it, or, for a finished run
        that lacks a part, what it lacks (it will not come)."""
        damage = self.reader.damage() if self.reader is not None else []
        self._set_message(f"This run finished, but {'; '.join(damage)}: {what} cannot be shown." if damage else waiting)

    def applies(self) -> bool:
        """Whether the run has what this view shows (a dashboard shows the view's tab only then).

        Called after :meth:`read` (in the same worker thread), again as the run writes, so a tab may
        appear later. The default: always.
        """
        return True

    def figures(self) -> list[LiveFigure]:
        """The live figures of this view."""
        return [v for v in vars(self).values() if isinstance(v, LiveFigure)]

    def refresh(self) -> None:
        """Read what is new in the run and update the figures in place (here, at once)."""
        self.read()
        self.flush()
        if self.finish():
            self.flush()

    def finish(self) -> bool:
        """Do the slow part of a read (if the view has one), after the rest is shown; safe in a worker thread.

        Returns whether it queued figure updates.
        """
        return False

    def read(self) -> bool:
        """Read what is new and queue figure updates (safe in a worker thread); a failure shows on the view.

        Returns whether the view computed anything new.
        """
        with self._read_lock:
            return self._read()

    def flush(self) -> int:
        """Apply the queued figure updates to the Bokeh models; returns how many figures changed."""
        return sum(f.flush() for f in self.figures())

    def _read(self) -> bool:
        new = False
        try:
            new = self._read_once()
        finally:
            # read once: an empty figure says why it is empty, no longer "loading" (a figure update to flush)
            settled = [fig.settle() for fig in self.figures()]
            if self.message == LOADING_RUN:
                self._set_message("")
        return new or any(settled)

    def _read_once(self) -> bool:
        if self.reader is None:
            self._set_message("No run selected.")
            return False
        problem = self.reader.problem()
        if problem:
            self._set_message(problem)
            self._showing_problem = True
            return False
        if self._showing_problem:
            self._set_message("")
            self._showing_problem = False
        try:
            inputs = self._inputs()
            if inputs is not None and self._last_inputs is not None and len(inputs) == len(self._last_inputs) and all(
                a is b for a, b in zip(inputs, self._last_inputs, strict=True)
            ):
                return False  # nothing new to read: keep the plots as they are
            self._update()
            self._last_inputs = inputs
        except Exception as exc:  # the view must stay up: report and go on with the next refresh
            logger.warning("%s refresh failed: %s", type(self).__name__, "".join(traceback.format_exception(exc)))
            self._error.object = f"Could not update this view: {type(exc).__name__}: {exc}"
            self._error.visible = True
            return False
        self._error.visible = False
        return True

    def _inputs(self) -> tuple[object, ...] | None:
        """The objects the view is drawn from; when all are the same objects as last time, no redraw.

        The reader hands out the same cached objects until the run writes something new. ``None``
        (the default) redraws on every refresh.
        """
        return None

    def _update(self) -> None:
        raise HookNotImplementedError(f"{type(self).__name__} must implement _update()")

    def _layout(self) -> pn.viewable.Viewable:
        raise HookNotImplementedError(f"{type(self).__name__} must implement _layout()")

    def __panel__(self) -> pn.viewable.Viewable:
        if not self._built and self.eager:
            self.refresh()
        self._built = True
        if self._panel is None:  # one layout per view: its figures can be on one page only
            self._panel = pn.Column(
                f"## {self.title}" if self.title else "", self._alert, self._error, self._layout(), sizing_mode="stretch_width"
            )
        return self._panel
