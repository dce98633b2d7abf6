"""The bank-backed trainer and its two knowledge makers, as runtime loops.

- :class:`GraphTrainer` trains the MLP. In ``bank`` mode each step looks up the logits of its
  batch's neighbours (the maker's newest outputs, for every node, test nodes included) in ONE
  batched bank call over the unique neighbour ids, with their age; with pseudo labels on, a second
  lookup reads the pseudo labels of the batch's unlabelled nodes. ``base`` and ``in-graph`` modes
  use no bank (they are the baselines).
- :class:`NeighbourMaker` loads the newest published model and writes the embedding and logits of
  every node to the ``nodes`` table, with ``model_step`` and its name as provenance.
- :class:`PseudoLabelMaker` labels the unlabelled nodes whose confidence passes the threshold,
  writes label + confidence to the ``pseudo_labels`` table (and deletes labels that no longer
  pass), and reports precision and coverage against held-out truth that training never sees.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from carls_dask.errors import ConfigError
from carls_dask.paradigms.semi_supervised.core import NodeClassifierCore, expand_neighbour_rows
from carls_dask.paradigms.semi_supervised.data import load_data
from carls_dask.paradigms.semi_supervised.pseudo_labels import (
    PseudoLabels,
    correct_probabilities,
    normalized_adjacency,
    propagate_labels,
    pseudo_label_quality,
    select_balanced_pseudo_labels,
    select_pseudo_labels,
    soft_pseudo_labels,
)
from carls_dask.paradigms.semi_supervised.settings import SemiSupervisedSettings
from carls_dask.paradigms.semi_supervised.tables import NODES_TABLE, PSEUDO_TABLE
from carls_dask.runtime.channel import ModelVersion
from carls_dask.runtime.context import LoopContext
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.trainer import Trainer
from carls_dask.storage.runfolder import PL_COUNT, PL_COVERAGE, PL_PRECISION

__all__ = ["GraphTrainer", "NeighbourMaker", "PseudoLabelMaker"]

logger = logging.getLogger(__name__)


def _limit_threads(n: int) -> None:
    import torch

    if n > 0:
        torch.set_num_threads(n)


def _hist_quantile(hist: np.ndarray, q: float) -> float:
    """The ``q`` quantile of the values whose counts ``hist`` holds (NaN when empty)."""
    total = int(hist.sum())
    if total == 0:
        return float("nan")
    return float(np.searchsorted(np.cumsum(hist), q * total))


class GraphTrainer(Trainer):
    """Trains the MLP with the graph term (and pseudo labels) from the bank, or a baseline.

    Parameters
    ----------
    name
        Loop name (also its model channel's name).
    config
        The run's :class:`SemiSupervisedSettings`; ``config.steps`` is the step budget.
    data_dir
        Data folder (see :func:`~carls_dask.paradigms.data.planetoid.find_data_dir`); resolved on the worker.
    publish_every
        Steps between published model versions (``carls.runtime.publish-every`` when ``None``).
    torch_threads
        Intra-op threads torch may use in the loop (0 leaves torch's default).
    """

    def __init__(self, name: str = "trainer", config: SemiSupervisedSettings | None = None, *,
                 data_dir: str | os.PathLike[str] | None = None, publish_every: int | None = None,
                 torch_threads: int | None = None) -> None:
        self.config = config or SemiSupervisedSettings()
        super().__init__(name, max_steps=self.config.steps,
                         publish_every=self.config.publish_every if publish_every is None else publish_every,
                         keep_state=False, eval_every=self.config.eval_every)
        folder = data_dir if data_dir is not None else self.config.data_dir
        self.data_dir = None if folder is None else str(folder)
        self.torch_threads = int(self.config.torch_threads if torch_threads is None else torch_threads)

    def setup(self, ctx: LoopContext) -> None:
        _limit_threads(self.torch_threads)
        if self.config.mode == "bank" and ctx.bank is None:
            raise ConfigError(f"trainer {self.name!r}: mode 'bank' needs a Workbench bank (wb.create_bank first)")
        self.graph = load_data(self.config, self.data_dir)
        self.core = NodeClassifierCore(self.graph, self.config)
        self.model = self.core.model
        self.optimizer = self.core.optimizer
        self.bank = ctx.bank if self.config.mode == "bank" else None
        self.step_seconds = 0.0
        self.timed_steps = 0
        self.lookups = 0
        self.lookup_seconds = 0.0
        self.age_sum = 0.0
        self.age_n = 0
        self.last_eval: dict[str, float] = {}
        #: Histogram of the lag (trainer step minus the row's model step) of the neighbour rows read.
        self.lag_hist = np.zeros(0, dtype=np.int64)
        #: L2 gaps between the bank's logits and the current model's, on the audit nodes, per evaluation.
        self.gaps: list[float] = []
        n_audit = min(int(self.config.audit_nodes), self.graph.n_nodes) if self.bank is not None else 0
        self.audit = np.sort(np.random.default_rng(12345).choice(self.graph.n_nodes, n_audit, replace=False))

    def _note_lag(self, step: int, model_step: np.ndarray) -> None:
        lag = np.clip(step - model_step, 0, None)
        counts = np.bincount(lag, minlength=self.lag_hist.size)
        if counts.size > self.lag_hist.size:
            counts[: self.lag_hist.size] += self.lag_hist
            self.lag_hist = counts
        else:
            self.lag_hist += counts

    def _audit(self) -> None:
        """Record how far the bank's logits of the audit nodes are from the current model's (L2 per node)."""
        import torch

        if self.bank is None or self.audit.size == 0:
            return
        got = self.bank.lookup(NODES_TABLE, self.audit, columns=["logits"])
        found = np.asarray(got.found, dtype=bool)
        if not found.any():
            return
        model = self.core.model
        was_training = model.training
        model.eval()
        with torch.no_grad():
            fresh = model.head(model.embed(torch.from_numpy(self.graph.features[self.audit[found]]))).numpy()
        model.train(was_training)
        self.gaps.extend(np.linalg.norm(np.asarray(got.values["logits"])[found] - fresh, axis=1).tolist())

    def _bank_inputs(self, batch: np.ndarray, step: int = 0) -> dict[str, np.ndarray]:
        assert self.bank is not None
        slot_keys, weights, unique = self.core.neighbour_keys(batch)
        if len(unique):
            t0 = time.perf_counter()
            got = self.bank.lookup(NODES_TABLE, unique, columns=["logits"])
            self.lookup_seconds += time.perf_counter() - t0
            self.lookups += 1
            found = np.asarray(got.found, dtype=bool)
            rows = np.asarray(got.values["logits"])
            if found.any():
                self.age_sum += float(np.asarray(got.age)[found].sum())
                self.age_n += int(found.sum())
                self._note_lag(step, np.asarray(got.model_step, dtype=np.int64)[found])
        else:  # a batch of isolated nodes (CiteSeer has some): nothing to look up
            found = np.zeros(0, dtype=bool)
            rows = np.zeros((0, self.graph.n_classes), dtype=np.float32)
        logits, present = expand_neighbour_rows(slot_keys, unique, rows, found)
        out = {"neighbour_logits": logits, "neighbour_present": present, "neighbour_weights": weights}
        self.last_slots = int((slot_keys >= 0).sum())
        if self.config.pseudo_labels:
            n_train = len(self.graph.train)
            rest = batch[n_train:]
            soft = self.config.pseudo.selection == "soft"
            labels = np.full(len(batch), -1, dtype=np.int64)
            conf = np.zeros(len(batch), dtype=np.float32)
            targets = np.zeros((len(batch), self.graph.n_classes), dtype=np.float32)
            if len(rest):
                columns = ["pseudo_label", "confidence"] + (["target"] if soft else [])
                pl = self.bank.lookup(PSEUDO_TABLE, rest, columns=columns)
                ok = np.asarray(pl.found, dtype=bool)
                labels[n_train:] = np.where(ok, np.asarray(pl.values["pseudo_label"]), -1)
                conf[n_train:] = np.where(ok, np.asarray(pl.values["confidence"]), 0.0)
                if soft:
                    targets[n_train:] = np.where(ok[:, None], np.asarray(pl.values["target"]), 0.0)
            out["pseudo_labels"] = labels
            out["pseudo_confidence"] = conf
            if soft:
                out["pseudo_targets"] = targets
        return out

    def step(self, step: int) -> Mapping[str, float]:
        t0 = time.perf_counter()
        batch = self.core.sample_batch()
        inputs = self._bank_inputs(batch, step) if self.bank is not None else {}
        out = self.core.train_step(batch, **inputs)
        self.step_seconds += time.perf_counter() - t0
        self.timed_steps += 1
        if "neighbour_present" in inputs:
            out["neighbour_found"] = float(inputs["neighbour_present"].sum() / max(1, self.last_slots))
        if self.age_n:
            out["neighbour_age_s"] = self.age_sum / self.age_n
        return out

    def evaluate(self) -> Mapping[str, float]:
        """Train, validation and test accuracy of the current weights (the best-validation weights are kept)."""
        self.last_eval = self.core.evaluate()
        self._audit()
        return self.last_eval

    def state(self) -> dict[str, Any]:
        out = super().state()
        out["core"] = self.core.training_state()
        out["counters"] = {"step_seconds": self.step_seconds, "timed_steps": self.timed_steps,
                           "lookups": self.lookups, "lookup_seconds": self.lookup_seconds,
                           "age_sum": self.age_sum, "age_n": self.age_n,
                           "lag_hist": self.lag_hist.tolist(), "gaps": list(self.gaps)}
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        if "core" in state:
            self.core.load_training_state(dict(state["core"]))
        for key, value in dict(state.get("counters", {})).items():
            setattr(self, key, np.asarray(value, dtype=np.int64) if key == "lag_hist" else value)

    def finish(self) -> dict[str, Any]:
        return {
            "mode": self.config.mode,
            "k": self.config.k,
            "seed": self.config.seed,
            "pseudo_labels": self.config.pseudo_labels,
            "best_val_acc": self.core.best_val,
            "best_step": self.core.best_step,
            "test_acc": self.core.best_test_accuracy(),
            "train_steps_per_s": self.timed_steps / self.step_seconds if self.step_seconds else float("nan"),
            "steps": self.timed_steps,
            "bank_lookups": self.lookups,
            "lookup_ms": 1000 * self.lookup_seconds / self.lookups if self.lookups else float("nan"),
            "mean_neighbour_age_s": self.age_sum / self.age_n if self.age_n else float("nan"),
            "neighbour_lag_p50": _hist_quantile(self.lag_hist, 0.5),
            "neighbour_lag_p90": _hist_quantile(self.lag_hist, 0.9),
            "knowledge_gap_p50": float(np.median(self.gaps)) if self.gaps else float("nan"),
            "knowledge_gap_p90": float(np.quantile(self.gaps, 0.9)) if self.gaps else float("nan"),
        }


class _ModelMaker(KnowledgeMaker):
    """Shared set-up of the makers: the graph and an MLP of the trainer's shape."""

    def __init__(self, name: str, config: SemiSupervisedSettings | None = None, *, source: str | None = None,
                 data_dir: str | os.PathLike[str] | None = None, torch_threads: int | None = None) -> None:
        super().__init__(name, source=source)
        self.config = config or SemiSupervisedSettings()
        folder = data_dir if data_dir is not None else self.config.data_dir
        self.data_dir = None if folder is None else str(folder)
        self.torch_threads = int(self.config.torch_threads if torch_threads is None else torch_threads)

    def setup(self, ctx: LoopContext) -> None:
        import torch

        from carls_dask.paradigms.semi_supervised.models import MLP

        _limit_threads(self.torch_threads)
        if ctx.bank is None:
            raise ConfigError(f"maker {self.name!r}: needs a Workbench bank (wb.create_bank first)")
        self.graph = load_data(self.config, self.data_dir)
        self.x = torch.from_numpy(self.graph.features)
        self.keys = np.arange(self.graph.n_nodes, dtype=np.int64)
        self.model = MLP(self.graph.n_features, self.graph.n_classes, self.config.hidden, self.config.dropout)
        self.model.eval()

    def load_model(self, state: Mapping[str, Any], version: ModelVersion) -> None:
        self.model.load_state_dict(state)

    def _forward(self, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Embeddings and logits of the nodes ``rows`` (all nodes when ``None``) under the loaded model."""
        import torch

        x = self.x if rows is None else self.x[torch.from_numpy(np.asarray(rows, dtype=np.int64))]
        with torch.no_grad():
            hidden = self.model.embed(x)
            logits = self.model.head(hidden)
        return hidden.numpy().astype(np.float32), logits.numpy().astype(np.float32)


class NeighbourMaker(_ModelMaker):
    """Writes the embedding and logits of the newest model to the ``nodes`` table.

    With ``maker_refresh="full"`` every round re-scores every node. With ``"changes"`` the first round
    does, and each later round re-scores only: the nodes whose logits the bank's change feed says moved
    (beyond ``refresh_threshold``) since the maker's cursor, their graph neighbours, and the next
    ``sweep_fraction`` of all nodes in a fixed cyclic order (so every node is re-scored at least once
    every ``1 / sweep_fraction`` rounds). Each round reports ``coverage`` (share of the nodes re-scored)
    and ``feed_keys`` (keys the feed returned).
    """

    def __init__(self, name: str = "neighbour-maker", config: SemiSupervisedSettings | None = None, **kwargs: Any) -> None:
        super().__init__(name, config, **kwargs)

    def setup(self, ctx: LoopContext) -> None:
        super().setup(ctx)
        self.cursor: Any = None
        self.sweep_at = 0
        self.sweep_order = np.random.default_rng(self.config.neighbour_seed).permutation(self.graph.n_nodes)
        if self.config.maker_refresh == "changes":
            self.adjacency = normalized_adjacency(self.graph.edges, self.graph.n_nodes)
        self.scored_rows = 0
        self.rounds = 0

    def _rows_to_score(self) -> tuple[np.ndarray | None, int]:
        """The nodes this round re-scores (``None``: all) and how many keys the change feed gave."""
        if self.config.maker_refresh == "full" or self.cursor is None:
            return None, 0
        assert self.ctx is not None
        batch = self.ctx.the_bank.changes(NODES_TABLE, self.cursor, column="logits")
        self.cursor = batch.cursor
        moved = np.zeros(self.graph.n_nodes, dtype=bool)
        moved[batch.keys[(batch.keys >= 0) & (batch.keys < self.graph.n_nodes)]] = True
        near = (self.adjacency @ moved.astype(np.float32)) > 0 if self.config.refresh_neighbours else False
        n_sweep = max(1, int(np.ceil(self.config.sweep_fraction * self.graph.n_nodes)))
        sweep = np.take(self.sweep_order, np.arange(self.sweep_at, self.sweep_at + n_sweep), mode="wrap")
        self.sweep_at = (self.sweep_at + n_sweep) % self.graph.n_nodes
        chosen = moved | near
        chosen[sweep] = True
        return np.flatnonzero(chosen), int(batch.keys.size)

    def make(self, version: ModelVersion) -> Mapping[str, float]:
        assert self.ctx is not None
        rows, feed_keys = self._rows_to_score()
        keys = self.keys if rows is None else self.keys[rows]
        hidden, logits = self._forward(rows)
        self.ctx.the_bank.update(NODES_TABLE, keys, {"embedding": hidden, "logits": logits},
                             model_step=int(version.step), maker=self.name)
        if self.config.maker_refresh == "changes" and self.cursor is None:  # follow the feed from here on
            self.cursor = self.ctx.the_bank.changes(NODES_TABLE, column="logits").cursor
        self.scored_rows += int(keys.size)
        self.rounds += 1
        out = {"rows": float(keys.size)}
        if self.config.maker_refresh == "changes":
            out.update(coverage=float(keys.size / self.graph.n_nodes), feed_keys=float(feed_keys))
        if rows is None:
            pred = logits.argmax(1)
            test = self.graph.test
            out["test_acc"] = float((pred[test] == self.graph.labels[test]).mean())
        return out

    def finish(self) -> dict[str, Any]:
        return {"maker_refresh": self.config.maker_refresh, "rounds": self.rounds, "scored_rows": self.scored_rows,
                "compute_fraction": self.scored_rows / max(1, self.rounds * self.graph.n_nodes)}


class PseudoLabelMaker(_ModelMaker):
    """Writes pseudo labels of unlabelled nodes; reports their precision and coverage.

    Candidates are all nodes outside the labelled-train split. Every round re-scores all of them
    with the newest model and replaces the previous set (labels that no longer qualify are
    deleted). With ``pseudo.selection="threshold"`` a candidate qualifies when the model's
    confidence passes ``pseudo.threshold``; with ``"balanced"`` the model's probabilities are propagated
    over the graph from the labelled-train nodes (the neighbour votes) and each class takes its
    most confident candidates on which votes and model agree, up to its share of
    ``pseudo.fraction`` (growing over ``pseudo.ramp`` steps after ``pseudo.warmup``). Truth is used
    only to measure ``pl_precision`` (share of given labels that are right) and ``pl_coverage``
    (share of candidates labelled).
    """

    def __init__(self, name: str = "pseudo-labeller", config: SemiSupervisedSettings | None = None, **kwargs: Any) -> None:
        super().__init__(name, config, **kwargs)

    def setup(self, ctx: LoopContext) -> None:
        super().setup(ctx)
        self.candidates = self.graph.unlabelled()
        # the labels given so far: none in a new bank; after a restart, those the bank holds
        self.current = np.sort(np.asarray(ctx.the_bank.keys(PSEUDO_TABLE), dtype=np.int64))
        self.adjacency = normalized_adjacency(self.graph.edges, self.graph.n_nodes)
        self.teacher: np.ndarray | None = None
        self.teacher_written = False
        if self.config.pseudo.teacher == "graph":
            from carls_dask.paradigms.semi_supervised.teacher import train_graph_teacher

            g = self.graph
            self.teacher, info = train_graph_teacher(g.features, g.edges, g.train, g.labels, g.val,
                                                     self.config.graph_teacher, seed=int(self.config.seed))
            self.teacher_val_acc = float(info["val_acc"])

    def fraction_at(self, step: int) -> float:
        """Share of the candidates that may be labelled at model step ``step`` (``balanced``)."""
        cfg = self.config
        if step < cfg.pseudo.warmup:
            return 0.0
        if cfg.pseudo.ramp <= 0:
            return float(cfg.pseudo.fraction)
        return float(cfg.pseudo.fraction) * min(1.0, (step - cfg.pseudo.warmup) / cfg.pseudo.ramp)

    def choose(self, probs: np.ndarray, step: int) -> PseudoLabels:
        """The pseudo labels of the model version at ``step`` given its class probabilities."""
        cfg = self.config
        if step < cfg.pseudo.warmup:
            return PseudoLabels(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                np.zeros(0, dtype=np.float32), len(self.candidates))
        if cfg.pseudo.selection == "threshold":
            return select_pseudo_labels(probs if self.teacher is None else self.teacher, self.candidates,
                                        cfg.pseudo.threshold)
        train = self.graph.train
        if self.teacher is not None:
            votes = self.teacher
        else:
            base = probs
            if cfg.pseudo.correct_alpha > 0:
                base = correct_probabilities(probs, self.adjacency, train, self.graph.labels[train],
                                             cfg.pseudo.correct_alpha, cfg.pseudo.propagation_steps,
                                             cfg.pseudo.correct_scale)
            votes = propagate_labels(base, self.adjacency, train, self.graph.labels[train], cfg.pseudo.alpha,
                                     cfg.pseudo.propagation_steps)
        if cfg.pseudo.selection == "soft":
            return soft_pseudo_labels(votes, self.candidates, cfg.pseudo.temperature)
        return select_balanced_pseudo_labels(probs, votes, self.candidates, self.fraction_at(step),
                                             agreement=cfg.pseudo.agreement)

    def make(self, version: ModelVersion) -> Mapping[str, float]:
        import torch

        assert self.ctx is not None
        _, logits = self._forward()
        probs = torch.softmax(torch.from_numpy(logits), dim=1).numpy()
        chosen = self.choose(probs, int(version.step))
        # a graph teacher's soft targets do not change between rounds: written once, kept after
        unchanged = self.teacher_written and self.config.pseudo.selection == "soft"
        if len(chosen.keys) and not unchanged:
            self.ctx.the_bank.update(PSEUDO_TABLE, chosen.keys, {"pseudo_label": chosen.labels,
                                                             "confidence": chosen.confidence,
                                                             "target": chosen.target_rows(self.graph.n_classes)},
                                 model_step=int(version.step), maker=self.name)
        dropped = np.setdiff1d(self.current, chosen.keys)
        if len(dropped):
            self.ctx.the_bank.delete(PSEUDO_TABLE, dropped)
        self.current = chosen.keys
        self.teacher_written = self.teacher is not None and bool(len(chosen.keys))
        q = pseudo_label_quality(chosen, self.graph.labels)
        out = {PL_PRECISION: q["precision"], PL_COVERAGE: q["coverage"], PL_COUNT: q["count"],
               "pl_dropped": float(len(dropped))}
        if self.teacher is not None:
            out["teacher_val_acc"] = self.teacher_val_acc
        return out
