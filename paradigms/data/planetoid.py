"""Cora and CiteSeer citation graphs with the standard Planetoid splits.

The files are numeric-only ``.npz`` conversions of the Planetoid data (``planetoid/cora.npz``,
``planetoid/citeseer.npz``) that lie in a data folder beside the project; nothing is downloaded.
The folder is the ``data_dir`` argument, else the ``carls.data.dir`` location (its environment variable
``CARLS_DATA_DIR``, and ``../shared/data`` beside a checkout; see :mod:`carls_dask.locations`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib

import numpy as np

from carls_dask.errors import ConfigError, CorruptStoreError, StoreNotFoundError
from carls_dask.locations import resolve

__all__ = ["PLANETOID_NAMES", "PlanetoidGraph", "find_data_dir", "load_planetoid"]

logger = logging.getLogger(__name__)

PLANETOID_NAMES = ("cora", "citeseer")
_REQUIRED = ("x_data", "x_indices", "x_indptr", "x_shape", "y", "edges", "train", "val", "test")


@dataclasses.dataclass(frozen=True)
class PlanetoidGraph:
    """One citation graph with its split.

    Attributes
    ----------
    name
        ``"cora"`` or ``"citeseer"``.
    features
        ``float32[n_nodes, n_features]`` bag-of-words features (row-normalised when loaded so).
    labels
        ``int64[n_nodes]`` class of every node (the test and validation labels are for evaluation only).
    edges
        ``int64[2, n_edges]`` undirected edges, each stored once.
    train, val, test
        ``int64`` node indices of the labelled-train, validation and test nodes.
    """

    name: str
    features: np.ndarray
    labels: np.ndarray
    edges: np.ndarray
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray

    @property
    def n_nodes(self) -> int:
        """Number of nodes."""
        return int(self.features.shape[0])

    @property
    def n_features(self) -> int:
        """Length of a node's feature vector."""
        return int(self.features.shape[1])

    @property
    def n_classes(self) -> int:
        """Number of classes."""
        return int(self.labels.max()) + 1

    def unlabelled(self) -> np.ndarray:
        """Indices of every node that is not a labelled-train node (validation and test included)."""
        mask = np.ones(self.n_nodes, dtype=bool)
        mask[self.train] = False
        return np.flatnonzero(mask).astype(np.int64)

    def adjacency_lists(self) -> list[np.ndarray]:
        """Sorted neighbour indices of every node (both directions of each undirected edge)."""
        src = np.concatenate([self.edges[0], self.edges[1]])
        dst = np.concatenate([self.edges[1], self.edges[0]])
        order = np.lexsort((dst, src))
        src, dst = src[order], dst[order]
        bounds = np.searchsorted(src, np.arange(self.n_nodes + 1))
        return [np.unique(dst[bounds[i] : bounds[i + 1]]) for i in range(self.n_nodes)]


def find_data_dir(data_dir: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """The data folder holding ``planetoid/``: ``data_dir``, else ``carls.data.dir`` (see :mod:`carls_dask.locations`).

    Raises
    ------
    StoreNotFoundError
        If the folder that was set does not exist, none was set and there is no default (an installed
        package), or the folder holds no ``planetoid`` subfolder; the message names the folder, where it
        was set and the setting to change.
    """
    loc = resolve("dir", data_dir, given_as="the data_dir setting")
    assert loc.path is not None
    if not (loc.path / "planetoid").is_dir():
        raise StoreNotFoundError(f"data folder {loc}: holds no 'planetoid' folder; expected planetoid/cora.npz and "
                                 f"planetoid/citeseer.npz there (set {loc.how_to_set()} to the folder that holds them)")
    return loc.path


def load_planetoid(
    name: str, data_dir: str | os.PathLike[str] | None = None, *, normalize: bool = True
) -> PlanetoidGraph:
    """Load Cora or CiteSeer with the standard Planetoid split.

    Parameters
    ----------
    name
        ``"cora"`` or ``"citeseer"`` (case-insensitive).
    data_dir
        Folder that holds ``planetoid/<name>.npz``; see :func:`find_data_dir` for the fall-backs.
    normalize
        Divide each node's features by their sum (the usual preprocessing for these data sets).

    Returns
    -------
    PlanetoidGraph

    Raises
    ------
    ConfigError
        If ``name`` is not a known data set.
    StoreNotFoundError
        If the file is not there.
    CorruptStoreError
        If the file lacks arrays or their shapes disagree.
    """
    key = str(name).lower()
    if key not in PLANETOID_NAMES:
        raise ConfigError(f"data set {name!r}: expected one of {', '.join(PLANETOID_NAMES)}")
    folder = find_data_dir(data_dir)
    path = folder / "planetoid" / f"{key}.npz"
    if not path.is_file():
        raise StoreNotFoundError(f"data set {key!r}: no file {path}; expected planetoid/{key}.npz in {folder}")
    with np.load(path, allow_pickle=False) as z:
        missing = [k for k in _REQUIRED if k not in z.files]
        if missing:
            raise CorruptStoreError(f"data set {key!r} at {path}: missing arrays {missing}; expected {list(_REQUIRED)}")
        arrays = {k: z[k] for k in _REQUIRED}
    n, f = (int(v) for v in arrays["x_shape"])
    indptr = arrays["x_indptr"].astype(np.int64)
    indices = arrays["x_indices"].astype(np.int64)
    if indptr.shape != (n + 1,) or arrays["y"].shape != (n,) or indices.shape != arrays["x_data"].shape:
        raise CorruptStoreError(
            f"data set {key!r} at {path}: feature/label shapes disagree "
            f"(x_shape {(n, f)}, indptr {indptr.shape}, y {arrays['y'].shape})"
        )
    features = np.zeros((n, f), dtype=np.float32)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    features[rows, indices] = arrays["x_data"].astype(np.float32)
    if normalize:
        sums = features.sum(axis=1, keepdims=True)
        features /= np.where(sums > 0, sums, 1.0)
    edges = arrays["edges"].astype(np.int64)
    if edges.ndim != 2 or edges.shape[0] != 2 or (edges.size and (edges.min() < 0 or edges.max() >= n)):
        raise CorruptStoreError(f"data set {key!r} at {path}: edges must be int[2, E] with ids in [0, {n})")
    logger.info("loaded %s from %s: %d nodes, %d features, %d edges", key, path, n, f, edges.shape[1])
    return PlanetoidGraph(
        name=key,
        features=features,
        labels=arrays["y"].astype(np.int64),
        edges=edges,
        train=arrays["train"].astype(np.int64),
        val=arrays["val"].astype(np.int64),
        test=arrays["test"].astype(np.int64),
    )
