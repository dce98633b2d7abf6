"""A paradigm as a user of carls-dask writes one, for the tests: a tiny two-tower recommender (not shipped).

Nothing of it is registered: the tests run it by import path (``tests.recsys:Recsys``). Its tables are named
unlike the shipped paradigms' (``items``, ``users``, ``item_stats``, ``hist``), and its maker reports a
figure of its own (``nb_planted_cos``), so the dashboard, the report and ``--resume`` are tried on a run
they know nothing about.

Users and items fall in ``clusters`` planted groups; a user's positives are the items of its group. The
trainer's two towers are :class:`~carls_dask.nn.BankEmbedding` layers (rows in ``users`` and ``items``,
trained by the bank's SGD) under one shared dense projection, trained with a BPR loss; every
``eval_every`` steps it measures ``recall@5`` (the share of each user's top 5 items in its group) and
writes each user's mean positive item vector to ``hist``. The maker ``neighbours`` loads each published
model, finds each item's 3 nearest items and writes them to ``item_stats`` with the share in the same
group; its own figure is the mean cosine between the planted vectors of an item and of its neighbours.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from carls_dask.runtime import KnowledgeMaker, Paradigm, Trainer
from carls_dask.runtime.settings import check_settings

ITEMS, USERS, STATS, HIST = "items", "users", "item_stats", "hist"
NEIGHBOURS = 3


@dataclasses.dataclass(frozen=True)
class RecsysSettings:
    """Settings of the two-tower run.

    Parameters
    ----------
    steps
        Trainer steps.
    seed
        Seed of the planted groups, the model and the batches.
    n_users, n_items
        Users and items.
    clusters
        Planted groups.
    dim
        Width of the bank rows and of the projection.
    batch_size
        Triples (user, positive, negative) per step.
    publish_every, eval_every
        Steps between published models, and between evaluations (and writes to ``hist``).
    """

    steps: int = 30
    seed: int = 0
    n_users: int = 40
    n_items: int = 48
    clusters: int = 4
    dim: int = 8
    batch_size: int = 32
    publish_every: int = 10
    eval_every: int = 10

    def __post_init__(self) -> None:
        check_settings("RecsysSettings", (
            (self.steps >= 1, f"steps={self.steps!r}; expected >= 1"),
            (self.clusters >= 2 and self.n_items >= 2 * self.clusters, "expected >= 2 clusters of >= 2 items"),
        ))


def planted(s: RecsysSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The group of every user and item, and each item's planted unit vector (its group's, plus noise)."""
    rng = np.random.default_rng(s.seed)
    user_group = np.arange(s.n_users) % s.clusters
    item_group = np.arange(s.n_items) % s.clusters
    centres = rng.normal(size=(s.clusters, s.dim))
    vec = centres[item_group] + 0.3 * rng.normal(size=(s.n_items, s.dim))
    return user_group, item_group, vec / np.linalg.norm(vec, axis=1, keepdims=True)


def tables(s: RecsysSettings) -> list[Any]:
    """The run's tables, in the order the bank is created with them (``items`` first)."""
    from carls_dask.bank import Column, TableSpec

    vec = (s.dim,)
    return [
        TableSpec(ITEMS, columns=(Column("embedding", "float32", vec, ("dim",)),), optimizer="sgd", learning_rate=10.0,
                  initializer="normal", init_scale=0.5),
        TableSpec(USERS, columns=(Column("embedding", "float32", vec, ("dim",)),), optimizer="sgd", learning_rate=10.0,
                  initializer="normal", init_scale=0.5),
        TableSpec(STATS, columns=(Column("nearest", "int64", (NEIGHBOURS,), ("neighbour",)),
                                  Column("same_group", "float32", (), ())), optimizer=None),
        TableSpec(HIST, columns=(Column("recent", "float32", vec, ("dim",)),), optimizer=None),
    ]


def towers(bank: Any, dim: int, trainable: bool) -> Any:
    """The two towers: bank rows of users and items under one shared projection."""
    import torch

    from carls_dask.nn import BankEmbedding

    class Towers(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.users = BankEmbedding(bank, USERS, trainable=trainable)
            self.items = BankEmbedding(bank, ITEMS, trainable=trainable)
            self.project = torch.nn.Linear(dim, dim)

        def forward(self, users: Any, items: Any) -> Any:
            return (self.project(self.users(users)) * self.project(self.items(items))).sum(-1)

    return Towers()


class TwoTowerTrainer(Trainer):
    def __init__(self, s: RecsysSettings) -> None:
        super().__init__("trainer", max_steps=s.steps, publish_every=s.publish_every, eval_every=s.eval_every)
        self.s = s

    def setup(self, ctx: Any) -> None:
        import torch

        torch.manual_seed(self.s.seed)
        torch.set_num_threads(1)
        self.user_group, self.item_group, _ = planted(self.s)
        self.model = towers(ctx.bank, self.s.dim, trainable=True)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.5)
        self.rng = np.random.default_rng(self.s.seed + 1)

    def step(self, step: int) -> Mapping[str, float]:
        import torch

        s = self.s
        users = self.rng.integers(0, s.n_users, s.batch_size)
        groups = self.user_group[users]
        pos = groups + s.clusters * self.rng.integers(0, s.n_items // s.clusters, s.batch_size)
        neg = (groups + self.rng.integers(1, s.clusters, s.batch_size)) % s.clusters \
            + s.clusters * self.rng.integers(0, s.n_items // s.clusters, s.batch_size)
        u = torch.from_numpy(users)
        loss = -torch.nn.functional.logsigmoid(self.model(u, torch.from_numpy(pos)) - self.model(u, torch.from_numpy(neg)))
        loss = loss.mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": float(loss.detach())}

    def _vectors(self) -> tuple[np.ndarray, np.ndarray]:
        import torch

        with torch.no_grad():
            self.model.eval()
            u = self.model.project(self.model.users(torch.arange(self.s.n_users))).numpy()
            i = self.model.project(self.model.items(torch.arange(self.s.n_items))).numpy()
            self.model.train()
        return u, i

    def evaluate(self) -> Mapping[str, float]:
        assert self.ctx is not None
        u, i = self._vectors()
        top = np.argsort(-(u @ i.T), axis=1)[:, :5]
        recall = float((self.item_group[top] == self.user_group[:, None]).mean())
        recent = np.stack([i[self.item_group == g].mean(0) for g in self.user_group]).astype(np.float32)
        self.ctx.bank.update(HIST, np.arange(self.s.n_users), {"recent": recent}, model_step=self.start_step,
                             maker=self.name)
        return {"recall@5": recall}

    def finish(self) -> dict[str, float]:
        return dict(self.evaluate())


class NeighbourMaker(KnowledgeMaker):
    def __init__(self, s: RecsysSettings) -> None:
        super().__init__("neighbours", source="trainer")
        self.s = s

    def setup(self, ctx: Any) -> None:
        import torch

        torch.set_num_threads(1)
        _, self.item_group, self.planted = planted(self.s)
        self.model = towers(ctx.bank, self.s.dim, trainable=False)
        self.model.eval()

    def load_model(self, state: Mapping[str, Any], version: Any) -> None:
        self.model.load_state_dict(state)  # the bank layers' records come along (no snapshot: a published model)

    def make(self, version: Any) -> Mapping[str, float]:
        import torch

        assert self.ctx is not None
        keys = np.arange(self.s.n_items)
        with torch.no_grad():
            vec = self.model.project(self.model.items(torch.from_numpy(keys))).numpy()
        unit = vec / np.maximum(np.linalg.norm(vec, axis=1, keepdims=True), 1e-12)
        sim = unit @ unit.T
        np.fill_diagonal(sim, -np.inf)
        nearest = np.argsort(-sim, axis=1)[:, :NEIGHBOURS].astype(np.int64)
        same = (self.item_group[nearest] == self.item_group[:, None]).mean(1).astype(np.float32)
        self.ctx.bank.update(STATS, keys, {"nearest": nearest, "same_group": same}, model_step=version.step,
                             maker=self.name)
        cos = float(np.einsum("id,ikd->ik", self.planted, self.planted[nearest]).mean())
        return {"nb_planted_cos": cos, "same_group": float(same.mean())}


class Recsys(Paradigm):
    name = "recsys"
    description = "a tiny two-tower recommender over planted groups (a test paradigm, not shipped)"
    settings_type = RecsysSettings
    variants = {"default": {}}
    headline = ("recall@5", "nb_planted_cos")
    cumulative = ("rounds",)

    def tables(self, s: RecsysSettings) -> list[Any]:
        return tables(s)

    def loops(self, s: RecsysSettings) -> list[Trainer | KnowledgeMaker]:
        return [TwoTowerTrainer(s), NeighbourMaker(s)]

    def summarize(self, s: RecsysSettings, results: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(results["trainer"].value or {})
        maker = results.get("neighbours")
        out["nb_planted_cos"] = maker.metrics.get("nb_planted_cos", float("nan")) if maker is not None else float("nan")
        out["rounds"] = len(maker.rounds) if maker is not None else 0
        return out
