"""The curriculum's trainer and knowledge maker.

- :class:`DifficultyMaker` loads the newest model version and scores every training example:
  ``difficulty`` (the pluggable scorer against the given label), ``pseudo_label`` and ``confidence``
  (the prediction), ``disagree_rounds`` (consecutive rounds rejecting the given label at high
  confidence) and ``clean_difficulty`` (the score against the label a cleaning trainer uses). Rows
  are written with the version's ``model_step`` and the maker's name as provenance.
- :class:`CurriculumTrainer` trains on batches from a :class:`~carls_dask.paradigms.curriculum.sampler.CurriculumSampler`
  fed with the bank's current scores; with cleaning on, flagged examples are relabelled or down-weighted.
  It reports the planned pacing, the admitted fraction and the realised sampling every step, and
  the clean test accuracy from :meth:`CurriculumTrainer.evaluate`.

Both work without a bank too (the trainer then samples uniformly: the baseline). Both are
restart-safe: the trainer's :meth:`~CurriculumTrainer.state` carries everything its later steps
read, and the maker keeps nothing between rounds that the bank does not hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from carls_dask.errors import ConfigError
from carls_dask.paradigms.curriculum.augment import epoch_of
from carls_dask.paradigms.curriculum.cleaning import clean_targets, detection_quality
from carls_dask.paradigms.curriculum.feed import CurriculumFeed, LoadingOptions
from carls_dask.paradigms.curriculum.models import make_model
from carls_dask.paradigms.curriculum.sampler import CurriculumSampler
from carls_dask.paradigms.curriculum.scoring import get_scorer
from carls_dask.paradigms.curriculum.settings import CurriculumSettings
from carls_dask.paradigms.curriculum.tables import BANK_COLUMNS, TABLE
from carls_dask.runtime.channel import ModelVersion
from carls_dask.runtime.context import LoopContext
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.trainer import Trainer
from carls_dask.storage.runfolder import (
    FLAG_PRECISION,
    FLAG_RECALL,
    FLAGGED_FRACTION,
    PL_COVERAGE,
    PL_PRECISION,
    SCORED_FRACTION,
)

__all__ = ["CurriculumTrainer", "DifficultyMaker", "evaluate"]

def _prepare(settings: CurriculumSettings, ctx: LoopContext, name: str) -> tuple[CurriculumFeed, Any]:
    """Set the worker's torch threads, open the loop's data feed and pick its device (trainer and maker alike)."""
    import torch

    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    options = LoadingOptions.from_config(ctx.config) if settings.shared_loading != "off" else None
    return CurriculumFeed(settings, name, options), torch.device(ctx.device)


def _logits(model: Any, x: Any, batch: int = 4096) -> np.ndarray:
    import torch

    model.eval()
    outs = []
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            outs.append(model(x[i:i + batch]).cpu().numpy())
    model.train()
    return np.concatenate(outs).astype(np.float32)


def evaluate(model: Any, x: Any, y: np.ndarray) -> float:
    """Accuracy of ``model`` on images ``x`` (a tensor) against labels ``y``."""
    return float((_logits(model, x).argmax(axis=1) == y).mean())


class CurriculumTrainer(Trainer):
    """Trains the classifier on paced, optionally cleaned batches; see the module docstring.

    Parameters
    ----------
    settings
        The run's :class:`~carls_dask.paradigms.curriculum.settings.CurriculumSettings`; its ``steps`` and
        ``publish_every`` set the loop's.
    name
        Loop name.
    """

    def __init__(self, settings: CurriculumSettings, name: str = "trainer") -> None:
        super().__init__(name, max_steps=settings.steps, publish_every=settings.publish_every,
                         eval_every=settings.eval_every or None)
        self.settings = settings

    def setup(self, ctx: LoopContext) -> None:
        import torch

        s = self.settings
        self.feed, self.device = _prepare(s, ctx, self.name)
        data = self.feed.data
        self.x_base = torch.from_numpy(data.images.x_train).to(self.device)
        self.x = self.x_base
        self.epoch: int | None = None
        self.x_test = torch.from_numpy(data.images.x_test).to(self.device)
        self.y_test = data.images.y_test
        self.x_val = None if data.x_val is None else torch.from_numpy(data.x_val).to(self.device)
        self.val = data.val
        self.given = data.labels.labels
        self.noisy = data.labels.flipped
        self.clean = data.labels.clean
        self.keys = np.arange(self.given.shape[0], dtype=np.int64)
        self.targets = torch.from_numpy(self.given.copy()).to(self.device)
        self.weights = torch.ones(self.given.shape[0], device=self.device)
        self.model = make_model(s, data.images.image_shape, data.images.n_classes).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
        pacing = s.make_pacing()
        self.sampler = CurriculumSampler(int(self.given.shape[0]), s.batch_size, pacing, seed=s.seed)
        self.rule = s.rule()
        self.use_bank = ctx.bank is not None and s.uses_bank
        self.knowledge: dict[str, float] = {}
        self.history: list[dict[str, float]] = []

    def refresh(self, step: int) -> None:
        """Read every example's newest scores from the bank and hand them to the sampler and the loss."""
        import torch

        assert self.ctx is not None
        got = self.ctx.the_bank.lookup(TABLE, self.keys, columns=list(BANK_COLUMNS))
        found = np.asarray(got.found, dtype=bool)
        if not found.any():
            self.knowledge = {SCORED_FRACTION: 0.0}
            return
        v = got.values
        flagged = found & self.rule.flagged(v["disagree_rounds"])
        score = v["clean_difficulty"] if self.settings.clean != "none" else v["difficulty"]
        self.sampler.set_difficulty(np.where(found, score, np.nan))
        labels, weights = clean_targets(self.given, v["pseudo_label"], flagged, self.settings.clean,
                                        self.settings.flagged_weight)
        self.sampler.set_excluded(weights == 0)
        if self.settings.balanced:
            self.sampler.set_groups(labels)
        # the share of the labels in use (less the excluded) that the newest model rejects
        used = found & (weights > 0)
        noise_estimate = float((v["pseudo_label"][used] != labels[used]).mean()) if used.any() else 0.0
        if self.settings.noise_limit:
            self.sampler.set_limit(max(1.0 - noise_estimate, 0.05))
        self.targets = torch.from_numpy(labels).to(self.device)
        self.weights = torch.from_numpy(weights).to(self.device)
        q = detection_quality(flagged, self.noisy)
        steps_behind = step - np.asarray(got.model_step)[found]
        self.knowledge = {
            SCORED_FRACTION: float(found.mean()),
            FLAGGED_FRACTION: q["flagged_fraction"],
            FLAG_PRECISION: q["precision"],
            FLAG_RECALL: q["recall"],
            "label_accuracy": float((labels == self.clean).mean()),
            "noise_estimate": noise_estimate,
            "scores_steps_behind": float(steps_behind.mean()),
            "scores_age_s": float(np.nanmean(np.asarray(got.age)[found])),
        }

    def step(self, step: int) -> Mapping[str, float]:
        import torch

        if self.use_bank and step % self.settings.refresh_every == 0:
            self.refresh(step)
        self.sampler.set_step(step)
        if self.settings.lr_schedule == "cosine":
            lr = 0.5 * self.settings.lr * (1.0 + np.cos(np.pi * min(step, self.settings.steps) / self.settings.steps))
            for group in self.optimizer.param_groups:
                group["lr"] = float(lr)
        idx = torch.from_numpy(self.sampler.next_batch()).to(self.device)
        batch = self.batch(step, idx)
        logits = self.model(batch)
        per = torch.nn.functional.cross_entropy(logits, self.targets[idx], reduction="none")
        w = self.weights[idx]
        loss = (per * w).sum() / w.sum().clamp_min(1e-6)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": float(loss.detach()), **self.sampler.last, **self.knowledge}

    def batch(self, step: int, idx: Any) -> Any:
        """The training images ``idx`` of the epoch ``step`` is in (augmented when the run augments)."""
        import torch

        if not self.settings.augment:
            return self.x[idx]
        e = epoch_of(step, self.settings.batch_size, self.given.shape[0])
        if e != self.epoch:
            self.x = torch.from_numpy(self.feed.images(e)).to(self.device)
            self.epoch = e
        out = self.x[idx]
        if not self.feed.intact():  # the shared epoch was overwritten: read it again, loaded separately
            self.x = torch.from_numpy(self.feed.images(e)).to(self.device)
            out = self.x[idx]
        return out

    def validation(self) -> dict[str, float]:
        """Accuracy on the held-out split against its noisy labels (``val_accuracy``, what choices are made
        on) and its true ones (``val_accuracy_clean``, for reports); empty without a holdout."""
        if self.x_val is None or self.val is None:
            return {}
        pred = _logits(self.model, self.x_val).argmax(axis=1)
        return {"val_accuracy": float((pred == self.val.labels).mean()),
                "val_accuracy_clean": float((pred == self.val.clean).mean())}

    def evaluate(self) -> Mapping[str, float]:
        """Clean test accuracy of the current weights (also kept in :attr:`history`), and the validation figures."""
        accuracy = evaluate(self.model, self.x_test, self.y_test)
        out = {"test_accuracy": accuracy, **self.validation()}
        self.history.append({"step": float(self.start_step), **out})
        return out

    def state(self) -> dict[str, Any]:
        """The base checkpoint plus the sampler, the training targets and weights, the knowledge and history.

        Targets and weights change only when the bank is read (every ``refresh_every`` steps), so a
        trainer continued from a checkpoint between two reads needs them to take the same steps.
        """
        out = super().state()
        out["sampler"] = self.sampler.state_dict()
        out["targets"] = self.targets.detach().cpu().clone()
        out["weights"] = self.weights.detach().cpu().clone()
        out["knowledge"] = dict(self.knowledge)
        out["history"] = [dict(h) for h in self.history]
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state` checkpoint."""
        super().load_state(state)
        if "sampler" in state:
            self.sampler.load_state_dict(dict(state["sampler"]))
        if "targets" in state:
            self.targets = state["targets"].to(self.device)
        if "weights" in state:
            self.weights = state["weights"].to(self.device)
        self.knowledge = {str(k): float(v) for k, v in dict(state.get("knowledge", {})).items()}
        self.history = [dict(h) for h in state.get("history", [])]

    def finish(self) -> dict[str, Any]:
        """The final clean test and train accuracy (on the images before augmentation), the newest knowledge
        figures, the evaluation history, the CPU seconds the trainer spent loading data (``loading_cpu_s``) and how
        it loaded them (``loading``: see :attr:`~carls_dask.paradigms.curriculum.feed.CurriculumFeed.mode`)."""
        return {"test_accuracy": evaluate(self.model, self.x_test, self.y_test), **self.validation(),
                "train_accuracy_clean": float((_logits(self.model, self.x_base).argmax(axis=1) == self.clean).mean()),
                **self.knowledge, "history": self.history, "loading_cpu_s": self.feed.cpu_seconds,
                "loading": self.feed.mode}

    def teardown(self) -> None:
        """Leave the shared loader (closing it when this loop created it)."""
        feed = getattr(self, "feed", None)
        if feed is not None:
            feed.close()


class DifficultyMaker(KnowledgeMaker):
    """Scores every training example with the newest model and writes the scores to the bank.

    Restart-safe: each round reads the count of consecutive disagreeing rounds from the bank, so a
    maker run again after its worker died (or in a resumed run) continues the count.

    Parameters
    ----------
    settings
        The run's settings (data, scorer, cleaning rule).
    name, source, max_rounds, final_pass
        See :class:`~carls_dask.runtime.maker.KnowledgeMaker`.
    part, parts
        This maker scores the examples whose index ``% parts == part``, so ``parts`` makers share the
        data set between them.
    """

    def __init__(self, settings: CurriculumSettings, name: str = "maker", *, source: str | None = None,
                 max_rounds: int | None = None, final_pass: bool = True, part: int = 0, parts: int = 1) -> None:
        super().__init__(name, source=source, max_rounds=max_rounds, final_pass=final_pass)
        if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1 or not 0 <= part < parts:
            raise ConfigError(f"DifficultyMaker {name!r}: part={part!r}, parts={parts!r}; expected 0 <= part < parts")
        self.part = part
        self.parts = parts
        self.settings = settings
        self.rounds = 0

    def setup(self, ctx: LoopContext) -> None:
        import torch

        s = self.settings
        self.feed, self.device = _prepare(s, ctx, self.name)
        data = self.feed.data
        self.n = int(data.labels.labels.shape[0])
        self.keys = np.arange(self.n, dtype=np.int64)[self.part::self.parts]
        self.rows = slice(self.part, None, self.parts)
        self.x = None if s.augment else torch.from_numpy(np.ascontiguousarray(data.images.x_train[self.rows])).to(self.device)
        self.given = data.labels.labels[self.keys]
        self.clean = data.labels.clean[self.keys]
        self.noisy = data.labels.flipped[self.keys]
        self.model = make_model(s, data.images.image_shape, data.images.n_classes).to(self.device)
        self.scorer = get_scorer(s.scorer)
        self.rule = s.rule()

    def load_model(self, state: Mapping[str, Any], version: ModelVersion) -> None:
        self.model.load_state_dict(state)

    def images(self, version: ModelVersion) -> Any:
        """This maker's part of the training images, of the epoch of ``version`` when the run augments."""
        import torch

        if self.x is not None:
            return self.x
        e = epoch_of(int(version.step), self.settings.batch_size, self.n)
        return torch.from_numpy(self.feed.images(e, self.rows)).to(self.device)

    def score(self, previous_rounds: np.ndarray, x: Any = None) -> dict[str, np.ndarray]:
        """The bank columns for every example of this maker's part (images ``x``, default the un-augmented
        ones) with the loaded model (pure given the model)."""
        if x is None:
            x = self.x if self.x is not None else self.feed.data.images.x_train[self.rows]
        logits = _logits(self.model, x)
        z = logits - logits.max(axis=1, keepdims=True)
        prob = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        pred = prob.argmax(axis=1).astype(np.int64)
        conf = prob.max(axis=1).astype(np.float32)
        rounds = self.rule.disagree_rounds(self.given, pred, conf, previous_rounds)
        flagged = self.rule.flagged(rounds)
        used = np.where(flagged, pred, self.given)
        return {"difficulty": self.scorer(logits, self.given), "clean_difficulty": self.scorer(logits, used),
                "pseudo_label": pred, "confidence": conf, "disagree_rounds": rounds}

    def make(self, version: ModelVersion) -> Mapping[str, float]:
        assert self.ctx is not None
        bank = self.ctx.bank
        if bank is None:
            previous = np.zeros(self.keys.shape[0], dtype=np.int64)
        else:
            got = bank.lookup(TABLE, self.keys, columns=["disagree_rounds"])
            previous = np.where(got.found, got.values["disagree_rounds"], 0)
        x = self.images(version)
        cols = self.score(previous, x)
        if not self.feed.intact():  # the shared epoch was overwritten while scoring: score it again
            cols = self.score(previous, self.images(version))
        self.feed.release()
        if bank is not None:
            bank.update(TABLE, self.keys, cols, model_step=int(version.step), maker=self.name)
        self.rounds += 1
        flagged = self.rule.flagged(cols["disagree_rounds"])
        q = detection_quality(flagged, self.noisy)
        pred = cols["pseudo_label"]
        relabel_ok = float((pred[flagged] == self.clean[flagged]).mean()) if flagged.any() else float("nan")
        return {
            "train_accuracy_clean": float((pred == self.clean).mean()),
            "mean_difficulty": float(np.mean(cols["difficulty"])),
            FLAG_PRECISION: q["precision"], FLAG_RECALL: q["recall"],
            FLAGGED_FRACTION: q["flagged_fraction"],
            PL_PRECISION: relabel_ok, PL_COVERAGE: q["flagged_fraction"],
        }

    def finish(self) -> dict[str, Any]:
        """Rounds made by this run of the maker, the CPU seconds it spent loading data (``loading_cpu_s``) and how
        it loaded them (``loading``)."""
        return {"rounds": self.rounds, "loading_cpu_s": self.feed.cpu_seconds, "loading": self.feed.mode}

    def teardown(self) -> None:
        """Leave the shared loader (closing it when this loop created it)."""
        feed = getattr(self, "feed", None)
        if feed is not None:
            feed.close()
