"""Fixed-size neighbour tables: K neighbour slots per node, padded, with weights."""

from __future__ import annotations

import numpy as np

from carls_dask.errors import ConfigError

__all__ = ["NeighbourTable", "build_neighbour_table"]


class NeighbourTable:
    """``keys[n, k]`` neighbour ids (``-1`` in empty slots) and ``weights[n, k]`` (0 in empty slots).

    Parameters
    ----------
    keys
        ``int64[n_nodes, k]`` neighbour node ids; ``-1`` marks an empty slot.
    weights
        ``float32[n_nodes, k]`` edge weight of each slot; 0 for empty slots.
    """

    def __init__(self, keys: np.ndarray, weights: np.ndarray) -> None:
        if keys.shape != weights.shape or keys.ndim != 2:
            raise ConfigError(f"neighbour table: keys {keys.shape} and weights {weights.shape} must be equal 2-D shapes")
        self.keys = keys.astype(np.int64, copy=False)
        self.weights = weights.astype(np.float32, copy=False)

    @property
    def k(self) -> int:
        """Number of neighbour slots per node."""
        return int(self.keys.shape[1])

    def gather(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return the ``(keys[b, k], weights[b, k])`` rows of ``nodes``."""
        return self.keys[nodes], self.weights[nodes]


def build_neighbour_table(adjacency: list[np.ndarray], k: int, seed: int = 0) -> NeighbourTable:
    """Pick up to ``k`` neighbours of every node, at random without replacement.

    Nodes with fewer than ``k`` neighbours keep all of them and the remaining slots stay empty
    (key ``-1``, weight 0), as in neural structured learning's padded neighbour features.

    Parameters
    ----------
    adjacency
        Neighbour ids of every node (e.g. :meth:`PlanetoidGraph.adjacency_lists`).
    k
        Slots per node, at least 1.
    seed
        Seed of the sampling, so a table is reproducible.
    """
    if int(k) < 1:
        raise ConfigError(f"neighbour table: k must be at least 1, got {k!r}")
    rng = np.random.default_rng(seed)
    n = len(adjacency)
    keys = np.full((n, k), -1, dtype=np.int64)
    weights = np.zeros((n, k), dtype=np.float32)
    for i, nbrs in enumerate(adjacency):
        if len(nbrs) > k:
            nbrs = rng.choice(nbrs, size=k, replace=False)
        keys[i, : len(nbrs)] = nbrs
        weights[i, : len(nbrs)] = 1.0
    return NeighbourTable(keys, weights)
