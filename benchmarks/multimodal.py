"""Multimodal benchmark: in-batch negatives vs bank negatives (uniform, hard), side by side.

Every variant trains the same dual encoder (same batch size, steps, seeds) on the OpenMoji
image-text pairs, with a corpus maker refreshing the bank's embeddings while it trains. It prints
image->text and text->image recall@1/@5 on the held-out concepts' pairs (mean and standard
deviation over the seeds, every seed's figure too), trainer steps/s, maker rounds and staleness,
and each bank variant's recall as a ratio to the in-batch baseline.

    python benchmarks/multimodal.py                       # 3 seeds x in_batch, uniform, hard
    python benchmarks/multimodal.py --steps 600 --seeds 5 --variants in_batch hard log_uniform
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import statistics
import time

METRICS = ("i2t_r@1", "i2t_r@5", "t2i_r@1", "t2i_r@5")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", default=["in_batch", "uniform", "hard"],
                   help="negatives of each variant (in_batch, uniform, log_uniform, hard)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per variant (>= 3 for the report)")
    p.add_argument("--steps", type=int, default=300, help="trainer steps per run")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--n-negatives", type=int, default=256, help="sampled bank negatives per step")
    p.add_argument("--n-hard", type=int, default=8, help="hard (top-k) bank negatives per query")
    p.add_argument("--no-logq", action="store_true", help="no logQ correction of sampled bank negatives")
    p.add_argument("--limit", type=int, default=None, help="concepts to keep (default: all)")
    p.add_argument("--n-test", type=int, default=300, help="held-out concepts")
    p.add_argument("--cache-dir", default=None, help="image and feature cache (default: carls.data.dir or ~/.cache)")
    p.add_argument("--json", type=pathlib.Path, default=None, help="also write every figure to this file")
    return p.parse_args()


def _fmt(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f}±{sd:.3f}"


def main() -> None:
    from distributed import Client, LocalCluster

    from carls_dask.runtime.workbench import Workbench
    from paradigms.multimodal.loops import CorpusSpec, default_cache_dir, load_corpus
    from paradigms.multimodal.run import run_contrastive

    args = _args()
    logging.basicConfig(level=logging.WARNING)
    corpus = CorpusSpec(limit=args.limit, n_test=args.n_test,
                        cache_dir=str(args.cache_dir or default_cache_dir()))
    t0 = time.perf_counter()
    c = load_corpus(corpus)  # fills the caches once, before the workers read them
    print(f"corpus: {len(c.train)} train pairs, {len(c.test)} held-out concepts (chance R@1 {1 / len(c.test):.4f}),"
          f" prepared in {time.perf_counter() - t0:.1f}s")
    rows: list[dict[str, object]] = []
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0") as lc, \
            Client(lc) as client:
        for seed in range(args.seeds):
            for variant in args.variants:
                t = time.perf_counter()
                with Workbench(client, progress=False, name=f"mm-{variant}-{seed}") as wb:
                    r = run_contrastive(wb, corpus, negatives=variant, seed=seed, steps=args.steps,
                                        batch_size=args.batch_size, n_negatives=args.n_negatives,
                                        n_hard=args.n_hard, logq_correction=not args.no_logq)
                row = {"variant": variant, "seed": seed, "steps_per_s": r.steps_per_s, "maker_rounds": r.maker_rounds,
                       "staleness_s": r.mean_staleness_s, "bank_age_s": r.metrics.get("mean_bank_age_s"),
                       "wall_s": time.perf_counter() - t, **{m: r.metrics[m] for m in METRICS}}
                rows.append(row)
                print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
    print(f"\n{args.seeds} seeds, {args.steps} steps, batch {args.batch_size}, "
          f"{args.n_negatives} sampled / {args.n_hard} hard bank negatives, logQ correction {not args.no_logq}")
    header = f"{'variant':<12}" + "".join(f"{m:>14}" for m in METRICS) + f"{'steps/s':>14}{'staleness s':>14}"
    print(header)
    means: dict[str, dict[str, float]] = {}
    for variant in args.variants:
        mine = [r for r in rows if r["variant"] == variant]
        means[variant] = {m: statistics.mean(float(r[m]) for r in mine) for m in (*METRICS, "steps_per_s")}  # type: ignore[arg-type]
        cells = "".join(f"{_fmt([float(r[m]) for r in mine]):>14}" for m in (*METRICS, "steps_per_s", "staleness_s"))  # type: ignore[arg-type]
        print(f"{variant:<12}{cells}")
    if "in_batch" in means:
        base = means["in_batch"]
        print("\nratio to in_batch (mean over seeds)")
        for variant in args.variants:
            if variant == "in_batch":
                continue
            cells = "".join(f"{(means[variant][m] / base[m] if base[m] > 0 else float('nan')):>14.2f}"
                            for m in (*METRICS, "steps_per_s"))
            print(f"{variant:<12}{cells}")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=2,
                                        default=str))


if __name__ == "__main__":
    main()
