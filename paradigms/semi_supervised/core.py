"""The trainer's pure core: one model, one optimizer, one step at a time; no Dask, no bank.

The three variants differ only in where neighbour outputs come from:

* ``base``: no graph term;
* ``in-graph``: a forward pass over every neighbour slot inside the step (NSL style, cost grows with K);
* ``bank``: the caller passes neighbour logits it looked up (one batched lookup, cost nearly flat in K).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from carls_dask.errors import ConfigError, InvalidShapeError
from carls_dask.paradigms.data.planetoid import PlanetoidGraph
from carls_dask.paradigms.semi_supervised.loss import (
    graph_regularization,
    pseudo_label_loss,
    soft_target_loss,
)
from carls_dask.paradigms.semi_supervised.models import MLP
from carls_dask.paradigms.semi_supervised.neighbours import NeighbourTable, build_neighbour_table
from carls_dask.paradigms.semi_supervised.settings import SemiSupervisedSettings

__all__ = ["NodeClassifierCore", "expand_neighbour_rows"]


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

    def __init__(self, graph: PlanetoidGraph, config: SemiSupervisedSettings) -> None:
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
        its confidence (``pseudo.confidence_weight``) or by 1 where its confidence is above 0.
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
                w = conf if cfg.pseudo.confidence_weight else (conf > 0).float()
                p = soft_target_loss(logits, torch.from_numpy(np.asarray(pseudo_targets, dtype=np.float32)), w)
            else:
                p = pseudo_label_loss(logits, pl, conf)
            loss = loss + float(cfg.pseudo.weight or 0.0) * p
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
