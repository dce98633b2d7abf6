"""The semi-supervised paradigm as the runner sees it: settings, variants, tables, loops and figures.

Variants (``carls-dask run semi-supervised --variant NAME``):

``base``
    The MLP on the labelled nodes only.
``in-graph``
    Graph regularization with a forward pass over every neighbour inside the step (NSL style).
``bank``
    Graph regularization with neighbour outputs looked up in the bank (a maker writes them).
``bank+pseudo`` (default)
    ``bank`` plus pseudo labels of the unlabelled nodes from a second maker.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from carls_dask.paradigms.data.graphs import graph_data_dir, graph_unlabelled_batch, load_graph
from carls_dask.paradigms.semi_supervised.core import SemiSupervisedConfig
from carls_dask.paradigms.semi_supervised.loops import (
    GraphTrainer,
    NeighbourMaker,
    PseudoLabelMaker,
    bank_tables,
)
from carls_dask.runtime.context import LoopResult
from carls_dask.runtime.paradigm import Paradigm
from carls_dask.storage.runfolder import PL_COUNT, PL_COVERAGE, PL_PRECISION, RunFolder

__all__ = ["ALL_NODES", "BANK_DEFAULTS", "SemiSupervised"]

TRAINER = "trainer"

# More than any Planetoid graph has nodes: a bank step then covers every unlabelled node.
ALL_NODES = 1_000_000

# Settings of the bank variants, chosen on the validation split of Cora (benchmarks/graph_regularization.py,
# in-process, seeds 100-102; the README's "Semi-supervised paradigm" section lists what was tried): every
# unlabelled node per step (the bank lookup cost barely grows with the batch), neighbour targets sharpened with
# temperature 0.5, and soft pseudo labels for every unlabelled node: from model step 20 on, the pseudo-label
# maker corrects the newest model's class probabilities with its errors on the labelled-train nodes spread over
# the graph (correct-and-smooth: neighbour weight 0.99, autoscale), propagates them over the graph (personalised
# PageRank, neighbour weight 0.8, 50 rounds, labelled-train nodes clamped to their labels), sharpens them with
# temperature 0.6 and writes them to the bank; the trainer distils them with weight 10 (``pseudo_selection="auto"``:
# the data set's preset, ``graph_pseudo_preset``, which holds those Planetoid values, and on WordNet, where that
# teacher is right too rarely, class-balanced hard labels instead). ``threshold`` is used only with
# ``pseudo_selection="threshold"``. GRAPH_WARMUP is the bank variants' ``graph_warmup``.
GRAPH_WARMUP = 50
BANK_DEFAULTS: dict[str, Any] = {"unlabelled_batch": ALL_NODES, "neighbour_temperature": 0.5, "graph_warmup": GRAPH_WARMUP,
                                 "threshold": 0.99, "pseudo_selection": "auto", "pseudo_warmup": 20}


class SemiSupervised(Paradigm):
    """Node classification on a citation graph with graph regularization and pseudo labels from the bank."""

    name = "semi-supervised"
    description = "node classification on Cora/CiteSeer with neighbour outputs and pseudo labels from the bank"
    settings_type = SemiSupervisedConfig
    variants = {
        "base": {"mode": "base"},
        "in-graph": {"mode": "in-graph"},
        "bank": {"mode": "bank", **BANK_DEFAULTS},
        "bank+pseudo": {"mode": "bank", "pseudo_labels": True, **BANK_DEFAULTS},
    }
    default_variant = "bank+pseudo"
    headline = ("test_acc", "best_val_acc", PL_PRECISION, PL_COVERAGE)
    unprefixed = {"trainer": ("val_acc", "test_acc", "train_acc"), "maker": (PL_PRECISION, PL_COVERAGE)}
    cumulative = ("*_rounds",)

    def prepare(self, settings: SemiSupervisedConfig) -> SemiSupervisedConfig:
        """Resolve the data folder here (so the loops get it explicitly) and check the data set loads."""
        folder = graph_data_dir(settings.dataset, settings.data_dir)
        load_graph(settings.dataset, folder)
        batch = graph_unlabelled_batch(settings.dataset, settings.unlabelled_batch, every=ALL_NODES)
        return dataclasses.replace(settings, data_dir=folder, unlabelled_batch=batch)

    def tables(self, settings: SemiSupervisedConfig) -> Sequence[Any]:
        if settings.mode != "bank":
            return []
        graph = load_graph(settings.dataset, settings.data_dir)
        return bank_tables(graph.n_classes, settings.hidden[-1], settings.refresh_threshold)

    def loops(self, settings: SemiSupervisedConfig) -> Sequence[Any]:
        out: list[Any] = [GraphTrainer(TRAINER, settings)]
        if settings.mode == "bank":
            out.append(NeighbourMaker("neighbour-maker", settings, source=TRAINER))
            if settings.pseudo_labels:
                out.append(PseudoLabelMaker("pseudo-labeller", settings, source=TRAINER))
        return out

    def write_artifacts(self, settings: SemiSupervisedConfig, run_dir: pathlib.Path) -> None:
        """``truth.npz``: the held-out labels of the unlabelled nodes, for judging pseudo labels."""
        graph = load_graph(settings.dataset, settings.data_dir)
        unlabelled = graph.unlabelled()
        np.savez(RunFolder(run_dir).truth, keys=unlabelled, labels=graph.labels[unlabelled])

    def summarize(self, settings: SemiSupervisedConfig, results: Mapping[str, LoopResult]) -> dict[str, Any]:
        out: dict[str, Any] = dict(results[TRAINER].value or {})
        for name, r in results.items():
            if r.kind != "maker":
                continue
            out[f"{name}_rounds"] = len(r.rounds)
            for key in (PL_PRECISION, PL_COVERAGE, PL_COUNT):
                if key in r.metrics:
                    out[key] = r.metrics[key]
        return out
