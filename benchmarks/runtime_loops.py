"""Runtime loops measured side by side on one LocalCluster (2 workers).

For the digits example (``carls_dask.examples.digits``) it runs the same trainer + maker pair under three
set-ups, alternating them over ``--repeats`` rounds so machine load hits each alike:

- ``no bank``: the trainer never calls the bank (baseline: the loop's own cost);
- ``colocate``: both bank shards on the trainer's worker (lookups stay in-process);
- ``spread``: one shard per worker (half of each lookup crosses processes);

and prints, per set-up, the trainer's steps/s, the maker's rounds and median staleness (seconds from
a version's publication until the maker finished writing knowledge from it), and the stop latency
(``Workbench.stop`` until every loop returned). Ratios are against ``no bank``.
Run: ``python benchmarks/runtime_loops.py [--steps N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

SETUPS = ("no bank", "colocate", "spread")


def one_run(client: Any, setup: str, steps: int) -> dict[str, float]:
    from carls_dask.examples.digits import DigitsMaker, DigitsTrainer, digits_table
    from carls_dask.runtime import Workbench

    with Workbench(client, progress=False) as wb:
        if setup != "no bank":
            wb.create_bank([digits_table()], n_shards=2, placement=setup)
        wb.submit_trainer(DigitsTrainer("trainer", max_steps=steps, publish_every=max(1, steps // 10), lr=0.02))
        wb.submit_maker(DigitsMaker("maker"))
        wb.wait(timeout=900)
        t0 = time.perf_counter()
        results = wb.stop(timeout=60)
        stop_s = time.perf_counter() - t0
    trainer, maker = results["trainer"], results["maker"]
    return {
        "steps_per_s": trainer.steps / trainer.elapsed,
        "maker_rounds": float(len(maker.rounds)),
        "staleness_s": statistics.median(r.staleness for r in maker.rounds) if maker.rounds else float("nan"),
        "stop_s": stop_s,
        "test_accuracy": float(trainer.value["test_accuracy"]),
    }


def main() -> None:
    from distributed import Client, LocalCluster

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with LocalCluster(n_workers=2, threads_per_worker=2, host="127.0.0.1", dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        one_run(client, "no bank", 20)  # warm-up: workers import torch and scikit-learn
        runs: dict[str, list[dict[str, float]]] = {s: [] for s in SETUPS}
        for _ in range(args.repeats):
            for setup in SETUPS:
                runs[setup].append(one_run(client, setup, args.steps))
    base = statistics.median(r["steps_per_s"] for r in runs["no bank"])
    print(f"digits trainer + maker, {args.steps} steps, median of {args.repeats} alternating runs")
    print(f"{'set-up':10} {'steps/s':>9} {'vs no bank':>11} {'rounds':>7} {'staleness s':>12} {'stop s':>7} {'test acc':>9}")
    for setup in SETUPS:
        med = {k: statistics.median(r[k] for r in runs[setup]) for k in runs[setup][0]}
        print(f"{setup:10} {med['steps_per_s']:9.1f} {med['steps_per_s'] / base:10.2f}x {med['maker_rounds']:7.0f} "
              f"{med['staleness_s']:12.3f} {med['stop_s']:7.2f} {med['test_accuracy']:9.3f}")


if __name__ == "__main__":
    main()
