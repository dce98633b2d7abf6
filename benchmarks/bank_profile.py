"""Where the CPU time of one bank call goes: client, transport and shard, stage by stage.

A bank of ``--shards`` shard actors (default 2) on a two-worker LocalCluster holds one table
``embedding float32[64]`` with Adagrad (``--rows`` keys, default 400,000). For ``lookup``, ``update`` and
``apply_gradients`` at batches of 4,096 and 65,536 fresh random keys, and ``lookup(insert=True)`` of as many
new keys (``insert``: the rows are allocated and initialised), it makes ``--calls`` calls and reports the CPU
time of one call split into its parts, summed over the client and both workers:

- the stages the code marks itself (:mod:`carls_dask.bank.stages`, switched on here in every process):
  the client's key conversion, validation, hashing, routing, splitting, building and issuing calls and
  reassembly; the shard's lock, key check, dedupe, index probe, allocation, gather, optimizer
  arithmetic, write, provenance, change marks and delta log;
- the transport: distributed's ``dumps``/``loads`` of every message (serialization, deserialization,
  timed in whichever thread runs them) and, as "the hop", the rest of the CPU time of the threads that
  carry messages (the event loops of the client and the workers, and their offload threads);
- what each thread spent outside the marked stages (the shard's dispatch: the actor thread's rest).

Per-thread CPU times are read from the kernel (``pthread_getcpuclockid``) before and after the calls,
so the parts add up to the CPU time the processes really spent. The same accounting is shown for a bare
actor returning a preallocated array of the lookup answer's bytes (the transport floor). With ``--log``
the bank appends every mutating batch to a delta log (``log_sync=False``). Everything shares the
machine's cores, so wall time per call is shown next to CPU time. Run:
``python benchmarks/bank_profile.py [--rows N] [--calls N] [--log] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

D = 64
BATCHES = (4096, 65536)
OPS = ("lookup", "update", "apply_gradients", "insert")

#: The order of the parts in the table: (part, stage).
ORDER = [
    ("client", "key conversion"), ("client", "validation"), ("client", "hashing"), ("client", "routing"),
    ("client", "hashing and routing"),
    ("client", "splitting"), ("client", "building calls"), ("client", "issuing calls"), ("client", "waiting"),
    ("client", "reassembly"), ("client", "rest of the caller's thread"),
    ("transport", "serialization"), ("transport", "deserialization"), ("transport", "the hop"),
    ("shard", "lock"), ("shard", "key check and hashing"), ("shard", "validation"), ("shard", "dedupe"),
    ("shard", "index probe"), ("shard", "allocation"), ("shard", "gather"), ("shard", "optimizer arithmetic"),
    ("shard", "write"), ("shard", "provenance"), ("shard", "change marks"), ("shard", "delta log"),
    ("shard", "dispatch (rest of the actor thread)"),
    ("other", "other threads (profiler, monitors, heartbeats)"),
]

ANSWER_ROW_BYTES = D * 4 + 4 * 8


class Bare:
    """The transport floor: returns a preallocated array of a lookup answer's bytes (values + provenance)."""

    def __init__(self) -> None:
        self.out = {b: np.ones((b, ANSWER_ROW_BYTES // 4), np.float32) for b in BATCHES}

    def get(self, keys: np.ndarray) -> np.ndarray:
        return self.out[keys.shape[0]]


def _snapshot() -> dict[str, Any]:
    from carls_dask.bank import stages

    return {"pid": os.getpid(), **stages.snapshot()}


def _reset() -> None:
    from carls_dask.bank import stages

    stages.reset()


def _enable() -> None:
    from carls_dask.bank import stages

    stages.enable()


def _classify(proc: str, thread: str, loop_thread: str) -> str:
    """The role of a thread: caller, loop (carries messages), actor (runs shard methods), other."""
    low = thread.lower()
    if thread == loop_thread or "offload" in low:
        return "loop"
    if proc == "client" and thread == "MainThread":
        return "caller"
    if proc != "client" and "actor" in low:
        return "actor"
    return "other"


def _current_thread() -> str:
    """Name of the calling thread (``Client.run`` calls it on the worker's event loop)."""
    import threading

    return threading.current_thread().name


def _diff(before: dict[str, Any], after: dict[str, Any]) -> tuple[dict[str, float], dict[tuple[str, str, str], float]]:
    threads = {name: after["threads"][name] - before["threads"].get(name, 0.0) for name in after["threads"]}
    b = {(t, p, s): cpu for t, p, s, cpu, _wall, _n in before["stages"]}
    stages = {}
    for t, p, s, cpu, _wall, _n in after["stages"]:
        d = cpu - b.get((t, p, s), 0.0)
        if d > 0:
            stages[(t, p, s)] = d
    return threads, stages


def measure(client: Any, workers: list[str], call: Callable[[int], Any], n_calls: int) -> dict[str, Any]:
    """CPU per call by (part, stage) over ``n_calls`` calls of ``call(i)``, and wall time per call."""
    call(0)  # warm-up
    # the client's loop thread (which a LocalCluster's scheduler shares), and each worker's
    loops = {"client": "IO loop", **client.run(_current_thread)}
    before = {"client": _snapshot(), **client.run(_snapshot)}
    walls = []
    for i in range(n_calls):
        t0 = time.perf_counter()
        call(i + 1)
        walls.append(time.perf_counter() - t0)
    after = {"client": _snapshot(), **client.run(_snapshot)}
    parts: dict[tuple[str, str], float] = {}
    others: dict[str, float] = {}
    for proc in before:
        threads, marked = _diff(before[proc], after[proc])
        in_thread: dict[str, float] = {}
        for (t, p, s), cpu in marked.items():
            parts[(p, s)] = parts.get((p, s), 0.0) + cpu
            in_thread[t] = in_thread.get(t, 0.0) + cpu
        for t, cpu in threads.items():
            rest = max(cpu - in_thread.get(t, 0.0), 0.0)
            role = _classify(proc, t, loops[proc])
            key = {"caller": ("client", "rest of the caller's thread"), "loop": ("transport", "the hop"),
                   "actor": ("shard", "dispatch (rest of the actor thread)")}.get(
                       role, ("other", "other threads (profiler, monitors, heartbeats)"))
            parts[key] = parts.get(key, 0.0) + rest
            if rest > 0:
                others[f"{role}: {proc} / {t}"] = rest / n_calls
    return {"cpu": {f"{p}: {s}": v / n_calls for (p, s), v in parts.items()},
            "wall": statistics.median(walls), "mean_wall": sum(walls) / len(walls), "others": others}


def table(results: dict[str, dict[str, Any]], columns: list[str]) -> str:
    """A markdown table of CPU microseconds per call by part and stage (rows with no time left out)."""
    lines = ["| part | stage | " + " | ".join(columns) + " |", "|---|---|" + "---:|" * len(columns)]
    groups: dict[str, list[float]] = {}
    for part, stage in ORDER:
        key = f"{part}: {stage}"
        vals = [results[c]["cpu"].get(key, 0.0) * 1e6 for c in columns]
        groups.setdefault(part, [0.0] * len(columns))
        groups[part] = [a + b for a, b in zip(groups[part], vals, strict=True)]
        if max(vals) < 0.5:
            continue
        lines.append(f"| {part} | {stage} | " + " | ".join(f"{v:,.0f}" for v in vals) + " |")
    for part, vals in groups.items():
        lines.append(f"| **{part}** | **all** | " + " | ".join(f"**{v:,.0f}**" for v in vals) + " |")
    total = [sum(results[c]["cpu"].values()) * 1e6 for c in columns]
    lines.append("| **all** | **CPU per call** | " + " | ".join(f"**{v:,.0f}**" for v in total) + " |")
    lines.append("| | wall time per call (median) | " + " | ".join(f"{results[c]['wall'] * 1e6:,.0f}" for c in columns)
                 + " |")
    lines.append("| | rows/s (median call) | " + " | ".join(
        f"{results[c]['batch'] / results[c]['wall'] / 1e6:.2f} M" for c in columns) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=400_000, help="rows in the table (default 400k)")
    ap.add_argument("--calls", type=int, default=0, help="calls per operation and batch (default 200 / 20)")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--log", action="store_true", help="log every mutating batch to a delta log (no fsync)")
    ap.add_argument("--json", default=None, help="write the raw figures to this file")
    args = ap.parse_args()

    import dask
    from distributed import Client, LocalCluster

    from carls_dask.bank import Column, KnowledgeBank, TableSpec, stages

    calls = {4096: args.calls or 200, 65536: max(1, (args.calls or 200) // 10)}
    rng = np.random.default_rng(0)
    keys = rng.choice(2**62, size=args.rows, replace=False).astype(np.int64)
    spec = TableSpec("bench", columns=(Column("embedding", shape=(D,)),), optimizer="adagrad", learning_rate=0.05,
                     initializer="normal", init_scale=0.1)
    t_start = time.perf_counter()
    load = os.getloadavg()[0]
    results: dict[str, dict[str, Any]] = {}
    log_root = tempfile.mkdtemp(prefix="bank-profile-") if args.log else None
    with dask.config.set({"distributed.worker.memory.target": False, "distributed.worker.memory.spill": False}), \
            LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0",
                         memory_limit=0) as cluster, Client(cluster, direct_to_workers=True) as client:
        workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
        bank = KnowledgeBank.create(client, [spec], n_shards=args.shards, workers=workers,
                                    initial_capacity=args.rows // args.shards + 4096, log_root=log_root,
                                    log_sync=False)
        for i in range(0, args.rows, 65536):
            bank.lookup("bench", keys[i:i + 65536], insert=True)
        bare = client.submit(Bare, actor=True, workers=[workers[-1]]).result()
        stages.enable()
        client.run(_enable)
        for b in BATCHES:
            n = calls[b]
            batches = [rng.choice(keys, b) for _ in range(n + 1)]
            values = np.full((b, D), 0.01, np.float32)
            fresh = [np.arange(i * b, (i + 1) * b, dtype=np.int64) + (b << 40) for i in range(n + 1)]  # new keys
            ops: dict[str, Callable[[int], Any]] = {
                "lookup": lambda i, bs=batches: bank.lookup("bench", bs[i]),
                "update": lambda i, bs=batches, v=values: bank.update("bench", bs[i], {"embedding": v}),
                "apply_gradients": lambda i, bs=batches, v=values: bank.apply_gradients("bench", bs[i], v),
                "insert": lambda i, fs=fresh: bank.lookup("bench", fs[i], insert=True),
                "bare actor": lambda i, bs=batches: bare.get(bs[i]).result(),
            }
            for op, fn in ops.items():
                got = measure(client, workers, fn, n)
                got["batch"] = b
                results[f"{op} {b:,}"] = got
                print(f"  {op} at {b:,}: {got['wall'] * 1e3:.2f} ms per call, "
                      f"{sum(got['cpu'].values()) * 1e3:.2f} ms CPU", flush=True)
        bank.close()
    columns = [f"{op} {b:,}" for op in (*OPS, "bare actor") for b in BATCHES]
    print()
    print(f"CPU microseconds per call, summed over the client and {args.shards} shard workers "
          f"({args.rows:,}-row table, d={D}, Adagrad, {'with' if args.log else 'no'} delta log; "
          f"{calls[4096]} / {calls[65536]} calls; load average {load:.1f} before, {os.getloadavg()[0]:.1f} after, "
          f"on {os.cpu_count()} cores; {time.perf_counter() - t_start:.0f} s)")
    print()
    print(table(results, columns))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
