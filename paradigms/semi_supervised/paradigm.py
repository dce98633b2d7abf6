"""The semi-supervised paradigm as the runner sees it: variants, tables, loops and figures.

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

from carls_dask.paradigms.semi_supervised.data import load_data, resolve_data_dir
from carls_dask.paradigms.semi_supervised.loops import GraphTrainer, NeighbourMaker, PseudoLabelMaker
from carls_dask.paradigms.semi_supervised.settings import ALL_NODES, SemiSupervisedSettings
from carls_dask.paradigms.semi_supervised.tables import bank_tables
from carls_dask.runtime.context import LoopResult
from carls_dask.runtime.paradigm import Paradigm
from carls_dask.storage.runfolder import PL_COUNT, PL_COVERAGE, PL_PRECISION, RunFolder

__all__ = ["ALL_NODES", "BANK_DEFAULTS", "SemiSupervised"]

TRAINER = "trainer"

#: Settings of the bank variants (chosen on Cora's validation split, see docs/results.md): every
#: unlabelled node per step, neighbour targets sharpened with temperature 0.5, the graph term from
#: step 50 on, and the data set's pseudo-label preset from model step 20 on (``pseudo.threshold`` is
#: read only with ``pseudo.selection="threshold"``).
BANK_DEFAULTS: dict[str, Any] = {"unlabelled_batch": ALL_NODES, "neighbour_temperature": 0.5, "graph_warmup": 50,
                                 "pseudo.threshold": 0.99, "pseudo.selection": "auto", "pseudo.warmup": 20}


class SemiSupervised(Paradigm[SemiSupervisedSettings]):
    """Node classification on a citation graph with graph regularization and pseudo labels from the bank."""

    name = "semi-supervised"
    description = ("node classification on Cora, CiteSeer and WordNet nouns with neighbour outputs and pseudo labels "
                   "from the bank")
    settings_type = SemiSupervisedSettings
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

    def prepare(self, settings: SemiSupervisedSettings) -> SemiSupervisedSettings:
        """Resolve the data folder here (so the loops get it explicitly) and check the data set loads."""
        settings = dataclasses.replace(settings, data_dir=resolve_data_dir(settings))
        load_data(settings)
        return settings

    def tables(self, settings: SemiSupervisedSettings) -> Sequence[Any]:
        if settings.mode != "bank":
            return []
        graph = load_data(settings)
        return bank_tables(graph.n_classes, settings.hidden[-1], settings.refresh_threshold)

    def loops(self, settings: SemiSupervisedSettings) -> Sequence[Any]:
        out: list[Any] = [GraphTrainer(TRAINER, settings)]
        if settings.mode == "bank":
            out.append(NeighbourMaker("neighbour-maker", settings, source=TRAINER))
            if settings.pseudo_labels:
                out.append(PseudoLabelMaker("pseudo-labeller", settings, source=TRAINER))
        return out

    def write_artifacts(self, settings: SemiSupervisedSettings, run_dir: pathlib.Path) -> None:
        """``truth.npz``: the held-out labels of the unlabelled nodes, for judging pseudo labels."""
        graph = load_data(settings)
        unlabelled = graph.unlabelled()
        np.savez(RunFolder(run_dir).truth, keys=unlabelled, labels=graph.labels[unlabelled])

    def summarize(self, settings: SemiSupervisedSettings, results: Mapping[str, LoopResult]) -> dict[str, Any]:
        out: dict[str, Any] = dict(results[TRAINER].value or {})
        for name, r in results.items():
            if r.kind != "maker":
                continue
            out[f"{name}_rounds"] = len(r.rounds)
            for key in (PL_PRECISION, PL_COVERAGE, PL_COUNT):
                if key in r.metrics:
                    out[key] = r.metrics[key]
        return out
