"""Drift-triggered knowledge making: the neighbour maker re-scoring what the bank's change feed says moved.

Runs the semi-supervised paradigm (``bank+pseudo``, the in-process deterministic driver) twice per seed,
side by side: the neighbour maker re-scoring every node each round (``maker_refresh=full``, the
baseline) and re-scoring only the nodes whose logits moved past ``--threshold`` at its last round, their
graph neighbours and a ``--sweep`` share of all nodes in a fixed cycle (``maker_refresh=changes``). It prints,
per data set, with the target of each figure and whether it is met:

- test accuracy (best-validation weights), mean ± std over the seeds, and the paired difference
  (target: within 0.5 points of full re-scoring);
- the maker's compute: nodes it ran the model on over the run, as a share of full re-scoring's (target <= 30 %),
  and, beside it, the seconds its rounds took (loading the model, choosing the nodes, the forward pass and
  the bank write), as a share of full re-scoring's: with a small model the gather of the chosen nodes'
  features and the fixed costs of a round weigh about as much as the forward pass saved;
- the staleness of the knowledge the trainer reads, two ways: the model-step lag of the neighbour rows
  it looked up (median and p90: trainer step minus the row's ``model_step``), and the gap between the
  bank's logits and the trainer's current model on a fixed sample of nodes at each evaluation (L2,
  median and p90). Target: no worse than full re-scoring.

With ``--cluster`` the runs go through the Workbench on a LocalCluster (2 workers, the actor bank, loops
asynchronous): a maker then takes the newest model version when its round ends, so a cheaper round could
read newer versions. The maker's compute is the nodes it ran the model on, summed over the run, as a share
of full re-scoring's.

Usage::

    python benchmarks/change_feeds.py --dataset cora --seeds 5
    python benchmarks/change_feeds.py --dataset wordnet --seeds 5
    python benchmarks/change_feeds.py --dataset cora --seeds 2 --steps 60       # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import time
from typing import Any

from carls_dask.runtime import run_inline, run_paradigm
from carls_dask.runtime.registry import get_paradigm

VARIANT = "bank+pseudo"
FIELDS = ("test_acc", "best_val_acc", "compute_fraction", "neighbour_lag_p50", "neighbour_lag_p90", "knowledge_gap_p50",
          "knowledge_gap_p90", "maker_s")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="cora", help="cora, citeseer, wordnet or wordnet-tfidf")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="trainer steps (default 300 on Planetoid, 200 on WordNet)")
    p.add_argument("--threshold", type=float, default=None, help="L2 move of a node's logits that counts (default: the paradigm's)")
    p.add_argument("--sweep", type=float, default=None, help="share of the nodes swept each round (default: the paradigm's)")
    p.add_argument("--no-neighbours", action="store_true",
                   help="re-score the moved nodes and the sweep only, not the moved nodes' graph neighbours")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--cluster", action="store_true",
                   help="run on a LocalCluster (2 workers, the actor bank, loops asynchronous) instead of in-process")
    return p.parse_args(argv)


def run_once(dataset: str, seed: int, refresh: str, steps: int, threshold: float | None, sweep: float | None,
             data_dir: str | None, client: Any = None, neighbours: bool = True) -> dict[str, float]:
    """One run (in-process, or on ``client``'s cluster); the figures this benchmark compares."""
    paradigm = get_paradigm("semi-supervised")
    options = {"maker_refresh": refresh, "refresh_neighbours": str(neighbours)}
    if threshold is not None:
        options["refresh_threshold"] = str(threshold)
    if sweep is not None:
        options["sweep_fraction"] = str(sweep)
    settings = paradigm.settings(VARIANT, options, dataset=dataset, seed=seed, steps=steps, data_dir=data_dir)
    if client is None:
        result = run_inline(paradigm, settings, variant=VARIANT)
    else:
        result = run_paradigm(paradigm, settings, variant=VARIANT, cluster=client, progress=False, timeout=1800)
    trainer = result.results["trainer"].value
    maker = result.results["neighbour-maker"]
    out = {k: float(trainer[k]) for k in FIELDS if k in trainer}
    out["compute_fraction"] = float(maker.value["compute_fraction"])
    out["scored_rows"] = float(maker.value["scored_rows"])
    out["rounds"] = float(maker.value["rounds"])
    out["maker_s"] = float(result.loops["neighbour-maker"]["seconds"])
    out["round_s"] = float(sum(r.seconds for r in maker.rounds))
    return out


def _mean_sd(values: list[float], scale: float = 1.0) -> str:
    mean = statistics.fmean(values) * scale
    sd = (statistics.stdev(values) if len(values) > 1 else 0.0) * scale
    return f"{mean:7.2f} ± {sd:5.2f}"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    args = _parse(argv)
    steps = args.steps or (200 if args.dataset.startswith("wordnet") else 300)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    got: dict[str, list[dict[str, float]]] = {"full": [], "changes": []}
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        client = None
        if args.cluster:
            from distributed import Client, LocalCluster

            for name in ("distributed", "distributed.nanny", "distributed.scheduler", "distributed.core"):
                logging.getLogger(name).setLevel(logging.ERROR)
            cluster = stack.enter_context(
                LocalCluster(n_workers=2, threads_per_worker=2, host="127.0.0.1", dashboard_address=":0"))
            client = stack.enter_context(Client(cluster))
        _runs(args, steps, seeds, got, client)
    _report(args, steps, seeds, got, time.perf_counter() - t0)
    return 0


def _runs(args: argparse.Namespace, steps: int, seeds: list[int], got: dict[str, list[dict[str, float]]],
          client: Any) -> None:
    for seed in seeds:
        for refresh in ("full", "changes"):
            r = run_once(args.dataset, seed, refresh, steps, args.threshold, args.sweep, args.data_dir, client,
                         neighbours=not args.no_neighbours)
            got[refresh].append(r)
            print(f"  seed {seed} {refresh:7s}: test {100 * r['test_acc']:.2f}, compute {100 * r['compute_fraction']:.1f} %, "
                  f"lag p50/p90 {r['neighbour_lag_p50']:.0f}/{r['neighbour_lag_p90']:.0f} steps, "
                  f"gap p50/p90 {r['knowledge_gap_p50']:.3f}/{r['knowledge_gap_p90']:.3f}, maker {r['rounds']:.0f} rounds "
                  f"in {r['maker_s']:.1f} s ({r['round_s']:.2f} s in its rounds)", flush=True)


def _report(args: argparse.Namespace, steps: int, seeds: list[int], got: dict[str, list[dict[str, float]]],
            seconds: float) -> None:
    where = "LocalCluster" if args.cluster else "in-process"
    print(f"\n{args.dataset}, {steps} steps, seeds {seeds[0]}-{seeds[-1]}, {where}, {seconds:.0f} s in all")
    print(f"| {'figure':34s} | {'full re-scoring':>16s} | {'change feed':>16s} | target | met |")
    print("|---|---|---|---|---|")

    def col(refresh: str, key: str, scale: float = 1.0) -> str:
        return _mean_sd([r[key] for r in got[refresh]], scale)

    diffs = [100 * (c["test_acc"] - f["test_acc"]) for f, c in zip(got["full"], got["changes"], strict=True)]
    acc_met = abs(statistics.fmean(diffs)) <= 0.5
    frac = statistics.fmean(c["scored_rows"] / f["scored_rows"] for f, c in zip(got["full"], got["changes"], strict=True))
    print(f"| {'test accuracy (%)':34s} | {col('full', 'test_acc', 100)} | {col('changes', 'test_acc', 100)} | "
          f"within 0.5 (paired {statistics.fmean(diffs):+.2f}) | {'yes' if acc_met else 'NO'} |")
    print(f"| {'validation accuracy (%), best step':34s} | {col('full', 'best_val_acc', 100)} | "
          f"{col('changes', 'best_val_acc', 100)} | - | - |")
    print(f"| {'maker compute (rows, share of full)':34s} | {'100.00':>16s} | {100 * frac:16.2f} | "
          f"<= 30 % | {'yes' if frac <= 0.30 else 'NO'} |")
    secs = statistics.fmean(c["round_s"] / f["round_s"] for f, c in zip(got["full"], got["changes"], strict=True))
    print(f"| {'maker seconds in rounds (share)':34s} | {'100.00':>16s} | {100 * secs:16.2f} | - | - |")
    print(f"| {'nodes scored per round (share)':34s} | {col('full', 'compute_fraction', 100)} | "
          f"{col('changes', 'compute_fraction', 100)} | - | - |")
    print(f"| {'maker rounds':34s} | {col('full', 'rounds')} | {col('changes', 'rounds')} | - | - |")
    for key, label in (("neighbour_lag_p50", "lag of rows read, p50 (steps)"), ("neighbour_lag_p90", "lag of rows read, p90 (steps)"),
                       ("knowledge_gap_p50", "logit gap to current model, p50"), ("knowledge_gap_p90", "logit gap to current model, p90")):
        worse = statistics.fmean(r[key] for r in got["changes"]) > statistics.fmean(r[key] for r in got["full"])
        print(f"| {label:34s} | {col('full', key)} | {col('changes', key)} | no worse than full | {'NO' if worse else 'yes'} |")


if __name__ == "__main__":
    sys.exit(main())

