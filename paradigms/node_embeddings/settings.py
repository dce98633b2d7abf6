"""What one node-embedding run is: :class:`NodeEmbeddingSettings` and the graph data it builds."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from carls_dask.bank.sampling import SAMPLERS
from carls_dask.errors import ConfigError
from carls_dask.paradigms.data.noun_hierarchy import (
    NounGraph,
    load_noun_graph,
    noun_subtree,
    transitive_closure,
)
from carls_dask.paradigms.node_embeddings.model import LOSSES
from carls_dask.paradigms.node_embeddings.walks import LinkSplit, PairSource, link_split

__all__ = ["BACKENDS", "GRAPHS", "GraphData", "NodeEmbeddingSettings", "load_graph_data"]

GRAPHS = ("nouns", "closure")
BACKENDS = ("bank", "in-process")
#: Seed of the fixed sample of synsets whose closure pairs are ranked (the same for every run).
RECONSTRUCTION_SEED = 2017


@dataclasses.dataclass(frozen=True)
class NodeEmbeddingSettings:
    """Every choice of a node-embedding run (picklable; trainer and maker build the same data from it).

    Parameters
    ----------
    graph
        ``"nouns"``: skip-gram pairs of random walks over the WordNet noun graph (every noun-to-noun
        relation), judged by link prediction on held-out edges and a linear probe of the lexicographer
        classes; ``"closure"``: the (synset, ancestor) pairs of the noun hierarchy's transitive closure,
        judged by Nickel & Kiela's reconstruction (mean rank and MAP).
    backend
        ``"bank"``: every vector held only in the bank and trained through ``BankEmbedding`` layers;
        ``"in-process"``: the same model with ``torch.nn.Embedding(sparse=True)`` tables in the trainer.
    steps
        Trainer steps (0: evaluate the initial, random vectors).
    seed
        Seed of the held-out edges, the walks, the orders and the negatives.
    dim
        Vector size.
    batch_size
        (center, context) pairs per step.
    negatives
        Negatives the bank draws per step, shared by the batch.
    loss
        ``"sgns"`` (word2vec's negative sampling), ``"softmax"`` (sampled softmax with the bank's expected
        counts, :func:`carls_dask.nn.sampled_softmax_loss`) or ``"auto"``: ``sgns`` on the noun graph (as
        DeepWalk and node2vec), ``softmax`` on the closure, whose reconstruction ranks every node.
    negatives_per_pair
        Weight of the negative term of ``sgns``: each pair is pushed from every shared negative with weight
        ``negatives_per_pair / negatives`` (word2vec's ``k`` negatives per pair, in expectation).
    sampler
        ``"log_uniform"`` (over frequency rank, Zipf-like as word2vec's unigram sampling) or ``"uniform"``.
    lr
        Adagrad learning rate of the vectors (on the bank's shards, or torch's Adagrad in-process).
    accumulator
        Adagrad's initial accumulator.
    init_scale
        Standard deviation of the initial input vectors (context vectors start at zero).
    walk_length, window
        Random-walk length and skip-gram window (``graph="nouns"``).
    holdout
        Share of the graph's edges held out for link prediction, outside a random spanning tree so the
        training graph stays connected (at most 0.288 on the noun graph, where only the tree is left).
    recon_sources
        Synsets (a fixed sample, the same for every run) whose closure pairs are ranked (``graph="closure"``).
    eval_every
        Steps between evaluations (0: only at the end).
    publish_every
        Steps between published versions (the neighbour maker's rounds).
    pipeline, staleness
        Prefetch the next batch's rows and push gradients off the training thread, missing at most
        ``staleness`` updates of a row (``backend="bank"``).
    maker
        Run the neighbour maker (``backend="bank"``): after each version it writes each query node's
        nearest neighbours (``bank.top_k``) to the bank and reports how many held-out edges they recover.
    maker_queries, maker_k
        Query nodes of the maker and neighbours kept per node.
    threads
        Torch intra-op threads of the loops (``None``: torch's default).
    subtree
        Learn only the synsets under the one whose first word this is (e.g. ``"mammal"``, 1,182 synsets;
        ``"body_part"``, 1,792 synsets with 2,566 edges), renumbered from 0; ``None``: every noun. The
        probe needs 20 nodes of each class present, so a subtree usually has none.
    data_dir, wordnet_dir
        Where ``data.noun`` is found (see :func:`~carls_dask.paradigms.data.wordnet.find_wordnet_dir`).
    """

    graph: str = "nouns"
    backend: str = "bank"
    steps: int = 3000
    seed: int = 0
    dim: int = 64
    batch_size: int = 4096
    negatives: int = 256
    loss: str = "auto"
    negatives_per_pair: float = 5.0
    sampler: str = "log_uniform"
    lr: float = 0.5
    accumulator: float = 0.1
    init_scale: float = 0.01
    walk_length: int = 10
    window: int = 2
    holdout: float = 0.15
    recon_sources: int = 2000
    eval_every: int = 1000
    publish_every: int = 500
    pipeline: bool = True
    staleness: int = 1
    maker: bool = True
    maker_queries: int = 1000
    maker_k: int = 10
    threads: int | None = 1
    subtree: str | None = None
    data_dir: str | None = None
    wordnet_dir: str | None = None

    def __post_init__(self) -> None:
        def fail(name: str, expected: str) -> None:
            raise ConfigError(f"NodeEmbeddingSettings: {name}={getattr(self, name)!r}; expected {expected}")

        if self.graph not in GRAPHS:
            fail("graph", f"one of {GRAPHS}")
        if self.backend not in BACKENDS:
            fail("backend", f"one of {BACKENDS}")
        if self.loss not in ("auto", *LOSSES):
            fail("loss", f"'auto' or one of {LOSSES}")
        if self.sampler not in SAMPLERS:
            fail("sampler", f"one of {SAMPLERS}")
        for name in ("dim", "batch_size", "negatives", "walk_length", "window", "recon_sources", "publish_every",
                     "maker_queries", "maker_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                fail(name, "a positive int")
        for name in ("steps", "seed", "eval_every", "staleness"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                fail(name, "an int >= 0")
        if self.walk_length < 2:
            fail("walk_length", "an int >= 2")
        for name in ("lr", "accumulator", "negatives_per_pair"):
            if not float(getattr(self, name)) > 0:
                fail(name, "a number > 0")
        if not float(self.init_scale) >= 0:
            fail("init_scale", "a number >= 0")
        if not 0.0 < float(self.holdout) < 1.0:
            fail("holdout", "a fraction in (0, 1)")
        for name in ("pipeline", "maker"):
            if not isinstance(getattr(self, name), bool):
                fail(name, "True or False")
        if self.subtree is not None and (not isinstance(self.subtree, str) or not self.subtree):
            fail("subtree", "None or a synset's first word such as 'mammal'")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            fail("threads", "a positive int or None")

    @property
    def loss_kind(self) -> str:
        """The loss trained: :attr:`loss`, with ``"auto"`` resolved for the graph."""
        if self.loss != "auto":
            return self.loss
        return "softmax" if self.graph == "closure" else "sgns"

    @property
    def uses_bank(self) -> bool:
        """Whether the vectors live in the bank."""
        return self.backend == "bank"


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

    def pair_source(self, s: NodeEmbeddingSettings) -> PairSource:
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


def load_graph_data(s: NodeEmbeddingSettings) -> GraphData:
    """The graph data of ``s`` (built once per process for each graph, seed and split)."""
    return _graph_data(s.graph, s.seed, float(s.holdout), s.recon_sources, s.subtree, s.data_dir, s.wordnet_dir)
