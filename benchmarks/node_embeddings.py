"""Node embeddings of the 82,115 WordNet nouns: bank-held vectors against in-process and random ones, per seed.

Runs the ``node-embeddings`` paradigm's variants on the same seeds and prints mean ± std and the paired
per-seed differences:

- ``--graph nouns`` (default): held-out link AUC (node2vec's protocol, Hadamard features) and the linear
  probe's test accuracy on the semi-supervised paradigm's classes and split, for ``bank``, ``in-process``
  and ``random``; the targets are the bank variant within 1 point of in-process on both;
- ``--graph closure --dims 50 100``: reconstruction mean rank and MAP of the noun hierarchy's transitive
  closure (a fixed sample of ``recon_sources`` synsets, all of their 743,241-pair closure's pairs ranked),
  beside Nickel & Kiela's (2017) Table 1 Euclidean row.

Runs use the deterministic in-process driver (:func:`carls_dask.runtime.run_inline`, a 2-shard
in-process bank for the bank variant) unless ``--driver cluster`` (a two-worker LocalCluster). Seeds 0-4 are
reported; settings were chosen with seed 100.

    python benchmarks/node_embeddings.py                               # nouns, seeds 0-4, three variants
    python benchmarks/node_embeddings.py --graph closure --dims 50 100 --seeds 5
    python benchmarks/node_embeddings.py --seeds 1 --first-seed 100 --set lr=0.3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

#: Nickel & Kiela (2017), Table 1, WordNet nouns reconstruction, Euclidean: (mean rank, MAP) by dimension.
EUCLIDEAN = {5: (3542.3, 0.024), 10: (2286.9, 0.059), 20: (1685.9, 0.087), 50: (1281.7, 0.140),
             100: (1187.3, 0.162), 200: (1157.3, 0.168)}
FIGURES = {"nouns": ("link_auc", "probe_acc"), "closure": ("recon_mean_rank", "recon_mean_avg_precision")}


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def run(variant: str, settings: dict[str, Any], driver: str, client: Any) -> dict[str, Any]:
    from carls_dask.paradigms.node_embeddings import NodeEmbeddings
    from carls_dask.runtime import run_inline, run_paradigm

    p = NodeEmbeddings()
    s = p.settings(variant, **settings)
    t0 = time.perf_counter()
    if driver == "cluster" and s.uses_bank:
        result = run_paradigm(p, s, cluster=client, progress=False, timeout=7200)
    else:
        result = run_inline(p, s, n_shards=2)
    out = {k: v for k, v in result.figures.items() if isinstance(v, int | float)}
    out["wall_s"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", choices=tuple(FIGURES), default="nouns")
    ap.add_argument("--variants", nargs="+", default=["bank", "in-process", "random"])
    ap.add_argument("--dims", nargs="+", type=int, default=None, help="vector sizes (default: the settings')")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--driver", choices=("inline", "cluster"), default="inline")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="settings of every run (typed)")
    ap.add_argument("--json", default=None, help="write every run's figures to this file")
    args = ap.parse_args(argv)
    extra = {}
    for item in args.set:
        key, _, value = item.partition("=")
        extra[key] = json.loads(value) if value[:1] in "0123456789-[{tf\"" else value
    client = cluster = None
    if args.driver == "cluster":
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=2, processes=True, host="127.0.0.1",
                               dashboard_address=":0")
        client = Client(cluster)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    figures = FIGURES[args.graph]
    records: list[dict[str, Any]] = []
    try:
        for dim in args.dims or [None]:
            got: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
            for seed in seeds:
                for v in args.variants:
                    settings = {"graph": args.graph, "seed": seed, "eval_every": 0, **extra}
                    if dim is not None:
                        settings["dim"] = dim
                    r = run(v, settings, args.driver, client)
                    got[v].append(r)
                    records.append({"variant": v, "dim": dim, "seed": seed, **r})
                    print(f"dim {dim or 'default'} seed {seed} {v:<11}"
                          + "".join(f" {f} {r[f]:.4f}" for f in figures) + f"  ({r['wall_s']:.0f} s)", flush=True)
            print(f"\n{args.graph}, dim {dim or 'default'}, seeds {seeds[0]}-{seeds[-1]} ({args.driver}):")
            print(f"  {'variant':<12}" + "".join(f"{f:>32}" for f in figures) + f"{'wall s':>10}")
            for v in args.variants:
                print(f"  {v:<12}" + "".join(f"{mean_std([r[f] for r in got[v]]):>32}" for f in figures)
                      + f"{statistics.mean(r['wall_s'] for r in got[v]):>10.0f}")
            if "bank" in got and "in-process" in got:
                for f in figures:
                    diff = [a[f] - b[f] for a, b in zip(got["bank"], got["in-process"], strict=True)]
                    print(f"  bank - in-process, {f}: " + " ".join(f"{d:+.4f}" for d in diff)
                          + f"  (mean {statistics.mean(diff):+.4f})")
            if args.graph == "closure" and dim in EUCLIDEAN:
                rank, ap_ = EUCLIDEAN[dim]
                print(f"  Nickel & Kiela (2017) Table 1, Euclidean, dim {dim}: mean rank {rank}, MAP {ap_}")
    finally:
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(records, fh, indent=1)
        if client is not None:
            client.close()
            cluster.close()


if __name__ == "__main__":
    main()
