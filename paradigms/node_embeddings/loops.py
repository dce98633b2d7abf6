"""The node-embedding trainer and its neighbour maker.

- :class:`NodeEmbeddingTrainer` trains the skip-gram model (:mod:`~carls_dask.paradigms.node_embeddings.models`)
  on the run's pairs, with the vectors in the bank (read and trained through layers, prefetching the next
  batch's rows) or in the trainer, and judges them every ``eval_every`` steps and at the end;
- :class:`NeighbourMaker`, after each published version, asks the bank for a fixed set of query nodes'
  nearest nodes (``bank.top_k`` over the current vectors), writes them to the bank's ``neighbours`` table
  with the version's step as provenance, and reports how many held-out edges (or, on the closure, how many
  ancestors) they recover: a live figure of what the run is learning, for the dashboard.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from carls_dask.errors import ConfigError
from carls_dask.paradigms.node_embeddings.data import GraphData, load_graph_data
from carls_dask.paradigms.node_embeddings.evaluation import link_auc, probe_accuracy, reconstruction
from carls_dask.paradigms.node_embeddings.models import BankTables, InProcessTables
from carls_dask.paradigms.node_embeddings.settings import NodeEmbeddingsSettings
from carls_dask.paradigms.node_embeddings.tables import CONTEXTS, NEIGHBOURS, TABLE, table_specs
from carls_dask.runtime.channel import ModelVersion
from carls_dask.runtime.context import LoopContext
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.trainer import Trainer

__all__ = ["NeighbourMaker", "NodeEmbeddingTrainer", "evaluate_vectors"]

logger = logging.getLogger(__name__)

def _set_threads(s: NodeEmbeddingsSettings) -> None:
    import torch

    if s.threads is not None and torch.get_num_threads() != s.threads:
        torch.set_num_threads(s.threads)


def evaluate_vectors(data: GraphData, vectors: Any, seed: int) -> dict[str, float]:
    """The run's figures for the vectors ``vectors(nodes, table)`` gives: link AUC and probe accuracy
    (``nouns``), or reconstruction mean rank and MAP (``closure``)."""
    nodes = np.arange(data.n_nodes)
    emb = vectors(nodes, TABLE)
    if data.link is not None:
        link = data.link
        out = {"link_auc": link_auc(emb, link.fit, link.fit_non, link.test, link.test_non, seed)}
        g = data.nouns
        if g.train.size:  # a subtree may lack the split's 20 nodes of a class
            out["probe_val_acc"], out["probe_acc"] = probe_accuracy(emb, g.labels, g.train, g.val, g.test, seed)
        return out
    assert data.closure is not None and data.sources is not None
    ctx = vectors(nodes, CONTEXTS)
    rank, ap = reconstruction(lambda q: emb[q] @ ctx.T, data.closure, data.sources)
    return {"recon_mean_rank": rank, "recon_mean_avg_precision": ap}


class NodeEmbeddingTrainer(Trainer):
    """Trains node vectors with skip-gram and negative sampling; the vectors live in the bank or in the trainer.

    Parameters
    ----------
    settings
        The run's :class:`~carls_dask.paradigms.node_embeddings.settings.NodeEmbeddingsSettings`.
    name
        Loop name.
    """

    def __init__(self, settings: NodeEmbeddingsSettings, name: str = "trainer") -> None:
        super().__init__(name, max_steps=settings.steps, publish_every=settings.publish_every,
                         eval_every=settings.eval_every or None, keep_state=False)
        self.settings = settings

    def setup(self, ctx: LoopContext) -> None:
        s = self.settings
        _set_threads(s)
        self.data = load_graph_data(s)
        self.source = self.data.pair_source(s)
        self.tables: BankTables | InProcessTables
        if s.uses_bank:
            if ctx.bank is None:
                raise ConfigError(f"trainer {self.name!r}: backend 'bank' needs a bank with the 'nodes' table")
            self.tables = BankTables(ctx.bank, pipeline=s.pipeline, staleness=s.staleness, sampler=s.sampler)
        else:
            self.tables = InProcessTables(table_specs(s), self.data.n_nodes, sampler=s.sampler)
        self.seconds = 0.0
        self.timed = 0

    def step(self, step: int) -> Mapping[str, float]:
        s = self.settings
        t0 = time.perf_counter()
        centers, contexts = self.source.batch_at(step)
        if s.uses_bank and s.pipeline:  # also at the last step: a run continued from its end reads these rows
            self.tables.prefetch(*self.source.batch_at(step + 1))
        loss = self.tables.loss(s.loss_kind, centers, contexts, s.negatives, s.negatives_per_pair,
                                s.seed * 1_000_003 + step)
        loss.backward()
        self.tables.step()
        self.seconds += time.perf_counter() - t0
        self.timed += 1
        return {"loss": float(loss.detach()) / centers.shape[0], **self.tables.stats()}

    def evaluate(self) -> dict[str, float]:
        """Link AUC and probe accuracy (``nouns``), or reconstruction (``closure``), of the current vectors."""
        return evaluate_vectors(self.data, self.tables.vectors, self.settings.seed)

    def publish_state(self) -> dict[str, Any]:
        """The step only: the vectors are in the bank (or, in-process, read by no maker)."""
        import torch

        return {"step": torch.tensor(self.start_step)}

    def state(self) -> dict[str, Any]:
        """The base checkpoint (the batches are a function of the step) and the tables' state: in-process the
        tables themselves, in the bank the rows prefetched for the next step (the vectors are in the bank's
        snapshot, taken after every push landed)."""
        out = super().state()
        out["tables"] = self.tables.state_dict()
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        if "tables" in state:
            self.tables.load_state_dict(state["tables"])

    def finish(self) -> dict[str, float]:
        """The final figures, the median step's seconds and the staleness the layers saw."""
        out = self.evaluate()
        out["step_ms"] = 1e3 * self.seconds / self.timed if self.timed else float("nan")
        out.update(self.tables.stats())
        return out

    def teardown(self) -> None:
        tables = getattr(self, "tables", None)
        if tables is not None:
            tables.close()


class NeighbourMaker(KnowledgeMaker):
    """Writes a fixed set of query nodes' nearest nodes to the bank after each version, and scores them.

    On the noun graph a query's neighbours are the nodes of most similar input vector (cosine), and the
    figure is ``heldout_recall@k``: the share of held-out edges of the queries whose other end is among
    them. On the closure they are the nodes of largest score ``u . c`` (the model's ancestor score), and
    the figure is ``ancestor_recall@k``.
    """

    def __init__(self, settings: NodeEmbeddingsSettings, name: str = "neighbour-maker", source: str = "trainer") -> None:
        super().__init__(name, source=source)
        self.settings = settings

    def setup(self, ctx: LoopContext) -> None:
        s = self.settings
        _set_threads(s)
        if ctx.bank is None:
            raise ConfigError(f"maker {self.name!r} needs the run's bank")
        data = load_graph_data(s)
        rng = np.random.default_rng([s.seed, 11])
        if data.link is not None:
            truth = np.concatenate([data.link.test, data.link.test[::-1]], axis=1)
            self.table, self.metric, self.figure = TABLE, "cosine", f"heldout_recall@{s.maker_k}"
        else:
            assert data.closure is not None
            truth = data.closure
            self.table, self.metric, self.figure = CONTEXTS, "dot", f"ancestor_recall@{s.maker_k}"
        have = np.unique(truth[0])
        self.queries = np.sort(rng.choice(have, size=min(s.maker_queries, have.shape[0]), replace=False))
        keep = np.isin(truth[0], self.queries)
        self.truth = truth[:, keep]
        self.rounds = 0

    def load_model(self, state: Mapping[str, Any], version: ModelVersion) -> None:
        """Nothing to load: the vectors are read from the bank."""

    def make(self, version: ModelVersion) -> dict[str, float]:
        assert self.ctx is not None and self.ctx.bank is not None
        bank, k = self.ctx.bank, self.settings.maker_k
        q = bank.lookup(TABLE, self.queries, columns=["embedding"]).values["embedding"]
        keys, scores = bank.top_k(self.table, q, k + 1, metric=self.metric)
        own = keys == self.queries[:, None]
        drop = np.where(own.any(1), own.argmax(1), k)  # the query itself, else the last
        keep = np.ones_like(keys, dtype=bool)
        keep[np.arange(keys.shape[0]), drop] = False
        keys, scores = keys[keep].reshape(-1, k), scores[keep].reshape(-1, k)
        bank.update(NEIGHBOURS, self.queries, {"nodes": keys, "scores": scores.astype(np.float32)},
                    model_step=version.step, maker=self.name)
        row = np.searchsorted(self.queries, self.truth[0])
        found = (keys[row] == self.truth[1][:, None]).any(1)
        self.rounds += 1
        return {self.figure: float(found.mean())}

    def finish(self) -> dict[str, int]:
        return {"rounds": self.rounds}
