"""Bank and cluster health view: bank size and newest write, shard sizes, rates, staleness, makers, speed."""

from __future__ import annotations

import math

import panel as pn
import param
import xarray as xr

from dashboards import metricnames as mn
from dashboards import plots
from dashboards.health import (
    bank_summary,
    counter_rate,
    maker_versions,
    shard_sizes,
    staleness,
    steps_per_second,
)
from dashboards.views.base import RunView

__all__ = ["HealthView"]


class HealthView(RunView):
    """The bank's size and freshness and the run's throughput."""

    bins = param.Integer(default=20, bounds=(2, 200), doc="Bins of the staleness histogram.")

    def __init__(self, **params: object) -> None:
        params.setdefault("title", "Bank and cluster health")
        super().__init__(**params)
        self.rows = pn.indicators.Number(label="bank rows", value=0, format="{value:,.0f}", font_size="28pt", title_size="11pt")
        self.version = pn.indicators.Number(label="newest row version", value=0, format="{value:,.0f}", font_size="28pt", title_size="11pt")
        self.model_step = pn.indicators.Number(label="newest model step", value=0, format="{value:,.0f}", font_size="28pt", title_size="11pt")
        self.snapshots = pn.indicators.Number(label="snapshots", value=0, format="{value:,.0f}", font_size="28pt", title_size="11pt")
        self._shards = plots.pane(plots.empty("rows per shard", "no bank yet"))
        self._rates = plots.pane(plots.empty("lookup / update rate", "not written by this run"))
        self._stale = plots.pane(plots.empty("staleness", "no bank yet"))
        self._makers = plots.pane(plots.empty("rows by maker version", "no bank yet"))
        self._speed = plots.pane(plots.empty("trainer steps/s", "not written by this run"))
        self.summary: dict[str, float] = {}

    def refresh_numbers(self) -> None:
        """Update only the headline figures (cheap: run on every tick so new writes show at once)."""
        figures = self.read_numbers()
        if figures is None:
            self.refresh()
        else:
            self.show_numbers(figures)

    def read_numbers(self) -> dict[str, float] | None:
        """Read the headline figures (safe in a worker thread); ``None`` when the run is not there."""
        if self.reader is None or self.reader.problem():
            return None
        figures = self.reader.headline()  # cheap and incremental: never waits on a whole-bank read
        if figures is None:
            figures = bank_summary(None)
            figures["snapshots"] = 0.0
        return figures

    def show_numbers(self, figures: dict[str, float]) -> None:
        """Show figures from :meth:`read_numbers` (call on the thread that owns the page)."""
        if self._showing_problem:
            self._set_message("")
            self._showing_problem = False
        self.summary = figures
        for ind, key in ((self.rows, "rows"), (self.version, "version"), (self.model_step, "model_step"), (self.snapshots, "snapshots")):
            v = figures.get(key, float("nan"))
            ind.value = 0 if math.isnan(v) else int(v)

    def _numbers(self) -> xr.Dataset | None:
        assert self.reader is not None
        figures = self.read_numbers()
        if figures is not None:
            self.show_numbers(figures)
        return self.reader.latest()

    def _inputs(self) -> tuple[object, ...]:
        assert self.reader is not None
        return (self.reader.latest(), self.reader.metrics())

    def _update(self) -> None:
        assert self.reader is not None
        ds = self._numbers()
        notes = []
        if ds is None:
            notes.append("no bank snapshot yet")
        else:
            sizes = shard_sizes(ds)
            self._shards.object = plots.bars(sizes["shard"].values, sizes["rows"].values, "rows per shard", "shard", "rows")
            st = staleness(ds, self.reader.now(), self.bins)
            if st is not None:
                self._stale.object = plots.bars(
                    [f"{a:.3g}" for a in st["age"].values], st["count"].values,
                    f"staleness (median {st.attrs['median']:.1f} s, p90 {st.attrs['p90']:.1f} s)", "age (s)", "rows",
                )
            mv = maker_versions(ds)
            if mv is not None:
                labels = [f"{m or '-'}@{s}" for m, s in zip(mv["maker"].values, mv["model_step"].values, strict=True)]
                self._makers.object = plots.bars(labels[-30:], mv["rows"].values[-30:], "rows by maker @ model step", "maker@step", "rows")
        m = self.reader.metrics()
        if m is None:
            notes.append("no metric store yet")
        else:
            rates = [(n, r) for n in (mn.BANK_LOOKUPS, mn.BANK_UPDATES) if (r := counter_rate(m, n)) is not None]
            if rates:
                self._rates.object = plots.curves(rates, "bank rows per second", ylabel="rows/s")
            sps = steps_per_second(m)
            if sps is not None:
                self._speed.object = plots.curves([("steps/s", sps)], "trainer steps per second", ylabel="steps/s")
        self._set_message(("This run has " + "; ".join(notes) + ".") if notes else "")

    def _layout(self) -> pn.viewable.Viewable:
        return pn.Column(
            pn.Row(self.rows, self.version, self.model_step, self.snapshots),
            pn.Row(self._shards, self._stale),
            pn.Row(self._rates, self._speed),
            self._makers,
        )
