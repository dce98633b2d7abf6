"""What durability costs: step rates with and without the delta log, the bank folder's parts, group commit's syncs.

Prints PASS/FAIL lines for the targets of the per-table durability policies (docs/durability.md):

1. **Step rate.** A two-tower recommender (user and item ``BankEmbedding`` tables and a history
   ``BankEmbeddingBag``, all trained by the bank's Adagrad, an MLP head per tower; :class:`TwoTower`, run
   through the runner on a 2-worker LocalCluster, so the runner's durability defaults are on) and the
   semi-supervised demo (its tables written by makers) train at >= 0.9x the step rate of the same run with
   no log (every table ``snapshot``). After a short warm-up run the runs alternate (``--rounds``), each
   configuration's rate is the median. The former behaviour (every table ``every-write``, the log kept back to the oldest snapshot) is
   printed beside them, without a target.
2. **Bytes.** At the end of a default run the delta log holds no more bytes than the snapshots beside it:
   the two-tower, semi-supervised and node-embeddings runs (``--skip`` leaves parts out). The former
   behaviour's parts are printed beside them.
3. **Group commit.** The same writes (a maker writing ``--writes`` batches of 256 rows into an in-process
   bank) under ``every-write`` and ``group``: syncs of the delta log, the writes' rate, and the group's
   window (most bytes and longest time a frame waited for its sync); group must sync >= 10x fewer times.

Wall-clock figures depend on the machine's load: run it on a quiet machine for the figures to keep.
Run: ``python benchmarks/durability.py [--quick] [--rounds R] [--skip twotower,semi,bytes,group]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from carls_dask.runtime.paradigm import Paradigm
from carls_dask.runtime.trainer import Trainer

# -- the two-tower recommender ------------------------------------------------------------------------
USERS, ITEMS, HISTORY = "users", "items", "history"


@dataclasses.dataclass(frozen=True)
class TwoTowerSettings:
    """A synthetic two-tower recommender.

    Items belong to ``topics`` topics; each user draws ``history + positives + held_out`` distinct items,
    mostly of the two topics they like (see :func:`synthetic`): ``history`` form the user's history,
    ``positives`` the training pairs, ``held_out`` the test items.

    Attributes
    ----------
    steps, seed
        Trainer steps and the seed of the data, the model and the batches.
    users, items, topics, history, positives, held_out
        The synthetic data (see above).
    dim
        Width of the bank's embedding rows and of each tower's output.
    batch
        Training pairs per step (the other items of the batch are each pair's negatives).
    lr, dense_lr
        The bank's Adagrad learning rate and the towers' Adam learning rate.
    eval_users
        Users whose recall@10 is measured at the end.
    """

    steps: int = 300
    seed: int = 0
    users: int = 20_000
    items: int = 5_000
    topics: int = 50
    history: int = 10
    positives: int = 20
    held_out: int = 5
    dim: int = 32
    batch: int = 512
    lr: float = 0.1
    dense_lr: float = 3e-3
    eval_users: int = 2_000

    def __post_init__(self) -> None:
        from carls_dask.errors import ConfigError

        if self.steps < 0 or self.users < self.batch or self.items < self.history + self.positives + self.held_out:
            raise ConfigError(f"two-tower settings {self}: expected steps >= 0, users >= batch and items >= "
                              "history + positives + held_out")


def synthetic(s: TwoTowerSettings) -> dict[str, np.ndarray]:
    """The data of ``s``: ``history`` [users, history], ``pairs`` [users * positives, 2] and ``held_out``
    [users, held_out] item ids (each user's items distinct).

    Items belong to ``topics`` topics and are more or less popular within theirs (Zipf); each user likes two
    topics and draws their items (Gumbel top-k, without replacement) mostly from those, by popularity.
    """
    rng = np.random.default_rng(s.seed)
    topic = rng.integers(0, s.topics, size=s.items)
    popularity = 1.0 / (1.0 + rng.permutation(s.items) % (s.items // s.topics + 1)) ** 0.7
    log_pop = np.log(popularity).astype(np.float32)
    take = s.history + s.positives + s.held_out
    chosen = np.empty((s.users, take), dtype=np.int64)
    for lo in range(0, s.users, 1000):
        hi = min(s.users, lo + 1000)
        liked = np.stack([rng.choice(s.topics, 2, replace=False) for _ in range(hi - lo)])
        inside = (topic[None, :] == liked[:, :1]) | (topic[None, :] == liked[:, 1:])
        scores = log_pop[None, :] + np.where(inside, 0.0, -4.0).astype(np.float32) \
            + rng.gumbel(size=(hi - lo, s.items)).astype(np.float32)
        top = np.argpartition(-scores, take, axis=1)[:, :take]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1)
        chosen[lo:hi] = np.take_along_axis(top, order, axis=1)
    chosen = np.stack([rng.permutation(row) for row in chosen])  # history, training and held-out items alike
    pos = chosen[:, s.history:s.history + s.positives]
    pairs = np.stack([np.repeat(np.arange(s.users), s.positives), pos.reshape(-1)], axis=1)
    return {"history": chosen[:, :s.history], "pairs": pairs, "held_out": chosen[:, s.history + s.positives:]}


def tables(s: TwoTowerSettings) -> list[Any]:
    """The three bank tables, trained by the bank's Adagrad (no durability named: the run's defaults apply)."""
    from carls_dask.bank import Column, TableSpec

    def table(name: str) -> TableSpec:
        return TableSpec(name, columns=(Column("embedding", "float32", (s.dim,), ("dim",)),), optimizer="adagrad",
                         learning_rate=s.lr, initializer="normal", init_scale=0.1, seed=s.seed)

    return [table(USERS), table(ITEMS), table(HISTORY)]


class TwoTowerTrainer(Trainer):
    """Trains the towers with an in-batch softmax (the batch's other items are a pair's negatives); ``finish``
    measures recall@10 of the held-out items.

    A user is its ``users`` row plus the mean of its history's ``history`` rows plus an MLP of both; an item is
    its ``items`` row plus an MLP of it; the score is their dot product.
    """

    def __init__(self, name: str, s: TwoTowerSettings) -> None:
        super().__init__(name, max_steps=s.steps, keep_state=False)
        self.s = s

    def setup(self, ctx: Any) -> None:
        import torch

        from carls_dask.nn import BankEmbedding, BankEmbeddingBag

        s = self.s
        torch.manual_seed(s.seed)
        self.data = synthetic(s)
        self.users = BankEmbedding(ctx.bank, USERS)
        self.items = BankEmbedding(ctx.bank, ITEMS)
        self.hist = BankEmbeddingBag(ctx.bank, HISTORY, mode="mean")
        self.model = torch.nn.ModuleDict({
            "user": torch.nn.Sequential(torch.nn.Linear(2 * s.dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, s.dim)),
            "item": torch.nn.Sequential(torch.nn.Linear(s.dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, s.dim)),
        })  # each tower's head, added to its embeddings (a residual MLP)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=s.dense_lr)
        self.rng = np.random.default_rng(s.seed + 1)

    def _towers(self, users: np.ndarray, items: np.ndarray) -> tuple[Any, Any]:
        import torch

        eu, eh = self.users(users), self.hist(self.data["history"][users])
        uv = eu + eh + self.model["user"](torch.cat([eu, eh], dim=1))
        ei = self.items(items)
        return uv, ei + self.model["item"](ei)

    def step(self, step: int) -> Mapping[str, float]:
        import torch

        pick = self.rng.integers(0, self.data["pairs"].shape[0], size=self.s.batch)
        users, items = self.data["pairs"][pick, 0], self.data["pairs"][pick, 1]
        uv, iv = self._towers(users, items)
        # summed over the batch: each row's gradient is its own (the bank's Adagrad steps by it), not 1/batch of it
        loss = torch.nn.functional.cross_entropy(uv @ iv.T, torch.arange(len(pick)), reduction="sum")
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": float(loss.detach()) / len(pick)}

    def recall_at_10(self) -> float:
        """Recall@10 of the held-out items of the first ``eval_users`` users (history and training items masked)."""
        import torch

        s = self.s
        users = np.arange(min(s.eval_users, s.users))
        with torch.no_grad():
            uv, iv = self._towers(users, np.arange(s.items))
            scores = (uv @ iv.T).numpy()
        seen = np.concatenate([self.data["history"][users],
                               self.data["pairs"][:, 1].reshape(s.users, s.positives)[users]], axis=1)
        np.put_along_axis(scores, seen, -np.inf, axis=1)
        top = np.argpartition(-scores, 10, axis=1)[:, :10]
        held = self.data["held_out"][users]
        hits = (top[:, :, None] == held[:, None, :]).any(axis=1).sum()
        return float(hits / held.size)

    def state(self) -> dict[str, Any]:
        out = super().state()
        out["rng"] = self.rng.bit_generator.state
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]

    def finish(self) -> dict[str, float]:
        return {"recall_at_10": self.recall_at_10()}


class TwoTower(Paradigm):
    """The two-tower recommender as a paradigm (its figure: ``recall_at_10``)."""

    name = "two-tower"
    description = "a synthetic two-tower recommender over bank-held user, item and history embeddings"
    settings_type = TwoTowerSettings
    headline = ("recall_at_10",)

    def tables(self, settings: TwoTowerSettings) -> list[Any]:
        return tables(settings)

    def loops(self, settings: TwoTowerSettings) -> list[Any]:
        return [TwoTowerTrainer("trainer", settings)]


# -- measuring runs -----------------------------------------------------------------------------------
#: The configurations compared: the defaults, no log at all, and the former behaviour.
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "no log": {"carls.run.durability.trained": "snapshot", "carls.run.durability.written": "snapshot"},
    "every-write (former)": {"carls.run.durability.trained": "every-write",
                             "carls.run.durability.written": "every-write", "carls.storage.log-history": "kept"},
}


def run_once(paradigm: Any, settings: Any, conf: Mapping[str, Any], workdir: pathlib.Path, client: Any,
             label: str) -> dict[str, Any]:
    """One run through the runner on ``client``'s cluster with ``conf`` set: its trainer's steps/s, its
    figures and its bank folder's parts."""
    import dask

    from carls_dask.runtime.runner import run_paradigm
    from carls_dask.storage.bankstore import store_bytes
    from carls_dask.storage.runfolder import STEPS_PER_S, RunFolder

    run_dir = pathlib.Path(tempfile.mkdtemp(prefix=f"{label.replace(' ', '-').replace('(', '').replace(')', '')}-",
                                            dir=workdir))
    with dask.config.set({"carls.runtime.progress": False, **conf}):
        result = run_paradigm(paradigm, settings, run_dir=run_dir, cluster=client)
    primary = next(r for r in result.results.values() if r.kind == "trainer")
    bank = RunFolder(run_dir).bank
    parts = store_bytes(bank) if bank.is_dir() else {"snapshots": 0, "log": 0}
    return {"steps_per_s": float(primary.metrics.get(STEPS_PER_S, float("nan"))), "figures": result.figures,
            "parts": parts}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def step_rates(name: str, paradigm: Any, settings: Any, rounds: int, workdir: pathlib.Path, client: Any,
               figure: str) -> None:
    """Part 1 for one paradigm: the configurations in turns, each rate the median of ``rounds`` runs."""
    rates: dict[str, list[float]] = {c: [] for c in CONFIGS}
    figs: dict[str, list[float]] = {c: [] for c in CONFIGS}
    # warm-up, not measured: the workers import the paradigm and compile their kernels once
    run_once(paradigm, dataclasses.replace(settings, steps=min(int(settings.steps), 20)), CONFIGS["no log"], workdir,
             client, f"{name}-warm-up")
    for _ in range(rounds):
        for label, conf in CONFIGS.items():
            got = run_once(paradigm, settings, conf, workdir, client, f"{name}-{label}")
            rates[label].append(got["steps_per_s"])
            figs[label].append(float(got["figures"].get(figure, float("nan"))))
    med = {c: statistics.median(v) for c, v in rates.items()}
    print(f"{name} ({rounds} round(s), median steps/s):")
    for label in CONFIGS:
        print(f"  {label:<22}{med[label]:>9.1f} steps/s  {med[label] / med['no log']:>5.2f}x of no log  "
              f"{figure} {statistics.median(figs[label]):.4f}")
    ratio = med["default"] / med["no log"]
    print(f"  {verdict(ratio >= 0.9)}  {name}: default policies at {ratio:.2f}x the step rate of no log (target >= 0.9x)")


def folder_bytes(name: str, paradigm: Any, settings: Any, workdir: pathlib.Path, client: Any) -> None:
    """Part 2 for one paradigm: the bank folder's parts after a default run (and after the former behaviour)."""
    for label in ("default", "every-write (former)"):
        parts = run_once(paradigm, settings, CONFIGS[label], workdir, client, f"{name}-bytes-{label}")["parts"]
        line = (f"{name} {label}: snapshots {parts['snapshots'] / 1e6:.2f} MB, delta log {parts['log'] / 1e6:.2f} MB")
        if label == "default":
            print(f"  {verdict(parts['log'] <= parts['snapshots'])}  {line} (target: log <= snapshots)")
        else:
            print(f"        {line}")


def group_syncs(writes: int, rows: int = 256) -> None:
    """Part 3: the same writes under every-write and group, syncs counted by the delta log."""
    from carls_dask.bank import Column, KnowledgeBank, TableSpec

    out = {}
    for policy in ("every-write", "group"):
        root = tempfile.mkdtemp(prefix=f"group-{policy}-")
        table = TableSpec("made", columns=(Column("value", "float32", (16,), ("w",)),), optimizer=None,
                          durability=policy)
        with KnowledgeBank.local([table], n_shards=1, log_root=root) as bank:
            rng = np.random.default_rng(0)
            t0 = time.perf_counter()
            for i in range(writes):
                keys = rng.integers(0, 100_000, size=rows)
                bank.update("made", keys, {"value": np.full((rows, 16), i, np.float32)}, maker="bench")
            elapsed = time.perf_counter() - t0
            bank.sync()
            log = bank.stats()["shards"][0]["log"]
        out[policy] = (log, elapsed)
        print(f"  {policy:<12} {writes} writes of {rows} rows: {log['syncs']:>6} syncs, {writes / elapsed:>8.0f} "
              f"writes/s; longest wait for a sync {log['max_unsynced_s'] * 1e3:.1f} ms, most bytes waiting "
              f"{log['max_unsynced_bytes'] / 1e3:.0f} kB")
    every, group = out["every-write"][0]["syncs"], out["group"][0]["syncs"]
    print(f"  {verdict(every >= 10 * group)}  group commit: {every} / {group} = {every / max(group, 1):.1f}x fewer syncs "
          "than every-write for the same writes (target >= 10x)")


def start_cluster() -> tuple[Any, Any]:
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=2, processes=True, host="127.0.0.1", dashboard_address=":0")
    return cluster, Client(cluster)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small runs (a check that it works, not figures to keep)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each configuration in part 1")
    ap.add_argument("--writes", type=int, default=2000, help="write calls of part 3")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: twotower, semi, bytes, group")
    args = ap.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    from carls_dask.runtime.registry import get_paradigm

    quick = args.quick
    two = TwoTower()
    two_settings = TwoTowerSettings(steps=150 if quick else 600, users=5000 if quick else 20_000,
                                    items=2000 if quick else 5_000)
    semi = get_paradigm("semi-supervised")
    semi_settings = semi.settings(steps=100) if quick else semi.settings()
    nodes = get_paradigm("node-embeddings")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="carls-durability-"))
    print(f"runs in {workdir}; wall-clock figures depend on the machine's load")
    parts: list[tuple[str, Callable[[Any], None]]] = [
        ("twotower", lambda c: step_rates("two-tower", two, two_settings, args.rounds, workdir, c, "recall_at_10")),
        ("semi", lambda c: step_rates("semi-supervised", semi, semi_settings, args.rounds, workdir, c, "test_acc")),
    ]
    cluster, client = start_cluster()
    try:
        for name, part in parts:
            if name not in skip:
                part(client)
        if "bytes" not in skip:
            print("bank folder after a default run:")
            node_settings = nodes.settings(steps=100) if quick else nodes.settings()
            for name, p, s in (("two-tower", two, two_settings), ("semi-supervised", semi, semi_settings),
                               ("node-embeddings", nodes, node_settings)):
                folder_bytes(name, p, s, workdir, client)
    finally:
        client.close()
        cluster.close()
    if "group" not in skip:
        print("group commit against every-write:")
        group_syncs(500 if quick else args.writes)


if __name__ == "__main__":
    main()
