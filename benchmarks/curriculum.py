"""Curriculum learning under label noise: uniform sampling vs curriculum vs curriculum + label cleaning.

Every arm trains the same model (an MLP, or ``--model cnn``) with the same optimiser, steps and batch
size on the same seeded subset of Fashion-MNIST (Debian's ``dataset-fashion-mnist``; scikit-learn
digits when it is absent), whose training labels get symmetric noise (``--noise``, default 30% and 50%);
the test set stays clean. The arms differ only in which examples the trainer draws and with which label:

- **uniform**: every batch uniformly from all examples (the baseline);
- **curriculum**: the maker scores every example with each new model version (loss of the given
  label) and the trainer draws from the easiest share of each class, linearly growing to all;
- **curriculum+clean**: the same, and examples whose given label the makers rejected with
  confidence >= ``--clean-confidence`` in two consecutive rounds get loss weight 0 (they are no
  longer drawn); ``--clean-mode relabel`` relabels them with the prediction instead.

Runs are in-process and deterministic (:func:`carls_dask.runtime.run_inline` of the ``curriculum``
paradigm's variants), ``--jobs`` at a time. Printed per noise rate: clean test accuracy, mean and spread (sample std) over ``--seeds``
seeds, every seed's figure, the paired gain over uniform, and for the cleaning arm the precision and
recall of the noisy-label detection against the known flipped labels. The target: curriculum+clean
beats uniform at 30% noise by several points. Run: ``python benchmarks/curriculum.py [--quick]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import time
from typing import Any

ARMS = ("uniform", "curriculum", "curriculum+clean")  # variants of the curriculum paradigm
TARGET_POINTS = 3.0


def _one(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from carls_dask.runtime import get_paradigm, run_inline

    paradigm = get_paradigm("curriculum")
    settings = paradigm.settings(job["arm"], **job["settings"])
    res = run_inline(paradigm, settings)
    f = res.figures
    return {"arm": job["arm"], "noise": settings.noise, "seed": settings.seed, "seconds": res.wall_seconds,
            "test_accuracy": f["test_accuracy"], "flag_precision": f["flag_precision"],
            "flag_recall": f["flag_recall"], "flagged_fraction": f["flagged_fraction"],
            "label_accuracy": f["label_accuracy"]}


def _fmt(values: list[float]) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * mean:5.1f} ± {100 * sd:4.1f}"


def main() -> None:
    from carls_dask.paradigms.data.fashion_mnist import fashion_mnist_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--noise", type=float, nargs="+", default=[0.3, 0.5])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--n-train", type=int, default=4000)
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--clean-confidence", type=float, default=0.6)
    ap.add_argument("--clean-mode", choices=["downweight", "relabel"], default="downweight")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one noise rate (30%%), 2 seeds, 600 steps")
    ap.add_argument("--out", default=None, help="write every run's figures to this JSON file")
    args = ap.parse_args()
    if args.quick:
        args.noise, args.seeds, args.steps = [0.3], 2, 600
    dataset = "fashion-mnist" if fashion_mnist_dir() is not None else "digits"
    if dataset == "digits":
        print("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist): using scikit-learn digits")
    base = {"dataset": dataset, "n_train": args.n_train, "n_test": args.n_test, "steps": args.steps,
            "model": args.model, "clean_confidence": args.clean_confidence}
    jobs = [{"arm": arm, "settings": {**base, "noise": noise, "seed": seed,
                                      **({"clean": args.clean_mode} if arm == "curriculum+clean" else {})}}
            for noise in args.noise for seed in range(args.seeds) for arm in ARMS]
    print(f"{dataset}: {args.n_train} train / {args.n_test} test images, {args.model}, {args.steps} steps of 128, "
          f"{args.seeds} seeds, {len(jobs)} runs, {args.jobs} at a time; load average {os.getloadavg()[0]:.1f}")
    t0 = time.monotonic()
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(_one, jobs))
    wall = time.monotonic() - t0
    for noise in args.noise:
        rows = {arm: [r for r in results if r["noise"] == noise and r["arm"] == arm] for arm in ARMS}
        base_acc = {r["seed"]: r["test_accuracy"] for r in rows["uniform"]}
        print(f"\nsymmetric noise {noise:.0%}: clean test accuracy (%), mean ± std over {args.seeds} seeds")
        print(f"{'arm':<18} {'accuracy':>13}  {'gain vs uniform':>16}  {'per seed':<24} {'flag prec/rec':>14} "
              f"{'s/run':>6}")
        for arm, rs in rows.items():
            acc = [r["test_accuracy"] for r in rs]
            gains = [r["test_accuracy"] - base_acc[r["seed"]] for r in rs]
            gain = "" if arm == "uniform" else _fmt(gains)
            flags = ""
            if arm.endswith("clean"):
                flags = (f"{statistics.fmean(r['flag_precision'] for r in rs):.2f}/"
                         f"{statistics.fmean(r['flag_recall'] for r in rs):.2f}")
            seeds = " ".join(f"{100 * a:.1f}" for a in acc)
            print(f"{arm:<18} {_fmt(acc):>13}  {gain:>16}  {seeds:<24} {flags:>14} "
                  f"{statistics.fmean(r['seconds'] for r in rs):6.1f}")
        if noise == 0.3:
            gains = [r["test_accuracy"] - base_acc[r["seed"]] for r in rows["curriculum+clean"]]
            verdict = "met" if statistics.fmean(gains) * 100 >= TARGET_POINTS else "NOT met"
            print(f"target: curriculum+clean >= uniform + {TARGET_POINTS:g} points at 30% noise: {verdict} "
                  f"({100 * statistics.fmean(gains):+.1f} points)")
    print(f"\nwall time {wall:.0f}s; load average now {os.getloadavg()[0]:.1f}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), "dataset": dataset, "runs": results}, fh, indent=2)


if __name__ == "__main__":
    main()
