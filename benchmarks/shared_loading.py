"""One data pass for co-located loops: the curriculum with separate loading against a node's shared loader.

The curriculum paradigm (``curriculum+clean``) on all 60,000 Fashion-MNIST training images (Debian's
``dataset-fashion-mnist``) with augmentation on (each epoch every image shifted by up to 2 pixels and
mirrored with probability 1/2), one trainer and two difficulty makers, all in this process
(:func:`carls_dask.runtime.run_inline`, deterministic), run three ways side by side:

- **separate** (``shared_loading="off"``): each loop loads the data set and augments what it needs itself (the trainer every
  image, each maker its half), as loops in processes of their own do: for this arm the in-process
  cache of the decoded data set is turned off, so each loop reads and converts Fashion-MNIST itself;
- **separate, one process**: the same with that cache on (loops in one process then share the read
  data set, and each still augments its own images);
- **shared**: ``shared_loading="on"`` (what the default ``"auto"`` picks for a run with makers): the first loop creates the node's shared loader, whose producer
  thread reads the data set once and augments each epoch once into shared memory; the other loops
  read views of it.

Printed per arm: the data-loading CPU seconds (thread CPU time of every loop around its loading and
augmentation code, plus the shared loader's producer thread), the ratio to the separate arm (target
<= 0.5), the process CPU time of the whole run, and whether the run's figures and the trainer's
evaluation history are identical to the separate arm's for the same seed. The arms run ``--repeats``
times, interleaved; CPU figures are medians over the repeats (CPU time on a busy shared machine
varies by tens of percent from run to run).
Run: ``python benchmarks/shared_loading.py [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import time
from collections.abc import Iterator
from typing import Any

TARGET_RATIO = 0.5
TIMING = {"trainer_seconds", "maker_staleness_s_mean"}


@contextlib.contextmanager
def _no_read_cache() -> Iterator[None]:
    """Each call of ``load_data`` reads the data set again, as a loop in a process of its own does."""
    from carls_dask.paradigms.curriculum import data as mod

    cached = mod._load
    mod._load = cached.__wrapped__  # type: ignore[assignment]
    try:
        yield
    finally:
        mod._load = cached


def _arm(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from carls_dask.paradigms.curriculum import data as mod
    from carls_dask.runtime import get_paradigm, run_inline

    torch.set_num_threads(1)
    mod._load.cache_clear()
    paradigm = get_paradigm("curriculum")
    kw: dict[str, Any] = {"augment": True, "makers": 2, "threads": 1, "shared_loading": "on" if name == "shared" else "off",
                          "seed": args.seed}
    if args.steps is not None:
        kw["steps"] = args.steps
    if args.n_train is not None:
        kw["n_train"] = args.n_train
    settings = paradigm.settings("curriculum+clean", **kw)
    t0, w0 = time.process_time(), time.perf_counter()
    with _no_read_cache() if name == "separate" else contextlib.nullcontext():
        res = run_inline(paradigm, settings)
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    loading = {n: float(r.value["loading_cpu_s"]) for n, r in res.results.items()}
    return {"arm": name, "loading": loading, "loading_total": sum(loading.values()), "process_cpu": cpu,
            "wall": wall, "figures": {k: v for k, v in res.figures.items() if k not in TIMING},
            "history": res.results["trainer"].value["history"]}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def eq(x: Any, y: Any) -> bool:
        return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))

    return (a["figures"].keys() == b["figures"].keys() and all(eq(a["figures"][k], b["figures"][k]) for k in a["figures"])
            and a["history"] == b["history"])


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run's results with CPU and wall figures replaced by their medians over ``runs``."""
    out = dict(runs[0])
    for k in ("loading_total", "process_cpu", "wall"):
        out[k] = statistics.median(r[k] for r in runs)
    out["loading"] = {n: statistics.median(r["loading"][n] for r in runs) for n in runs[0]["loading"]}
    out["repeatable"] = all(_same(r, runs[0]) for r in runs)
    out["all_loading_totals"] = [round(r["loading_total"], 2) for r in runs]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 epochs (1,407 steps) instead of the default 7,035")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--n-train", type=int, default=None, help="training images (default all 60,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each arm (interleaved); medians are printed")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
    if args.quick and args.steps is None:
        args.steps = 1407
    names = ("separate", "separate, one process", "shared")
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for _ in range(max(args.repeats, 1)):
        for name in names:
            runs[name].append(_arm(name, args))
    arms = [_median(runs[n]) for n in names]
    base = arms[0]
    print(f"curriculum+clean, Fashion-MNIST, augmentation on, 1 trainer + 2 makers in one process, "
          f"steps={args.steps or 'default'}, seed={args.seed}")
    print(f"{'arm':24} {'loading CPU s':>14} {'ratio':>7} {'process CPU s':>14} {'wall s':>8}  per loop  same result")
    for a in arms:
        per = ", ".join(f"{n} {v:.2f}" for n, v in a["loading"].items())
        same = _same(a, base) and a["repeatable"]
        print(f"{a['arm']:24} {a['loading_total']:14.2f} {a['loading_total'] / base['loading_total']:7.2f} "
              f"{a['process_cpu']:14.1f} {a['wall']:8.1f}  {per}  {'yes' if same else 'NO'}  "
              f"(runs: {a['all_loading_totals']})")
    shared = arms[-1]
    ratio = shared["loading_total"] / base["loading_total"]
    print(f"shared / separate data-loading CPU: {ratio:.2f} (target <= {TARGET_RATIO}: "
          f"{'met' if ratio <= TARGET_RATIO else 'NOT met'}); "
          f"shared / separate in one process: {shared['loading_total'] / arms[1]['loading_total']:.2f}; "
          f"test accuracy {shared['figures']['test_accuracy']:.4f} in every arm: "
          f"{'yes' if all(_same(a, base) and a['repeatable'] for a in arms) else 'NO'}")
    if args.json:
        print(json.dumps([{k: v for k, v in a.items() if k != "history"} for a in arms], default=float))


if __name__ == "__main__":
    main()
