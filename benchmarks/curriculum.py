"""Curriculum learning on all of Fashion-MNIST under symmetric label noise, against the same model on clean labels.

Every arm trains the paradigm's default model (see ``CurriculumSettings``) with the same optimiser, steps
and batch size on the 60,000 training images of Fashion-MNIST (Debian's ``dataset-fashion-mnist``),
whose training labels get symmetric noise (``--noise``, default 30 % and 50 %), and is measured on the
10,000 test images with their true labels. The arms differ only in which examples the trainer draws
and with which label:

- **clean**: uniform sampling on the true labels (no noise): the ceiling the noisy arms are compared to;
- **uniform**: every batch uniformly from all examples with their noisy labels (the baseline);
- **curriculum**: the maker scores every example with each new model version (loss of the given
  label) and the trainer draws from the easiest share of each class (see the paradigm's variants);
- **curriculum+clean**: the same, and examples whose given label the makers reject with confidence in
  consecutive rounds are no longer drawn.

Runs are in-process and deterministic (:func:`carls_dask.runtime.run_inline` of the ``curriculum``
paradigm's variants with their default settings), ``--jobs`` at a time. Printed per noise rate: clean
test accuracy, mean ± sample std over ``--seeds`` seeds, every seed's figure, the gap to the clean arm,
and for the cleaning arm the precision and recall of the noisy-label detection against the known
flipped labels. Targets: the best noisy arm within 3 points of clean at 30 % noise, within 6 at 50 %.
The anchor: the Fashion-MNIST maintainers' benchmark puts a clean-label MLP at about 90 %.

Hyper-parameters are chosen on a validation split of the noisy training labels with other seeds:
``--holdout 0.1 --first-seed 100`` holds 10 % of the training images out and prints the accuracy on
them against their noisy labels (``val``), which is what choices are made on.
Run: ``python benchmarks/curriculum.py [--quick]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import statistics
import time
from typing import Any

NOISY_ARMS = ("uniform", "curriculum", "curriculum+clean")  # variants of the curriculum paradigm
#: Points the best noisy arm may trail the clean arm by, per noise rate.
TARGET_GAP = {0.3: 3.0, 0.5: 6.0}
#: The cleaning arm's ``clean_confidence`` per noise rate, chosen on the validation split (seed 100): a model
#: fitted to labels with noise rate r predicts the true class with probability about 1 - r, so the
#: confidence that rejects a given label falls as the noise grows. Other rates use the settings' default.
CLEAN_CONFIDENCE = {0.3: 0.9, 0.5: 0.6}
#: Fashion-MNIST maintainers' benchmark: a multi-layer perceptron on clean labels reaches about 90 %.
ANCHOR = 0.90


def _one(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from carls_dask.runtime import get_paradigm, run_inline

    paradigm = get_paradigm("curriculum")
    settings = paradigm.settings(job["variant"], **job["settings"])
    res = run_inline(paradigm, settings)
    f = res.figures
    keys = ("test_accuracy", "val_accuracy", "val_accuracy_clean", "flag_precision", "flag_recall",
            "flagged_fraction", "label_accuracy", "noise_estimate")
    return {"arm": job["arm"], "noise": settings.noise, "seed": settings.seed, "seconds": res.wall_seconds,
            **{k: float(f.get(k, math.nan)) for k in keys}}


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _fmt(values: list[float]) -> str:
    mean, sd = _mean_sd(values)
    return f"{100 * mean:5.1f} ± {100 * sd:4.1f}"


def _jobs(args: argparse.Namespace) -> list[dict[str, Any]]:
    base: dict[str, Any] = {"threads": 1, "holdout": args.holdout}
    if args.n_train is not None:
        base["n_train"] = args.n_train
    if args.n_test is not None:
        base["n_test"] = args.n_test
    if args.steps is not None:
        base["steps"] = args.steps
    base.update(json.loads(args.set))
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = [{"arm": "clean", "variant": "uniform", "settings": {**base, "noise": 0.0, "seed": s}} for s in seeds]
    extra = json.loads(args.set)

    def arm_settings(arm: str, noise: float) -> dict[str, Any]:
        if arm == "curriculum+clean" and noise in CLEAN_CONFIDENCE and "clean_confidence" not in extra:
            return {"clean_confidence": CLEAN_CONFIDENCE[noise]}
        return {}

    jobs += [{"arm": arm, "variant": arm, "settings": {**base, "noise": noise, "seed": s, **arm_settings(arm, noise)}}
             for noise in args.noise for s in seeds for arm in NOISY_ARMS]
    return jobs


def _print_table(noise: float, results: list[dict[str, Any]], clean: dict[int, float], holdout: bool) -> None:
    rows = {arm: [r for r in results if r["noise"] == noise and r["arm"] == arm] for arm in NOISY_ARMS}
    clean_mean = statistics.fmean(clean.values())
    print(f"\nsymmetric noise {noise:.0%}: clean test accuracy (%), mean ± std over {len(clean)} seeds")
    val = f"{'val (noisy)':>13}  " if holdout else ""
    print(f"{'arm':<18} {'test':>13}  {val}{'gap to clean':>13}  {'per seed':<20} {'flag prec/rec':>13} {'s/run':>6}")
    print(f"{'clean labels':<18} {_fmt(list(clean.values())):>13}  {'':>{len(val)}}{'':>13}  "
          f"{' '.join(f'{100 * a:.1f}' for a in clean.values()):<20} {'':>13}   (anchor: MLP ~{100 * ANCHOR:.0f})")
    best = None
    for arm, rs in rows.items():
        acc = [r["test_accuracy"] for r in rs]
        gaps = [clean[r["seed"]] - r["test_accuracy"] for r in rs]
        flags = ""
        if arm.endswith("clean"):
            flags = (f"{statistics.fmean(r['flag_precision'] for r in rs):.2f}/"
                     f"{statistics.fmean(r['flag_recall'] for r in rs):.2f}")
        v = f"{_fmt([r['val_accuracy'] for r in rs]):>13}  " if holdout else ""
        print(f"{arm:<18} {_fmt(acc):>13}  {v}{_fmt(gaps):>13}  {' '.join(f'{100 * a:.1f}' for a in acc):<20} "
              f"{flags:>13} {statistics.fmean(r['seconds'] for r in rs):6.1f}")
        if best is None or statistics.fmean(acc) > best[1]:
            best = (arm, statistics.fmean(acc))
    if best is not None and noise in TARGET_GAP:
        gap = 100 * (clean_mean - best[1])
        verdict = "met" if gap <= TARGET_GAP[noise] else "NOT met"
        print(f"target: best arm within {TARGET_GAP[noise]:g} points of clean at {noise:.0%} noise: {verdict} "
              f"({best[0]}, {gap:.1f} points below clean {100 * clean_mean:.1f}; anchor {100 * ANCHOR:.0f})")


def main() -> None:
    from carls_dask.paradigms.data.fashion_mnist import fashion_mnist_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--noise", type=float, nargs="+", default=[0.3, 0.5])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed, first-seed + 1, ...")
    ap.add_argument("--holdout", type=float, default=0.0,
                    help="hold this share of the training images out as a (noisy) validation split")
    ap.add_argument("--n-train", type=int, default=None, help="training images (default: the settings', all)")
    ap.add_argument("--n-test", type=int, default=None, help="test images (default: the settings', all)")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps (default: the settings')")
    ap.add_argument("--set", default="{}", help='further settings for every arm, as JSON: \'{"dropout": 0.2}\'')
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="10,000 train / 5,000 test images, 30%% noise, 2 seeds")
    ap.add_argument("--out", default=None, help="write every run's figures to this JSON file")
    args = ap.parse_args()
    if args.quick:
        args.noise, args.seeds = [0.3], 2
        args.n_train = args.n_train or 10_000
        args.n_test = args.n_test or 5_000
    if fashion_mnist_dir() is None:
        raise SystemExit("Fashion-MNIST is not installed: apt-get install dataset-fashion-mnist")
    jobs = _jobs(args)
    print(f"Fashion-MNIST: {args.n_train or 'all'} train / {args.n_test or 'all'} test images, "
          f"holdout {args.holdout:g}, seeds {args.first_seed}..{args.first_seed + args.seeds - 1}, {len(jobs)} runs, "
          f"{args.jobs} at a time; load average {os.getloadavg()[0]:.1f}")
    t0 = time.monotonic()
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(_one, jobs))
    wall = time.monotonic() - t0
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), "runs": results}, fh, indent=2)
    clean = {r["seed"]: r["test_accuracy"] for r in results if r["arm"] == "clean"}
    for noise in args.noise:
        _print_table(noise, results, clean, args.holdout > 0)
    print(f"\nwall time {wall:.0f}s; load average now {os.getloadavg()[0]:.1f} (2 cores, shared)")


if __name__ == "__main__":
    main()
