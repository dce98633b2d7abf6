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
from collections.abc import Callable, Sequence
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
@dataclass(frozen=True)
class TableDef:
    """One embedding table of a model: its rows and width, the features it serves, and its pooling (None: rows)."""

    name: str
    rows: int
    dim: int
    features: tuple[str, ...]
    pooling: str | None = None


class InProcessTables(nn.Module):
    """The tables in this process: ``torch.nn.Embedding`` / ``EmbeddingBag`` with ``sparse=True``, read by feature,
    starting from the values the bank's initializer gives the same keys."""

    def __init__(self, defs: Sequence[TableDef]) -> None:
        super().__init__()
        self.defs = list(defs)
        self.tables = nn.ModuleList()
        from carls_dask.nn import initial_rows

        for d, spec in zip(self.defs, table_specs([(d.name, d.dim) for d in self.defs]), strict=True):
            m = nn.EmbeddingBag(d.rows, d.dim, mode=d.pooling, sparse=True) if d.pooling else \
                nn.Embedding(d.rows, d.dim, sparse=True)
            with torch.no_grad():  # the rows the bank's initializer gives the same keys: the ways start equal
                m.weight.copy_(torch.from_numpy(initial_rows(spec, "embedding", np.arange(d.rows))))
            self.tables.append(m)

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for d, m in zip(self.defs, self.tables, strict=True):
            for f in d.features:
                x = features[f]
                out[f] = m(x if x.dim() == 2 or not d.pooling else x[:, None])
        return out


class SeparateBankLayers(nn.Module):
    """The tables in a bank, one :class:`~carls_dask.nn.BankEmbedding` / ``BankEmbeddingBag`` per table, as a
    user first writes a model (each layer's read is its own call unless the step prefetches)."""

    def __init__(self, bank: Any, defs: Sequence[TableDef], pipeline: bool = True) -> None:
        super().__init__()
        from carls_dask.nn import BankEmbedding, BankEmbeddingBag

        self.defs = list(defs)
        self.tables = nn.ModuleList([BankEmbeddingBag(bank, d.name, mode=d.pooling, pipeline=pipeline) if d.pooling
                                     else BankEmbedding(bank, d.name, pipeline=pipeline) for d in self.defs])

    def _inputs(self, d: TableDef, features: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        return [features[f] if features[f].dim() == 2 or not d.pooling else features[f][:, None] for f in d.features]

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {f: m(x) for d, m in zip(self.defs, self.tables, strict=True)
                for f, x in zip(d.features, self._inputs(d, features), strict=True)}

    def prefetch(self, features: dict[str, torch.Tensor]) -> None:
        for d, m in zip(self.defs, self.tables, strict=True):
            for x in self._inputs(d, features):
                m.prefetch(x)  # type: ignore[operator]

    def flush(self) -> None:
        for m in self.tables:
            m.flush()  # type: ignore[operator]


def bank_collection(bank: Any, defs: Sequence[TableDef]) -> nn.Module:
    """Every table in one collection (one message per shard per step): pooled tables in a
    :class:`~carls_dask.nn.BankEmbeddingBagCollection`, or all in a ``BankEmbeddingCollection`` (no pooling)."""
    from carls_dask.nn import BankEmbeddingBagCollection, BankEmbeddingCollection, BankTableConfig

    pooled = {d.pooling for d in defs}
    if None in pooled and len(pooled) > 1:
        raise ValueError("a benchmark model's tables are all pooled or all unpooled")
    configs = [BankTableConfig(d.name, feature_names=d.features, pooling=d.pooling or "sum") for d in defs]
    if None in pooled:
        return BankEmbeddingCollection(bank, configs)
    ebc = BankEmbeddingBagCollection(bank, configs)
    return _Pooled(ebc)


class _Pooled(nn.Module):
    """A bag collection's :class:`KeyedTensor` as a dict by feature (the models read features by name)."""

    def __init__(self, ebc: nn.Module) -> None:
        super().__init__()
        self.ebc = ebc

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.ebc(features).to_dict()  # type: ignore[no-any-return]

    def prefetch(self, features: dict[str, torch.Tensor]) -> None:
        self.ebc.prefetch(features)  # type: ignore[operator]

    def flush(self) -> None:
        self.ebc.flush()  # type: ignore[operator]


@dataclass
class Holding:
    """How a way holds a model's tables: its name, the module it builds and whether its steps prefetch."""

    name: str
    make: Callable[[Sequence[TableDef]], nn.Module]
    bank: Any = None
    prefetch: bool = False

    def optimizers(self, model: nn.Module) -> list[torch.optim.Optimizer]:
        if self.bank is not None:  # the tables are trained by the bank's optimizer
            return [torch.optim.Adam(model.parameters(), lr=DENSE_LR)]
        tables = [p for m in model.modules() if isinstance(m, InProcessTables) for p in m.parameters()]
        ids = {id(p) for p in tables}
        return [torch.optim.Adam([p for p in model.parameters() if id(p) not in ids], lr=DENSE_LR),
                torch.optim.Adagrad(tables, lr=TABLE_LR, initial_accumulator_value=INIT_ACC, eps=0.0)]


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
    """User tower (user row, mean of the history rows, MLP) against item rows; in-batch and shared negatives.

    Three tables (``users``, ``history``, ``items``), read by feature through ``tables``; the history bag is
    pooled here (the mean of a user's 20 rows), so every table is read unpooled, in one collection.
    """

    DIM = 32

    @staticmethod
    def defs(data: TwoTowerData) -> list[TableDef]:
        d = TwoTower.DIM
        return [TableDef("users", data.users, d, ("user",)), TableDef("history", data.items, d, ("history",)),
                TableDef("items", data.items, d, ("candidates",))]

    def __init__(self, tables: nn.Module) -> None:
        super().__init__()
        self.tables = tables
        torch.manual_seed(0)
        self.user_mlp = nn.Sequential(nn.Linear(2 * self.DIM, 64), nn.ReLU(), nn.Linear(64, self.DIM))
        self.temperature = 0.1

    @staticmethod
    def features(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"user": batch["user"], "history": batch["history"],
                "candidates": torch.cat([batch["item"], batch["shared"]])}

    def user_vectors(self, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        x = torch.cat([rows["user"], rows["history"].mean(dim=1)], dim=1)
        return nn.functional.normalize(self.user_mlp(x), dim=1)

    def prefetch(self, batch: dict[str, torch.Tensor]) -> None:
        self.tables.prefetch(self.features(batch))  # type: ignore[operator]

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = self.tables(self.features(batch))
        u = self.user_vectors(rows)
        logits = u @ nn.functional.normalize(rows["candidates"], dim=1).T / self.temperature
        return nn.functional.cross_entropy(logits, torch.arange(u.shape[0]))


def two_tower_quality(model: TwoTower, data: TwoTowerData, users: int = 4_000, seed: int = 1) -> dict[str, float]:
    """HR@10 of the held-out item among all items, and AUC of its score against a random item's."""
    rng = np.random.default_rng(seed)
    who = rng.choice(data.users, size=users, replace=False)
    model.eval()
    with torch.no_grad():
        rows = model.tables({"user": torch.from_numpy(who), "history": torch.from_numpy(data.hist[who]),
                             "candidates": torch.arange(data.items)})
        scores = model.user_vectors(rows) @ nn.functional.normalize(rows["candidates"], dim=1).T
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
    """Bottom MLP on the dense features, one pooled row per sparse feature (a table each), pairwise dots, top MLP."""

    DIM = 16

    @staticmethod
    def defs(data: ClickData) -> list[TableDef]:
        return [TableDef(f"t{i}", r, DLRM.DIM, (f"f{i}",), pooling="sum") for i, r in enumerate(data.rows)]

    def __init__(self, tables: nn.Module, data: ClickData) -> None:
        super().__init__()
        self.tables = tables
        self.names = [f"f{i}" for i in range(len(data.rows))]
        torch.manual_seed(0)
        self.bottom = nn.Sequential(nn.Linear(data.dense, 64), nn.ReLU(), nn.Linear(64, self.DIM), nn.ReLU())
        k = len(data.rows) + 1
        self.pairs = torch.triu_indices(k, k, offset=1)
        self.top = nn.Sequential(nn.Linear(self.DIM + self.pairs.shape[1], 64), nn.ReLU(), nn.Linear(64, 1))

    def features(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {f: batch["ids"][:, i] for i, f in enumerate(self.names)}

    def prefetch(self, batch: dict[str, torch.Tensor]) -> None:
        self.tables.prefetch(self.features(batch))  # type: ignore[operator]

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        d = self.bottom(batch["dense"])
        rows = self.tables(self.features(batch))
        z = torch.stack([d, *(rows[f] for f in self.names)], dim=1)
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

    @staticmethod
    def defs(rows: int = 1_000_000, dim: int = 64) -> list[TableDef]:
        return [TableDef("ids", rows, dim, ("ids",))]

    def __init__(self, tables: nn.Module, dim: int = 64) -> None:
        super().__init__()
        self.tables = tables
        torch.manual_seed(0)
        self.mlp = nn.Sequential(nn.Linear(dim, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
        self.correct: list[float] = []

    def prefetch(self, batch: torch.Tensor) -> None:
        self.tables.prefetch({"ids": batch})  # type: ignore[operator]

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        z = self.mlp(self.tables({"ids": batch})["ids"]).squeeze(-1)
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

    holding: Holding
    model: Any
    optimizers: list[torch.optim.Optimizer]
    times: list[float] = field(default_factory=list)
    costs: list[Any] = field(default_factory=list)
    quality: dict[str, float] = field(default_factory=dict)

    def cost(self, what: str) -> float | None:
        """A step-profile figure per step over every block of this way."""
        got = [(c.steps, getattr(c, what)) for c in self.costs if getattr(c, what) is not None]
        steps = sum(n for n, _ in got)
        return sum(n * v for n, v in got) / steps if got and steps else None

    @property
    def name(self) -> str:
        return self.holding.name

    @property
    def bank(self) -> Any:
        return self.holding.bank

    def step(self, batches: Sequence[Any], i: int) -> None:
        """Step ``i`` of the documented training loop: prefetch the next batch's rows (when the way does), then
        forward, backward and the dense optimizer's step."""
        if self.holding.prefetch and i + 1 < len(batches):
            self.model.prefetch(batches[i + 1])
        loss = self.model.loss(batches[i])
        for o in self.optimizers:
            o.zero_grad()
        loss.backward()
        for o in self.optimizers:
            o.step()

    def flush(self) -> None:
        """Wait until the way's pushes have landed (nothing to wait for in this process)."""
        if self.bank is None:
            return
        if hasattr(self.bank, "flush"):
            self.bank.flush()
        else:  # carls-dask before the bank's queue: each layer flushes its own pushes
            for m in self.model.modules():
                if hasattr(m, "flush") and hasattr(m, "rows"):
                    m.flush()

    @property
    def steps_per_s(self) -> float:
        return 1.0 / statistics.median(self.times)


@dataclass(frozen=True)
class _OldStepCost:
    """A step's cost as :class:`carls_dask.bank.stepprofile.StepCost` holds it, for code that has none."""

    steps: int
    messages: float
    sends: float
    operations: float
    kb: float
    wait_ms: float
    trainer_cpu_ms: float
    shard_cpu_ms: float | None
    wall_ms: float


class _CpuOnly:
    """The trainer's CPU per step where no bank is involved (the in-process way)."""

    def __init__(self) -> None:
        self._cpu, self._wall = time.process_time(), time.perf_counter()

    def stop(self, steps: int) -> Any:
        try:
            from carls_dask.bank.stepprofile import StepCost
        except ImportError:  # carls-dask before the step profile (the "before" table)
            StepCost = _OldStepCost  # type: ignore[assignment,misc]

        n = max(steps, 1)
        return StepCost(steps, 0.0, 0.0, 0.0, 0.0, 0.0, (time.process_time() - self._cpu) * 1e3 / n, None,
                        (time.perf_counter() - self._wall) * 1e3 / n)


def run_in_turns(ways: Sequence[Way], batches: Sequence[Any], rounds: int, warmup: int = 5) -> None:
    """Each way trains ``batches`` in ``rounds`` blocks, the ways taking turns block by block.

    Each block ends with the way's pushes landed, so what it sent and the CPU it took (this process's and,
    for a bank, the shards') belong to that block; a way's step profile sums its blocks.
    """
    try:
        from carls_dask.bank.stepprofile import StepProfile
    except ImportError:  # carls-dask before the step profile (the "before" table): CPU of this process only
        StepProfile = None  # type: ignore[assignment,misc]

    n = len(batches)
    edges = np.linspace(0, n, rounds + 1).astype(int)
    done = [0] * len(ways)
    for r in range(rounds):
        for w_i, way in enumerate(ways):
            start, stop = done[w_i], int(edges[r + 1])
            prof: Any = StepProfile(way.bank, shards=True) if way.bank is not None and StepProfile else _CpuOnly()
            for i in range(start, stop):
                t0 = time.perf_counter()
                way.step(batches, i)
                if i >= warmup:
                    way.times.append(time.perf_counter() - t0)
            way.flush()
            way.costs.append(prof.stop(stop - start))
            done[w_i] = stop


def start_cluster(threads: int) -> tuple[Any, Any]:
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=threads, processes=True, host="127.0.0.1",
                           dashboard_address=":0")
    return cluster, Client(cluster)


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def report(title: str, runs: Sequence[Sequence[Way]]) -> dict[str, dict[str, float]]:
    """Print one row per way over every seed's run (steps/s and ratio: medians; quality: mean and std over seeds)
    and return each way's ratio, calls per shard and quality for the targets."""
    print(f"\n{title}")
    print(f"  {'tables held by':<34} {'steps/s':>7} {'x in-proc':>9} {'calls/shard':>11} {'KB':>6} {'wait ms':>7} "
          f"{'trainer CPU':>11} {'shard CPU':>9}   quality (mean +- std over seeds)")
    out: dict[str, dict[str, float]] = {}
    for i, w in enumerate(runs[0]):
        same = [run[i] for run in runs]
        rate = statistics.median(x.steps_per_s for x in same)
        ratio = statistics.median(x.steps_per_s / run[0].steps_per_s for x, run in zip(same, runs, strict=True))
        bank = w.bank if hasattr(w.bank, "counters") else None  # (no counters before the bank's queue)

        def mean(what: str, ways: Sequence[Way] = same) -> float | None:
            got = [x.cost(what) for x in ways]
            return None if any(g is None for g in got) else statistics.fmean(g for g in got if g is not None)

        calls = None if bank is None else (mean("messages") or 0.0) / bank.n_shards
        quality = {}
        for k in w.quality:
            vals = [x.quality[k] for x in same]
            quality[k] = (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0)
        q = ", ".join(f"{k} {m:.4f} +- {sd:.4f}" for k, (m, sd) in quality.items())
        print(f"  {w.name:<34} {rate:>7.1f} {ratio:>8.2f}x {_fmt(calls, '.2f'):>11} "
              f"{_fmt(mean('kb') if bank else None, '.0f'):>6} {_fmt(mean('wait_ms') if bank else None, '.1f'):>7} "
              f"{_fmt(mean('trainer_cpu_ms'), '.1f'):>11} {_fmt(mean('shard_cpu_ms'), '.1f'):>9}   {q}")
        out[w.name] = {"ratio": ratio, "calls": float("nan") if calls is None else calls,
                       **{f"q:{k}": m for k, (m, _) in quality.items()}, **{f"sd:{k}": sd for k, (_, sd) in quality.items()}}
    print("  per step: bank calls per shard, KB sent and received, ms the sending threads waited (in the background "
          "when prefetched), CPU ms of this process (trainer) and of the shards' processes")
    return out


#: Targets of each model: the least ratio to in-process of the plain and the pipelined bank.
TARGETS = {"two-tower": (0.6, 0.8), "dlrm": (0.6, 0.8), "single": (None, 0.8)}


def judge(name: str, rows: dict[str, dict[str, float]]) -> list[str]:
    """PASS/FAIL lines: the ratios against the targets, at most two calls per shard per step, quality within the
    in-process spread (the larger of two standard deviations over seeds and 1 % of its mean)."""
    lines = []
    plain, piped = TARGETS[name]
    base = rows["in-process"]
    for way, target in (("bank", plain), ("bank, pipelined", piped)):
        if target is not None and way in rows:
            r = rows[way]["ratio"]
            lines.append(f"{'PASS' if r >= target else 'FAIL'} {name}: {way} {r:.2f}x in-process (target >= {target}x)")
    for way, row in rows.items():
        if way == "in-process":
            continue
        if way in ("bank", "bank, pipelined"):
            ok = row["calls"] <= 2.0
            lines.append(f"{'PASS' if ok else 'FAIL'} {name}: {way} {row['calls']:.2f} bank calls per shard per step "
                         "(target <= 2)")
        for k in (k[2:] for k in base if k.startswith("q:")):
            spread = max(2 * base[f"sd:{k}"], 0.01 * abs(base[f"q:{k}"]))
            d = row[f"q:{k}"] - base[f"q:{k}"]
            lines.append(f"{'PASS' if abs(d) <= spread else 'FAIL'} {name}: {way} {k} {row[f'q:{k}']:.4f} vs "
                         f"in-process {base[f'q:{k}']:.4f} (difference {d:+.4f}, spread {spread:.4f})")
    return lines


def holdings(client: Any, defs: Sequence[TableDef], layouts: Sequence[str]) -> list[Holding]:
    """In-process tables, then for each layout a bank way without and with prefetching (a fresh bank each)."""
    from carls_dask.bank import KnowledgeBank

    out = [Holding("in-process", lambda d: InProcessTables(d))]
    for layout in layouts:
        for prefetch in (False, True):
            bank = KnowledgeBank.create(client, table_specs([(d.name, d.dim) for d in defs]), n_shards=2, timeout=300)
            make = (lambda d, b=bank: bank_collection(b, d)) if layout == "collection" else \
                (lambda d, b=bank, p=prefetch: SeparateBankLayers(b, d, pipeline=p))
            label = "bank" + ("" if layout == "collection" else ", separate layers") + (", pipelined" if prefetch else "")
            out.append(Holding(label, make, bank, prefetch))
    return out


def ways_of(holdings_: Sequence[Holding], defs: Sequence[TableDef], model: Callable[[nn.Module], Any]) -> list[Way]:
    ways = []
    for h in holdings_:
        m = model(h.make(defs))
        ways.append(Way(h, m, h.optimizers(m)))
    return ways


MODELS: dict[str, Callable[..., list[Way]]] = {}


def registered(name: str) -> Callable[[Callable[..., list[Way]]], Callable[..., list[Way]]]:
    def register(fn: Callable[..., list[Way]]) -> Callable[..., list[Way]]:
        MODELS[name] = fn
        return fn
    return register


@registered("two-tower")
def run_two_tower(client: Any, steps: int, rounds: int, seed: int, layouts: Sequence[str]) -> list[Way]:
    data = TwoTowerData(seed=seed)
    batches = data.batches(1_024, steps, shared=512, seed=seed + 1)
    defs = TwoTower.defs(data)
    ways = ways_of(holdings(client, defs, layouts), defs, TwoTower)
    run_in_turns(ways, batches, rounds)
    for w in ways:
        w.quality = two_tower_quality(w.model, data)
    return ways


@registered("dlrm")
def run_dlrm(client: Any, steps: int, rounds: int, seed: int, layouts: Sequence[str]) -> list[Way]:
    data = ClickData(seed=seed)
    batches = data.batches(2_048, steps, seed=seed + 1)
    test = data.sample(50_000, np.random.default_rng(seed + 2))
    defs = DLRM.defs(data)
    ways = ways_of(holdings(client, defs, layouts), defs, lambda t: DLRM(t, data))
    run_in_turns(ways, batches, rounds)
    for w in ways:
        w.quality = click_quality(w.model, test)
    return ways


@registered("single")
def run_single(client: Any, steps: int, rounds: int, seed: int, layouts: Sequence[str]) -> list[Way]:
    batches = zipf_keys(1_000_000, 4_096, steps, seed)
    defs = Single.defs()
    ways = ways_of(holdings(client, defs, layouts), defs, Single)
    run_in_turns(ways, batches, rounds)
    for w in ways:
        w.quality = {"accuracy": float(np.mean(w.model.correct[-50:]))}
    return ways


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="two-tower,dlrm,single")
    p.add_argument("--steps", type=int, default=600, help="training steps of every way of a model")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seeds", default="0,1,2", help="seeds, comma-separated: one run of every way each")
    p.add_argument("--layouts", default="collection",
                   help="how the bank ways hold the tables: collection (one collection module), layers (one layer "
                        "per table, as a model is first written), or both, comma-separated")
    p.add_argument("--threads", type=int, default=1, help="threads per bank worker")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="torch's intra-op threads in this (the trainer's) process (0: torch's default)")
    args = p.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    seeds = [int(x) for x in args.seeds.split(",")]
    print(f"torch threads in the trainer: {torch.get_num_threads()}; bank: 2 shards on a LocalCluster of 2 workers x "
          f"{args.threads} thread; seeds {seeds}")
    warnings.filterwarnings("ignore", category=UserWarning)
    cluster, client = start_cluster(args.threads)
    verdicts = []
    try:
        for name in args.models.split(","):
            t0 = time.perf_counter()
            runs = []
            for seed in seeds:
                ways = MODELS[name](client, args.steps, args.rounds, seed, args.layouts.split(","))
                for w in ways:
                    if w.bank is not None:
                        w.bank.close()
                runs.append(ways)
            rows = report(f"{name}: {args.steps} steps per way in {args.rounds} rounds, {len(seeds)} seeds "
                          f"({time.perf_counter() - t0:.0f} s)", runs)
            verdicts += judge(name, rows)
    finally:
        client.close()
        cluster.close()
    print()
    for line in verdicts:
        print(line)


if __name__ == "__main__":
    main()
