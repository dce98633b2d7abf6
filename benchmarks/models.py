"""The models users bring, each trained three ways in one process, in turns: in-process tables, a bank, a pipelined bank.

Three models, each with its embedding tables held three ways and everything else the same (data, batches,
dense layers and their Adam, the tables' optimizer: Adagrad with the same learning rate and initial
accumulator, no epsilon):

- ``in-process``: ``torch.nn.Embedding`` / ``torch.nn.EmbeddingBag`` with ``sparse=True`` in this (the
  trainer's) process, trained by ``torch.optim.Adagrad``;
- ``bank``: the tables in a 2-shard bank on a two-worker LocalCluster (one thread each), read in forward and
  trained by the shards' Adagrad in backward, in the exact order of the in-process model;
- ``bank, pipelined``: the same, each step first prefetching the next batch's rows, gradients pushed in the
  background (``staleness=1``).

The models:

(a) ``two-tower``: a retrieval model on synthetic implicit feedback (20,000 users x 5,000 items; user,
    history-bag and item tables of 32 dims; a small user-tower MLP; in-batch and shared sampled negatives;
    batch 1,024), judged by HR@10 and AUC of one held-out item per user;
(b) ``dlrm``: a DLRM-style click model on synthetic Criteo-shaped data (13 dense features, 8 sparse features of
    Zipf-distributed ids in tables of 100 to 1,000,000 rows, 16 dims, bottom MLP 13-64-16, pairwise dot
    interactions, top MLP 52-64-1; batch 2,048), judged by AUC and log loss on held-out samples;
(c) ``single``: one 1M x 64 table of Zipf keys under an MLP 64-256-256-1 at batch 4,096 (the model of
    ``benchmarks/embedding_layer.py``), judged by the accuracy of the last 50 steps' logits.

The three ways of a model train the same batches in turns (``--rounds`` blocks of steps each), so load from
other work falls on all of them alike; the step rate is the median over every step of a way, and each way is
evaluated after its last step. Beside the bank ways the script prints the bank calls per shard per step and,
with ``--profile``, where a step's time goes (the step profile of :mod:`carls_dask.nn.profile`).

Run: ``python benchmarks/models.py [--models two-tower,dlrm,single] [--steps S] [--rounds R] [--seed N]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

#: The tables' optimizer, the same on both sides.
TABLE_LR = 0.05
INIT_ACC = 0.1
INIT_SCALE = 0.05
DENSE_LR = 2e-3


# -- holding tables ---------------------------------------------------------------------------------
class Tables:
    """Makes a model's embedding tables, held in this process or in a bank (the only difference of the ways)."""

    name = "in-process"

    def __init__(self) -> None:
        self.modules: list[nn.Module] = []

    def embedding(self, table: str, rows: int, dim: int) -> nn.Module:
        m = nn.Embedding(rows, dim, sparse=True)
        nn.init.normal_(m.weight, std=INIT_SCALE)
        self.modules.append(m)
        return m

    def bag(self, table: str, rows: int, dim: int, mode: str = "mean") -> nn.Module:
        m = nn.EmbeddingBag(rows, dim, mode=mode, sparse=True)
        nn.init.normal_(m.weight, std=INIT_SCALE)
        self.modules.append(m)
        return m

    def optimizers(self, model: nn.Module) -> list[torch.optim.Optimizer]:
        table_params = [p for m in self.modules for p in m.parameters()]
        ids = {id(p) for p in table_params}
        dense = [p for p in model.parameters() if id(p) not in ids]
        return [torch.optim.Adam(dense, lr=DENSE_LR),
                torch.optim.Adagrad(table_params, lr=TABLE_LR, initial_accumulator_value=INIT_ACC, eps=0.0)]

    def prefetch(self, model: Any, batch: Any) -> None:
        """Nothing to prefetch in this process."""

    def finish(self) -> None:
        """Nothing in flight."""


class BankTables(Tables):
    """Tables in a bank: one :class:`~carls_dask.nn.BankEmbedding` / ``BankEmbeddingBag`` per table."""

    def __init__(self, bank: Any, pipeline: bool) -> None:
        super().__init__()
        self.bank = bank
        self.pipeline = pipeline
        self.name = "bank, pipelined" if pipeline else "bank"

    def embedding(self, table: str, rows: int, dim: int) -> nn.Module:
        from carls_dask.nn import BankEmbedding

        m = BankEmbedding(self.bank, table, pipeline=self.pipeline)
        self.modules.append(m)
        return m

    def bag(self, table: str, rows: int, dim: int, mode: str = "mean") -> nn.Module:
        from carls_dask.nn import BankEmbeddingBag

        m = BankEmbeddingBag(self.bank, table, mode=mode, pipeline=self.pipeline)
        self.modules.append(m)
        return m

    def optimizers(self, model: nn.Module) -> list[torch.optim.Optimizer]:
        return [torch.optim.Adam(model.parameters(), lr=DENSE_LR)]

    def prefetch(self, model: Any, batch: Any) -> None:
        if self.pipeline:
            model.prefetch(batch)

    def finish(self) -> None:
        for m in self.modules:
            m.flush()  # type: ignore[operator]


def table_specs(shapes: Sequence[tuple[str, int]]) -> list[Any]:
    """Bank tables of the given (name, dim) with the benchmark's Adagrad."""
    from carls_dask.bank import Column, TableSpec

    return [TableSpec(name, columns=(Column("embedding", shape=(dim,)),), optimizer="adagrad",
                      learning_rate=TABLE_LR, initializer="normal", init_scale=INIT_SCALE,
                      adagrad_initial_accumulator=INIT_ACC) for name, dim in shapes]


# -- (a) two-tower retrieval --------------------------------------------------------------------------
class TwoTowerData:
    """Synthetic implicit feedback: users pick items by a hidden taste (latent dot product plus popularity).

    Every user has ``history`` past items (the history bag) and ``train_per_user`` training positives
    drawn from the same distribution; one more per user is held out for evaluation.
    """

    def __init__(self, users: int = 20_000, items: int = 5_000, history: int = 20, train_per_user: int = 40,
                 latent: int = 16, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.users, self.items, self.history_len = users, items, history
        u = rng.normal(size=(users, latent)).astype(np.float32)
        v = rng.normal(size=(items, latent)).astype(np.float32)
        pop = rng.normal(scale=1.0, size=items).astype(np.float32)
        per = history + train_per_user + 1
        picks = np.empty((users, per), dtype=np.int64)
        for s in range(0, users, 2_000):
            logits = u[s:s + 2_000] @ v.T / np.sqrt(latent) * 2.0 + pop
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            cum = p.cumsum(axis=1) + np.arange(p.shape[0])[:, None]  # rows stacked into one increasing array
            draws = rng.random((p.shape[0], per)) + np.arange(p.shape[0])[:, None]
            at = np.searchsorted(cum.ravel(), draws.ravel()).reshape(draws.shape) - np.arange(p.shape[0])[:, None] * items
            picks[s:s + 2_000] = np.minimum(at, items - 1)
        self.hist = picks[:, :history]
        train = picks[:, history:history + train_per_user]
        self.test_items = picks[:, -1]
        self.train_users = np.repeat(np.arange(users, dtype=np.int64), train_per_user)
        self.train_items = train.reshape(-1)
        order = rng.permutation(self.train_users.shape[0])
        self.train_users, self.train_items = self.train_users[order], self.train_items[order]

    def batches(self, batch: int, n: int, shared: int, seed: int) -> list[dict[str, torch.Tensor]]:
        rng = np.random.default_rng(seed)
        out = []
        total = self.train_users.shape[0]
        for i in range(n):
            at = (i * batch) % (total - batch)
            users = self.train_users[at:at + batch]
            out.append({"user": torch.from_numpy(users),
                        "history": torch.from_numpy(self.hist[users]),
                        "item": torch.from_numpy(self.train_items[at:at + batch]),
                        "shared": torch.from_numpy(rng.integers(0, self.items, size=shared))})
        return out


class TwoTower(nn.Module):
    """User tower (user row, mean of the history bag, MLP) against item rows; in-batch and shared negatives."""

    def __init__(self, tables: Tables, data: TwoTowerData, dim: int = 32) -> None:
        super().__init__()
        self.users = tables.embedding("users", data.users, dim)
        self.history = tables.bag("history", data.items, dim, mode="mean")
        self.items = tables.embedding("items", data.items, dim)
        torch.manual_seed(0)
        self.user_mlp = nn.Sequential(nn.Linear(2 * dim, 64), nn.ReLU(), nn.Linear(64, dim))
        self.temperature = 0.1

    def user_vectors(self, user: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.users(user), self.history(history)], dim=1)
        return nn.functional.normalize(self.user_mlp(x), dim=1)

    def item_vectors(self, items: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(self.items(items), dim=1)

    def prefetch(self, batch: dict[str, torch.Tensor]) -> None:
        self.users.prefetch(batch["user"])
        self.history.prefetch(batch["history"])
        self.items.prefetch(torch.cat([batch["item"], batch["shared"]]))

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        u = self.user_vectors(batch["user"], batch["history"])
        candidates = self.item_vectors(torch.cat([batch["item"], batch["shared"]]))
        logits = u @ candidates.T / self.temperature
        return nn.functional.cross_entropy(logits, torch.arange(u.shape[0]))


def two_tower_quality(model: TwoTower, data: TwoTowerData, users: int = 4_000, seed: int = 1) -> dict[str, float]:
    """HR@10 of the held-out item among all items, and AUC of its score against a random item's."""
    rng = np.random.default_rng(seed)
    who = rng.choice(data.users, size=users, replace=False)
    model.eval()
    with torch.no_grad():
        u = model.user_vectors(torch.from_numpy(who), torch.from_numpy(data.hist[who]))
        scores = u @ model.item_vectors(torch.arange(data.items)).T
    model.train()
    s = scores.numpy()
    pos = s[np.arange(users), data.test_items[who]]
    rank = (s > pos[:, None]).sum(axis=1)
    neg = s[np.arange(users), rng.integers(0, data.items, size=users)]
    return {"HR@10": float((rank < 10).mean()), "AUC": float((pos > neg).mean() + 0.5 * (pos == neg).mean())}


# -- (b) DLRM-style click model ----------------------------------------------------------------------
DLRM_ROWS = (1_000_000, 300_000, 100_000, 30_000, 10_000, 3_000, 1_000, 100)


class ClickData:
    """Criteo-shaped synthetic clicks: 13 dense features and one Zipf-distributed id per sparse feature.

    The click probability is a hidden logistic model: a weight per id of every feature (drawn once) plus a
    linear function of the dense features.
    """

    def __init__(self, rows: Sequence[int] = DLRM_ROWS, dense: int = 13, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.rows = tuple(int(r) for r in rows)
        self.dense = dense
        self.weights = [self.rng.normal(scale=0.6, size=r).astype(np.float32) for r in self.rows]
        self.perm = [self.rng.permutation(r) for r in self.rows]  # popular ids spread over the table
        self.beta = self.rng.normal(scale=0.3, size=dense).astype(np.float32)

    def sample(self, n: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        x = rng.normal(size=(n, self.dense)).astype(np.float32)
        ids = np.stack([p[(rng.zipf(1.1, size=n) - 1) % r] for p, r in zip(self.perm, self.rows, strict=True)], 1)
        logit = x @ self.beta - 1.0
        for f, w in enumerate(self.weights):
            logit = logit + w[ids[:, f]]
        y = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return {"dense": torch.from_numpy(x), "ids": torch.from_numpy(ids.astype(np.int64)),
                "label": torch.from_numpy(y)}

    def batches(self, batch: int, n: int, seed: int) -> list[dict[str, torch.Tensor]]:
        rng = np.random.default_rng(seed)
        return [self.sample(batch, rng) for _ in range(n)]


class DLRM(nn.Module):
    """Bottom MLP on the dense features, one pooled row per sparse feature, pairwise dots, top MLP."""

    def __init__(self, tables: Tables, data: ClickData, dim: int = 16) -> None:
        super().__init__()
        self.features = [f"f{i}" for i in range(len(data.rows))]
        self.tables = nn.ModuleList([tables.bag(f, r, dim, mode="sum") for f, r in zip(self.features, data.rows,
                                                                                           strict=True)])
        torch.manual_seed(0)
        self.bottom = nn.Sequential(nn.Linear(data.dense, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        k = len(data.rows) + 1
        self.pairs = torch.triu_indices(k, k, offset=1)
        self.top = nn.Sequential(nn.Linear(dim + self.pairs.shape[1], 64), nn.ReLU(), nn.Linear(64, 1))

    def prefetch(self, batch: dict[str, torch.Tensor]) -> None:
        for f, t in enumerate(self.tables):
            t.prefetch(batch["ids"][:, f:f + 1])  # type: ignore[operator]

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        d = self.bottom(batch["dense"])
        rows = [t(batch["ids"][:, f:f + 1]) for f, t in enumerate(self.tables)]
        z = torch.stack([d, *rows], dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([d, inter], dim=1)).squeeze(1)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(self.logits(batch), batch["label"])


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties counted half)."""
    from scipy.stats import rankdata

    r = rankdata(scores)
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def click_quality(model: DLRM, test: dict[str, torch.Tensor]) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        z = model.logits(test)
    model.train()
    y = test["label"]
    return {"AUC": auc(z.numpy(), y.numpy()),
            "logloss": float(nn.functional.binary_cross_entropy_with_logits(z, y))}


# -- (c) one table --------------------------------------------------------------------------------------
class Single(nn.Module):
    """One table of Zipf keys under an MLP 64-256-256-1; a key's label is its parity."""

    def __init__(self, tables: Tables, rows: int = 1_000_000, dim: int = 64) -> None:
        super().__init__()
        self.embedding = tables.embedding("ids", rows, dim)
        torch.manual_seed(0)
        self.mlp = nn.Sequential(nn.Linear(dim, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
        self.correct: list[float] = []

    def prefetch(self, batch: torch.Tensor) -> None:
        self.embedding.prefetch(batch)  # type: ignore[operator]

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        z = self.mlp(self.embedding(batch)).squeeze(-1)
        y = (batch % 2).to(torch.float32)
        self.correct.append(float(((z > 0).float() == y).float().mean()))
        return nn.functional.binary_cross_entropy_with_logits(z, y)


def zipf_keys(rows: int, batch: int, n: int, seed: int) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    return [torch.from_numpy((rng.zipf(1.1, size=batch) - 1) % rows) for _ in range(n)]


# -- running --------------------------------------------------------------------------------------------
@dataclass
class Way:
    """One way of holding a model's tables, its model and optimizers, and what its steps took."""

    tables: Tables
    model: Any
    optimizers: list[torch.optim.Optimizer]
    times: list[float] = field(default_factory=list)
    calls: list[float] = field(default_factory=list)
    quality: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.tables.name

    def run(self, batches: Sequence[Any], upto: int, record: bool = True) -> None:
        """Train on ``batches[:upto]`` (prefetching ``batches[i + 1]`` at step ``i`` when pipelined)."""
        for i in range(upto):
            t0 = time.perf_counter()
            if i + 1 < len(batches):
                self.tables.prefetch(self.model, batches[i + 1])
            loss = self.model.loss(batches[i])
            for o in self.optimizers:
                o.zero_grad()
            loss.backward()
            for o in self.optimizers:
                o.step()
            if record:
                self.times.append(time.perf_counter() - t0)

    @property
    def steps_per_s(self) -> float:
        return 1.0 / statistics.median(self.times)


def messages_per_shard_step(way: Way, steps: int) -> float | None:
    bank = getattr(way.tables, "bank", None)
    if bank is None:
        return None
    return bank.counters.messages / steps / bank.n_shards


def run_in_turns(ways: Sequence[Way], batches: Sequence[Any], rounds: int, warmup: int = 5) -> None:
    """Each way trains ``batches`` in ``rounds`` blocks, the ways taking turns block by block."""
    n = len(batches)
    edges = np.linspace(0, n, rounds + 1).astype(int)
    done = [0] * len(ways)
    for r in range(rounds):
        for w_i, way in enumerate(ways):
            start, stop = done[w_i], int(edges[r + 1])
            for i in range(start, stop):
                t0 = time.perf_counter()
                if i + 1 < n:
                    way.tables.prefetch(way.model, batches[i + 1])
                loss = way.model.loss(batches[i])
                for o in way.optimizers:
                    o.zero_grad()
                loss.backward()
                for o in way.optimizers:
                    o.step()
                if i >= warmup:
                    way.times.append(time.perf_counter() - t0)
            done[w_i] = stop
    for way in ways:
        way.tables.finish()
        c = messages_per_shard_step(way, n)
        if c is not None:
            way.calls.append(c)


def start_cluster(threads: int) -> tuple[Any, Any]:
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=threads, processes=True, host="127.0.0.1",
                           dashboard_address=":0")
    return cluster, Client(cluster)


def report(title: str, ways: Sequence[Way], bank: Any) -> None:
    base = ways[0].steps_per_s
    print(f"\n{title}")
    print(f"  {'tables held by':<20} {'steps/s':>8} {'x in-process':>13} {'calls/shard/step':>17}   quality")
    for w in ways:
        q = ", ".join(f"{k} {v:.4f}" for k, v in w.quality.items())
        c = w.calls[0] if w.calls else None
        cs = "-" if c is None else f"{c:.2f}"
        print(f"  {w.name:<20} {w.steps_per_s:>8.1f} {w.steps_per_s / base:>12.2f}x {cs:>17}   {q}")


MODELS: dict[str, Callable[..., None]] = {}


def model(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def register(fn: Callable[..., None]) -> Callable[..., None]:
        MODELS[name] = fn
        return fn
    return register


def ways_of(make: Callable[[Tables], Any], client: Any, shapes: Sequence[tuple[str, int]]) -> Iterator[Way]:
    from carls_dask.bank import KnowledgeBank

    yield _way(Tables(), make)
    for pipeline in (False, True):
        bank = KnowledgeBank.create(client, table_specs(shapes), n_shards=2, timeout=300)
        yield _way(BankTables(bank, pipeline), make)


def _way(tables: Tables, make: Callable[[Tables], Any]) -> Way:
    m = make(tables)
    return Way(tables, m, tables.optimizers(m))


@model("two-tower")
def run_two_tower(client: Any, steps: int, rounds: int, seed: int) -> list[Way]:
    data = TwoTowerData(seed=seed)
    batches = data.batches(1_024, steps, shared=512, seed=seed + 1)
    ways = list(ways_of(lambda t: TwoTower(t, data), client, [("users", 32), ("history", 32), ("items", 32)]))
    run_in_turns(ways, batches, rounds)
    for w in ways:
        w.quality = two_tower_quality(w.model, data)
    return ways


@model("dlrm")
def run_dlrm(client: Any, steps: int, rounds: int, seed: int) -> list[Way]:
    data = ClickData(seed=seed)
    batches = data.batches(2_048, steps, seed=seed + 1)
    test = data.sample(50_000, np.random.default_rng(seed + 2))
    ways = list(ways_of(lambda t: DLRM(t, data), client, [(f"f{i}", 16) for i in range(len(data.rows))]))
    run_in_turns(ways, batches, rounds)
    for w in ways:
        w.quality = click_quality(w.model, test)
    return ways


@model("single")
def run_single(client: Any, steps: int, rounds: int, seed: int) -> list[Way]:
    batches = zipf_keys(1_000_000, 4_096, steps, seed)
    ways = list(ways_of(lambda t: Single(t), client, [("ids", 64)]))
    run_in_turns(ways, batches, rounds)
    for w in ways:
        w.quality = {"accuracy": float(np.mean(w.model.correct[-50:]))}
    return ways


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="two-tower,dlrm,single")
    p.add_argument("--steps", type=int, default=300, help="training steps of every way of a model")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="threads per bank worker")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    cluster, client = start_cluster(args.threads)
    try:
        for name in args.models.split(","):
            t0 = time.perf_counter()
            ways = MODELS[name](client, args.steps, args.rounds, args.seed)
            report(f"{name}: {args.steps} steps per way in {args.rounds} rounds ({time.perf_counter() - t0:.0f} s)",
                   ways, None)
            for w in ways:
                bank = getattr(w.tables, "bank", None)
                if bank is not None:
                    bank.close()
    finally:
        client.close()
        cluster.close()


if __name__ == "__main__":
    main()
