"""Graph regularization on WordNet nouns (82,115 nodes, 30x Cora): accuracy and the bank's K-flat step rate.

The graph is :func:`carls_dask.paradigms.data.wordnet.load_wordnet`: noun synsets of WordNet 3.0,
classes = the 26 noun lexicographer files, edges = noun-to-noun pointers, gloss features from
all-MiniLM-L6-v2 (``--dataset wordnet``) or TF-IDF (``--dataset wordnet-tfidf``), a fixed
Planetoid-style split (20 labels per class = 520 train, 500 validation, 1,000 test).

It reuses :mod:`benchmarks.graph_regularization` (the Cora/CiteSeer benchmark) for the runs and
prints, with the anchor of each figure and whether its target is met:

1. test accuracy (best-validation weights, mean ± std over seeds 0..N-1) of base / in-graph / bank /
   bank + pseudo labels. No published result exists for this split, so the anchor is the base MLP
   run here on the same split and seeds;
2. trainer steps/s at K = 1, 5, 10 of in-graph and bank on a real LocalCluster with the actor bank,
   the K values cycled ``--repeats`` times (so load drifts hit each K alike) and medians kept; the
   load average is printed before and after (the machine may be shared). Targets: bank K=10 >= 0.9x
   its K=1 rate while in-graph falls (< 1x; the Cora benchmark asks <= 0.35x).

The bank variants draw ``--bank-unlabelled-batch`` unlabelled nodes per step (default: the WordNet
default of the paradigm, :data:`~carls_dask.paradigms.data.graphs.WORDNET_UNLABELLED_BATCH`).

Usage::

    python benchmarks/wordnet_graph.py --in-process              # accuracy in-process, speed on the cluster
    python benchmarks/wordnet_graph.py --dataset wordnet-tfidf --seeds 2 --steps 50 --skip-speed --in-process
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import statistics
import sys
import time
from typing import Any

import graph_regularization as gr  # the sibling script: a script's own folder is first on sys.path

from carls_dask.paradigms.data.graphs import WORDNET_UNLABELLED_BATCH


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="wordnet", choices=["wordnet", "wordnet-tfidf"],
                   help="gloss features: wordnet (MiniLM when installed, else TF-IDF) or wordnet-tfidf")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0,
                   help="first seed (choose settings with seeds the report does not use, e.g. 100)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--ks", default="1,5,10")
    p.add_argument("--speed-steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3, help="cycles over the K values; the median of each is kept")
    p.add_argument("--unlabelled-batch", type=int, default=512, help="unlabelled nodes per step (base, in-graph)")
    p.add_argument("--bank-unlabelled-batch", type=int, default=WORDNET_UNLABELLED_BATCH,
                   help="unlabelled nodes per step of the bank variants")
    p.add_argument("--bank-option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--variants", default="0,1,2,3")
    p.add_argument("--in-process", action="store_true", help="accuracy runs in this process (deterministic)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--skip-accuracy", action="store_true")
    p.add_argument("--skip-speed", action="store_true")
    args = p.parse_args(argv)
    # everything else the Cora benchmark's runs read, at its defaults (bank temperature, threshold, ...)
    base = gr._parse([])
    for key, value in vars(args).items():
        setattr(base, key, value)
    return base


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING)
    for name in ("distributed", "distributed.nanny", "distributed.scheduler", "distributed.core"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import torch
    from distributed import Client, LocalCluster

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    print(f"WordNet nouns ({args.dataset}); {_load()}", flush=True)
    acc: dict[str, list[float]] = {}
    med: dict[tuple[str, int], float] = {}
    with contextlib.ExitStack() as stack:
        client: Any = None
        if not args.skip_speed or not args.in_process:
            cluster = stack.enter_context(
                LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0"))
            client = stack.enter_context(Client(cluster))
        if not args.skip_accuracy:
            t = time.perf_counter()
            acc = gr.accuracy(client, args)
            print(f"  (accuracy part {time.perf_counter() - t:.0f} s; {_load()})", flush=True)
        if not args.skip_speed:
            print(f"\nthroughput on a LocalCluster (2 workers, actor bank); before: {_load()}", flush=True)
            med = gr.speed(client, args)
            print(f"  after: {_load()}", flush=True)
    print("\nTargets (no published figure exists for this split: the anchor is the base MLP run here):")
    names = [name for name, _ in gr.VARIANTS]
    if names[0] in acc:
        base = statistics.fmean(acc[names[0]])
        print(f"  anchor: {names[0]} {100 * base:.2f} % (seeds {args.first_seed}..{args.first_seed + args.seeds - 1})")
        for name in names[1:]:
            if name in acc:
                gain = statistics.fmean(acc[name]) - base
                print(f"  {name:34s} - base = {100 * gain:+6.2f} points (target > 0): {'met' if gain > 0 else 'NOT met'}")
        if names[2] in acc and names[1] in acc:
            d = statistics.fmean(acc[names[2]]) - statistics.fmean(acc[names[1]])
            print(f"  bank - in-graph = {100 * d:+5.2f} points (target within 1.00 or above): "
                  f"{'met' if d >= -0.01 else 'NOT met'}")
    if med:
        ks = [int(k) for k in args.ks.split(",")]
        rb = med[("bank", ks[-1])] / med[("bank", ks[0])]
        ri = med[("in-graph", ks[-1])] / med[("in-graph", ks[0])]
        print(f"  bank K={ks[-1]}/K={ks[0]} = {rb:.2f}x (target >= 0.90): {'met' if rb >= 0.9 else 'NOT met'}")
        print(f"  in-graph K={ks[-1]}/K={ks[0]} = {ri:.2f}x (target: falls, < 1.00; Cora's <= 0.35): "
              f"{'met' if ri < 1.0 else 'NOT met'}{' (also <= 0.35)' if ri <= 0.35 else ''}")
    print(f"\n(total {time.perf_counter() - t0:.0f} s; {_load()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
