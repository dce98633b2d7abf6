"""The trainer's pure core: one model, one optimizer, one step at a time; no Dask, no bank.

The three variants differ only in where neighbour outputs come from:

* ``base``: no graph term;
* ``in-graph``: a forward pass over every neighbour slot inside the step (NSL style, cost grows with K);
* ``bank``: the caller passes neighbour logits it looked up (one batched lookup, cost nearly flat in K).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from carls_dask.errors import ConfigError, InvalidShapeError
from carls_dask.paradigms.data.graphs import graph_pseudo_preset
from carls_dask.paradigms.data.planetoid import PlanetoidGraph
from carls_dask.paradigms.semi_supervised.loss import (
    DISTANCES,
    graph_regularization,
    pseudo_label_loss,
    soft_target_loss,
)
from carls_dask.paradigms.semi_supervised.model import MLP
from carls_dask.paradigms.semi_supervised.neighbours import NeighbourTable, build_neighbour_table

__all__ = ["MAKER_REFRESH", "MODES", "PSEUDO_SELECTIONS", "PSEUDO_TEACHERS", "NodeClassifierCore", "SemiSupervisedConfig", "expand_neighbour_rows"]

MODES = ("base", "in-graph", "bank")
PSEUDO_SELECTIONS = ("threshold", "balanced", "soft", "auto")
PSEUDO_TEACHERS = ("student", "graph")
#: What the neighbour maker re-scores each round (see :attr:`SemiSupervisedConfig.maker_refresh`).
MAKER_REFRESH = ("full", "changes")


@dataclasses.dataclass
class SemiSupervisedConfig:
    """Hyper-parameters shared by every variant.

    Attributes
    ----------
    dataset
        ``"cora"``, ``"citeseer"``, ``"wordnet"`` or ``"wordnet-tfidf"`` (:func:`~carls_dask.paradigms.data.graphs.load_graph`).
    mode
        ``"base"``, ``"in-graph"`` or ``"bank"``.
    k
        Neighbour slots per node.
    steps
        Optimizer steps of one run.
    hidden, dropout, lr, weight_decay
        The MLP and its Adam optimizer.
    unlabelled_batch
        Unlabelled nodes drawn per step beside all labelled-train nodes (the graph term covers both).
    graph_weight
        Multiplier of the graph-regularization term.
    distance
        ``"kl"`` or ``"l2"`` (see :func:`graph_regularization`).
    neighbour_temperature
        Neighbour logits are divided by it before the graph term: values below 1 sharpen the
        neighbours' distributions into firmer targets (1 leaves them as they are).
    pseudo_labels
        Add the pseudo-label term (bank mode only: pseudo labels come from a maker).
    pseudo_weight
        Multiplier of the pseudo-label term; ``None``: the data set's preset under ``pseudo_selection="auto"``,
        else 10 for ``soft`` and 0.5 for the hard labels.
    threshold
        Confidence a prediction needs to become a pseudo label (``pseudo_selection="threshold"``).
    pseudo_selection
        ``"threshold"``: every unlabelled node whose model confidence passes ``threshold``;
        ``"balanced"``: per class, the candidates with the most confident neighbour vote that agrees
        with the model, up to ``pseudo_fraction`` of the candidates in all (see
        :func:`~carls_dask.paradigms.semi_supervised.pseudo_labels.select_balanced_pseudo_labels`);
        ``"soft"``: every unlabelled node gets its neighbour vote as a soft target (distillation of a
        personalised-PageRank teacher, see
        :func:`~carls_dask.paradigms.semi_supervised.pseudo_labels.soft_pseudo_labels`);
        ``"auto"``: the preset of the data set, chosen on its validation split
        (:func:`~carls_dask.paradigms.data.graphs.graph_pseudo_preset`: ``soft`` with weight 10, temperature
        0.6, neighbour weight 0.8, a correct step with neighbour weight 0.99 (autoscale) and 50 propagation
        rounds on Cora and CiteSeer; ``balanced`` with weight 0.5, fraction 0.4, ramp 50
        and no agreement test on WordNet). The preset fills the fields left at their defaults: a field set to
        another value keeps it, but one set to its default value (e.g. ``pseudo_alpha=0.9``) cannot be
        told from an unset one and takes the preset's value; to run such a value, give
        ``pseudo_selection="soft"`` (or ``"balanced"``) and the other fields explicitly.
    pseudo_fraction
        Share of the unlabelled nodes that may get a pseudo label (``balanced``).
    pseudo_alpha
        Neighbour weight of the label propagation that makes the votes (``balanced``; 0: the model alone).
    pseudo_agreement
        Require the model's and the neighbour vote's classes to agree (``balanced``).
    pseudo_temperature
        Sharpening temperature of the soft targets (``soft``; 1 leaves the votes as they are).
    pseudo_confidence_weight
        Weight each soft target's loss by its confidence (``soft``; else every target weighs 1).
    pseudo_correct_alpha
        Neighbour weight of the "correct" step before the label propagation (``balanced`` and ``soft``;
        0: off): the model's errors on the labelled-train nodes are spread over the graph and added to
        its probabilities (correct-and-smooth, see
        :func:`~carls_dask.paradigms.semi_supervised.pseudo_labels.correct_probabilities`).
    pseudo_correct_scale
        Multiplier of the spread errors in the correct step; 0: autoscale (each row scaled to the mean
        size of the labelled-train errors).
    pseudo_teacher
        Whose class probabilities the pseudo labels come from: ``"student"`` (the newest model
        version, corrected and propagated as above) or ``"graph"`` (a separate graph model the maker
        trains once from the labelled-train nodes and the graph, with random propagation and
        consistency regularisation, see :mod:`~carls_dask.paradigms.semi_supervised.teacher`; its
        probabilities take the place of the votes: the correct step and the propagation do not
        apply, the sharpening with ``pseudo_temperature`` does). The trainer stays an MLP at inference
        either way. ``None``: ``"graph"`` on CiteSeer under ``pseudo_selection="auto"``, else ``"student"``
        (an explicit value is kept).
    teacher_epochs
        Training steps of the ``"graph"`` teacher.
    propagation_steps
        Rounds of the label propagation that makes the votes (``balanced`` and ``soft``), and of the
        correct step.
    graph_warmup
        Trainer steps before which the graph term is off (the run starts as the base MLP).
    pseudo_warmup
        Model step before which no pseudo label is given.
    pseudo_ramp
        Steps after the warm-up over which the labelled share grows linearly to ``pseudo_fraction``
        (0: all at once).
    eval_every
        Steps between validation evaluations (the best-validation model is the one reported).
    seed
        Seed of weights, dropout and batch sampling.
    neighbour_seed
        Seed of the neighbour-table sampling.
    publish_every
        Trainer steps between model versions the makers pick up.
    data_dir
        Folder of the Planetoid files (``None``: ``carls.data.dir``, then ``CARLS_DATA_DIR``).
    torch_threads
        Intra-op threads torch may use in each loop (0 leaves torch's default).
    maker_refresh
        What the neighbour maker re-scores each round: ``"full"`` (every node) or ``"changes"`` (the
        nodes the bank's change feed says moved at its last round and their graph neighbours, plus a
        slow sweep of ``sweep_fraction`` of the nodes so that none is starved; see
        :meth:`~carls_dask.bank.client.KnowledgeBank.changes`).
    refresh_threshold
        L2 distance between a node's new and last reported logits above which the change feed counts it as moved.
    sweep_fraction
        Share of the nodes a ``"changes"`` maker re-scores each round in a fixed cycle, whatever moved.
    refresh_neighbours
        Whether a ``"changes"`` maker also re-scores the graph neighbours of the nodes that moved (on by
        default; off re-scores the moved nodes and the sweep only, about a third of the rows on WordNet).
    audit_nodes
        Nodes (a fixed sample) on which the trainer measures, at each evaluation, how far the bank's logits
        are from its current model's: the staleness of the knowledge it reads (0: no audit).
    """

    dataset: str = "cora"
    mode: str = "bank"
    k: int = 5
    steps: int = 300
    hidden: tuple[int, ...] = (64,)
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 5e-4
    unlabelled_batch: int = 512
    graph_weight: float = 1.0
    distance: str = "kl"
    neighbour_temperature: float = 1.0
    pseudo_labels: bool = False
    pseudo_weight: float | None = None
    threshold: float = 0.6
    pseudo_selection: str = "threshold"
    pseudo_fraction: float = 0.3
    pseudo_alpha: float = 0.9
    pseudo_agreement: bool = True
    pseudo_temperature: float = 1.0
    pseudo_confidence_weight: bool = False
    pseudo_correct_alpha: float = 0.0
    pseudo_correct_scale: float = 0.0
    pseudo_teacher: str | None = None
    teacher_epochs: int = 400
    propagation_steps: int = 10
    graph_warmup: int = 0
    pseudo_warmup: int = 0
    pseudo_ramp: int = 0
    eval_every: int = 10
    seed: int = 0
    neighbour_seed: int = 0
    publish_every: int = 10
    data_dir: str | None = None
    torch_threads: int = 1
    maker_refresh: str = "full"
    refresh_threshold: float = 2.0
    sweep_fraction: float = 0.05
    refresh_neighbours: bool = True
    audit_nodes: int = 256

    def __post_init__(self) -> None:
        self.hidden = tuple(int(h) for h in self.hidden)
        if self.pseudo_selection == "auto":  # the preset fills the fields left at their defaults
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            for name, value in graph_pseudo_preset(self.dataset).items():
                if name == "pseudo_selection" or getattr(self, name) == defaults[name]:
                    setattr(self, name, value)
        if self.pseudo_weight is None:
            self.pseudo_weight = 10.0 if self.pseudo_selection == "soft" else 0.5
        if self.pseudo_teacher is None:
            self.pseudo_teacher = "student"
        checks: Sequence[tuple[bool, str]] = (
            (self.mode in MODES, f"mode {self.mode!r}, expected one of {MODES}"),
            (self.distance in DISTANCES, f"distance {self.distance!r}, expected one of {DISTANCES}"),
            (int(self.k) >= 1, f"k {self.k!r}, expected an integer >= 1"),
            (int(self.steps) >= 1, f"steps {self.steps!r}, expected an integer >= 1"),
            (int(self.eval_every) >= 1, f"eval_every {self.eval_every!r}, expected an integer >= 1"),
            (int(self.publish_every) >= 1, f"publish_every {self.publish_every!r}, expected an integer >= 1"),
            (int(self.torch_threads) >= 0, f"torch_threads {self.torch_threads!r}, expected an integer >= 0"),
            (int(self.unlabelled_batch) >= 0, f"unlabelled_batch {self.unlabelled_batch!r}, expected >= 0"),
            (0.0 <= self.dropout < 1.0, f"dropout {self.dropout!r}, expected a value in [0, 1)"),
            (self.lr > 0, f"lr {self.lr!r}, expected > 0"),
            (self.neighbour_temperature > 0,
             f"neighbour_temperature {self.neighbour_temperature!r}, expected > 0"),
            (self.pseudo_weight >= 0, f"pseudo_weight {self.pseudo_weight!r}, expected >= 0"),
            (0.0 < self.threshold <= 1.0, f"threshold {self.threshold!r}, expected a value in (0, 1]"),
            (not (self.pseudo_labels and self.mode != "bank"), "pseudo_labels need mode 'bank'"),
            (self.pseudo_selection in PSEUDO_SELECTIONS,
             f"pseudo_selection {self.pseudo_selection!r}, expected one of {PSEUDO_SELECTIONS}"),
            (0.0 <= self.pseudo_fraction <= 1.0, f"pseudo_fraction {self.pseudo_fraction!r}, expected a value in [0, 1]"),
            (0.0 <= self.pseudo_alpha < 1.0, f"pseudo_alpha {self.pseudo_alpha!r}, expected a value in [0, 1)"),
            (int(self.pseudo_warmup) >= 0, f"pseudo_warmup {self.pseudo_warmup!r}, expected an integer >= 0"),
            (int(self.pseudo_ramp) >= 0, f"pseudo_ramp {self.pseudo_ramp!r}, expected an integer >= 0"),
            (self.pseudo_temperature > 0, f"pseudo_temperature {self.pseudo_temperature!r}, expected > 0"),
            (0.0 <= self.pseudo_correct_alpha < 1.0,
             f"pseudo_correct_alpha {self.pseudo_correct_alpha!r}, expected a value in [0, 1)"),
            (self.pseudo_correct_scale >= 0,
             f"pseudo_correct_scale {self.pseudo_correct_scale!r}, expected >= 0 (0: autoscale)"),
            (self.pseudo_teacher in PSEUDO_TEACHERS,
             f"pseudo_teacher {self.pseudo_teacher!r}, expected one of {PSEUDO_TEACHERS}"),
            (int(self.teacher_epochs) >= 1, f"teacher_epochs {self.teacher_epochs!r}, expected an integer >= 1"),
            (int(self.propagation_steps) >= 0,
             f"propagation_steps {self.propagation_steps!r}, expected an integer >= 0"),
            (int(self.graph_warmup) >= 0, f"graph_warmup {self.graph_warmup!r}, expected an integer >= 0"),
            (self.maker_refresh in MAKER_REFRESH, f"maker_refresh {self.maker_refresh!r}, expected one of {MAKER_REFRESH}"),
            (self.refresh_threshold >= 0, f"refresh_threshold {self.refresh_threshold!r}, expected >= 0"),
            (0.0 < self.sweep_fraction <= 1.0, f"sweep_fraction {self.sweep_fraction!r}, expected a value in (0, 1]"),
            (int(self.audit_nodes) >= 0, f"audit_nodes {self.audit_nodes!r}, expected an integer >= 0"),
        )
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"semi-supervised config: {msg}")

    def to_json(self) -> dict[str, Any]:
        """The settings as a JSON-able dict."""
        d = dataclasses.asdict(self)
        d["hidden"] = list(self.hidden)
        return d


def expand_neighbour_rows(
    slot_keys: np.ndarray, row_keys: np.ndarray, rows: np.ndarray, found: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Spread rows looked up once per unique key back onto ``[B, K]`` neighbour slots.

    Parameters
    ----------
    slot_keys
        ``int64[B, K]`` neighbour ids, ``-1`` for empty slots.
    row_keys
        ``int64[u]`` the sorted unique keys that were looked up.
    rows
        ``[u, ...]`` the looked-up values, aligned with ``row_keys``.
    found
        ``bool[u]`` whether the bank held each key.

    Returns
    -------
    values, present
        ``[B, K, ...]`` values (zeros where absent) and ``bool[B, K]`` slots with a found row.
    """
    if rows.shape[0] != row_keys.shape[0] or found.shape != row_keys.shape:
        raise InvalidShapeError(
            f"neighbour rows: {rows.shape[0]} rows and {found.shape} found flags for {row_keys.shape[0]} keys"
        )
    valid = slot_keys >= 0
    if len(row_keys):
        # a position map over the key range (O(B*K), no search); keys outside it are misses
        top = int(row_keys[-1])
        pos_map = np.zeros(top + 1, dtype=np.int64)
        pos_map[row_keys] = np.arange(len(row_keys))
        inside = valid & (slot_keys <= top)
        pos = pos_map[np.where(inside, slot_keys, 0)]
        present = inside & (row_keys[pos] == slot_keys) & found[pos]
        values = rows[pos]  # a fresh copy: absent slots are zeroed in place
        values[~present] = 0
    else:
        present = np.zeros(slot_keys.shape, dtype=bool)
        values = np.zeros((*slot_keys.shape, *rows.shape[1:]), dtype=rows.dtype)
    return values, present


class NodeClassifierCore:
    """Trains an :class:`MLP` on a :class:`PlanetoidGraph` one step at a time.

    Parameters
    ----------
    graph
        The data set.
    config
        Hyper-parameters.
    """

    def __init__(self, graph: PlanetoidGraph, config: SemiSupervisedConfig) -> None:
        self.graph = graph
        self.config = config
        torch.manual_seed(config.seed)
        self.rng = np.random.default_rng(config.seed)
        self.model = MLP(graph.n_features, graph.n_classes, config.hidden, config.dropout)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.x = torch.from_numpy(graph.features)
        self.y = torch.from_numpy(graph.labels)
        self.table: NeighbourTable = build_neighbour_table(graph.adjacency_lists(), config.k, config.neighbour_seed)
        self.unlabelled = graph.unlabelled()
        self.step_count = 0
        self.best_val = -1.0
        self.best_step = 0
        self.best_state: dict[str, torch.Tensor] = copy.deepcopy(self.model.state_dict())

    def sample_batch(self) -> np.ndarray:
        """All labelled-train nodes first, then ``unlabelled_batch`` random other nodes."""
        n = min(self.config.unlabelled_batch, len(self.unlabelled))
        extra = self.rng.choice(self.unlabelled, size=n, replace=False) if n else np.zeros(0, dtype=np.int64)
        return np.concatenate([self.graph.train, extra]).astype(np.int64)

    def neighbour_keys(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(slot_keys[B, K], weights[B, K], unique_keys[u])`` of a batch's neighbours."""
        keys, weights = self.table.gather(batch)
        seen = np.zeros(self.graph.n_nodes, dtype=bool)  # O(B*K) marking instead of a sort
        seen[keys[keys >= 0]] = True
        return keys, weights, np.flatnonzero(seen).astype(np.int64)

    def train_step(
        self,
        batch: np.ndarray,
        neighbour_logits: np.ndarray | None = None,
        neighbour_present: np.ndarray | None = None,
        pseudo_labels: np.ndarray | None = None,
        pseudo_confidence: np.ndarray | None = None,
        neighbour_weights: np.ndarray | None = None,
        pseudo_targets: np.ndarray | None = None,
    ) -> dict[str, float]:
        """Run one optimizer step on ``batch`` and return its loss terms.

        In ``bank`` mode, ``neighbour_logits[B, K, C]`` and ``neighbour_present[B, K]`` must be given;
        ``pseudo_labels[B]`` (``-1`` = none) and ``pseudo_confidence[B]`` add the pseudo-label term.
        ``neighbour_weights[B, K]`` are the batch's slot weights when the caller gathered them
        already (:meth:`neighbour_keys`), else they are gathered here. With ``pseudo_targets[B, C]``
        (soft targets) the pseudo-label term is the cross-entropy against them, each row weighted by
        its confidence (``pseudo_confidence_weight``) or by 1 where its confidence is above 0.
        Before ``graph_warmup`` steps the graph term is left out.
        """
        cfg = self.config
        n_train = len(self.graph.train)
        self.model.train()
        logits = self.model(self.x[batch])
        ce = F.cross_entropy(logits[:n_train], self.y[batch[:n_train]])
        loss = ce
        out = {"ce": float(ce.detach())}
        if cfg.mode != "base" and self.step_count >= cfg.graph_warmup:
            if cfg.mode == "in-graph":
                keys, weights = self.table.gather(batch)
                w = torch.from_numpy(weights)
                nb = self.model(self.x[keys.clip(min=0).reshape(-1)]).reshape(len(batch), cfg.k, -1)
            else:
                weights = self.table.weights[batch] if neighbour_weights is None else neighbour_weights
                w = torch.from_numpy(weights)
                if neighbour_logits is None or neighbour_present is None:
                    raise ConfigError("train_step: bank mode needs neighbour_logits and neighbour_present")
                if neighbour_logits.shape[:2] != weights.shape or neighbour_present.shape != weights.shape:
                    raise InvalidShapeError(
                        f"train_step: neighbour_logits {neighbour_logits.shape} and neighbour_present "
                        f"{neighbour_present.shape}, expected {(*weights.shape, logits.shape[1])} and {weights.shape}"
                    )
                nb = torch.from_numpy(np.ascontiguousarray(neighbour_logits, dtype=np.float32))
                w = w * torch.from_numpy(neighbour_present.astype(np.float32))
            if cfg.neighbour_temperature != 1.0:
                nb = nb / cfg.neighbour_temperature
            g = graph_regularization(logits, nb, w, cfg.distance)
            loss = loss + cfg.graph_weight * g
            out["graph"] = float(g.detach())
        if pseudo_labels is not None and pseudo_confidence is not None:
            pl = torch.from_numpy(np.asarray(pseudo_labels, dtype=np.int64)).clone()
            pl[:n_train] = -1  # true labels win on labelled nodes
            conf = torch.from_numpy(np.asarray(pseudo_confidence, dtype=np.float32)).clone()
            if pseudo_targets is not None:
                conf[:n_train] = 0.0
                w = conf if cfg.pseudo_confidence_weight else (conf > 0).float()
                p = soft_target_loss(logits, torch.from_numpy(np.asarray(pseudo_targets, dtype=np.float32)), w)
            else:
                p = pseudo_label_loss(logits, pl, conf)
            loss = loss + float(cfg.pseudo_weight or 0.0) * p
            out["pseudo"] = float(p.detach())
            out["pseudo_used"] = float((pl >= 0).sum())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.step_count += 1
        out["loss"] = float(loss.detach())
        return out

    @torch.no_grad()
    def predict_logits(self) -> np.ndarray:
        """Logits of every node with the current weights (evaluation mode)."""
        self.model.eval()
        return self.model(self.x).numpy()

    def evaluate(self) -> dict[str, float]:
        """Validation and test accuracy now; keeps the weights with the best validation accuracy."""
        pred = self.predict_logits().argmax(1)
        labels = self.graph.labels
        train = float((pred[self.graph.train] == labels[self.graph.train]).mean())
        val = float((pred[self.graph.val] == labels[self.graph.val]).mean())
        test = float((pred[self.graph.test] == labels[self.graph.test]).mean())
        if val > self.best_val:
            self.best_val, self.best_step = val, self.step_count
            self.best_state = copy.deepcopy(self.model.state_dict())
        return {"train_acc": train, "val_acc": val, "test_acc": test}

    def training_state(self) -> dict[str, Any]:
        """What the next steps depend on besides the weights: the batch generator and the best model so far."""
        return {"rng": self.rng.bit_generator.state, "step_count": self.step_count, "best_val": self.best_val,
                "best_step": self.best_step, "best_state": copy.deepcopy(self.best_state)}

    def load_training_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`training_state`."""
        self.rng.bit_generator.state = state["rng"]
        self.step_count = int(state["step_count"])
        self.best_val = float(state["best_val"])
        self.best_step = int(state["best_step"])
        self.best_state = state["best_state"]

    def best_test_accuracy(self) -> float:
        """Test accuracy of the weights that had the best validation accuracy."""
        current = copy.deepcopy(self.model.state_dict())
        self.model.load_state_dict(self.best_state)
        pred = self.predict_logits().argmax(1)
        self.model.load_state_dict(current)
        t = self.graph.test
        return float((pred[t] == self.graph.labels[t]).mean())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A detached copy of the model weights (what is published to makers)."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
