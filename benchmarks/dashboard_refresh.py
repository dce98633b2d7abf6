"""Dashboard refresh: rebuilding every figure vs updating the live figures in place, side by side.

A synthetic run folder (``--rows`` bank rows with 32-d embeddings, ``--snapshots`` snapshots, a metric
store of ``--metric-rows`` rows) is shown by one :class:`~carls_dask.dashboards.dashboard.Dashboard` whose figures
sit in a Bokeh document, as in a served page. Each round the run gains a snapshot and ``--new-rows``
metric rows, every view reads it (``read``: the part that runs in a worker thread), and then the
figures are brought up to date in three ways, timed one after the other in this process:

- **HoloViews rebuild** (how the dashboard used to redraw): every figure is built again as a HoloViews
  element and rendered to new Bokeh models, which replace the old ones in the document;
- **Bokeh rebuild**: every figure is built again as a new live Bokeh figure, replacing the old one;
- **in place** (what the dashboard does now): the queued data goes into the existing figures'
  sources (``source.data = ...``, or ``source.stream`` of the new points only).

Each side's time includes turning the document changes into the PATCH-DOC message the server would
send, whose size is printed too. This is the work the server's event loop does per refresh; the
read is printed separately (it runs in a worker thread, off the event loop, in every case).

The same is measured for the tabs read on every tick: the **Learning** tab of the run (trainer loss and
evaluation curves, makers' staleness, rounds and rows) and the **Comparison** of ``--runs`` runs (each
with its own metric store gaining ``--new-rows`` rows a round): their in-place update (``flush`` of the
view as rendered by Panel into a document: streamed curve points, the table) against rebuilding their
figures, and against the :data:`EVENT_LOOP_BUDGET_MS` budget of one tick.

Run: ``python benchmarks/dashboard_refresh.py [--rows 100000] [--rounds 5] [--runs 10]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from bokeh.document import Document
from bokeh.layouts import column
from bokeh.protocol import Protocol
from panel.viewable import Viewable

from carls_dask.dashboards.dashboard import Dashboard
from carls_dask.dashboards.figures import (
    LiveBars,
    LiveCurves,
    LiveFigure,
    LiveHeatmap,
    LiveImage,
    LiveStackedBars,
)
from carls_dask.dashboards.runreader import RunReader
from carls_dask.storage.metrics import MetricWriter
from carls_dask.storage.runfolder import RunFolder
from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, write_shard

CLASSES = 7
DIM = 32
#: Most milliseconds the event loop may spend on one tick's update of the Learning or Comparison tab.
EVENT_LOOP_BUDGET_MS = 50.0


def _table(rows: int, step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    keys = np.arange(rows, dtype=np.int64)
    truth = keys % CLASSES
    centres = rng.normal(size=(CLASSES, DIM)) * 4
    emb = centres[truth] + np.random.default_rng(step).normal(size=(rows, DIM)) * 0.3 + 0.01 * step
    pseudo = np.where(keys % 5 == 0, -1, np.where(keys % 7 == 0, (truth + 1) % CLASSES, truth))
    conf = np.where(pseudo == truth, 0.9, 0.4)
    return {
        "keys": keys,
        "bucket": (keys % 64).astype(np.int32),
        "frequency": np.ones(rows, np.int64),
        "prov/version": np.full(rows, step, np.int64),
        "prov/model_step": np.full(rows, step, np.int64),
        "prov/maker": np.ones(rows, np.int32),
        "prov/wall_time": np.full(rows, time.time()),
        "col/embedding": emb.astype(np.float32),
        "col/pseudo_label": pseudo.astype(np.int64),
        "col/confidence": conf.astype(np.float32),
        "col/difficulty": (1.0 - conf + 0.01 * (keys % 10)).astype(np.float32),
    }


def write_snapshot(bank: pathlib.Path, step: int, rows: int) -> None:
    """Commit one single-shard snapshot of table ``nodes``."""
    arrays = _table(rows, step)
    columns = [
        {"name": n.split("/", 1)[1], "dtype": str(a.dtype), "shape": list(a.shape[1:])} for n, a in arrays.items() if n.startswith("col/")
    ]
    meta = {
        "format": 1, "shard": 0, "n_shards": 1, "buckets": 64, "owned_buckets": list(range(64)),
        "tables": {"nodes": {"name": "nodes", "columns": columns}}, "makers": ["", "labeller"], "version": step,
        "optimizer": {},
    }
    handle = begin_snapshot(bank, step)
    write_shard(handle, {"meta": meta, "tables": {"nodes": arrays}}, delta_seq=0)
    commit_snapshot(handle)


def append_metrics(writer: MetricWriter, start: int, n: int, seed: int = 0) -> None:
    """Metric rows ``start .. start + n - 1``: bank counters, curriculum and pseudo-label series, and a
    trainer's loss and accuracies and a maker's staleness, rounds and rows under their loops' names."""
    wiggle = np.random.default_rng(seed + start).normal(size=n) * 0.01
    for i, step in enumerate(range(start, start + n)):
        writer.append(step, bank_lookups=step * 100.0, bank_updates=step * 40.0, pacing=min(1.0, step / 5000),
                      admitted_fraction=min(1.0, step / 5200), pl_precision=0.8 + 1e-5 * step, pl_coverage=0.6,
                      **{"trainer.loss": 1.0 / (1 + 0.01 * step) + wiggle[i], "trainer.val_acc": 0.9 - 0.5 / (1 + 0.01 * step),
                         "trainer.test_acc": 0.88 - 0.5 / (1 + 0.01 * step) + wiggle[i], "trainer.train_acc": min(1.0, step / 2000),
                         "maker.staleness_s": 0.5 + 0.1 * (step % 10), "maker.round": step // 10, "maker.rows": 100.0 * (step // 10)})
    writer.flush()


def write_request(run: pathlib.Path, index: int) -> None:
    """The run's ``request.json``: variants ``v0`` .. ``v4``, seeds 0, 1, ... (so the comparison averages seeds)."""
    run.mkdir(parents=True, exist_ok=True)
    RunFolder(run).request.write_text(json.dumps({"paradigm": "bench", "variant": f"v{index % 5}", "settings": {"seed": index // 5}}))


# ---------------------------------------------------------------------------- the three ways to redraw


def _hv_element(fig: LiveFigure) -> Any:
    """The figure's current content as a HoloViews element (the former way of drawing it)."""
    import holoviews as hv

    title = str(fig.figure.title.text) if fig.figure.title is not None else ""  # type: ignore[union-attr]
    opts: dict[str, Any] = {"title": title, "width": fig.figure.width, "height": fig.figure.height}
    if isinstance(fig, LiveCurves):
        lines = [hv.Curve((s.data["x"], s.data["y"]), "step", "value", label=n) for n, s in fig.sources.items()]
        return hv.Overlay(lines or [hv.Curve([])]).opts(**opts, legend_position="top_left")
    if isinstance(fig, LiveBars):
        return hv.Bars((list(fig.source.data["x"]), np.asarray(fig.source.data["top"])), "x", "y").opts(**opts, tools=["hover"])
    if isinstance(fig, LiveStackedBars):
        d = fig.source.data
        x = np.round(np.asarray(d["x"], float), 3).astype(str)
        return hv.Bars((x, list(d["part"]), np.asarray(d["top"]) - np.asarray(d["bottom"])), ["x", "part"], "rows").opts(
            **opts, stacked=True, tools=["hover"]
        )
    if isinstance(fig, LiveHeatmap):
        d = fig.source.data
        return hv.HeatMap((np.asarray(d["x"]), np.round(np.asarray(d["y"]), 3), np.asarray(d["value"]))).opts(**opts, colorbar=True)
    if isinstance(fig, LiveImage):
        d = fig.source.data
        if not len(d["image"]):
            return hv.RGB(np.zeros((2, 2, 4), np.uint8)).opts(**opts)
        rgba = np.asarray(d["image"][0]).view(np.uint8).reshape(*np.shape(d["image"][0]), 4)
        x0, y0 = d["x"][0], d["y"][0]
        return hv.RGB(rgba[::-1], bounds=(x0, y0, x0 + d["dw"][0], y0 + d["dh"][0])).opts(**opts)
    raise TypeError(type(fig))


def bokeh_rebuild(figures: list[LiveFigure], content: list[Any], holder: Any, fresh: list[LiveFigure]) -> None:
    """New live figures holding ``content``, swapped into ``holder`` (kept in ``fresh``)."""
    for f, update in zip(figures, content, strict=True):
        g = type(f)(str(f.figure.title.text))  # type: ignore[union-attr]
        g._pending = update
        g.flush()
        fresh.append(g)
    holder.children = [g.figure for g in fresh]


def hv_rebuild(fresh: list[LiveFigure], holder: Any, renderer: Any) -> None:
    """The figures drawn again as HoloViews elements rendered to new Bokeh models, swapped into ``holder``."""
    holder.children = [renderer.get_plot(_hv_element(g)).state for g in fresh]


def in_place(figures: list[LiveFigure]) -> None:
    """The queued data moved into the existing figures."""
    for f in figures:
        f.flush()


def _patch_bytes(events: list[Any]) -> int:
    if not events:
        return 0
    msg = Protocol().create("PATCH-DOC", events)
    return len(msg.content_json) + sum(memoryview(b.data).nbytes for b in msg.buffers)


def _timed(doc: Document, change: Callable[[], None]) -> tuple[float, int]:
    """Seconds to make the document change and serialise it as the server's patch, and its bytes."""
    events: list[Any] = []
    doc.on_change(events.append)
    t0 = time.perf_counter()
    change()
    size = _patch_bytes(events)
    seconds = time.perf_counter() - t0
    doc.remove_on_change(events.append)
    return seconds, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="bank rows")
    parser.add_argument("--snapshots", type=int, default=4, help="snapshots before the first round")
    parser.add_argument("--metric-rows", type=int, default=3000, help="metric rows before the first round")
    parser.add_argument("--new-rows", type=int, default=20, help="metric rows each round adds")
    parser.add_argument("--rounds", type=int, default=5, help="refreshes measured")
    parser.add_argument("--runs", type=int, default=10, help="runs compared (each with its own metric store)")
    args = parser.parse_args()

    import holoviews as hv

    hv.extension("bokeh", logo=False)
    renderer = hv.renderer("bokeh")

    with tempfile.TemporaryDirectory(prefix="dashboard-bench-") as tmp:
        run = pathlib.Path(tmp)
        step = 100
        for _ in range(args.snapshots):
            write_snapshot(RunFolder(run).bank, step, args.rows)
            step += 100
        np.savez(RunFolder(run).truth, keys=np.arange(args.rows, dtype=np.int64), labels=np.arange(args.rows) % CLASSES)
        write_request(run, 0)
        others = [run.parent / f"{run.name}-run{i}" for i in range(1, args.runs)]
        writers = []
        for i, path in enumerate([run, *others]):
            if i:
                write_request(path, i)
            writers.append(MetricWriter(RunFolder(path).metrics, run=f"bench{i}", flush_rows=10**6, flush_seconds=3600))
            append_metrics(writers[-1], 1, args.metric_rows, seed=i)
        writers[0]
        next_metric = args.metric_rows + 1

        dash = Dashboard([RunReader(run), *[RunReader(p) for p in others]]) if others else Dashboard(reader=RunReader(run))
        base_views = [v for v in dash.views if v is not dash.learning]
        figures = [f for v in base_views for f in v.figures()]
        page = Document()  # the page of the in-place way: its figures stay, their data changes
        page.add_root(column(*[f.figure for f in figures]))
        rebuilt = {"bokeh": Document(), "hv": Document()}  # the pages of the rebuilds: figures replaced
        holders = {k: column() for k in rebuilt}
        for k, d in rebuilt.items():
            d.add_root(holders[k])
        t0 = time.perf_counter()
        dash.refresh()
        first = time.perf_counter() - t0
        # The tabs read on every tick, rendered by Panel into documents of their own (as a served page holds them).
        ticked: dict[str, Any] = {"learning": dash.learning}
        if dash.comparison is not None:
            ticked["comparison"] = dash.comparison
        tick_pages = {}
        for key, view in ticked.items():
            tick_pages[key] = Document()
            tick_pages[key].add_root(Viewable.get_root(view.__panel__(), tick_pages[key]))  # type: ignore[arg-type]
        tick_rebuilt = {(key, way): Document() for key in ticked for way in ("bokeh", "hv")}
        tick_holders = {k: column() for k in tick_rebuilt}
        for k, d in tick_rebuilt.items():
            d.add_root(tick_holders[k])

        keys = ("read", "hv", "bokeh", "inplace", "hv_b", "bokeh_b", "inplace_b")
        rows: dict[str, list[float]] = {k: [] for k in keys}
        rows.update({f"{tab}_{k}": [] for tab in ticked for k in keys})
        for _ in range(args.rounds):
            write_snapshot(RunFolder(run).bank, step, args.rows)
            step += 100
            for i, w in enumerate(writers):
                append_metrics(w, next_metric, args.new_rows, seed=i)
            next_metric += args.new_rows

            t0 = time.perf_counter()
            for v in base_views:
                v.read()
            rows["read"].append(time.perf_counter() - t0)
            for tab, view in ticked.items():
                t0 = time.perf_counter()
                view.read()
                rows[f"{tab}_read"].append(time.perf_counter() - t0)
                tab_figures = view.figures()
                tab_pending = [f._pending or f._last for f in tab_figures]
                tab_fresh: list[LiveFigure] = []
                tab_ways: list[tuple[str, Callable[[], None], Document]] = [
                    ("bokeh", partial(bokeh_rebuild, tab_figures, tab_pending, tick_holders[tab, "bokeh"], tab_fresh),
                     tick_rebuilt[tab, "bokeh"]),
                    ("hv", partial(hv_rebuild, tab_fresh, tick_holders[tab, "hv"], renderer), tick_rebuilt[tab, "hv"]),
                    ("inplace", view.flush, tick_pages[tab]),
                ]
                for key, change, doc in tab_ways:
                    secs, size = _timed(doc, change)
                    rows[f"{tab}_{key}"].append(secs)
                    rows[f"{tab}_{key}_b"].append(size)
            pending = [f._pending or f._last for f in figures]  # this round's content of every figure

            fresh: list[LiveFigure] = []
            ways: list[tuple[str, Callable[[], None], Document]] = [
                ("bokeh", partial(bokeh_rebuild, figures, pending, holders["bokeh"], fresh), rebuilt["bokeh"]),
                ("hv", partial(hv_rebuild, fresh, holders["hv"], renderer), rebuilt["hv"]),
                ("inplace", partial(in_place, figures), page),
            ]
            for key, change, doc in ways:
                secs, size = _timed(doc, change)
                rows[key].append(secs)
                rows[key + "_b"].append(size)
        for w in writers:
            w.close()
        for path in others:
            shutil.rmtree(path, ignore_errors=True)

    def med(k: str) -> float:
        return statistics.median(rows[k])

    print(f"dashboard refresh: {args.rows} bank rows x {DIM} dims, {args.metric_rows}+{args.new_rows}/round metric rows, "
          f"{len(figures)} figures, {args.rounds} rounds, load average {os.getloadavg()[0]:.1f}")
    print(f"  first full read + draw (worker thread + page): {first:.2f} s")
    print(f"  read per refresh (worker thread, off the event loop): median {med('read'):.2f} s")
    print("  on the event loop per refresh (median):")
    print(f"  {'way':<20}{'ms':>10}{'patch KiB':>12}{'vs in place':>14}")
    for name, k in (("HoloViews rebuild", "hv"), ("Bokeh rebuild", "bokeh"), ("in place", "inplace")):
        print(f"  {name:<20}{med(k) * 1000:>10.1f}{med(k + '_b') / 1024:>12.1f}{med(k) / med('inplace'):>13.1f}x")
    over = []
    for tab, view in ticked.items():
        what = f"{len(view.figures())} figures" + (f", {args.runs} runs" if tab == "comparison" else "")
        print(f"  {tab} tab (read on every tick; {what}):")
        print(f"    read per refresh (worker thread): median {med(tab + '_read') * 1000:.1f} ms")
        print(f"    {'way':<20}{'ms':>10}{'patch KiB':>12}{'vs in place':>14}{'vs run views':>14}")
        for name, k in (("HoloViews rebuild", "hv"), ("Bokeh rebuild", "bokeh"), ("in place", "inplace")):
            ms = med(f"{tab}_{k}") * 1000
            print(f"    {name:<20}{ms:>10.1f}{med(f'{tab}_{k}_b') / 1024:>12.1f}"
                  f"{med(f'{tab}_{k}') / med(f'{tab}_inplace'):>13.1f}x{med(f'{tab}_{k}') / med('inplace'):>13.2f}x")
        worst = max(rows[f"{tab}_inplace"]) * 1000
        print(f"    in place, worst round: {worst:.1f} ms (budget {EVENT_LOOP_BUDGET_MS:.0f} ms per tick)")
        if worst > EVENT_LOOP_BUDGET_MS:
            over.append(f"{tab} {worst:.1f} ms")
    if over:
        print(f"  OVER BUDGET on the event loop: {', '.join(over)}")


if __name__ == "__main__":
    main()
