"""Progress of a run: loops' reports gathered into one book, shown in the terminal, written to metrics.

Loops send small dicts of numbers (see :func:`carls_dask.runtime.tasks.run_loop_task`). The
:class:`ProgressBook` keeps the newest values per loop (pure, no I/O); :class:`ProgressSink` shows
them with a tqdm bar and appends them to the run's metric store, one row per advance of the
trainers' step.
"""

from __future__ import annotations

import logging
import math
import os
import pathlib
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm import tqdm

from carls_dask.storage.runfolder import MAKER_STALENESS_S, MAKER_VERSION, STEPS_PER_S, TRAIN_LOSS

__all__ = ["ProgressBook", "ProgressSink", "work_bar"]

logger = logging.getLogger(__name__)


class _Bar(tqdm):
    """A tqdm bar without tqdm's shared monitor thread (a Workbench leaves no threads behind)."""

    monitor_interval = 0


def work_bar(total: int, what: str, *, unit: str = "item", cache: str | os.PathLike[str] | None = None,
             show: bool | None = None) -> Any:
    """A terminal bar for long work done once per machine (encoding a data set, computing features for a cache).

    It counts ``unit`` of ``total`` with tqdm's rate and estimate of the time left, and its label says
    where the result is cached (so the user knows the wait happens once) or that it is not. Use it as
    a context manager and call ``update(n)``. ``show`` defaults to ``carls.runtime.progress``; when
    false the bar draws nothing.
    """
    from carls_dask import config

    visible = bool(config.get("runtime.progress", show))
    where = f"cached in {cache}" if cache is not None else "not cached"
    return _Bar(total=int(total), unit=unit, desc=f"{what} (once; {where})", disable=not visible, leave=True,
                mininterval=1.0, file=sys.stderr)


class ProgressBook:
    """The newest reported values of every loop of a run.

    Parameters
    ----------
    unprefixed
        Series to write also without the loop's name, by loop kind (from the first loop of that
        kind that reports it), e.g. ``{"maker": ("pl_precision",)}``: the names a paradigm's dashboards read.
    primary
        The primary trainer's name: the progress bar counts its steps (``None``: the largest step
        any trainer reported).
    """

    def __init__(self, unprefixed: Mapping[str, Sequence[str]] | None = None, *, primary: str | None = None) -> None:
        self.unprefixed = {str(k): tuple(v) for k, v in (unprefixed or {}).items()}
        self.primary = primary
        self._lock = threading.Lock()
        self.loops: dict[str, dict[str, float]] = {}
        self.kinds: dict[str, str] = {}
        self.events = 0

    def update(self, msg: Mapping[str, Any]) -> None:
        """Take one report: ``{"loop": name, "kind": ..., "time": ..., name: number, ...}``."""
        name = str(msg.get("loop", "?"))
        values = {}
        for key, value in msg.items():
            if value is None:
                values[str(key)] = math.nan
            elif isinstance(value, int | float) and not isinstance(value, bool):
                values[str(key)] = float(value)
            # anything else (loop, kind, the worker address Dask adds) is not a number to keep
        with self._lock:
            self.loops.setdefault(name, {}).update(values)
            self.kinds[name] = str(msg.get("kind", ""))
            self.events += 1

    def trainer_step(self) -> int:
        """The largest step any trainer reported (0 before the first report)."""
        with self._lock:
            steps = [v.get("step", 0.0) for n, v in self.loops.items() if self.kinds.get(n) == "trainer"]
        return int(max(steps, default=0.0))

    def primary_step(self) -> int:
        """The primary trainer's newest step (:meth:`trainer_step` when no primary is named)."""
        if self.primary is None:
            return self.trainer_step()
        with self._lock:
            return int(self.loops.get(self.primary, {}).get("step", 0.0))

    def row(self) -> dict[str, float]:
        """All newest values, flattened to ``"<loop>.<name>"``.

        The first trainer's ``steps_per_s`` and ``loss`` also appear as ``steps_per_s`` and
        ``train_loss``, and the first maker's ``version`` and ``staleness_s`` as ``maker_version``
        and ``maker_staleness_s``: the names the dashboards look for.
        """
        with self._lock:
            out = {f"{loop}.{key}": value for loop, values in self.loops.items()
                   for key, value in values.items() if key != "time"}
            trainers = [n for n in self.loops if self.kinds.get(n) == "trainer"]
            makers = [n for n in self.loops if self.kinds.get(n) == "maker"]
            aliases = []
            if trainers:
                aliases += [(trainers[0], STEPS_PER_S, STEPS_PER_S), (trainers[0], "loss", TRAIN_LOSS)]
            if makers:
                aliases += [(makers[0], "version", MAKER_VERSION), (makers[0], "staleness_s", MAKER_STALENESS_S)]
            for loop, key, alias in aliases:
                if key in self.loops[loop]:
                    out[alias] = self.loops[loop][key]
            for kind, names in self.unprefixed.items():
                loops = [n for n in self.loops if self.kinds.get(n) == kind]
                for name in names:
                    first = next((n for n in loops if name in self.loops[n]), None)
                    if first is not None:
                        out[name] = self.loops[first][name]
            return out

    def summary(self) -> str:
        """A one-line summary: steps/s of trainers, versions and staleness of makers."""
        parts = []
        with self._lock:
            for loop, v in sorted(self.loops.items()):
                if self.kinds.get(loop) == "trainer":
                    parts.append(f"{loop} {v.get(STEPS_PER_S, math.nan):.0f} st/s")
                    if "loss" in v:
                        parts.append(f"loss {v['loss']:.3g}")
                else:
                    parts.append(f"{loop} v{int(v.get('version', 0))} stale {v.get('staleness_s', math.nan):.2f}s")
        return ", ".join(parts)


class ProgressSink:
    """Shows a :class:`ProgressBook` in the terminal and appends it to a metric store.

    Parameters
    ----------
    book
        The book to read.
    total
        Trainer steps expected in all (``None`` when trainers run until stopped).
    show
        Whether to draw a terminal progress bar.
    metrics_path
        ``RUN/metrics.zarr``, or ``None`` to write no metrics.
    run
        The run's identity, stored with the metrics (a store of another run is refused).
    desc
        What the bar is labelled with (default ``run``).
    initial
        The step the primary trainer starts from (a resumed run's checkpoint): the bar starts there,
        and its rate and estimate count only the steps taken from there.
    """

    def __init__(self, book: ProgressBook, *, total: int | None = None, show: bool = True,
                 metrics_path: str | pathlib.Path | None = None, run: str = "", desc: str | None = None,
                 initial: int = 0) -> None:
        self.book = book
        # without a total yet (a Workbench learns it when the primary trainer is submitted) the bar waits for it
        self._bar: Any = (_Bar(total=total, initial=int(initial), unit="step", desc=desc or run or "run", leave=True,
                               mininterval=1.0, delay=0 if total is not None else 3600)
                          if show else None)
        self._writer: Any = None
        if metrics_path is not None:
            from carls_dask.storage.metrics import MetricWriter

            self._writer = MetricWriter(metrics_path, run=run)
        self._last_step = -1
        self._lock = threading.Lock()
        self.rows_written = 0
        self._total = total
        self._closing = False

    def start_at(self, step: int) -> None:
        """Start the bar at ``step`` (a resumed run's checkpoint), counting rate and estimate from there."""
        if self._bar is not None and step > self._bar.n:
            self._bar.initial = self._bar.n = self._bar.last_print_n = int(step)
            if self._bar.total is not None:
                self._bar.refresh()

    def set_total(self, total: int | None) -> None:
        """Change the expected total of trainer steps."""
        self._total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def record(self) -> None:
        """Append a metric row when the trainers' step passed the store's newest row.

        Called after every report, so the store gets a row for each trainer report (every
        ``carls.run.metrics-every`` steps and after every evaluation), not a time-sampled subset. A
        trainer continued from an earlier step writes again once it passes the newest row. The row of the
        last expected step waits for :meth:`close`, so the reports that arrive after the trainers' last one
        (a maker's final round, a second trainer's last evaluation) are in it.
        """
        if self._writer is None or not self.book.events:
            return
        with self._lock:  # the Workbench records from its monitor thread and from the caller's
            step = self.book.trainer_step()
            if not self._closing and self._total is not None and step >= self._total:
                return
            last = self._writer.last_step
            if step > self._last_step and (last is None or step > last):
                row = {k: v for k, v in self.book.row().items() if not math.isnan(v)}
                self._writer.append(step, **row)
                self.rows_written += 1
            self._last_step = max(self._last_step, step)

    def flush(self) -> None:
        """Draw the newest values and append a metric row if the trainers' step advanced."""
        step = self.book.primary_step()
        if self._bar is not None and step > self._bar.n:
            self._bar.set_postfix_str(self.book.summary(), refresh=False)
            self._bar.update(step - self._bar.n)  # redraws at most once per mininterval
        self.record()

    def close(self) -> None:
        """Write what is left (the last step's row included) and close the bar and the metric writer."""
        self._closing = True
        try:
            self.flush()
        finally:
            if self._bar is not None:
                self._bar.set_postfix_str(self.book.summary(), refresh=False)
                self._bar.refresh()  # the final state stays on the terminal: the bar ends complete
                self._bar.close()
            if self._writer is not None:
                self._writer.close()
