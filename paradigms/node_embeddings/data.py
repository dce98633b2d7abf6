"""What a node-embedding run reads: :class:`GraphData` (the graph, its training pairs and what the run is
judged on), built once per process by :func:`load_graph_data`."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import numpy as np

from carls_dask.paradigms.data.noun_hierarchy import (
    NounGraph,
    load_noun_graph,
    noun_subtree,
    transitive_closure,
)
from carls_dask.paradigms.node_embeddings.walks import LinkSplit, PairSource, link_split

if TYPE_CHECKING:
    from carls_dask.paradigms.node_embeddings.settings import NodeEmbeddingsSettings

__all__ = ["RECONSTRUCTION_SEED", "GraphData", "load_graph_data"]

#: Seed of the fixed sample of synsets whose closure pairs are ranked (the same for every run).
RECONSTRUCTION_SEED = 2017


@dataclasses.dataclass(frozen=True)
class GraphData:
    """What a run trains and is judged on.

    Attributes
    ----------
    nouns
        The noun graph (labels, split, edges, hierarchy).
    pairs_from, train_pairs
        ``"walks"`` over the training edges (``graph="nouns"``) or the closure ``"edges"`` themselves.
    link
        The link-prediction split (``graph="nouns"``), else ``None``.
    closure, sources
        The closure's (synset, ancestor) pairs and the synsets whose pairs are ranked (``graph="closure"``).
    """

    nouns: NounGraph
    pairs_from: str
    train_pairs: np.ndarray
    link: LinkSplit | None
    closure: np.ndarray | None
    sources: np.ndarray | None

    @property
    def n_nodes(self) -> int:
        return self.nouns.n_nodes

    def pair_source(self, s: NodeEmbeddingsSettings) -> PairSource:
        """The run's batches."""
        return PairSource(self.pairs_from, self.train_pairs, self.n_nodes, s.batch_size, s.seed,
                          walk_length=s.walk_length, window=s.window)


@functools.lru_cache(maxsize=4)
def _graph_data(graph: str, seed: int, holdout: float, recon_sources: int, subtree: str | None, data_dir: str | None,
                wordnet_dir: str | None) -> GraphData:
    from carls_dask.paradigms.node_embeddings.evaluation import reconstruction_sources

    nouns = load_noun_graph(data_dir, wordnet_dir=wordnet_dir)
    if subtree is not None:
        nouns = noun_subtree(nouns, subtree)
    if graph == "closure":
        closure = transitive_closure(nouns.hypernyms, nouns.n_nodes)
        return GraphData(nouns, "edges", closure, None, closure,
                         reconstruction_sources(closure, recon_sources, RECONSTRUCTION_SEED))
    split = link_split(nouns.edges, nouns.n_nodes, holdout, np.random.default_rng([seed, 7]))
    return GraphData(nouns, "walks", split.train, split, None, None)


def load_graph_data(s: NodeEmbeddingsSettings) -> GraphData:
    """The graph data of ``s`` (built once per process for each graph, seed and split)."""
    return _graph_data(s.graph, s.seed, float(s.holdout), s.recon_sources, s.subtree, s.data_dir, s.wordnet_dir)
