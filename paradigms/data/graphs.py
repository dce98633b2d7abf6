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

__all__ = ["GRAPH_NAMES", "WORDNET_UNLABELLED_BATCH", "graph_data_dir", "graph_pseudo_preset", "graph_unlabelled_batch",
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

#: The pseudo labels ``pseudo_selection="auto"`` means on each family of graphs, chosen on its validation
#: split (README "Semi-supervised paradigm"): on the Planetoid graphs soft targets for every unlabelled
#: node distilled with weight 10, from a correct-and-smooth teacher (correct step with neighbour weight
#: 0.99 and autoscale, then label propagation with weight 0.8, 50 rounds each); on WordNet the soft teacher is right too rarely (validation 59.8-61.0 %
#: against 69.6-70.4 % for the bank alone, seeds 0-1) and class-balanced hard labels win (validation
#: 70.28 % against 69.88 % for the bank alone, seeds 0-4). CiteSeer takes the Planetoid settings with the
#: graph teacher (``pseudo_teacher="graph"``, :mod:`~carls_dask.paradigms.semi_supervised.teacher`) in place
#: of the student's own corrected predictions: validation 75.73 % against 71.17 % (seeds 100-102 and
#: 100-105); on Cora the graph teacher lost (validation 80.00 % against 81.93 %, seeds 100-102).
_PLANETOID_PRESET: dict[str, object] = {
    "pseudo_selection": "soft", "pseudo_weight": 10.0, "pseudo_temperature": 0.6, "pseudo_alpha": 0.8,
    "pseudo_correct_alpha": 0.99, "propagation_steps": 50}
_PSEUDO_PRESETS: dict[str, dict[str, object]] = {
    "planetoid": _PLANETOID_PRESET,
    "citeseer": {**_PLANETOID_PRESET, "pseudo_teacher": "graph"},
    "wordnet": {"pseudo_selection": "balanced", "pseudo_weight": 0.5, "pseudo_fraction": 0.4, "pseudo_ramp": 50,
                "pseudo_agreement": False},
}


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


def graph_pseudo_preset(name: str) -> dict[str, object]:
    """The pseudo-label settings ``pseudo_selection="auto"`` stands for on the graph ``name``.

    Raises
    ------
    ConfigError
        If ``name`` is not one of :data:`GRAPH_NAMES`.
    """
    key = _key(name)
    if key in _PSEUDO_PRESETS:
        return dict(_PSEUDO_PRESETS[key])
    return dict(_PSEUDO_PRESETS["wordnet" if key in _WORDNET else "planetoid"])


def graph_unlabelled_batch(name: str, requested: int, every: int) -> int:
    """Unlabelled nodes per step on ``name``: ``requested``, except that a request for all of them
    (``requested >= every``) is :data:`WORDNET_UNLABELLED_BATCH` on WordNet."""
    if _key(name) in _WORDNET and int(requested) >= int(every):
        return WORDNET_UNLABELLED_BATCH
    return int(requested)
