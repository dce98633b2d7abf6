"""Multimodal benchmark: in-batch negatives vs bank negatives (uniform, hard), side by side.

Every variant trains the same dual encoder (same batch size, steps, seeds) on the OpenMoji
image-text pairs, with a corpus maker refreshing the bank's embeddings while it trains. Besides
the 300 held-out test concepts, ``--n-val`` further concepts are held out of training as a
validation split: settings are chosen on it (the variant with the best mean of the four
validation recalls) and the test figures are read for the record. It prints image->text and
text->image recall@1/@5 on both splits (mean and standard deviation over the seeds, every seed's
figure too), trainer steps/s, maker rounds and staleness, each bank variant's mean recall as a
ratio to the in-batch baseline, and a paired per-seed comparison (same seed: same initialisation,
same batches) of each variant against in-batch. Every run is the ``multimodal`` paradigm
(:class:`carls_dask.paradigms.multimodal.paradigm.Multimodal`) run by
:func:`carls_dask.runtime.run_paradigm` on one shared two-worker LocalCluster, all seeds on one
concept split (``split_seed=0``), without the concept classifier.

A variant is ``NEGATIVES[@N][+stale][+logq]``: ``in_batch``, ``uniform``, ``log_uniform`` or
``hard``; ``@N`` sets the sampled (or, for ``hard``, top-k) negatives per step; ``+stale`` uses the
bank's stored embeddings instead of encoding the drawn negatives with the current model;
``+logq`` switches on the logQ correction of sampled negatives.

    python benchmarks/multimodal.py                       # 3 seeds x the default variants, 800 steps
    python benchmarks/multimodal.py --steps 400 --seeds 5 --variants in_batch uniform@1024 hard+stale
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import pathlib
import statistics
import time

METRICS = ("i2t_r@1", "i2t_r@5", "t2i_r@1", "t2i_r@5")
NAMES = ("in_batch", "uniform", "log_uniform", "hard")
VARIANTS = {"in_batch": "in-batch", "uniform": "uniform", "log_uniform": "log-uniform", "hard": "hard"}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One benchmark variant, parsed from ``NEGATIVES[@N][+stale][+logq]``."""

    label: str
    negatives: str
    count: int | None
    reencode: bool
    logq: bool


def parse_variant(text: str) -> Variant:
    """Parse a variant string; raises ``ValueError`` naming what was given and what is expected."""
    head, *flags = text.split("+")
    name, _, count = head.partition("@")
    bad = [f for f in flags if f not in ("stale", "logq")]
    if name not in NAMES or bad or (count and not count.isdigit()) or (name == "in_batch" and (count or flags)):
        raise ValueError(f"variant {text!r}: expected NEGATIVES[@N][+stale][+logq] with NEGATIVES one of {NAMES} "
                         "(in_batch takes no @N or flags)")
    return Variant(text, name, int(count) if count else None, "stale" not in flags, "logq" in flags)


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", default=["in_batch", "uniform", "hard", "uniform+logq", "uniform+stale"],
                   help="variants NEGATIVES[@N][+stale][+logq] (see the module docstring)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per variant (>= 3 for the report)")
    p.add_argument("--first-seed", type=int, default=0, help="seeds run are first-seed .. first-seed + seeds - 1")
    p.add_argument("--steps", type=int, default=800, help="trainer steps per run")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--n-negatives", type=int, default=256, help="sampled bank negatives per step (unless @N)")
    p.add_argument("--n-hard", type=int, default=8, help="hard (top-k) bank negatives per query (unless @N)")
    p.add_argument("--limit", type=int, default=None, help="concepts to keep (default: all)")
    p.add_argument("--n-test", type=int, default=300, help="held-out test concepts")
    p.add_argument("--n-val", type=int, default=300, help="validation concepts held out of training")
    p.add_argument("--cache-dir", default=None, help="image and feature cache (default: carls.data.dir or ~/.cache)")
    p.add_argument("--json", type=pathlib.Path, default=None, help="also write every figure to this file")
    return p.parse_args()


def _fmt(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f}±{sd:.3f}"


def _table(rows: list[dict[str, object]], variants: list[Variant], prefix: str, title: str) -> None:
    print(f"\n{title}")
    print(f"{'variant':<18}" + "".join(f"{m:>14}" for m in METRICS) + f"{'steps/s':>14}{'staleness s':>14}")
    for v in variants:
        mine = [r for r in rows if r["variant"] == v.label]
        cells = "".join(f"{_fmt([float(r[prefix + m]) for r in mine]):>14}" for m in METRICS)  # type: ignore[arg-type]
        cells += "".join(f"{_fmt([float(r[m]) for r in mine]):>14}" for m in ("steps_per_s", "staleness_s"))  # type: ignore[arg-type]
        print(f"{v.label:<18}{cells}")


def _paired(rows: list[dict[str, object]], variants: list[Variant], prefix: str, title: str) -> None:
    """Per-seed differences against in-batch (same seed), their mean, and the seeds won."""
    base = {r["seed"]: r for r in rows if r["variant"] == "in_batch"}
    if not base:
        return
    print(f"\n{title}: mean of (variant - in_batch) over seeds [seeds where variant > in_batch]; ratio of means")
    for v in variants:
        if v.label == "in_batch":
            continue
        mine = [r for r in rows if r["variant"] == v.label and r["seed"] in base]
        cells = ""
        for m in METRICS:
            d = [float(r[prefix + m]) - float(base[r["seed"]][prefix + m]) for r in mine]  # type: ignore[arg-type]
            b = statistics.mean(float(base[r["seed"]][prefix + m]) for r in mine)  # type: ignore[arg-type]
            a = statistics.mean(float(r[prefix + m]) for r in mine)  # type: ignore[arg-type]
            cells += f"  {m} {statistics.mean(d):+.3f} [{sum(x > 0 for x in d)}/{len(d)}] {a / b if b else float('nan'):.2f}x"
        sps = statistics.mean(float(r["steps_per_s"]) for r in mine)  # type: ignore[arg-type]
        bsps = statistics.mean(float(base[r["seed"]]["steps_per_s"]) for r in mine)  # type: ignore[arg-type]
        print(f"{v.label:<18}{cells}  steps/s {sps / bsps:.2f}x")


def _figure(figures: dict[str, object], name: str) -> float:
    value = figures.get(name)
    return float("nan") if value is None else float(value)  # type: ignore[arg-type]


def main() -> None:
    import os

    from distributed import Client, LocalCluster

    from carls_dask.paradigms.multimodal.loops import load_corpus
    from carls_dask.paradigms.multimodal.paradigm import Multimodal
    from carls_dask.runtime import run_paradigm

    args = _args()
    variants = [parse_variant(v) for v in args.variants]
    logging.basicConfig(level=logging.WARNING)
    paradigm = Multimodal()
    # one concept split (split_seed 0) for every seed: the seeds vary initialisation, batches and samples
    base = paradigm.prepare(paradigm.settings(
        None, steps=args.steps, batch_size=args.batch_size, limit=args.limit, n_test=args.n_test, n_val=args.n_val,
        split_seed=0, classifier_steps=0, eval_every=None, cache_dir=args.cache_dir))
    t0 = time.perf_counter()
    c = load_corpus(base.corpus())  # fills the caches once, before the workers read them
    print(f"corpus: {len(c.train)} train pairs, {len(c.val)} validation and {len(c.test)} test concepts "
          f"(chance R@1 {1 / len(c.test):.4f}), prepared in {time.perf_counter() - t0:.1f}s; load {os.getloadavg()}")
    rows: list[dict[str, object]] = []
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0") as lc, \
            Client(lc) as client:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for v in variants:
                t = time.perf_counter()
                settings = dataclasses.replace(
                    base, negatives=v.negatives, seed=seed, reencode=v.reencode, logq_correction=v.logq,
                    n_negatives=v.count if v.count and v.negatives != "hard" else args.n_negatives,
                    n_hard=v.count if v.count and v.negatives == "hard" else args.n_hard)
                r = run_paradigm(paradigm, settings, variant=VARIANTS[v.negatives], cluster=client, progress=False)
                f = r.figures
                row = {"variant": v.label, "seed": seed, "steps_per_s": _figure(f, "steps_per_s"),
                       "maker_rounds": f["maker_rounds"], "staleness_s": _figure(f, "mean_staleness_s"),
                       "wall_s": time.perf_counter() - t, "bank_steps": f.get("bank_steps"),
                       **{p + m: _figure(f, p + m) for p in ("val_", "") for m in METRICS}}
                rows.append(row)
                print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
    print(f"\n{args.seeds} seeds, {args.steps} steps, batch {args.batch_size}, {args.n_negatives} sampled / "
          f"{args.n_hard} hard bank negatives unless @N; load {os.getloadavg()}")
    if args.n_val:
        _table(rows, variants, "val_", f"validation ({len(c.val)} concepts), mean±std over seeds")
        score = {v.label: statistics.mean(float(r["val_" + m]) for r in rows if r["variant"] == v.label  # type: ignore[arg-type]
                                          for m in METRICS) for v in variants}
        print(f"chosen on validation (best mean of the four recalls): {max(score, key=score.__getitem__)}")
    _table(rows, variants, "", f"test ({len(c.test)} concepts), mean±std over seeds")
    if args.n_val:
        _paired(rows, variants, "val_", "paired per seed, validation")
    _paired(rows, variants, "", "paired per seed, test")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=2,
                                        default=str))


if __name__ == "__main__":
    main()
