"""The node-embedding paradigm as the runner sees it: settings, variants, tables, loops and figures.

Variants (``carls-dask run node-embeddings --variant NAME``):

``bank`` (default)
    Every node's vectors held only in the bank's ``nodes`` table and trained through ``BankEmbedding``
    layers, negatives drawn by the bank, the next batch's rows prefetched; the neighbour maker writes
    each query node's nearest nodes to the bank after every version.
``in-process``
    The same model with ``torch.nn.Embedding(sparse=True)`` tables and torch's Adagrad in the trainer.
``random``
    The initial (random) vectors, judged without training.

``-o graph=closure`` trains on the noun hierarchy's transitive closure instead and reports Nickel &
Kiela's reconstruction figures (``-o dim=50``, ``-o dim=100`` for their Table 1's sizes).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from carls_dask.paradigms.data.wordnet import find_wordnet_dir
from carls_dask.paradigms.node_embeddings.data import load_graph_data
from carls_dask.paradigms.node_embeddings.loops import NeighbourMaker, NodeEmbeddingTrainer
from carls_dask.paradigms.node_embeddings.settings import NodeEmbeddingsSettings
from carls_dask.paradigms.node_embeddings.tables import bank_tables, initialise_bank
from carls_dask.runtime.context import LoopResult
from carls_dask.runtime.paradigm import Paradigm
from carls_dask.storage.runfolder import RunFolder

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["NodeEmbeddings"]

TRAINER = "trainer"
MAKER = "neighbour-maker"


class NodeEmbeddings(Paradigm[NodeEmbeddingsSettings]):
    """Skip-gram node embeddings of the WordNet noun graph, learned in the bank."""

    name = "node-embeddings"
    description = "DeepWalk-style embeddings of the 82,115 WordNet nouns, every vector held and trained in the bank"
    settings_type = NodeEmbeddingsSettings
    variants = {
        "bank": {"backend": "bank"},
        "in-process": {"backend": "in-process", "maker": False},
        "random": {"backend": "in-process", "steps": 0, "maker": False},
    }
    default_variant = "bank"
    headline = ("link_auc", "probe_acc", "recon_mean_avg_precision", "recon_mean_rank")
    unprefixed = {"trainer": ("link_auc", "probe_acc"), "maker": ()}

    def prepare(self, settings: NodeEmbeddingsSettings) -> NodeEmbeddingsSettings:
        """Resolve the WordNet folder here (the loops get it explicitly) and build the graph once, so a missing
        data set fails before a cluster starts. A run without a bank has no maker."""
        folder = find_wordnet_dir(settings.wordnet_dir, settings.data_dir)
        s = dataclasses.replace(settings, wordnet_dir=str(folder), maker=settings.maker and settings.uses_bank)
        load_graph_data(s)
        return s

    def tables(self, settings: NodeEmbeddingsSettings) -> Sequence[Any]:
        return bank_tables(settings) if settings.uses_bank else []

    def loops(self, settings: NodeEmbeddingsSettings) -> Sequence[Any]:
        out: list[Any] = [NodeEmbeddingTrainer(settings, TRAINER)]
        if settings.uses_bank and settings.maker:
            out.append(NeighbourMaker(settings, MAKER, source=TRAINER))
        return out

    def initialise(self, bank: KnowledgeBank, settings: NodeEmbeddingsSettings) -> None:
        """Allocate every node's row before training (a resumed run's bank has them already)."""
        initialise_bank(bank, load_graph_data(settings).n_nodes)

    def write_artifacts(self, settings: NodeEmbeddingsSettings, run_dir: pathlib.Path) -> None:
        """``truth.npz``: the nodes' classes (``keys``, ``labels``) and, on the noun graph, the held-out edges."""
        data = load_graph_data(settings)
        arrays: dict[str, Any] = {"keys": np.arange(data.n_nodes), "labels": data.nouns.labels}
        if data.link is not None:
            arrays["heldout_edges"] = data.link.test
        np.savez(RunFolder(run_dir).truth, **arrays)

    def summarize(self, settings: NodeEmbeddingsSettings, results: Mapping[str, LoopResult]) -> dict[str, Any]:
        out: dict[str, Any] = dict(results[TRAINER].value or {})
        if MAKER in results:
            out[f"{MAKER}_rounds"] = len(results[MAKER].rounds)
            out.update({k: v for k, v in results[MAKER].metrics.items() if "recall@" in k})
        return out
