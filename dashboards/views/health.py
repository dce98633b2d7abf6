"""Bank and cluster health view: bank size and newest write, the bank folder's bytes by part (snapshots, delta
log), shard sizes, rates, staleness, makers, speed."""

from __future__ import annotations

import math

import panel as pn
import param
import xarray as xr

from carls_dask.dashboards import metricnames as mn
from carls_dask.dashboards.bankdata import has_column
from carls_dask.dashboards.figures import LiveBars, LiveCurves
from carls_dask.dashboards.health import (
    bank_parts,
    bank_summary,
    counter_rates,
    maker_versions,
    rows_written_per_second,
    shard_sizes,
    staleness,
    steps_per_second,
)
from carls_dask.dashboards.views.base import RunView

__all__ = ["HealthView"]


class HealthView(RunView):
    """The bank's size and freshness and the run's throughput."""

    bins = param.Integer(default=20, bounds=(2, 200), doc="Bins of the staleness histogram.")
    idle = param.Number(
        default=300.0, bounds=(1.0, None),
        doc="Seconds without a write after which a run counts as ended: row ages are then measured to its last write.",
    )
    max_snapshots = param.Integer(default=20, bounds=(2, 10_000), doc="Most recent snapshots in the write-rate plot.")

    def __init__(self, **params: object) -> None:
        params.setdefault("title", "Bank and cluster health")
        super().__init__(**params)
        self.rows = pn.indicators.Number(label="bank rows", value=0, format="{value:,.0f}", font_size="28pt", title_size="11pt")
        self.version = pn.indicators.Number(label="newest row version", value=0, format="{value:,.0f}", font_size="28pt", title_size="11pt")
        self.model_step = pn.indicators.Number(label="newest model step", value=0, format="{value:,.0f}", font_size="28pt", title_size="11pt")
        self.snapshots = pn.indicators.Number(label="snapshots", value=0, format="{value:,.0f}", font_size="28pt", title_size="11pt")
        self.snapshot_mb = pn.indicators.Number(label="snapshots MB", value=0, format="{value:,.1f}", font_size="28pt", title_size="11pt")
        self.log_mb = pn.indicators.Number(label="delta log MB", value=0, format="{value:,.1f}", font_size="28pt", title_size="11pt")
        self._shards = LiveBars("rows per shard", "no bank yet", "shard", "rows", name="health-shards")
        self._rates = LiveCurves(
            "bank rows per second", "needs two bank snapshots (or a bank counter series)", ylabel="rows/s", name="health-rates"
        )
        self._stale = LiveBars("staleness", "no bank yet", "age (s)", "rows", name="health-staleness")
        self._makers = LiveBars("rows by maker @ model step", "no bank yet", "maker@step", "rows", name="health-makers")
        self._speed = LiveCurves("trainer steps per second", "not written by this run", ylabel="steps/s", name="health-speed")
        self.summary: dict[str, float] = {}
        self._prov: dict[int, xr.Dataset] = {}  # by snapshot version: the rows' write time and maker
        #: The time row ages were last measured against (the run's last write once it has ended).
        self.reference: float = float("nan")

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
        parts = self.reader.bank_bytes()  # measured again only when the bank folder changed
        return {**figures, **bank_parts(parts)}

    def show_numbers(self, figures: dict[str, float]) -> None:
        """Show figures from :meth:`read_numbers` (call on the thread that owns the page)."""
        if self._showing_problem:
            self._set_message("")
            self._showing_problem = False
        self.summary = figures
        for ind, key in ((self.rows, "rows"), (self.version, "version"), (self.model_step, "model_step"), (self.snapshots, "snapshots")):
            v = figures.get(key, float("nan"))
            ind.value = 0 if math.isnan(v) else int(v)
        for ind, key in ((self.snapshot_mb, "snapshot_mb"), (self.log_mb, "log_mb")):
            v = figures.get(key, float("nan"))
            ind.value = 0.0 if math.isnan(v) else float(v)

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
            self._shards.set(sizes["shard"].values, sizes["rows"].values)
            self.reference = self.reader.age_reference(self.idle)
            ended = self.reader.ended(self.idle)
            st = staleness(ds, self.reference, self.bins)
            if st is not None:
                when = "at the run's last write" if ended else "now"
                self._stale.set(
                    [f"{a:.3g}" for a in st["age"].values], st["count"].values,
                    title=f"staleness: row age {when} (median {st.attrs['median']:.1f} s, p90 {st.attrs['p90']:.1f} s)",
                )
            mv = maker_versions(ds)
            if mv is not None:
                labels = [f"{m or '-'}@{s}" for m, s in zip(mv["maker"].values, mv["model_step"].values, strict=True)]
                self._makers.set(labels[-30:], mv["rows"].values[-30:])
        m = self.reader.metrics()
        rates: list[tuple[str, xr.DataArray]] = []
        if m is None:
            notes.append("no metric store yet")
        else:
            rates = [
                (f"{loop + '.' if loop else ''}{n}", r) for n in (mn.BANK_LOOKUPS, mn.BANK_UPDATES)
                for loop, r in counter_rates(m, n).items()
            ]
            if rates:
                self._rates.set([(n, r["step"].values, r.values) for n, r in rates], title="bank rows per second (counters)")
            sps = steps_per_second(m)
            if sps is not None:
                self._speed.set([("steps/s", sps["step"].values, sps.values)])
        if not rates:
            self._update_write_rates()
        self._set_message(("This run has " + "; ".join(notes) + ".") if notes else "")

    def _update_write_rates(self) -> None:
        """Rows written per second by each maker between snapshots (for runs that write no bank counter)."""
        assert self.reader is not None
        if self.reader.table not in self.reader.tables():
            return
        snaps = self.reader.snapshots()[-self.max_snapshots :]
        for s in snaps:
            v = int(s["version"])
            if v not in self._prov:
                ds = self.reader.snapshot(v)
                cols = [c for c in ("wall_time", "maker") if has_column(ds, c)]
                self._prov[v] = ds[cols].load()
                self._prov[v].attrs["step"] = int(s["step"])
        kept = {int(s["version"]) for s in snaps}
        for v in [v for v in self._prov if v not in kept]:
            del self._prov[v]
        rates = rows_written_per_second([self._prov[v] for v in sorted(self._prov)])
        if rates:
            self._rates.set(
                [(m or "rows", r["step"].values, r.values) for m, r in rates.items()],
                title="bank rows written per second between snapshots, by maker",
            )

    def _layout(self) -> pn.viewable.Viewable:
        wide = {"sizing_mode": "stretch_width"}
        return pn.Column(
            pn.Row(self.rows, self.version, self.model_step, self.snapshots, self.snapshot_mb, self.log_mb, **wide),
            pn.Row(self._shards.pane, self._stale.pane, **wide),
            pn.Row(self._rates.pane, self._speed.pane, **wide),
            self._makers.pane,
            **wide,
        )

    def applies(self) -> bool:
        """Every run has a bank or a metric store to show the health of."""
        return True
