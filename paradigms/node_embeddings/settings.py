"""What one node-embedding run is: :class:`NodeEmbeddingsSettings`, validated on construction."""

from __future__ import annotations

import dataclasses

from carls_dask.bank.sampling import SAMPLERS
from carls_dask.runtime.settings import check_settings

__all__ = ["BACKENDS", "GRAPHS", "LOSSES", "NodeEmbeddingsSettings"]

GRAPHS = ("nouns", "closure")
BACKENDS = ("bank", "in-process")
LOSSES = ("sgns", "softmax")
_OWNER = "node-embeddings settings"


@dataclasses.dataclass(frozen=True)
class NodeEmbeddingsSettings:
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
        def positive_int(v: object, least: int = 1) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= least

        def said(name: str, expected: str) -> str:
            return f"{name}={getattr(self, name)!r}; expected {expected}"

        check_settings(_OWNER, (
            (self.graph in GRAPHS, said("graph", f"one of {GRAPHS}")),
            (self.backend in BACKENDS, said("backend", f"one of {BACKENDS}")),
            (self.loss in ("auto", *LOSSES), said("loss", f"'auto' or one of {LOSSES}")),
            (self.sampler in SAMPLERS, said("sampler", f"one of {SAMPLERS}")),
            *((positive_int(getattr(self, name)), said(name, "a positive int"))
              for name in ("dim", "batch_size", "negatives", "walk_length", "window", "recon_sources",
                           "publish_every", "maker_queries", "maker_k")),
            *((positive_int(getattr(self, name), 0), said(name, "an int >= 0"))
              for name in ("steps", "seed", "eval_every", "staleness")),
            (positive_int(self.walk_length, 2), said("walk_length", "an int >= 2")),
            *((float(getattr(self, name)) > 0, said(name, "a number > 0"))
              for name in ("lr", "accumulator", "negatives_per_pair")),
            (float(self.init_scale) >= 0, said("init_scale", "a number >= 0")),
            (0.0 < float(self.holdout) < 1.0, said("holdout", "a fraction in (0, 1)")),
            *((isinstance(getattr(self, name), bool), said(name, "True or False")) for name in ("pipeline", "maker")),
            (self.subtree is None or (isinstance(self.subtree, str) and bool(self.subtree)),
             said("subtree", "None or a synset's first word such as 'mammal'")),
            (self.threads is None or positive_int(self.threads), said("threads", "a positive int or None")),
        ))

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
