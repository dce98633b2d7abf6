"""The WordNet 3.0 noun graph without node features: its edges, its hypernym hierarchy and that hierarchy's
transitive closure.

The node-embedding paradigm learns one vector per noun synset from the graph alone, so it needs the
structure :mod:`carls_dask.paradigms.data.wordnet` reads (the same 82,115 synsets in file order, the same
undirected noun-to-noun edges, the same 26 lexicographer-file classes and Planetoid split) without the
gloss features, and the noun hierarchy of Nickel & Kiela (2017, Poincare embeddings): the hypernym
(``@``) and instance-hypernym (``@i``) pointers, whose transitive closure has 743,241 (synset, ancestor)
pairs, their Table 1's "transitive closure of the WordNet noun hierarchy".
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time

import numpy as np
import scipy.sparse as sp

from carls_dask.errors import ConfigError
from carls_dask.paradigms.data.wordnet import (
    FIRST_NOUN_LEXFILE,
    NOUN_LEXNAMES,
    find_wordnet_dir,
    planetoid_split,
    read_data_file,
    wordnet_edges,
)

__all__ = ["HYPERNYM_POINTERS", "NounGraph", "load_noun_graph", "noun_subtree", "transitive_closure"]

logger = logging.getLogger(__name__)

#: The pointers that make the noun hierarchy: hypernym and instance hypernym (child -> parent).
HYPERNYM_POINTERS = ("@", "@i")


@dataclasses.dataclass(frozen=True)
class NounGraph:
    """The noun synsets as a graph (node ``i`` is the ``i``-th synset of ``data.noun``).

    Attributes
    ----------
    labels
        ``int64[n]``: the lexicographer file of each synset (26 classes, :data:`~carls_dask.paradigms.data.wordnet.NOUN_LEXNAMES`).
    edges
        ``int64[2, E]``: every noun-to-noun relation as an undirected edge, each once (``u < v``).
    hypernyms
        ``int64[2, H]``: ``(synset, parent)`` for every hypernym and instance-hypernym pointer.
    words
        The first word of each synset (for display).
    train, val, test
        The Planetoid split of the semi-supervised paradigm: 20 nodes per class, 500, 1,000.
    """

    labels: np.ndarray
    edges: np.ndarray
    hypernyms: np.ndarray
    words: tuple[str, ...]
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray

    @property
    def n_nodes(self) -> int:
        """Number of synsets."""
        return int(self.labels.shape[0])

    @property
    def n_classes(self) -> int:
        """Number of classes."""
        return len(NOUN_LEXNAMES)


@functools.lru_cache(maxsize=2)
def _read(path: str, stamp: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]:
    """Labels, edges, hypernym pointers and words of a ``data.noun`` (parsed once per version of the file)."""
    t0 = time.monotonic()
    synsets = read_data_file(path)
    labels = np.asarray([s.lex_filenum for s in synsets], dtype=np.int64) - FIRST_NOUN_LEXFILE
    index = {s.offset: i for i, s in enumerate(synsets)}
    child, parent = [], []
    for i, s in enumerate(synsets):
        for sym, target, pos, _ in s.pointers:
            j = index.get(target) if pos == "n" and sym in HYPERNYM_POINTERS else None
            if j is not None and j != i:
                child.append(i)
                parent.append(j)
    hyper = np.unique(np.stack([np.asarray(child, np.int64), np.asarray(parent, np.int64)], 1), axis=0).T
    logger.info("read the noun graph of %s in %.1f s", path, time.monotonic() - t0)
    return labels, wordnet_edges(synsets), np.ascontiguousarray(hyper), tuple(s.words[0] for s in synsets)


def load_noun_graph(data_dir: str | os.PathLike[str] | None = None, *,
                    wordnet_dir: str | os.PathLike[str] | None = None) -> NounGraph:
    """The WordNet noun graph (the folder is found as :func:`~carls_dask.paradigms.data.wordnet.find_wordnet_dir` does).

    Raises
    ------
    StoreNotFoundError, CorruptStoreError
        When ``data.noun`` is missing or broken.
    """
    path = find_wordnet_dir(wordnet_dir, data_dir) / "data.noun"
    st = path.stat()
    labels, edges, hyper, words = _read(str(path.resolve()), (st.st_mtime_ns, st.st_size))
    train, val, test = planetoid_split(labels)
    return NounGraph(labels.copy(), edges.copy(), hyper.copy(), words, train, val, test)


def transitive_closure(pairs: np.ndarray, n: int) -> np.ndarray:
    """``int64[2, C]``: every ``(node, ancestor)`` reachable along ``(child, parent)`` ``pairs``, each once.

    Computed level by level with sparse boolean products (paths of length 1, 2, ... until none is new);
    the hierarchy is acyclic, so it ends after its depth.
    """
    a = sp.csr_matrix((np.ones(pairs.shape[1], dtype=np.int8), (pairs[0], pairs[1])), shape=(n, n))
    a.data[:] = 1
    reach = a.copy()
    frontier = a
    for _ in range(n):
        frontier = frontier @ a
        frontier.data[:] = 1
        frontier = frontier - frontier.multiply(reach)  # keep only pairs not reached yet
        frontier.eliminate_zeros()
        if frontier.nnz == 0:
            break
        reach = reach + frontier
        reach.data[:] = 1
    coo = reach.tocoo()
    order = np.lexsort((coo.col, coo.row))
    return np.stack([coo.row[order].astype(np.int64), coo.col[order].astype(np.int64)])


def noun_subtree(graph: NounGraph, root: str) -> NounGraph:
    """The synsets under the synset whose first word is ``root`` (itself included), renumbered from 0.

    Edges and hypernym pointers are those among them; the Planetoid split is drawn anew when every class
    present has 20 nodes, else the split arrays are empty. ``"mammal"`` gives the 1,180 nouns of Nickel &
    Kiela's mammal closure.

    Raises
    ------
    ConfigError
        If no synset, or more than one, has ``root`` as its first word.
    """
    matches = [i for i, w in enumerate(graph.words) if w == root]
    if len(matches) != 1:
        raise ConfigError(f"noun subtree {root!r}: {len(matches)} synsets have it as their first word; expected "
                          "exactly one (e.g. 'mammal')")
    closure = transitive_closure(graph.hypernyms, graph.n_nodes)
    nodes = np.union1d(closure[0][closure[1] == matches[0]], matches)
    new = np.full(graph.n_nodes, -1, dtype=np.int64)
    new[nodes] = np.arange(nodes.shape[0])

    def keep(pairs: np.ndarray) -> np.ndarray:
        inside = (new[pairs[0]] >= 0) & (new[pairs[1]] >= 0)
        return new[pairs[:, inside]]

    labels = graph.labels[nodes]
    try:
        train, val, test = planetoid_split(labels - labels.min(), n_val=0, n_test=0)
    except ConfigError:
        train = val = test = np.zeros(0, dtype=np.int64)
    return NounGraph(labels, keep(graph.edges), keep(graph.hypernyms), tuple(graph.words[i] for i in nodes),
                     train, val, test)
