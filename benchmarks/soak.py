"""Soak: trainers, makers and a logged bank on a LocalCluster for a set time; nothing lost, memory flat.

On a 2-worker LocalCluster a Workbench runs digits trainers and makers (``carls_dask.examples.digits``)
with a bank whose every write goes to the delta log. Besides their own work each loop writes a
ledger batch per step (trainer) or round (maker) into its own key range of a ``soak`` table and
keeps, for every key, the step of its last acknowledged write. Meanwhile the driver snapshots the
bank every ``--snapshot-every`` seconds (pruning old snapshots and covered log segments) and samples
the workers' resident memory.

At the end it checks, key by key, that the bank holds exactly each loop's last acknowledged write
(lost = keys whose bank row is older), then restores a fresh bank from the newest snapshot plus the
delta log and checks it the same way. Memory growth is the change of the workers' summed RSS from
the first to the last quarter of the second half of the run, relative to the first.

Prints steps/s, writes acknowledged, lost (live and restored), RSS start/peak/end, growth and the
number of snapshots, a PASS/FAIL line per check (those ``tests/test_soak.py`` asserts on a 30-second
run), and (``--json``) writes the figures to a file.
Run: ``python benchmarks/soak.py [--minutes 30] [--trainers 1] [--makers 1]``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from carls_dask.examples.digits import DigitsMaker, DigitsTrainer, digits_table
from carls_dask.runtime.channel import ModelVersion
from carls_dask.storage.runfolder import RunFolder

SOAK = "soak"
WIDTH = 8
RANGE = 4096  # ledger keys per loop
BATCH = 64  # ledger keys written per trainer step


def soak_table() -> Any:
    from carls_dask.bank.schema import Column, TableSpec

    return TableSpec(SOAK, columns=(
        Column("value", dtype="float32", shape=(WIDTH,), dims=("w",)),
        Column("step", dtype="int64", shape=(), dims=()),
    ), optimizer=None)


def ledger_values(keys: np.ndarray, step: int | np.ndarray) -> np.ndarray:
    """The rows a write of ``step`` (one per key, or one for all) puts at ``keys`` (exact in float32)."""
    j = np.arange(WIDTH, dtype=np.int64)
    steps = np.broadcast_to(np.asarray(step, dtype=np.int64), keys.shape)
    return ((keys[:, None] * 31 + steps[:, None] * 7 + j) % 10007).astype(np.float32)


class Ledger:
    """One loop's record of its acknowledged writes: the step of the last one per key (-1: none)."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.keys = np.arange(base, base + RANGE, dtype=np.int64)
        self.last = np.full(RANGE, -1, dtype=np.int64)
        self.writes = 0

    def write(self, bank: Any, keys: np.ndarray, step: int, maker: str) -> None:
        bank.update(SOAK, keys, {"value": ledger_values(keys, step), "step": np.full(keys.size, step)},
                    model_step=step, maker=maker)
        self.last[keys - self.base] = step  # only after the bank acknowledged the batch
        self.writes += 1

    def result(self) -> dict[str, Any]:
        return {"base": self.base, "last": self.last, "writes": self.writes}


class SoakTrainer(DigitsTrainer):
    """A digits trainer that also writes a ledger batch per step."""

    def __init__(self, name: str, base: int, **kwargs: Any) -> None:
        super().__init__(name, max_steps=None, **kwargs)
        self.base = base

    def setup(self, ctx: Any) -> None:
        super().setup(ctx)
        self.ledger = Ledger(self.base)
        self.draw = np.random.default_rng(self.base)

    def step(self, step: int) -> Mapping[str, float]:
        out = dict(super().step(step))
        keys = self.ledger.keys[self.draw.choice(RANGE, size=BATCH, replace=False)]
        assert self.ctx is not None
        self.ledger.write(self.ctx.bank, keys, step, self.name)
        return out

    def finish(self) -> dict[str, Any]:
        return {**super().finish(), "ledger": self.ledger.result()}


class SoakMaker(DigitsMaker):
    """A digits maker that also writes a ledger batch (its whole range) per round."""

    def __init__(self, name: str, base: int, **kwargs: Any) -> None:
        super().__init__(name, final_pass=False, **kwargs)
        self.base = base

    def setup(self, ctx: Any) -> None:
        super().setup(ctx)
        self.ledger = Ledger(self.base)

    def make(self, version: ModelVersion) -> Mapping[str, float]:
        out = dict(super().make(version) or {})
        assert self.ctx is not None
        self.ledger.write(self.ctx.bank, self.ledger.keys, int(version.step), self.name)
        return out

    def finish(self) -> dict[str, Any]:
        return {"ledger": self.ledger.result()}


def worker_rss() -> int:
    """Resident set size of the calling worker process (bytes)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def lost_writes(bank: Any, ledgers: list[dict[str, Any]]) -> tuple[int, int]:
    """``(lost, checked)``: keys whose bank row is not their loop's last acknowledged write."""
    lost = checked = 0
    for led in ledgers:
        last = np.asarray(led["last"])
        written = np.flatnonzero(last >= 0)
        if not written.size:
            continue
        keys = np.int64(led["base"]) + written.astype(np.int64)
        got = bank.lookup(SOAK, keys)
        want = last[written]
        same = got.found & (got.values["step"] == want)
        same &= (got.values["value"] == ledger_values(keys, want)).all(axis=1)
        lost += int((~same).sum())
        checked += int(written.size)
    return lost, checked


def growth(samples: list[tuple[float, int]]) -> float:
    """Relative RSS change over the second half: last quarter's median vs. the third quarter's."""
    n = len(samples)
    if n < 8:
        return float("nan")
    third = [r for _, r in samples[n // 2 : 3 * n // 4]]
    fourth = [r for _, r in samples[3 * n // 4 :]]
    return (statistics.median(fourth) - statistics.median(third)) / statistics.median(third)


def run(minutes: float, *, trainers: int = 1, makers: int = 1, snapshot_every: float = 30.0,
        sample_every: float = 5.0, workdir: str | pathlib.Path | None = None, log: Any = print) -> dict[str, Any]:
    """Run the soak and return its figures (see the module docstring)."""
    from carls_dask.bank.client import KnowledgeBank
    from carls_dask.runtime import Workbench
    from carls_dask.storage.bankstore import prune_snapshots

    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="carls-soak-")
        workdir = tmp.name
    root = str(RunFolder(workdir).bank)
    threads = trainers + makers
    n_workers = 2
    per_worker = -(-threads // n_workers)
    samples: list[tuple[float, int]] = []
    snapshots = 0
    out: dict[str, Any] = {"minutes": minutes, "trainers": trainers, "makers": makers}
    try:
        with Workbench(progress=False, cluster_options={"n_workers": n_workers,
                                                        "threads_per_worker": per_worker}) as wb:
            wb.create_bank([digits_table(), soak_table()], n_shards=2, placement="spread", log_root=root)
            bank = wb.bank
            names = []
            for i in range(trainers):
                wb.submit_trainer(SoakTrainer(f"trainer{i}", base=(1 + i) * 10 * RANGE, publish_every=25))
                names.append(f"trainer{i}")
            for i in range(makers):
                wb.submit_maker(SoakMaker(f"maker{i}", base=(100 + i) * 10 * RANGE,
                                          source=f"trainer{i % max(1, trainers)}"))
            start = time.monotonic()
            end = start + 60.0 * minutes
            next_snap = start + snapshot_every
            next_log = start + 60.0
            while (now := time.monotonic()) < end:
                rss = wb.client.run(worker_rss)
                samples.append((now - start, int(sum(rss.values()))))
                if now >= next_snap:
                    bank.snapshot(root, step=snapshots + 1)
                    snapshots += 1
                    prune_snapshots(root, keep=2)  # and the delta-log segments the kept snapshots cover
                    next_snap = now + snapshot_every
                if now >= next_log:
                    steps = {n: wb.status()[n].progress.get("step", 0) for n in names}
                    log(f"[soak] {(now - start) / 60:.1f} min: steps {steps}, rss {samples[-1][1] / 2**20:.0f} MiB, "
                        f"snapshots {snapshots}")
                    next_log = now + 60.0
                failed = [n for n, s in wb.status().items() if s.state == "failed"]
                if failed:
                    break
                time.sleep(min(sample_every, max(0.0, end - time.monotonic())))
            results = wb.stop(timeout=120)
            ledgers = [r.value["ledger"] for r in results.values()]
            out["steps"] = int(sum(results[n].steps for n in names))
            out["steps_per_s"] = float(sum(results[n].steps / results[n].elapsed for n in names))
            out["maker_rounds"] = int(sum(r.steps for n, r in results.items() if n not in names))
            out["writes_acknowledged"] = int(sum(led["writes"] for led in ledgers))
            out["lost"], out["keys_checked"] = lost_writes(bank, ledgers)
            out["test_accuracy"] = float(results[names[0]].value["test_accuracy"]) if names else float("nan")
            bank.close()  # releases the log writers; the restore below reads snapshot + log
            restored = KnowledgeBank.restore(wb.client, root, n_shards=2)
            try:
                out["lost_after_restore"], _ = lost_writes(restored, ledgers)
            finally:
                restored.close()
    finally:
        if tmp is not None:
            tmp.cleanup()
    rss = [r for _, r in samples]
    warm_at = min(60.0, 15.0 * minutes)  # workers have imported torch and built their models by then
    warm = [r for t, r in samples if t >= warm_at] or rss
    out.update({
        "snapshots": snapshots,
        "rss_start_mib": rss[0] / 2**20 if rss else float("nan"),
        "rss_warm_mib": warm[0] / 2**20 if warm else float("nan"),
        "rss_peak_mib": max(rss) / 2**20 if rss else float("nan"),
        "rss_end_mib": rss[-1] / 2**20 if rss else float("nan"),
        "rss_growth_second_half": growth(samples),
        "rss_samples": len(rss),
    })
    return out


def report(fig: Mapping[str, Any]) -> str:
    return "\n".join([
        f"soak {fig['minutes']:g} min, {fig['trainers']} trainer(s) + {fig['makers']} maker(s), 2 workers",
        f"  trainer steps        {fig['steps']} ({fig['steps_per_s']:.1f} steps/s), maker rounds {fig['maker_rounds']}",
        f"  writes acknowledged  {fig['writes_acknowledged']} (ledger keys checked {fig['keys_checked']})",
        f"  lost                 {fig['lost']} live, {fig['lost_after_restore']} after restore (snapshot + log)",
        f"  snapshots taken      {fig['snapshots']}",
        f"  worker RSS (sum)     start {fig['rss_start_mib']:.0f} MiB, warm {fig['rss_warm_mib']:.0f} MiB, "
        f"peak {fig['rss_peak_mib']:.0f} MiB, "
        f"end {fig['rss_end_mib']:.0f} MiB; second-half growth {100 * fig['rss_growth_second_half']:+.1f}%",
        f"  test accuracy        {fig['test_accuracy']:.3f}",
    ])


def checks(fig: Mapping[str, Any], snapshot_every: float, sample_every: float = 5.0) -> list[tuple[str, bool, str]]:
    """The soak's verdicts, as ``tests/test_soak.py`` asserts them on a short run: ``(what, passed, figure)``.

    Snapshots are taken between memory samples, so they come every ``max(snapshot_every, sample_every)``
    seconds at most.
    """
    expected_snapshots = int(60.0 * fig["minutes"] / max(snapshot_every, sample_every)) - 1  # one may fall after the end
    loops = fig["trainers"] + fig["makers"]
    return [
        ("no acknowledged write lost (live)", fig["lost"] == 0, f"{fig['lost']}"),
        ("no acknowledged write lost (snapshot + log)", fig["lost_after_restore"] == 0, f"{fig['lost_after_restore']}"),
        (f"every loop's {RANGE} ledger keys checked", fig["keys_checked"] >= RANGE * loops, f"{fig['keys_checked']}"),
        (f"snapshots taken >= {expected_snapshots}", fig["snapshots"] >= expected_snapshots, f"{fig['snapshots']}"),
        ("makers ran >= 2 rounds", fig["maker_rounds"] >= 2 or not fig["makers"], f"{fig['maker_rounds']}"),
        ("worker memory growth over the second half < 10 %", fig["rss_growth_second_half"] < 0.10,
         f"{100 * fig['rss_growth_second_half']:+.1f}%"),
    ]


def main() -> None:
    import os

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--trainers", type=int, default=1)
    parser.add_argument("--makers", type=int, default=1)
    parser.add_argument("--snapshot-every", type=float, default=30.0, help="seconds between snapshots")
    parser.add_argument("--dir", default=None, help="bank store folder (default: a temporary one)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()}", flush=True)
    fig = run(args.minutes, trainers=args.trainers, makers=args.makers, snapshot_every=args.snapshot_every,
              workdir=args.dir, log=lambda m: print(m, flush=True))
    print(report(fig))
    for what, ok, got in checks(fig, args.snapshot_every):
        print(f"  {'PASS' if ok else 'FAIL'}  {what:52s} {got}")
    print(f"load: {os.getloadavg()}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(fig, indent=2))


if __name__ == "__main__":
    main()
