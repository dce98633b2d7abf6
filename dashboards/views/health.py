"""Bank and cluster health view, over every table of the bank: its tables, size and newest write, the bank
folder's bytes by part (snapshots, delta log), shard sizes, rates, staleness, makers, speed."""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import panel as pn
import param
import xarray as xr

from carls_dask.dashboards import metricnames as mn
from carls_dask.dashboards.bankdata import has_column, shards_of
from carls_dask.dashboards.figures import LiveBars, LiveCurves, LiveStackedBars
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

_TABLE_CSS = ("table.carls-tables {border-collapse: collapse; margin: 4px 0} .carls-tables td, .carls-tables th "
              "{border: 1px solid #ccc; padding: 2px 8px; text-align: left; font-size: 10pt}")


def provenance(tables: list[xr.Dataset]) -> xr.Dataset:
    """The rows of several tables as one dataset over ``key`` (positions): ``wall_time``, ``maker``, ``model_step``
    and ``shard`` of every row, where a table lacks one: NaN, ``""`` and -1."""
    def part(ds: xr.Dataset, var: str, fill: Any, dtype: Any) -> np.ndarray:
        n = ds.sizes.get("key", 0)
        return np.asarray(ds[var].values).astype(dtype) if has_column(ds, var) else np.full(n, fill, dtype=dtype)

    cols = {var: np.concatenate([part(ds, var, fill, dtype) for ds in tables]) if tables else np.zeros(0, dtype)
            for var, fill, dtype in (("wall_time", np.nan, np.float64), ("maker", "", object),
                                     ("model_step", -1, np.int64))}
    cols["maker"] = cols["maker"].astype(str)
    shard = np.concatenate([shards_of(ds) for ds in tables]) if tables else np.zeros(0, np.int64)
    return xr.Dataset({**{k: ("key", v) for k, v in cols.items()}, "shard": ("key", shard)},
                      coords={"key": np.arange(shard.size)})


class HealthView(RunView):
    """The bank's size and freshness, over every table it holds, and the run's throughput.

    A table of the bank's tables (rows, columns, newest model step and makers of each), rows per shard
    stacked by table, the staleness of every row, rows by maker and model step, bank rows written per
    second, and the primary trainer's steps per second.
    """

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
        self.tables = pn.pane.HTML("", sizing_mode="stretch_width", stylesheets=[_TABLE_CSS])
        self._shards = LiveStackedBars("rows per shard, by table", "no bank yet", "shard", "rows", name="health-shards")
        self._rates = LiveCurves(
            "bank rows per second", "needs two bank snapshots (or a bank counter series)", ylabel="rows/s", name="health-rates"
        )
        self._stale = LiveBars("staleness", "no bank yet", "age (s)", "rows", name="health-staleness")
        self._makers = LiveBars("rows by maker @ model step", "no bank yet", "maker@step", "rows", name="health-makers")
        self._speed = LiveCurves("trainer steps per second", "not written by this run", ylabel="steps/s", name="health-speed")
        self.summary: dict[str, float] = {}
        self._prov: dict[int, xr.Dataset] = {}  # by snapshot version: every table's rows' write time and maker
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

    def _latest(self) -> dict[str, xr.Dataset]:
        """Every table of the bank as it is now (none before the first snapshot)."""
        assert self.reader is not None
        return {t: ds for t in self.reader.tables() if (ds := self.reader.latest(t)) is not None}

    def _numbers(self) -> dict[str, xr.Dataset]:
        figures = self.read_numbers()
        if figures is not None:
            self.show_numbers(figures)
        return self._latest()

    def _inputs(self) -> tuple[object, ...]:
        assert self.reader is not None
        return (*self._latest().values(), self.reader.metrics())

    def _update(self) -> None:
        assert self.reader is not None
        tables = self._numbers()
        notes = []
        self.tables.object = self._tables_html(tables)
        if not tables:
            notes.append("no bank snapshot yet")
        else:
            per_table = {t: shard_sizes(ds) for t, ds in tables.items()}
            shard_ids = np.unique(np.concatenate([s["shard"].values for s in per_table.values()]))
            self._shards.set(shard_ids, {t: s["rows"].reindex(shard=shard_ids, fill_value=0).values
                                         for t, s in per_table.items()})
            ds = provenance(list(tables.values()))
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

    def _tables_html(self, tables: dict[str, xr.Dataset]) -> str:
        """The bank's tables as an HTML table: rows, columns (with their row shapes), newest model step, makers."""
        assert self.reader is not None
        columns = self.reader.table_columns()
        if not columns:
            return ""
        head = ("table", "rows", "columns", "newest model step", "makers")
        body = []
        for t, cols in columns.items():
            ds = tables.get(t)
            n = int(ds.sizes["key"]) if ds is not None else 0
            step = (int(np.nanmax(ds["model_step"].values)) if ds is not None and n and has_column(ds, "model_step")
                    else "")
            makers = (", ".join(sorted({str(m) for m in np.unique(ds["maker"].values) if str(m)}))
                      if ds is not None and n and has_column(ds, "maker") else "")
            shown = ", ".join(f"{c}[{','.join(map(str, shape))}] {dtype}" if shape else f"{c} {dtype}"
                              for c, (dtype, shape) in cols.items())
            cells = (t, f"{n:,}", shown, str(step), makers)
            body.append("<tr>" + "".join(f'<td data-column="{h}">{html.escape(str(c))}</td>'
                                         for h, c in zip(head, cells, strict=True)) + "</tr>")
        return (f'<table class="carls-tables"><thead><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr></thead>'
                f'<tbody>{"".join(body)}</tbody></table>')

    def _update_write_rates(self) -> None:
        """Rows written per second by each maker between snapshots, over every table (for runs that write no
        bank counter)."""
        assert self.reader is not None
        tables = list(self.reader.tables())
        if not tables:
            return
        snaps = self.reader.snapshots()[-self.max_snapshots :]
        for s in snaps:
            v = int(s["version"])
            if v not in self._prov:
                prov = provenance([self.reader.snapshot(v, t) for t in tables])
                prov.attrs["step"] = int(s["step"])
                self._prov[v] = prov
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
            self.tables,
            pn.Row(self._shards.pane, self._stale.pane, **wide),
            pn.Row(self._rates.pane, self._speed.pane, **wide),
            self._makers.pane,
            **wide,
        )

    def applies(self) -> bool:
        """Every run has a bank or a metric store to show the health of."""
        return True
