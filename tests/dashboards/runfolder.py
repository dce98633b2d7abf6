"""Write run folders (bank snapshots through carls_dask.storage.snapshots, metrics through carls_dask.storage.metrics) for tests.

Also runnable as a background writer: ``python -m tests.dashboards.runfolder RUN --period 0.3``
commits a new snapshot (with more rows) every period until killed, and appends metric rows.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time

import numpy as np

from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, write_shard

BUCKETS = 64
N_SHARDS = 2


def shard_states(
    keys: np.ndarray,
    columns: dict[str, np.ndarray],
    *,
    model_step: int = 0,
    version: int = 1,
    wall_time: float | None = None,
    n_shards: int = N_SHARDS,
    buckets: int = BUCKETS,
) -> list[dict[str, object]]:
    """Split rows into exported shard states (the format ShardCore.export_state produces)."""
    keys = np.asarray(keys, np.int64)
    bucket = (keys % buckets).astype(np.int32)
    t = time.time() if wall_time is None else wall_time
    specs = {
        name: {"name": name, "dtype": str(arr.dtype), "shape": list(arr.shape[1:])} for name, arr in columns.items()
    }
    states = []
    for shard in range(n_shards):
        m = bucket % n_shards == shard
        n = int(m.sum())
        arrays: dict[str, np.ndarray] = {
            "keys": keys[m],
            "bucket": bucket[m],
            "frequency": np.ones(n, np.int64),
            "prov/version": np.full(n, version, np.int64),
            "prov/model_step": np.full(n, model_step, np.int64),
            "prov/maker": np.ones(n, np.int32),  # code 1: "labeller"
            "prov/wall_time": np.full(n, t, np.float64),
        }
        for name, arr in columns.items():
            arrays[f"col/{name}"] = np.asarray(arr)[m]
        states.append(
            {
                "meta": {
                    "format": 1,
                    "shard": shard,
                    "n_shards": n_shards,
                    "buckets": buckets,
                    "owned_buckets": [b for b in range(buckets) if b % n_shards == shard],
                    "tables": {"nodes": {"name": "nodes", "columns": list(specs.values())}},
                    "makers": ["", "labeller"],
                    "version": version,
                    "optimizer": {},
                },
                "tables": {"nodes": arrays},
            }
        )
    return states


def write_snapshot(bank: pathlib.Path, step: int, keys: np.ndarray, columns: dict[str, np.ndarray],
                   delta_seqs: list[int] | None = None, **kw: object) -> None:
    """Commit one snapshot of table ``nodes`` holding ``columns`` for ``keys``.

    ``delta_seqs`` are the shards' delta-log sequence numbers the snapshot includes (0 without a log).
    """
    handle = begin_snapshot(bank, step)
    for s, state in enumerate(shard_states(keys, columns, model_step=step, **kw)):  # type: ignore[arg-type]
        write_shard(handle, state, delta_seq=delta_seqs[s] if delta_seqs else 0)
    commit_snapshot(handle)


def write_with_label_table(bank: pathlib.Path, step: int, node_columns: dict[str, np.ndarray],
                           keys: np.ndarray, labelled: np.ndarray, labels: dict[str, np.ndarray]) -> None:
    """Commit one snapshot with table ``nodes`` (``node_columns`` for ``keys``) and table ``pseudo_labels``
    (``labels`` for the ``labelled`` keys), laid out as the semi-supervised paradigm keeps its pseudo labels."""
    node_states = shard_states(keys, node_columns, model_step=step)
    label_states = shard_states(labelled, labels, model_step=step)
    handle = begin_snapshot(bank, step)
    for nodes_state, labels_state in zip(node_states, label_states, strict=True):
        meta = nodes_state["meta"]
        meta["tables"]["pseudo_labels"] = labels_state["meta"]["tables"]["nodes"] | {"name": "pseudo_labels"}  # type: ignore[index]
        nodes_state["tables"]["pseudo_labels"] = labels_state["tables"]["nodes"]  # type: ignore[index]
        write_shard(handle, nodes_state, delta_seq=0)
    commit_snapshot(handle)


def nodes(n: int, step: int, d: int = 8, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``n`` rows of a three-cluster table whose embeddings drift a little with ``step``."""
    rng = np.random.default_rng(seed)
    keys = np.arange(n, dtype=np.int64)
    truth = keys % classes
    centres = rng.normal(size=(classes, d)) * 4
    noise = np.random.default_rng(seed + 1 + step).normal(size=(n, d)) * 0.3
    emb = (centres[truth] + noise + 0.05 * step).astype(np.float32)
    pseudo = truth.copy()
    pseudo[keys % 7 == 0] = (truth[keys % 7 == 0] + 1) % classes  # some wrong labels
    pseudo[keys % 5 == 0] = -1  # some unlabelled rows
    conf = np.where(pseudo == truth, 0.9, 0.4).astype(np.float32)
    difficulty = (1.0 - conf + 0.01 * (keys % 10)).astype(np.float32)
    return keys, {"embedding": emb, "pseudo_label": pseudo, "confidence": conf, "difficulty": difficulty}


def write_truth(run: pathlib.Path, n: int, classes: int = 3) -> None:
    """Held-out labels of the :func:`nodes` table."""
    keys = np.arange(n, dtype=np.int64)
    np.savez(run / "truth.npz", keys=keys, labels=keys % classes)


def delta_rows(keys: np.ndarray, columns: dict[str, np.ndarray], step: int, shard: int) -> dict[str, np.ndarray]:
    """The upsert record of shard ``shard`` for new rows (full rows, as the bank logs them)."""
    state = shard_states(keys, columns, model_step=step, version=1)[shard]
    return state["tables"]["nodes"]  # type: ignore[index,return-value]


def inline_run(root: pathlib.Path, paradigm: str, variant: str, seed: int, steps: int, **overrides: object) -> pathlib.Path:
    """A real run of a shipped paradigm, in process, in ``root/PARADIGM-VARIANT-SEED`` (a semi-supervised one skips the
    calling test where the Planetoid files are not present)."""
    from carls_dask.runtime.registry import get_paradigm
    from carls_dask.runtime.runner import run_inline
    from tests.datasets import planetoid_dir

    if paradigm == "semi-supervised":
        planetoid_dir()
    p = get_paradigm(paradigm)
    run_dir = root / f"{paradigm}-{variant}-{seed}"
    run_inline(p, p.settings(variant, steps=steps, seed=seed, **overrides), variant=variant, run_dir=run_dir)
    return run_dir


def real_run(root: pathlib.Path, variant: str, seed: int, steps: int = 20) -> pathlib.Path:
    """A real semi-supervised run on Cora, in process (the calling test skips where Cora is not present)."""
    return inline_run(root, "semi-supervised", variant, seed, steps)


def snapshot_run(run: pathlib.Path) -> pathlib.Path:
    """A run folder with one committed bank snapshot (300 nodes at step 10) and held-out labels."""
    keys, columns = nodes(300, step=10)
    write_snapshot(run / "bank", 10, keys, columns)
    write_truth(run, 300)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run", type=pathlib.Path)
    parser.add_argument("--period", type=float, default=0.5, help="seconds between bank writes")
    parser.add_argument("--snapshot-every", type=int, default=6, help="writes between snapshots")
    parser.add_argument("--start-rows", type=int, default=2000)
    parser.add_argument("--grow", type=int, default=7, help="rows each write adds")
    args = parser.parse_args()
    from carls_dask.storage.deltalog import DeltaLog
    from carls_dask.storage.metrics import MetricWriter

    args.run.mkdir(parents=True, exist_ok=True)
    bank = args.run / "bank"
    write_truth(args.run, 1_000_000)
    step, rows = 10, args.start_rows
    keys, cols = nodes(rows, step)
    write_snapshot(bank, step, keys, cols)
    logs = [DeltaLog(bank, s, sync=False) for s in range(N_SHARDS)]
    writer = MetricWriter(args.run / "metrics.zarr", run="dashboard-test")
    i = 0
    while True:
        i += 1
        step += 10
        keys, cols = nodes(rows + args.grow, step)
        new = slice(rows, rows + args.grow)
        for s, log in enumerate(logs):
            log.append(step, "nodes", "upsert", delta_rows(keys[new], {k: v[new] for k, v in cols.items()}, step, s))
        rows += args.grow
        if i % args.snapshot_every == 0:
            write_snapshot(bank, step, keys, cols, delta_seqs=[log.seq for log in logs])
        writer.append(step, bank_rows=float(rows), bank_lookups=float(step * 100), bank_updates=float(step * 40),
                      pacing=min(1.0, step / 500), admitted_fraction=min(1.0, step / 520), train_loss=1.0 / step,
                      **{"trainer.loss": 1.0 / step, "trainer.val_acc": 1.0 - 1.0 / step, "labeller.staleness_s": 0.1 * i})
        writer.flush()
        # written aside and renamed, so a reader never sees the file empty between truncation and write
        (args.run / "writer.progress.tmp").write_text(f"{step} {rows}\n")
        os.replace(args.run / "writer.progress.tmp", args.run / "writer.progress")
        time.sleep(args.period)


if __name__ == "__main__":
    main()
