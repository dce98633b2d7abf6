"""Graph regularization on Cora/CiteSeer: base MLP vs in-graph (NSL style) vs the carls-dask bank.

Runs every variant side by side on one LocalCluster (2 workers) and prints:

1. test accuracy (mean and spread over seeds) of: the base MLP, the in-graph graph-regularized
   MLP (a forward pass per neighbour slot, fresh outputs), the bank version (neighbour logits
   written by a knowledge maker, read in one batched lookup per step), and the bank version with
   pseudo labels from a second maker;
2. trainer steps/s at K = 1, 5, 10 for in-graph vs bank, and each one's rate relative to its K=1 rate.

Beside the table stand the published anchors on the same split (GCN and GAT use the graph at
inference; Graph-MLP, like every variant here, runs an MLP at inference) and the targets of an MLP at
inference (issue 20): bank + pseudo labels >= 83.0 on Cora and >= 73.5 on CiteSeer (mean over the
seeds), and the bank variant never below the base MLP on any seed.

Targets (issue 6): bank >= base + 2 points and within 1 point of in-graph; bank at K=10 >= 0.9x its
K=1 rate while in-graph falls to <= 0.35x; pseudo labels add accuracy (the per-seed difference of
bank + pseudo labels against bank, same seeds, is printed with its mean and spread). Steps/s are
measured inside the trainer over its step bodies (evaluation excluded), with the makers running beside it.

Every run goes through the paradigm runner: :func:`carls_dask.runtime.run_paradigm` on the cluster, or
with ``--in-process`` :func:`carls_dask.runtime.run_inline` for the accuracy part (the same trainer and
makers in one process, makers in lock step every 10 steps, torch threads 1):
deterministic per seed, so the variants' differences are paired exactly; the speed part always runs
on the cluster (the bank lookup is the thing measured).

Usage::

    python benchmarks/graph_regularization.py                 # default: a few minutes on 2 cores
    python benchmarks/graph_regularization.py --seeds 10 --steps 300 --dataset citeseer
    python benchmarks/graph_regularization.py --in-process --skip-speed --steps 100
    python benchmarks/graph_regularization.py --in-process --skip-speed --seeds 10 --dataset citeseer
    python benchmarks/graph_regularization.py --checks teacher     # PASS/FAIL, the size tests once ran at

``--checks NAME ...`` runs, instead of the table, the checks of ``tests/paradigms`` at the sizes those tests
ran at before the suite was cut to 20 minutes (the tests now show each effect at a smaller size) and prints a
PASS/FAIL line per check: ``teacher`` (CiteSeer, 120 steps: the graph teacher's pseudo labels against the
student's own), ``cora`` (Cora, 100 steps: bank + pseudo labels and the bank variant against the base MLP).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import statistics
import sys
import time
from typing import Any

from carls_dask.paradigms.semi_supervised.paradigm import BANK_DEFAULTS, SemiSupervised
from carls_dask.runtime import run_inline, run_paradigm

PARADIGM = SemiSupervised()

#: published test accuracy (%) on the standard Planetoid split: (model, Cora, CiteSeer, what runs at inference)
ANCHORS = (
    ("GCN", 81.5, 70.3, "graph"),
    ("GAT", 83.0, 72.5, "graph"),
    ("Graph-MLP", 79.5, 73.1, "MLP"),
)

#: issue 20's targets of bank + pseudo labels (an MLP at inference), mean test accuracy in %
TARGETS = {"cora": 83.0, "citeseer": 73.5}

#: (printed name, the paradigm's variant)
VARIANTS = (
    ("base MLP", "base"),
    ("in-graph (NSL style)", "in-graph"),
    ("carls-dask bank", "bank"),
    ("carls-dask bank + pseudo labels", "bank+pseudo"),
)


def check_teacher(data_dir: str | None) -> list[tuple[str, bool, str]]:
    """tests/paradigms/test_graph_teacher.py's run test at 120 steps: CiteSeer, bank + pseudo labels, seed 0."""
    acc, metrics = {}, {}
    for teacher in ("student", "graph"):
        s = PARADIGM.settings("bank+pseudo", {"dataset": "citeseer", "pseudo_teacher": teacher}, steps=120,
                              data_dir=data_dir)
        result = run_inline(PARADIGM, s, variant="bank+pseudo")
        acc[teacher], metrics[teacher] = result["test_acc"], result.loops["pseudo-labeller"]["metrics"]
    m = metrics["graph"]
    return [
        ("graph teacher's val accuracy > 0.70", m["teacher_val_acc"] > 0.7, f"{m['teacher_val_acc']:.4f}"),
        ("graph teacher labels every node", m["pl_coverage"] == 1.0, f"{m['pl_coverage']:.4f}"),
        ("graph teacher >= student teacher + 2 points", acc["graph"] >= acc["student"] + 0.02,
         f"{acc['graph']:.4f} vs {acc['student']:.4f}"),
    ]


def check_cora(data_dir: str | None) -> list[tuple[str, bool, str]]:
    """tests/paradigms/test_semi_supervised_run.py's learning checks at 100 steps: Cora, in process."""
    acc: dict[tuple[str, int], float] = {}
    for variant, seed in (("base", 0), ("bank+pseudo", 0), ("bank", 0), ("base", 1), ("bank", 1)):
        s = PARADIGM.settings(variant, steps=100, seed=seed, data_dir=data_dir)
        acc[variant, seed] = float(run_inline(PARADIGM, s, variant=variant)["test_acc"])
    out = [("bank + pseudo labels >= base MLP + 15 points (seed 0)", acc["bank+pseudo", 0] >= acc["base", 0] + 0.15,
            f"{acc['bank+pseudo', 0]:.4f} vs {acc['base', 0]:.4f}")]
    out += [(f"bank >= base MLP (seed {seed})", acc["bank", seed] >= acc["base", seed],
             f"{acc['bank', seed]:.4f} vs {acc['base', seed]:.4f}") for seed in (0, 1)]
    return out


#: ``--checks`` names: the full-size versions of the paradigm tests' checks
CHECKS = {"teacher": check_teacher, "cora": check_cora}


def run_checks(names: list[str], data_dir: str | None) -> int:
    """Run the named checks, print a PASS/FAIL line each; 0 when all passed."""
    failed = 0
    for name in names:
        t0 = time.perf_counter()
        lines = CHECKS[name](data_dir)
        print(f"{name} ({time.perf_counter() - t0:.0f} s):")
        for what, ok, got in lines:
            print(f"  {'PASS' if ok else 'FAIL'}  {what:52s} {got}", flush=True)
            failed += not ok
    return 1 if failed else 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="cora", choices=["cora", "citeseer"])
    p.add_argument("--seeds", type=int, default=10, help="seeds per variant for accuracy (10 for the report)")
    p.add_argument("--first-seed", type=int, default=0,
                   help="first seed (0 for the report; the settings were chosen with seeds 100 and up)")
    p.add_argument("--steps", type=int, default=None, help="trainer steps of each accuracy run (default: the paradigm's)")
    p.add_argument("--k", type=int, default=5, help="neighbour slots per node for the accuracy runs")
    p.add_argument("--ks", default="1,5,10", help="K values of the throughput runs")
    p.add_argument("--speed-steps", type=int, default=60, help="trainer steps of each throughput run")
    p.add_argument("--repeats", type=int, default=2, help="throughput runs per (variant, K); the median is kept")
    p.add_argument("--unlabelled-batch", type=int, default=512, help="unlabelled nodes per step (base, in-graph)")
    p.add_argument("--bank-unlabelled-batch", type=int, default=BANK_DEFAULTS["unlabelled_batch"],
                   help="unlabelled nodes per step of the bank variants (default: all; the lookup cost barely grows)")
    p.add_argument("--bank-temperature", type=float, default=BANK_DEFAULTS["neighbour_temperature"],
                   help="neighbour_temperature of the bank variants (chosen on the validation split)")
    p.add_argument("--bank-threshold", type=float, default=BANK_DEFAULTS["pseudo.threshold"],
                   help="pseudo-label confidence threshold of the bank variants (chosen on the validation split)")
    p.add_argument("--bank-pseudo-weight", type=float, default=None,
                   help="pseudo-label loss weight of the bank variants (default: the data set's preset, chosen on "
                        "its validation split)")
    p.add_argument("--bank-option", action="append", default=[], metavar="KEY=VALUE",
                   help="any other setting of the bank variants (pseudo.fraction=0.4, ...)")
    p.add_argument("--in-process", action="store_true",
                   help="accuracy runs in this process, makers in lock step (deterministic, paired seeds)")
    p.add_argument("--data-dir", default=None, help="data folder (default: carls.data.dir, else CARLS_DATA_DIR, else ../shared/data beside the checkout)")
    p.add_argument("--variants", default="0,1,2,3",
                   help="accuracy variants to run, by index: 0 base, 1 in-graph, 2 bank, 3 bank + pseudo labels")
    p.add_argument("--skip-accuracy", action="store_true")
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--checks", nargs="+", choices=sorted(CHECKS), default=None,
                   help="run these full-size test checks (PASS/FAIL) instead of the table")
    return p.parse_args(argv)


def _fmt(values: list[float]) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * mean:6.2f} ± {100 * sd:4.2f}"


def _bank_options(args: argparse.Namespace) -> dict[str, str]:
    """The bank variants' settings the command line sets, as ``key=value`` strings for the paradigm."""
    return {"unlabelled_batch": str(args.bank_unlabelled_batch), "neighbour_temperature": str(args.bank_temperature),
            "pseudo.threshold": str(args.bank_threshold),
            **({} if args.bank_pseudo_weight is None else {"pseudo.weight": str(args.bank_pseudo_weight)}),
            **dict(item.split("=", 1) for item in args.bank_option)}


def _run(client: Any, args: argparse.Namespace, variant: str, in_process: bool = False, **kw: Any) -> Any:
    options = _bank_options(args) if variant.startswith("bank") else {"unlabelled_batch": str(args.unlabelled_batch)}
    settings = PARADIGM.settings(variant, options, dataset=args.dataset, data_dir=args.data_dir, **kw)
    if in_process:
        return run_inline(PARADIGM, settings, variant=variant)
    return run_paradigm(PARADIGM, settings, variant=variant, cluster=client, progress=False, timeout=1800)


def _seeds(args: argparse.Namespace) -> list[int]:
    first = int(getattr(args, "first_seed", 0))
    return list(range(first, first + args.seeds))


def anchor_table(dataset: str, acc: dict[str, list[float]], seeds: list[int]) -> list[str]:
    """Lines of the anchor table: each variant's mean ± std beside the published anchors and the targets."""
    col = 1 if dataset == "cora" else 2
    anchors = ", ".join(f"{a[0]} {a[col]:.1f} ({a[3]} at inference)" for a in ANCHORS)
    span = f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ",".join(map(str, seeds))
    lines = [f"  {'variant (MLP at inference)':34s} {'mean ± std %':>15s} {'seeds':>7s}  anchor / target"]
    target = TARGETS.get(dataset)
    base = acc.get(VARIANTS[0][0])
    for name, _ in VARIANTS:
        if name not in acc:
            continue
        v = acc[name]
        note = ""
        if name == VARIANTS[0][0]:
            note = f"anchors: {anchors}"
        elif name == VARIANTS[3][0] and target is not None:
            mean = 100 * statistics.fmean(v)
            note = f"target >= {target:.1f}: {'met' if mean >= target else 'NOT met'} ({mean - target:+.2f})"
        elif name == VARIANTS[2][0] and base is not None and len(base) == len(v):
            worst = min(b2 - b1 for b1, b2 in zip(base, v, strict=True))
            note = (f"target >= base on every seed: {'met' if worst >= 0 else 'NOT met'}"
                    f" (worst seed {100 * worst:+.1f} points)")
        lines.append(f"  {name:34s} {_fmt(v):>15s} {span:>7s}  {note}")
    return lines


def accuracy(client: Any, args: argparse.Namespace) -> dict[str, list[float]]:
    """Test accuracy of every variant over the seeds (seeds interleaved, so load drifts hit all alike)."""
    chosen = [VARIANTS[int(i)] for i in args.variants.split(",")]
    acc: dict[str, list[float]] = {name: [] for name, _ in chosen}
    extra: dict[str, list[Any]] = {name: [] for name, _ in chosen}  # RunResults
    steps = {} if args.steps is None else {"steps": args.steps}
    for seed in _seeds(args):
        for name, variant in chosen:
            r = _run(client, args, variant, in_process=args.in_process, seed=seed, k=args.k, **steps)
            acc[name].append(float(r["test_acc"]))
            extra[name].append(r)
            print(f"  seed {seed} {name:34s} test {100 * r['test_acc']:.1f}  (best val {100 * r['best_val_acc']:.1f}"
                  f" at step {r['best_step']})", flush=True)
    shown = "the paradigm's default" if args.steps is None else str(args.steps)
    print(f"\nTest accuracy on {args.dataset} ({args.seeds} seeds, {shown} steps, K={args.k}), mean ± std in %:")
    for line in anchor_table(args.dataset, acc, _seeds(args)):
        print(line)
    for name, _ in chosen:
        print(f"  {name:34s} per seed: {' '.join(f'{100 * a:.1f}' for a in acc[name])}")
    how = "in-process, makers in lock step" if args.in_process else "on the cluster"
    print(f"  ({how}; best-validation weights reported; validation accuracy mean: "
          + ", ".join(f"{name} {100 * statistics.fmean(r['best_val_acc'] for r in extra[name]):.2f}"
                      for name, _ in chosen) + ")")
    pl = [r.figures for r in extra.get(VARIANTS[3][0], [])]
    if pl:
        prec = [p["pl_precision"] for p in pl if not math.isnan(p["pl_precision"])]
        cov = [p["pl_coverage"] for p in pl]
        if prec:
            print(f"  pseudo labels at the end: precision {_fmt(prec)} %, coverage {_fmt(cov)} % of unlabelled nodes")
    if VARIANTS[2][0] in acc and VARIANTS[3][0] in acc:
        diff = [p - b for p, b in zip(acc[VARIANTS[3][0]], acc[VARIANTS[2][0]], strict=True)]
        print(f"  bank + pseudo labels - bank, per seed: {' '.join(f'{100 * d:+.1f}' for d in diff)}"
              f" (mean ± std {_fmt(diff)} points, {sum(d > 0 for d in diff)} of {len(diff)} seeds better)")
    ages = [r["mean_neighbour_age_s"] for r in extra.get(VARIANTS[2][0], [])]
    if ages:
        print(f"  bank: mean age of neighbour rows read {statistics.fmean(ages):.2f} s")
    return acc


def speed(client: Any, args: argparse.Namespace) -> dict[tuple[str, int], float]:
    """Median trainer steps/s of in-graph and bank at each K."""
    ks = [int(k) for k in args.ks.split(",")]
    rates: dict[tuple[str, int], list[float]] = {}
    lookup: dict[int, list[float]] = {}
    for rep in range(args.repeats):
        for k in ks:
            for mode in ("in-graph", "bank"):
                r = _run(client, args, mode, k=k, steps=args.speed_steps, seed=rep, eval_every=args.speed_steps)
                rates.setdefault((mode, k), []).append(float(r["train_steps_per_s"]))
                if mode == "bank":
                    lookup.setdefault(k, []).append(float(r["lookup_ms"]))
                print(f"  repeat {rep} K={k:2d} {mode:9s} {r['train_steps_per_s']:7.2f} steps/s", flush=True)
    med = {key: statistics.median(v) for key, v in rates.items()}
    print(f"\nTrainer steps/s on {args.dataset} (median of {args.repeats}, {args.speed_steps} steps each):")
    print(f"  {'K':>3s} {'in-graph':>10s} {'x K=1':>7s} {'bank':>10s} {'x K=1':>7s} {'bank lookup ms':>15s}")
    for k in ks:
        ig, bk = med[("in-graph", k)], med[("bank", k)]
        print(f"  {k:3d} {ig:10.2f} {ig / med[('in-graph', ks[0])]:7.2f} {bk:10.2f} {bk / med[('bank', ks[0])]:7.2f}"
              f" {statistics.median(lookup[k]):15.2f}")
    return med


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.checks:
        import torch

        torch.set_num_threads(1)
        return run_checks(args.checks, args.data_dir)
    for name in ("distributed", "distributed.nanny", "distributed.scheduler", "distributed.core"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        client = None
        if not args.skip_speed or not args.in_process:
            cluster = stack.enter_context(
                LocalCluster(n_workers=2, threads_per_worker=2, host="127.0.0.1", dashboard_address=":0"))
            client = stack.enter_context(Client(cluster))
        else:
            import torch

            torch.set_num_threads(1)
        acc = accuracy(client, args) if not args.skip_accuracy else {}
        med = speed(client, args) if not args.skip_speed else {}
    print("\nTargets:")
    if len(acc) == len(VARIANTS):
        m = {name: statistics.fmean(v) for name, v in acc.items()}
        base, ig, bank, pl = (m[name] for name, _ in VARIANTS)
        print(f"  bank - base     = {100 * (bank - base):+5.2f} points (target >= +2.00): {'met' if bank - base >= 0.02 else 'NOT met'}")
        print(f"  bank - in-graph = {100 * (bank - ig):+5.2f} points (target within 1.00): "
              f"{'met' if abs(bank - ig) <= 0.01 or bank > ig else 'NOT met'}")
        diff = [p - b for p, b in zip(acc[VARIANTS[3][0]], acc[VARIANTS[2][0]], strict=True)]
        spread = statistics.stdev(acc[VARIANTS[2][0]]) if len(diff) > 1 else 0.0
        ok = pl - bank >= 0.01 and pl - bank > spread and min(diff) > 0
        print(f"  pseudo - bank   = {100 * (pl - bank):+5.2f} points (target >= +1.00, above bank's seed spread "
              f"{100 * spread:.2f}, every seed better): {'met' if ok else 'NOT met'}")
    if med:
        ks = [int(k) for k in args.ks.split(",")]
        rb = med[("bank", ks[-1])] / med[("bank", ks[0])]
        ri = med[("in-graph", ks[-1])] / med[("in-graph", ks[0])]
        print(f"  bank K={ks[-1]}/K={ks[0]} = {rb:.2f}x (target >= 0.90): {'met' if rb >= 0.9 else 'NOT met'}")
        print(f"  in-graph K={ks[-1]}/K={ks[0]} = {ri:.2f}x (target <= 0.35): {'met' if ri <= 0.35 else 'NOT met'}")
    print(f"\n(total {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
