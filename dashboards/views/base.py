"""The common shell of every view: a reader, a message line and a guarded refresh."""

from __future__ import annotations

import logging
import traceback

import panel as pn
import param

from dashboards.runreader import RunReader

__all__ = ["RunView"]

logger = logging.getLogger(__name__)


class RunView(pn.viewable.Viewer):
    """Base class of the views: holds the reader, shows a message when there is nothing to plot.

    Subclasses implement :meth:`_update`, which reads through :attr:`reader` and sets their panes, and
    :meth:`_layout`, which returns the view's Panel layout.
    """

    reader = param.ClassSelector(class_=RunReader, doc="Reader of the run folder this view shows.")
    message = param.String(default="", doc="Why (part of) the view is empty; shown above the plots.")
    title = param.String(default="", doc="Heading of the view.")

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        self._alert = pn.pane.Alert("", alert_type="info", visible=False, sizing_mode="stretch_width")
        self._error = pn.pane.Alert("", alert_type="danger", visible=False, sizing_mode="stretch_width")
        self._built = False
        self._showing_problem = False
        self._last_inputs: tuple[object, ...] | None = None

    def _set_message(self, text: str) -> None:
        self.message = text
        self._alert.object = text
        self._alert.visible = bool(text)

    def refresh(self) -> None:
        """Read what is new in the run and update the plots; a failure shows on the view, not as a traceback."""
        if self.reader is None:
            self._set_message("No run selected.")
            return
        problem = self.reader.problem()
        if problem:
            self._set_message(problem)
            self._showing_problem = True
            return
        if self._showing_problem:
            self._set_message("")
            self._showing_problem = False
        try:
            inputs = self._inputs()
            if inputs is not None and self._last_inputs is not None and len(inputs) == len(self._last_inputs) and all(
                a is b for a, b in zip(inputs, self._last_inputs, strict=True)
            ):
                return  # nothing new to read: keep the plots as they are
            self._update()
            self._last_inputs = inputs
        except Exception as exc:  # the view must stay up: report and go on with the next refresh
            logger.warning("%s refresh failed: %s", type(self).__name__, "".join(traceback.format_exception(exc)))
            self._error.object = f"Could not update this view: {type(exc).__name__}: {exc}"
            self._error.visible = True
        else:
            self._error.visible = False

    def _inputs(self) -> tuple[object, ...] | None:
        """The objects the view is drawn from; when all are the same objects as last time, no redraw.

        The reader hands out the same cached objects until the run writes something new. ``None``
        (the default) redraws on every refresh.
        """
        return None

    def _update(self) -> None:
        raise NotImplementedError

    def _layout(self) -> pn.viewable.Viewable:
        raise NotImplementedError

    def __panel__(self) -> pn.viewable.Viewable:
        if not self._built:
            self.refresh()
            self._built = True
        return pn.Column(f"## {self.title}" if self.title else "", self._alert, self._error, self._layout(), sizing_mode="stretch_width")
