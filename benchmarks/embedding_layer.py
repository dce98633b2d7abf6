"""The bank as an embedding layer against an in-process sparse embedding, side by side in one run.

A model with a ``--rows`` x ``--dim`` table (default 1M x 64) and a small MLP on top trains on batches of
``--batch`` Zipf-distributed keys (default 4,096), three ways, with the same optimizers (Adagrad for the
table: the bank's on its shards, or ``torch.optim.Adagrad`` with the same initial accumulator and no
epsilon; Adam for the MLP):

- ``in-process``: ``torch.nn.Embedding(rows, dim, sparse=True)`` in this (the trainer's) process;
- ``layer``: :class:`~carls_dask.nn.BankEmbedding` over a 2-shard bank on a two-worker LocalCluster
  (one thread each), reading rows in forward and pushing gradients in backward;
- ``layer, pipelined``: the same with ``pipeline=True`` (``staleness=1``): each step first prefetches the
  next batch's rows, and the gradient push travels while the next step runs.

The three paths run in turns (``--rounds`` blocks of ``--steps`` steps each), so load from other work
falls on all of them alike; the step rate is the median over every step of a path. Then, unless
``--skip memory``, a fresh bank holds a ``--memory-rows`` table (default 10M rows) and this process
trains the layer over it: its resident memory (before the layer was built, and the most it reached while
training, sampled every 10 ms) is printed against the table's bytes. The memory part runs first, before
the in-process table exists in this process.

Run: ``python benchmarks/embedding_layer.py [--rows N] [--memory-rows N] [--steps S] [--rounds R]
[--threads T] [--skip memory,speed]``.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

HIDDEN = 256


def rss_mib() -> float:
    """This process's resident memory, MiB."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20


class PeakRss:
    """The most resident memory this process reaches while the block runs (sampled every 10 ms)."""

    def __enter__(self) -> PeakRss:
        self.peak = rss_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_mib())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mib())


class Net(torch.nn.Module):
    """Embedding, then a two-hidden-layer MLP to one logit."""

    def __init__(self, embedding: torch.nn.Module, dim: int) -> None:
        super().__init__()
        self.embedding = embedding
        torch.manual_seed(0)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                                       torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embedding(keys)).squeeze(-1)


def zipf_batches(rows: int, batch: int, n: int, seed: int) -> list[torch.Tensor]:
    """``n`` batches of Zipf(1.1) keys folded into ``[0, rows)``."""
    rng = np.random.default_rng(seed)
    return [torch.from_numpy((rng.zipf(1.1, size=batch) - 1) % rows) for _ in range(n)]


def labels_of(keys: torch.Tensor) -> torch.Tensor:
    """A fixed label per key (its parity), the target of the logit."""
    return (keys % 2).to(torch.float32)


class Path:
    """One way of training: a model, its optimizers and (for the pipelined layer) a prefetch per step."""

    def __init__(self, name: str, model: Net, optimizers: list[torch.optim.Optimizer], prefetch: bool = False) -> None:
        self.name = name
        self.model = model
        self.optimizers = optimizers
        self.prefetch = prefetch
        self.times: list[float] = []
        self.losses: list[float] = []

    def run(self, batches: list[torch.Tensor], record: bool = True) -> None:
        for i, keys in enumerate(batches):
            t0 = time.perf_counter()
            if self.prefetch and i + 1 < len(batches):
                self.model.embedding.prefetch(batches[i + 1])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(self.model(keys), labels_of(keys))
            for o in self.optimizers:
                o.zero_grad()
            loss.backward()
            for o in self.optimizers:
                o.step()
            if record:
                self.times.append(time.perf_counter() - t0)
                self.losses.append(float(loss.detach()))
        if hasattr(self.model.embedding, "flush"):
            self.model.embedding.flush()

    @property
    def steps_per_s(self) -> float:
        return 1.0 / statistics.median(self.times)


def start_cluster() -> tuple[Any, Any]:
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=":0")
    return cluster, Client(cluster)


def fill_bank(client: Any, rows: int, dim: int, chunk: int = 1 << 19) -> Any:
    """A 2-shard bank whose Adagrad table holds keys ``0 .. rows - 1``."""
    from carls_dask.bank import Column, KnowledgeBank, TableSpec

    spec = TableSpec("ids", columns=(Column("embedding", shape=(dim,)),), optimizer="adagrad", learning_rate=0.05,
                     initializer="normal", init_scale=0.01, adagrad_initial_accumulator=0.1)
    bank = KnowledgeBank.create(client, [spec], n_shards=2, initial_capacity=rows // 2 + 1, timeout=300)
    t0 = time.perf_counter()
    for s in range(0, rows, chunk):
        bank.lookup("ids", np.arange(s, min(rows, s + chunk), dtype=np.int64), columns=[], insert=True)
    print(f"  bank filled with {rows:,} rows in {time.perf_counter() - t0:.1f} s")
    return bank


def memory(client: Any, rows: int, dim: int, batch: int, steps: int) -> None:
    """This process's memory while it trains the layer over a ``rows``-row table held by the bank.

    The reference is the same model with an in-process table of one batch's rows (the trainer's working
    set without a large table), trained first for as many steps; the difference of the two peaks is what
    holding the table in the bank costs the trainer.
    """
    from carls_dask.nn import BankEmbedding

    print(f"\nmemory: a {rows:,} x {dim} table in the bank, the trainer in this process")
    start = rss_mib()
    rng = np.random.default_rng(1)
    # half Zipf, half uniform keys: most of a batch's rows are distinct, over all the table's keys
    batches = [torch.from_numpy(np.concatenate([(rng.zipf(1.1, size=batch // 2) - 1) % rows,
                                                rng.integers(0, rows, size=batch - batch // 2)]))
               for _ in range(steps)]
    small = torch.nn.Embedding(batch, dim, sparse=True)
    ref = Net(small, dim)
    ref_path = Path("in-process, one batch of rows", ref, [
        torch.optim.Adam(ref.mlp.parameters(), lr=1e-3),
        torch.optim.Adagrad(small.parameters(), lr=0.05, initial_accumulator_value=0.1, eps=0.0)])
    with PeakRss() as ref_peak:
        ref_path.run([k % batch for k in batches])
    del ref, ref_path, small
    bank = fill_bank(client, rows, dim)
    try:
        before = rss_mib()
        model = Net(BankEmbedding(bank, "ids", pipeline=True), dim)
        path = Path("layer, pipelined", model, [torch.optim.Adam(model.mlp.parameters(), lr=1e-3)], prefetch=True)
        with PeakRss() as peak:
            path.run(batches)
        model.embedding.close()
        table_mib = rows * dim * 4 / 2**20
        workers = client.run(lambda: __import__("psutil").Process().memory_info().rss)
        print(f"  table values: {table_mib:,.0f} MiB (float32; the bank also keeps an Adagrad accumulator of the "
              f"same size); bank workers' RSS {sum(workers.values()) / 2**20:,.0f} MiB")
        print(f"  trainer RSS: {start:,.0f} MiB after imports and the cluster's start; peak {ref_peak.peak:,.0f} MiB "
              f"training with an in-process table of {batch:,} rows; {before:,.0f} MiB before the layer, peak "
              f"{peak.peak:,.0f} MiB training the layer over the bank ({path.steps_per_s:.1f} steps/s)")
        print(f"  trainer peak / table bytes: {peak.peak / table_mib:.3f}x in all; above the in-process reference "
              f"{(peak.peak - ref_peak.peak) / table_mib:.3f}x (target <= 0.1x)")
        print("  an in-process torch.nn.Embedding of this table with Adagrad would hold "
              f"{2 * table_mib:,.0f} MiB in the trainer")
    finally:
        bank.close()


def speed(client: Any, rows: int, dim: int, batch: int, steps: int, rounds: int) -> None:
    from carls_dask.nn import BankEmbedding

    print(f"\nspeed: {rows:,} x {dim} table, batch {batch:,} Zipf keys, MLP {dim}-{HIDDEN}-{HIDDEN}-1; "
          f"{rounds} rounds of {steps} steps per path")
    bank = fill_bank(client, rows, dim)
    try:
        ref_emb = torch.nn.Embedding(rows, dim, sparse=True)
        torch.nn.init.normal_(ref_emb.weight, std=0.01)
        ref = Net(ref_emb, dim)
        plain = Net(BankEmbedding(bank, "ids"), dim)
        piped = Net(BankEmbedding(bank, "ids", pipeline=True, staleness=1), dim)
        paths = [
            Path("in-process", ref, [torch.optim.Adam(ref.mlp.parameters(), lr=1e-3),
                                     torch.optim.Adagrad(ref_emb.parameters(), lr=0.05, initial_accumulator_value=0.1,
                                                         eps=0.0)]),
            Path("layer", plain, [torch.optim.Adam(plain.mlp.parameters(), lr=1e-3)]),
            Path("layer, pipelined", piped, [torch.optim.Adam(piped.mlp.parameters(), lr=1e-3)], prefetch=True),
        ]
        for p in paths:  # warm-up (compiled kernels, first allocations)
            p.run(zipf_batches(rows, batch, 3, seed=99), record=False)
        for r in range(rounds):
            for i, p in enumerate(paths):
                p.run(zipf_batches(rows, batch, steps, seed=1000 * r + i))
        base = paths[0].steps_per_s
        print(f"  {'path':<20}{'steps/s':>10}{'x in-process':>15}{'last loss':>11}")
        for p in paths:
            print(f"  {p.name:<20}{p.steps_per_s:>10.1f}{p.steps_per_s / base:>15.2f}{p.losses[-1]:>11.4f}")
        st = piped.embedding.pipeline_stats()
        print(f"  pipelined staleness: {st.stale_rows / max(1, st.rows):.1%} of rows missed an update "
              f"(at most {st.max_staleness}); forward waited {st.wait_s / max(1, st.reads) * 1e3:.1f} ms per step "
              f"for its rows")
        ps = plain.embedding.pipeline_stats()
        print(f"  the plain layer spent {ps.wait_s / ps.reads * 1e3:.1f} ms per step reading rows and "
              f"{ps.push_s / ps.pushes * 1e3:.1f} ms pushing gradients (bank calls, waited for in the step)")
        ratio = paths[2].steps_per_s / base
        print(f"  pipelined / in-process: {ratio:.2f}x (target >= 0.8x): {'met' if ratio >= 0.8 else 'NOT met'}")
        piped.embedding.close()
    finally:
        bank.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20, help="steps per path per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--memory-rows", type=int, default=10_000_000)
    ap.add_argument("--memory-steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads of this process")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: memory, speed")
    args = ap.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    warnings.filterwarnings("ignore", message="Sparse invariant checks")  # torch's sparse Adagrad, every step
    torch.set_num_threads(args.threads)
    cluster, client = start_cluster()
    try:
        print(f"2 workers x 1 thread hold the bank; this process trains with {args.threads} torch thread(s)")
        parts: list[Callable[[], None]] = []
        if "memory" not in skip:
            parts.append(lambda: memory(client, args.memory_rows, args.dim, args.batch, args.memory_steps))
        if "speed" not in skip:
            parts.append(lambda: speed(client, args.rows, args.dim, args.batch, args.steps, args.rounds))
        for part in parts:
            part()
    finally:
        client.close()
        cluster.close()


if __name__ == "__main__":
    main()
