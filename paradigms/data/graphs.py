"""One entry point for the node-classification graphs: Cora, CiteSeer (Planetoid files) and WordNet nouns.

===================  ===========================================================================
name                 data
===================  ===========================================================================
``cora``             :func:`~carls_dask.paradigms.data.planetoid.load_planetoid` (2,708 nodes)
``citeseer``         :func:`~carls_dask.paradigms.data.planetoid.load_planetoid` (3,327 nodes)
``wordnet``          :func:`~carls_dask.paradigms.data.wordnet.load_wordnet`, gloss features from the
                     sentence encoder when installed, else TF-IDF (82,115 nodes)
``wordnet-tfidf``    the same graph with TF-IDF gloss features (no extra packages)
===================  ===========================================================================

>>> from carls_dask.paradigms.data.graphs import load_graph
>>> load_graph("cora").n_nodes   # doctest: +SKIP
2708
"""

from __future__ import annotations

import os
import pathlib

from carls_dask.errors import ConfigError, StoreNotFoundError
from carls_dask.paradigms.data.planetoid import PLANETOID_NAMES, PlanetoidGraph, find_data_dir, load_planetoid
from carls_dask.paradigms.data.wordnet import load_wordnet

__all__ = ["GRAPH_NAMES", "WORDNET_UNLABELLED_BATCH", "graph_data_dir", "graph_family", "graph_unlabelled_batch",
           "load_graph"]

#: name -> features of the WordNet loader
_WORDNET = {"wordnet": "auto", "wordnet-tfidf": "tfidf"}
GRAPH_NAMES: tuple[str, ...] = (*PLANETOID_NAMES, *_WORDNET)

#: Unlabelled nodes per step on WordNet where a variant asks for every one (Cora's bank setting):
#: 81,595 nodes a step would make each step a forward pass over the whole graph. 2,048 unlabelled
#: nodes (with the 520 labelled ones) give each step ~2.5k nodes, about Cora's whole graph. Chosen
#: on the WordNet validation split (bank variant, seeds 10 and 11, 200 steps): 512 val 67.1 %,
#: 2,048 val 69.4 %, 8,192 val 70.5 % at a third of the step rate (README "WordNet nouns").
WORDNET_UNLABELLED_BATCH = 2048

def _key(name: str) -> str:
    key = str(name).lower()
    if key not in GRAPH_NAMES:
        raise ConfigError(f"data set {name!r}: expected one of {', '.join(GRAPH_NAMES)}")
    return key


def load_graph(name: str, data_dir: str | os.PathLike[str] | None = None) -> PlanetoidGraph:
    """Load the graph ``name`` (one of :data:`GRAPH_NAMES`, case-insensitive) with its fixed split.

    Parameters
    ----------
    name
        ``"cora"``, ``"citeseer"``, ``"wordnet"`` or ``"wordnet-tfidf"``.
    data_dir
        The data folder (Planetoid files; for WordNet one place searched for ``wordnet/data.noun``).

    Raises
    ------
    ConfigError
        For an unknown name; otherwise what the loader raises.
    """
    key = _key(name)
    if key in _WORDNET:
        return load_wordnet(data_dir, features=_WORDNET[key])
    return load_planetoid(key, data_dir)


def graph_data_dir(name: str, data_dir: str | os.PathLike[str] | None = None) -> str | None:
    """The data folder a run of ``name`` passes to its loops (resolved once, on the client).

    Planetoid graphs need it (:func:`~carls_dask.paradigms.data.planetoid.find_data_dir`); WordNet is
    read from the WordNet folder, so there it is the resolved folder when one exists, else ``data_dir``.
    """
    key = _key(name)
    if key not in _WORDNET:
        return str(find_data_dir(data_dir))
    try:
        return str(find_data_dir(data_dir))
    except StoreNotFoundError:
        return None if data_dir is None else str(pathlib.Path(data_dir))


def graph_family(name: str) -> str:
    """The family of the graph ``name``: ``"planetoid"`` (Cora, CiteSeer) or ``"wordnet"`` (both WordNet graphs).

    Raises
    ------
    ConfigError
        If ``name`` is not one of :data:`GRAPH_NAMES`.
    """
    return "wordnet" if _key(name) in _WORDNET else "planetoid"


def graph_unlabelled_batch(name: str, requested: int, every: int) -> int:
    """Unlabelled nodes per step on ``name``: ``requested``, except that a request for all of them
    (``requested >= every``) is :data:`WORDNET_UNLABELLED_BATCH` on WordNet."""
    if _key(name) in _WORDNET and int(requested) >= int(every):
        return WORDNET_UNLABELLED_BATCH
    return int(requested)
