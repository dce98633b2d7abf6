"""What the node-embedding trainer learns from: random-walk skip-gram pairs, closure pairs, link-prediction splits.

Everything here is pure NumPy/SciPy and a function of its seed, so a batch is the same on every worker
and a resumed run draws the batches an uninterrupted one would.

- :func:`random_walks` and :func:`skipgram_pairs`: DeepWalk's uniform random walks over the graph and the
  (center, context) pairs within a window of each walk position;
- :class:`PairSource`: the batches of a run, batch ``i`` a pure function of (seed, ``i``): walks started
  from every node in a fresh order per round (or the closure's pairs in a fresh order per epoch), cut
  into chunks whose pairs are shuffled;
- :func:`link_split` and :func:`sample_non_edges`: node2vec's link-prediction protocol (edges held out
  with the rest of the graph kept connected, as many sampled non-edges).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp

from carls_dask.errors import ConfigError

__all__ = ["LinkSplit", "PairSource", "adjacency", "link_split", "random_walks", "sample_non_edges", "skipgram_pairs"]


def adjacency(edges: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR ``(indptr, indices)`` of the undirected graph of ``edges`` (``int64[2, E]``, each edge once)."""
    a = sp.csr_matrix((np.ones(2 * edges.shape[1], dtype=np.int8),
                       (np.concatenate([edges[0], edges[1]]), np.concatenate([edges[1], edges[0]]))), shape=(n, n))
    a.sum_duplicates()
    a.sort_indices()
    return a.indptr.astype(np.int64), a.indices.astype(np.int64)


def random_walks(indptr: np.ndarray, indices: np.ndarray, starts: np.ndarray, length: int,
                 rng: np.random.Generator) -> np.ndarray:
    """``int64[len(starts), length]`` uniform random walks (DeepWalk's); a node without edges stays put."""
    walks = np.empty((starts.shape[0], length), dtype=np.int64)
    cur = np.asarray(starts, dtype=np.int64)
    walks[:, 0] = cur
    deg = np.diff(indptr)
    for t in range(1, length):
        d = deg[cur]
        pick = (rng.random(cur.shape[0]) * np.maximum(d, 1)).astype(np.int64)
        cur = np.where(d > 0, indices[indptr[cur] + np.minimum(pick, np.maximum(d - 1, 0))], cur)
        walks[:, t] = cur
    return walks


def skipgram_pairs(walks: np.ndarray, window: int) -> np.ndarray:
    """``int64[2, P]`` (center, context) pairs: every two positions of a walk at most ``window`` apart, both ways.

    Pairs of a node with itself (a walk that came back) are dropped.
    """
    out = []
    length = walks.shape[1]
    for off in range(1, min(window, length - 1) + 1):
        a, b = walks[:, :-off].reshape(-1), walks[:, off:].reshape(-1)
        out.append(np.stack([a, b]))
        out.append(np.stack([b, a]))
    pairs = np.concatenate(out, axis=1) if out else np.zeros((2, 0), dtype=np.int64)
    return pairs[:, pairs[0] != pairs[1]]


@dataclasses.dataclass(frozen=True)
class LinkSplit:
    """A link-prediction split of an undirected graph.

    Attributes
    ----------
    train
        ``int64[2, E_train]``: the edges training may see (a connected graph on every node).
    test
        ``int64[2, E_test]``: held-out edges.
    test_non
        ``int64[2, E_test]``: sampled node pairs that are not edges of the whole graph.
    fit, fit_non
        Training edges and further sampled non-edges (as many as the test edges) on which the edge
        classifier is fitted.
    """

    train: np.ndarray
    test: np.ndarray
    test_non: np.ndarray
    fit: np.ndarray
    fit_non: np.ndarray

    @property
    def held_out_fraction(self) -> float:
        """Share of the graph's edges held out."""
        return self.test.shape[1] / (self.test.shape[1] + self.train.shape[1])


def _pair_keys(pairs: np.ndarray, n: int) -> np.ndarray:
    lo, hi = np.minimum(pairs[0], pairs[1]), np.maximum(pairs[0], pairs[1])
    return lo * n + hi


def sample_non_edges(edges: np.ndarray, n: int, count: int, rng: np.random.Generator,
                     exclude: np.ndarray | None = None) -> np.ndarray:
    """``int64[2, count]`` distinct node pairs ``u < v`` that are not in ``edges`` (nor in ``exclude``)."""
    taken = _pair_keys(edges, n)
    if exclude is not None and exclude.size:
        taken = np.concatenate([taken, _pair_keys(exclude, n)])
    taken = np.unique(taken)
    got = np.zeros(0, dtype=np.int64)
    while got.shape[0] < count:
        u = rng.integers(0, n, size=2 * (count - got.shape[0]) + 16)
        v = rng.integers(0, n, size=u.shape[0])
        keys = _pair_keys(np.stack([u, v]), n)[u != v]
        keys = keys[~np.isin(keys, taken)]
        _, first = np.unique(keys, return_index=True)
        keys = keys[np.sort(first)]
        keys = keys[~np.isin(keys, got)]
        got = np.concatenate([got, keys])[:count]
    return np.stack([got // n, got % n])


def link_split(edges: np.ndarray, n: int, holdout: float, rng: np.random.Generator) -> LinkSplit:
    """Hold out up to ``holdout`` of the edges, keeping a random spanning tree (so training stays connected).

    node2vec's protocol holds out half the edges of a graph while the rest stays connected; on a graph
    with fewer than twice as many edges as nodes that cannot be done, so the held-out edges are then
    every edge outside the spanning tree (the WordNet noun graph: 33,196 of 115,310, 28.8 %).

    Raises
    ------
    ConfigError
        If ``holdout`` is not in ``(0, 1)``.
    """
    if not 0.0 < holdout < 1.0:
        raise ConfigError(f"link_split: holdout={holdout!r}; expected a fraction in (0, 1)")
    m = edges.shape[1]
    w = sp.csr_matrix((rng.random(m) + 1.0, (edges[0], edges[1])), shape=(n, n))
    tree = sp.csgraph.minimum_spanning_tree(w).tocoo()
    in_tree = np.isin(_pair_keys(edges, n), _pair_keys(np.stack([tree.row, tree.col]).astype(np.int64), n))
    spare = np.flatnonzero(~in_tree)
    k = min(round(holdout * m), spare.shape[0])
    held = np.zeros(m, dtype=bool)
    held[rng.choice(spare, size=k, replace=False)] = True
    train, test = edges[:, ~held], edges[:, held]
    test_non = sample_non_edges(edges, n, k, rng)
    fit = train[:, rng.choice(train.shape[1], size=min(k, train.shape[1]), replace=False)]
    fit_non = sample_non_edges(edges, n, fit.shape[1], rng, exclude=test_non)
    return LinkSplit(train, test, test_non, fit, fit_non)


class PairSource:
    """The run's batches of (center, context) pairs; batch ``i`` is a pure function of (``seed``, ``i``).

    Parameters
    ----------
    pairs_from
        ``"walks"``: skip-gram pairs of uniform random walks over ``edges`` (undirected); ``"edges"``:
        the given directed ``(center, context)`` pairs themselves (e.g. the closure's ``(synset, ancestor)``).
    edges
        ``int64[2, E]``.
    n
        Number of nodes.
    batch
        Pairs per batch.
    seed
        Seed of the walks and orders.
    walk_length, window
        Walk length and skip-gram window (``"walks"``).
    walks_per_chunk
        Walks generated at once; their pairs are shuffled together.
    """

    def __init__(self, pairs_from: str, edges: np.ndarray, n: int, batch: int, seed: int, *, walk_length: int = 20,
                 window: int = 5, walks_per_chunk: int = 4096) -> None:
        if pairs_from not in ("walks", "edges"):
            raise ConfigError(f"PairSource: pairs_from={pairs_from!r}; expected 'walks' or 'edges'")
        self.pairs_from = pairs_from
        self.n = int(n)
        self.batch = int(batch)
        self.seed = int(seed)
        self.edges = edges
        self.walk_length = int(walk_length)
        self.window = int(window)
        self.walks_per_chunk = int(walks_per_chunk)
        if pairs_from == "walks":
            self.indptr, self.indices = adjacency(edges, self.n)
            self.chunks_per_round = -(-self.n // self.walks_per_chunk)
        self._chunk: tuple[int, np.ndarray] | None = None

    def _make_chunk(self, c: int) -> np.ndarray:
        """Pairs of chunk ``c`` in their shuffled order."""
        if self.pairs_from == "edges":  # chunk c is epoch c: all pairs in a fresh order
            rng = np.random.default_rng([self.seed, c, 1])
            return self.edges[:, rng.permutation(self.edges.shape[1])]
        rnd, part = divmod(c, self.chunks_per_round)
        order = np.random.default_rng([self.seed, rnd, 0]).permutation(self.n)
        starts = order[part * self.walks_per_chunk:(part + 1) * self.walks_per_chunk]
        rng = np.random.default_rng([self.seed, c, 2])
        pairs = skipgram_pairs(random_walks(self.indptr, self.indices, starts, self.walk_length, rng), self.window)
        return pairs[:, rng.permutation(pairs.shape[1])]

    def _chunk_pairs(self, c: int) -> np.ndarray:
        if self._chunk is None or self._chunk[0] != c:
            self._chunk = (c, self._make_chunk(c))
        return self._chunk[1]

    def batch_at(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(centers, contexts)`` of batch ``i``: the next ``batch`` pairs, continuing into the next chunk."""
        # chunks are consumed in order; a chunk's pairs not filling a whole batch start the next batch
        c, pos = self._locate(i)
        parts, need = [], self.batch
        while need > 0:
            pairs = self._chunk_pairs(c)
            take = pairs[:, pos:pos + need]
            parts.append(take)
            need -= take.shape[1]
            c, pos = c + 1, 0
        got = np.concatenate(parts, axis=1)
        return got[0], got[1]

    def _locate(self, i: int) -> tuple[int, int]:
        """Chunk and offset where batch ``i`` starts (chunks' sizes counted once, then remembered)."""
        if not hasattr(self, "_sizes"):
            self._sizes: list[int] = []
        start = i * self.batch
        c, total = 0, 0
        while True:
            while c >= len(self._sizes):
                self._sizes.append(int(self._chunk_pairs(len(self._sizes)).shape[1]))
            if total + self._sizes[c] > start:
                return c, start - total
            total += self._sizes[c]
            c += 1
