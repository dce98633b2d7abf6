"""Trainers and the maker of the multimodal paradigm.

- :class:`ContrastiveTrainer` trains the dual encoder on image-text pairs; besides the in-batch
  negatives it draws negatives from the bank's corpus tables (``uniform``/``log_uniform`` samples
  with expected counts for logQ correction, or each query's ``hard`` top-k), so their number is not
  bounded by the batch; by default it encodes the drawn keys' frozen features with its current model.
- :class:`CorpusMaker` loads the newest encoder version and rewrites every corpus embedding in the
  bank (``texts`` and ``images`` tables) with ``model_step`` and its name as provenance.
- :class:`ConceptClassifierTrainer` is the large-output-space use: class embeddings live in the
  bank, are allocated on first sight and trained with sampled softmax through a ``BankEmbedding`` layer.

The corpus they read is :mod:`~carls_dask.paradigms.multimodal.data`'s, their bank tables are
:mod:`~carls_dask.paradigms.multimodal.tables`' and their models :mod:`~carls_dask.paradigms.multimodal.models`'.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from carls_dask.bank import to_int64_keys
from carls_dask.errors import ConfigError
from carls_dask.paradigms.data.openmoji import cldr_concepts, load_openmoji_pairs
from carls_dask.paradigms.multimodal.data import CorpusSpec, load_corpus
from carls_dask.paradigms.multimodal.features import FEATURE_DIM, image_features
from carls_dask.paradigms.multimodal.metrics import retrieval_report
from carls_dask.paradigms.multimodal.settings import NEGATIVES
from carls_dask.paradigms.multimodal.tables import CONCEPTS, IMAGES, TEXTS, has_pretrained
from carls_dask.runtime.channel import ModelVersion
from carls_dask.runtime.context import LoopContext
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.trainer import Trainer

__all__ = ["ConceptClassifierTrainer", "ContrastiveTrainer", "CorpusMaker"]

logger = logging.getLogger(__name__)


def _set_threads(spec: CorpusSpec) -> None:
    import torch

    if spec.torch_threads is not None and torch.get_num_threads() != spec.torch_threads:
        torch.set_num_threads(spec.torch_threads)



def _check_choice(owner: str, what: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{owner}: {what}={value!r}; expected one of {allowed}")


class ContrastiveTrainer(Trainer):
    """CLIP-style dual-encoder trainer with negatives drawn from the bank.

    Parameters
    ----------
    corpus
        The corpus to train on.
    negatives
        ``"in_batch"`` (baseline), ``"uniform"``/``"log_uniform"`` (``n_negatives`` sampled keys of
        the corpus, with expected counts) or ``"hard"`` (each query's ``n_hard + 4`` top-k by the
        bank's embeddings). Bank negatives join the in-batch ones in one softmax. Negatives of the
        positive's own concept (itself and its skin-tone or gender variants) are masked out as
        false negatives.
    n_negatives, n_hard
        Sampled and hard negatives per step.
    reencode
        ``True``: the bank gives the negatives' keys (a sample, or each query's top-k by the
        maker's embeddings) and the trainer encodes their frozen image features and text ids with
        the current model, so they are fresh and carry gradients; ``False``: the bank's stored
        (stale) embeddings are used as constants.
    logq_correction
        Subtract log(expected count) from sampled negatives' logits (sampled softmax's estimate of
        the softmax over the whole corpus; only the sampled part is corrected, never the in-batch or
        hard negatives); ``False`` weighs them like in-batch negatives.
    batch_size, lr, dim, hidden, weight_decay
        Optimisation and model sizes.
    seed
        Seed of the model initialisation, batches and samples.
    bank_wait_s
        Until the maker has filled the bank the steps use in-batch negatives only; with
        ``bank_wait_s > 0`` the first step after the first published version waits up to that many
        seconds for the maker's first pass (once), so short runs use bank negatives for certain.
    name, max_steps, publish_every, eval_every
        See :class:`~carls_dask.runtime.trainer.Trainer`; :meth:`evaluate` gives the retrieval
        figures (``eval_every=None``: only :meth:`finish` evaluates, at the end).
    temperature, learn_temperature
        Initial softmax temperature, and whether it is learned.

    The text head reads the corpus's frozen MiniLM features (from the bank's ``texts.pretrained``
    when the pretrained task wrote them) or, with ``CorpusSpec.text_encoder="hashed"``, its hashed ids.
    """

    def __init__(self, corpus: CorpusSpec, *, negatives: str = "uniform", n_negatives: int = 256, n_hard: int = 8,
                 reencode: bool = True, logq_correction: bool = False, batch_size: int = 32, lr: float = 2e-3,
                 dim: int = 64, hidden: int = 128, weight_decay: float = 1e-4, seed: int = 0,
                 bank_wait_s: float = 0.0, name: str = "trainer", max_steps: int | None = 400,
                 publish_every: int | None = 20, eval_every: int | None = None, temperature: float = 0.07,
                 learn_temperature: bool = True) -> None:
        super().__init__(name, max_steps=max_steps, publish_every=publish_every, eval_every=eval_every)
        _check_choice(f"ContrastiveTrainer {name!r}", "negatives", negatives, NEGATIVES)
        for what, v in (("n_negatives", n_negatives), ("n_hard", n_hard), ("batch_size", batch_size)):
            if not isinstance(v, int) or v < (2 if what == "batch_size" else 1):
                raise ConfigError(f"ContrastiveTrainer {name!r}: {what}={v!r}; expected a positive int"
                                  + (" >= 2" if what == "batch_size" else ""))
        self.corpus_spec = corpus
        self.negatives = negatives
        self.n_negatives = n_negatives
        self.n_hard = n_hard
        self.reencode = bool(reencode)
        self.logq_correction = bool(logq_correction)
        self.batch_size = batch_size
        self.lr = lr
        self.dim = dim
        self.hidden = hidden
        self.weight_decay = weight_decay
        self.seed = seed
        self.bank_wait_s = float(bank_wait_s)
        self.temperature = float(temperature)
        self.learn_temperature = bool(learn_temperature)

    def setup(self, ctx: LoopContext) -> None:
        import torch

        from carls_dask.paradigms.multimodal.models import dual_encoder

        _set_threads(self.corpus_spec)
        torch.manual_seed(self.seed)
        self.rng = np.random.default_rng(self.seed)
        self.corpus = load_corpus(self.corpus_spec)
        keys = self.corpus.train_keys
        feats = self.corpus.features[keys]
        text = self.corpus.text_inputs[keys]
        self.use_bank = self.negatives != "in_batch"
        if ctx.bank is not None:  # the frozen features the pretrained encoders' task wrote, when it did
            got = ctx.bank.lookup(IMAGES, keys, columns=["pretrained"])
            if bool(np.all(got.found)):
                feats = got.values["pretrained"]
            if self.corpus.text_features is not None and has_pretrained(ctx.bank, TEXTS):
                got = ctx.bank.lookup(TEXTS, keys, columns=["pretrained"])
                if bool(np.all(got.found)):
                    text = got.values["pretrained"]
        elif self.use_bank:
            raise ConfigError(f"ContrastiveTrainer {self.name!r}: negatives={self.negatives!r} needs a bank; "
                              "create one with Workbench.create_bank(corpus_tables(...))")
        self.device = torch.device(ctx.device)
        self.keys = keys
        self.feats = torch.from_numpy(np.ascontiguousarray(feats)).to(self.device)
        self.ids = torch.from_numpy(np.ascontiguousarray(text)).to(self.device)
        self.model = dual_encoder(self.corpus, self.corpus_spec, self.dim, self.hidden, self.temperature,
                                  self.learn_temperature).to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        self.bank_ready = False
        self.ages: list[float] = []
        self.bank_steps = 0
        self._evaluated: tuple[int, dict[str, float]] | None = None

    def state(self) -> dict[str, Any]:
        """The base checkpoint plus what the next steps depend on: the batch generator, whether the bank
        was ready (and the one wait of ``bank_wait_s`` spent), the bank-step count and the ages seen."""
        out = super().state()
        out["rng"] = self.rng.bit_generator.state
        out["bank"] = {"ready": self.bank_ready, "steps": self.bank_steps, "ages": list(self.ages),
                       "wait_s": self.bank_wait_s}
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state` checkpoint (after :meth:`setup`)."""
        super().load_state(state)
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]
        bank = dict(state.get("bank", {}))
        self.bank_ready = bool(bank.get("ready", self.bank_ready))
        self.bank_steps = int(bank.get("steps", self.bank_steps))
        self.ages = [float(a) for a in bank.get("ages", self.ages)]
        self.bank_wait_s = float(bank.get("wait_s", self.bank_wait_s))

    def _ready(self, step: int = 0) -> bool:
        """Whether the maker has filled the corpus tables (checked until it has; see ``bank_wait_s``)."""
        assert self.ctx is not None
        every = self.publish_every or self.ctx.publish_every
        deadline = None
        if self.bank_wait_s > 0 and not self.bank_ready and step > every:
            deadline = time.monotonic() + self.bank_wait_s
            self.bank_wait_s = 0.0  # once
        while not self.bank_ready:  # the maker's embeddings are unit-norm; unwritten ones are zeros
            got = self.ctx.the_bank.lookup(TEXTS, self.keys[:1], columns=["embedding"])
            self.bank_ready = bool(got.found[0]) and bool(np.any(got.values["embedding"][0]))
            if self.bank_ready or deadline is None or time.monotonic() > deadline or self.ctx.stop.wait(0.05):
                break
        return self.bank_ready

    def _hard_negatives(self, table: str, query: Any, pos_keys: np.ndarray) -> tuple[Any, Any, float]:
        """Each query's top-k rows of ``table`` by the bank's (stale) embeddings, its positive masked."""
        import torch

        assert self.ctx is not None
        k = min(self.n_hard + 4, len(self.keys))
        hk, _ = self.ctx.the_bank.top_k(table, query.detach().cpu().numpy(), k, metric="dot")
        got = self.ctx.the_bank.lookup(table, hk.reshape(-1), columns=["embedding"])
        neg = torch.from_numpy(got.values["embedding"].reshape(*hk.shape, -1)).to(self.device)
        mask = torch.from_numpy(self._same_concept(hk, pos_keys)).to(self.device)
        return neg, mask, float(np.nanmean(got.age))

    def _same_concept(self, neg_keys: np.ndarray, pos_keys: np.ndarray) -> np.ndarray:
        """``bool``: where a negative is the positive itself or one of its variants (false negatives)."""
        concept = self.corpus.pairs.concepts
        if neg_keys.ndim == 1:
            return np.asarray(concept[neg_keys][None, :] == concept[pos_keys][:, None])
        return np.asarray(concept[neg_keys] == concept[pos_keys][:, None])

    def _rows(self, keys: np.ndarray) -> Any:
        """Positions in the trainer's feature and text-id tensors of corpus ``keys``."""
        import torch

        return torch.from_numpy(np.searchsorted(self.keys, keys)).to(self.device)

    def _fresh_hard(self, table: str, query: Any, pos_keys: np.ndarray) -> tuple[Any, Any]:
        """Each query's top-k keys of ``table`` by the bank's embeddings, encoded by the current model."""
        import torch

        assert self.ctx is not None
        k = min(self.n_hard + 4, len(self.keys))
        hk, _ = self.ctx.the_bank.top_k(table, query.detach().cpu().numpy(), k, metric="dot")
        rows = self._rows(hk.reshape(-1))
        enc = self.model.encode_text(self.ids[rows]) if table == TEXTS else self.model.encode_image(self.feats[rows])
        mask = torch.from_numpy(self._same_concept(hk, pos_keys)).to(self.device)
        return enc.reshape(*hk.shape, -1), mask

    def _fresh_sampled(self, pos_keys: np.ndarray, step: int) -> tuple[Any, Any, Any, Any]:
        """One sample of corpus keys from the bank (with expected counts), encoded by the current model."""
        import torch

        assert self.ctx is not None
        s = self.ctx.the_bank.sample_negatives(TEXTS, min(self.n_negatives, len(self.keys)), sampler=self.negatives,
                                           seed=self.seed * 1_000_003 + step)
        rows = self._rows(s.keys)
        img, txt = self.model(self.feats[rows], self.ids[rows])
        logq = (torch.from_numpy(np.log(s.expected_count).astype(np.float32)).to(self.device)
                if self.logq_correction else None)
        mask = torch.from_numpy(self._same_concept(s.keys, pos_keys)).to(self.device)
        return txt, img, logq, mask

    def _sampled_negatives(self, pos_keys: np.ndarray, step: int) -> tuple[Any, Any, Any, Any, float]:
        """One sample of corpus keys (with expected counts), looked up in both tables."""
        import torch

        assert self.ctx is not None
        bank = self.ctx.the_bank
        s = bank.sample_negatives(TEXTS, min(self.n_negatives, len(self.keys)), sampler=self.negatives,
                                  seed=self.seed * 1_000_003 + step)
        got_t = bank.lookup(TEXTS, s.keys, columns=["embedding"])
        got_i = bank.lookup(IMAGES, s.keys, columns=["embedding"])
        logq = (torch.from_numpy(np.log(s.expected_count).astype(np.float32)).to(self.device)
                if self.logq_correction else None)
        mask = torch.from_numpy(self._same_concept(s.keys, pos_keys)).to(self.device)
        age = float(np.nanmean(np.concatenate([got_t.age, got_i.age])))
        return (torch.from_numpy(got_t.values["embedding"]).to(self.device),
                torch.from_numpy(got_i.values["embedding"]).to(self.device), logq, mask, age)

    def step(self, step: int) -> Mapping[str, float]:
        import torch

        from carls_dask.paradigms.multimodal.losses import contrastive_loss

        idx = self.rng.choice(len(self.keys), size=self.batch_size, replace=False)
        img, txt = self.model(self.feats[idx], self.ids[idx])
        scale = self.model.scale
        pos = self.keys[idx]
        in_batch = torch.from_numpy(self._same_concept(pos, pos)).to(self.device)
        out: dict[str, float] = {}
        if self.use_bank and self._ready(step) and self.reencode:
            if self.negatives == "hard":
                tn, tm = self._fresh_hard(TEXTS, img, pos)
                im, imask = self._fresh_hard(IMAGES, txt, pos)
                tq = iq = None
            else:
                tn, im, tq, tm = self._fresh_sampled(pos, step)
                iq, imask = tq, tm
            loss = 0.5 * (contrastive_loss(img, txt, scale, tn, tq, tm, in_batch)
                          + contrastive_loss(txt, img, scale, im, iq, imask, in_batch))
            out["bank_negatives"] = float(tn.shape[-2] if tn.ndim == 3 else tn.shape[0])
            self.bank_steps += 1
        elif self.use_bank and self._ready():
            if self.negatives == "hard":
                tn, tm, age_t = self._hard_negatives(TEXTS, img, pos)
                im, imask, age_i = self._hard_negatives(IMAGES, txt, pos)
                tq = iq = None
                age = 0.5 * (age_t + age_i)
            else:
                tn, im, tq, tm, age = self._sampled_negatives(pos, step)
                iq, imask = tq, tm
            loss = 0.5 * (contrastive_loss(img, txt, scale, tn, tq, tm, in_batch)
                          + contrastive_loss(txt, img, scale, im, iq, imask, in_batch))
            out["bank_age_s"] = age
            out["bank_negatives"] = float(tn.shape[-2] if tn.ndim == 3 else tn.shape[0])
            self.ages.append(out["bank_age_s"])
            self.bank_steps += 1
        else:
            loss = 0.5 * (contrastive_loss(img, txt, scale, batch_mask=in_batch)
                          + contrastive_loss(txt, img, scale, batch_mask=in_batch))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        out["loss"] = float(loss.detach())
        out["temperature"] = float(1.0 / scale.detach())
        return out

    def _report(self, rows: np.ndarray) -> dict[str, float]:
        import torch

        with torch.inference_mode():
            img = self.model.encode_image(torch.from_numpy(self.corpus.features[rows]).to(self.device))
            txt = self.model.encode_text(torch.from_numpy(self.corpus.text_inputs[rows]).to(self.device))
        return retrieval_report(img.cpu().numpy(), txt.cpu().numpy())

    def evaluate(self) -> dict[str, float]:
        """Image->text and text->image recall@1/@5 among the held-out test concepts' pairs, and with a
        validation split (``CorpusSpec.n_val``) the same figures on it, prefixed ``val_``."""
        out = self._report(self.corpus.test)
        if len(self.corpus.val):
            out.update({f"val_{k}": v for k, v in self._report(self.corpus.val).items()})
        self._evaluated = (self.start_step, dict(out))
        return out

    def finish(self) -> dict[str, float]:
        """The final retrieval figures (the evaluation of the last step, reused when there was one) and
        the run's counts: held-out and train pairs, steps with bank negatives, mean bank age (NaN when none)."""
        done = self._evaluated
        out = dict(done[1]) if done is not None and done[0] == self.start_step else self.evaluate()
        out["n_test"] = float(len(self.corpus.test))
        out["n_val"] = float(len(self.corpus.val))
        out["bank_steps"] = float(self.bank_steps)
        out["n_train"] = float(len(self.keys))
        out["mean_bank_age_s"] = float(np.mean(self.ages)) if self.ages else float("nan")
        return out


class CorpusMaker(KnowledgeMaker):
    """Rewrites the bank's ``texts`` and ``images`` embeddings of the whole corpus with the newest encoder.

    Parameters
    ----------
    corpus
        The corpus (same as the trainer's).
    dim, hidden
        The trainer's model sizes.
    chunk
        Rows per bank write.
    name, source, max_rounds, final_pass
        See :class:`~carls_dask.runtime.maker.KnowledgeMaker`.
    """

    def __init__(self, corpus: CorpusSpec, *, dim: int = 64, hidden: int = 128, chunk: int = 2048,
                 name: str = "corpus-maker", source: str | None = None, max_rounds: int | None = None,
                 final_pass: bool = True) -> None:
        super().__init__(name, source=source, max_rounds=max_rounds, final_pass=final_pass)
        self.corpus_spec = corpus
        self.dim = dim
        self.hidden = hidden
        self.chunk = chunk

    def setup(self, ctx: LoopContext) -> None:
        import torch

        from carls_dask.paradigms.multimodal.models import dual_encoder

        if ctx.bank is None:
            raise ConfigError(f"CorpusMaker {self.name!r} needs a bank with the corpus tables")
        _set_threads(self.corpus_spec)
        corpus = load_corpus(self.corpus_spec)
        self.keys = corpus.train_keys
        self.device = torch.device(ctx.device)
        self.feats = torch.from_numpy(corpus.features[self.keys]).to(self.device)
        self.ids = torch.from_numpy(corpus.text_inputs[self.keys]).to(self.device)
        self.model = dual_encoder(corpus, self.corpus_spec, self.dim, self.hidden).to(self.device)
        self.previous: np.ndarray | None = None

    def load_model(self, state: Mapping[str, Any], version: ModelVersion) -> None:
        self.model.load_state_dict(state)

    def make(self, version: ModelVersion) -> Mapping[str, float]:
        import torch

        assert self.ctx is not None
        with torch.inference_mode():
            img = self.model.encode_image(self.feats).cpu().numpy()
            txt = self.model.encode_text(self.ids).cpu().numpy()
        for s in range(0, len(self.keys), self.chunk):
            k = self.keys[s:s + self.chunk]
            self.ctx.the_bank.update(TEXTS, k, {"embedding": txt[s:s + self.chunk]}, model_step=version.step,
                                 maker=self.name)
            self.ctx.the_bank.update(IMAGES, k, {"embedding": img[s:s + self.chunk]}, model_step=version.step,
                                 maker=self.name)
        drift = float("nan") if self.previous is None else float(1.0 - (txt * self.previous).sum(1).mean())
        self.previous = txt
        return {"rows": float(2 * len(self.keys)), "text_drift": drift}


class ConceptClassifierTrainer(Trainer):
    """Large output space: classify an emoji image into its concept, class embeddings held in the bank.

    The ``concepts`` table holds a row for every CLDR concept the ``emoji`` package names (1,727,
    allocated at setup), not only those with an OpenMoji image (1,718, the ones trained and tested),
    so evaluation ranks all of them. Each step looks up the batch's class embeddings with ``insert=True`` (a class is allocated the
    first time it is seen, and its frequency counted), samples ``n_sampled`` classes from the bank
    (``log_uniform`` by frequency rank, or ``uniform``), computes sampled softmax with logQ
    correction, and sends the class-embedding gradients to the bank's optimizer: all three through a
    :class:`~carls_dask.nn.BankEmbedding` over the ``concepts`` table and
    :func:`carls_dask.nn.sampled_softmax_loss`. Evaluation is a full top-k over every class in the bank.

    Parameters
    ----------
    corpus
        The corpus; every concept with two or more images keeps one image for testing.
    sampler, n_sampled
        Negative class sampler and how many classes per step (``uniform`` with ``n_sampled`` at least
        the number of classes is the full softmax: every class, expected count 1).
    all_concepts
        Allocate every CLDR concept in the bank at setup (``False``: only those seen in training).
    batch_size, lr, dim, hidden, seed
        Optimisation, model sizes and seed.
    name, max_steps, publish_every, eval_every
        See :class:`~carls_dask.runtime.trainer.Trainer`.
    """

    def __init__(self, corpus: CorpusSpec, *, sampler: str = "log_uniform", n_sampled: int = 64, batch_size: int = 64,
                 lr: float = 2e-3, dim: int = 64, hidden: int = 128, seed: int = 0, name: str = "classifier",
                 max_steps: int | None = 300, publish_every: int | None = 50, eval_every: int | None = None,
                 all_concepts: bool = True) -> None:
        super().__init__(name, max_steps=max_steps, publish_every=publish_every, eval_every=eval_every)
        _check_choice(f"ConceptClassifierTrainer {name!r}", "sampler", sampler, ("uniform", "log_uniform"))
        if not isinstance(n_sampled, int) or isinstance(n_sampled, bool) or n_sampled < 1:
            raise ConfigError(f"ConceptClassifierTrainer {name!r}: n_sampled={n_sampled!r}; expected a positive int")
        self.all_concepts = bool(all_concepts)
        self.corpus_spec = corpus
        self.sampler = sampler
        self.n_sampled = n_sampled
        self.batch_size = batch_size
        self.lr = lr
        self.dim = dim
        self.hidden = hidden
        self.seed = seed

    def setup(self, ctx: LoopContext) -> None:
        import torch

        from carls_dask.nn import BankEmbedding
        from carls_dask.paradigms.multimodal.models import ImageQueryHead

        if ctx.bank is None:
            raise ConfigError(f"ConceptClassifierTrainer {self.name!r} needs a bank with a 'concepts' table")
        _set_threads(self.corpus_spec)
        torch.manual_seed(self.seed)
        self.rng = np.random.default_rng(self.seed)
        pairs = load_openmoji_pairs(self.corpus_spec.size, limit=self.corpus_spec.limit, seed=self.corpus_spec.seed,
                                    cache_dir=self.corpus_spec.cache_dir)
        feats = image_features(pairs.images, cache_dir=self.corpus_spec.cache_dir)
        test = []
        for c in np.unique(pairs.concepts):
            members = np.flatnonzero(pairs.concepts == c)
            if len(members) >= 2:
                test.append(members[-1])
        self.test = np.array(test, dtype=np.int64)
        self.train = np.setdiff1d(np.arange(len(pairs)), self.test)
        names = [pairs.concept_names[c] for c in pairs.concepts]
        self.class_keys = to_int64_keys(names, CONCEPTS)
        self.device = torch.device(ctx.device)
        self.feats = torch.from_numpy(feats).to(self.device)
        self.model = ImageQueryHead(FEATURE_DIM, self.dim, self.hidden).to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        self.classes = BankEmbedding(ctx.bank, CONCEPTS).to(self.device)
        self.step_seconds: list[float] = []
        if self.all_concepts:  # allocate the classes not in the bank yet (a resumed run finds them all)
            every = to_int64_keys(list(cldr_concepts()), CONCEPTS)
            missing = every[~ctx.bank.lookup(CONCEPTS, every, columns=["embedding"]).found]
            if len(missing):
                ctx.bank.lookup(CONCEPTS, missing, columns=["embedding"], insert=True)

    def state(self) -> dict[str, Any]:
        """The base checkpoint plus the batch generator (the class embeddings are in the bank's snapshot)."""
        out = super().state()
        out["rng"] = self.rng.bit_generator.state
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state` checkpoint (after :meth:`setup`)."""
        super().load_state(state)
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]

    def step(self, step: int) -> Mapping[str, float]:
        import torch

        from carls_dask.nn import sampled_softmax_loss

        assert self.ctx is not None
        bank = self.ctx.the_bank
        t0 = time.perf_counter()
        idx = self.train[self.rng.choice(len(self.train), size=self.batch_size, replace=False)]
        kb = self.class_keys[idx]
        before = bank.size(CONCEPTS)
        full = self.n_sampled >= before  # every class, no correction: the full softmax
        q = self.model(self.feats[torch.from_numpy(idx).to(self.device)])
        # the layer reads the batch's classes with insert, draws the candidates from the bank (the batch's
        # classes as true keys, accidental hits removed) and sends the rows' gradients to the bank's
        # optimizer in backward; the logit scale 10 goes into the query
        loss = sampled_softmax_loss(self.classes, 10.0 * q, kb, min(self.n_sampled, before),
                                    sampler="uniform" if full else self.sampler, subtract_log_q=not full,
                                    seed=self.seed * 1_000_003 + step)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        size = bank.size(CONCEPTS)
        self.step_seconds.append(time.perf_counter() - t0)
        return {"loss": float(loss.detach()), "classes": float(size), "new_classes": float(size - before),
                "sampled": float(min(self.n_sampled, before))}

    def evaluate(self) -> dict[str, float]:
        """Top-1/top-5 accuracy of held-out images against every class embedding in the bank."""
        import torch

        assert self.ctx is not None
        with torch.inference_mode():
            q = self.model(self.feats[torch.from_numpy(self.test).to(self.device)]).cpu().numpy()
        k = min(5, self.ctx.the_bank.size(CONCEPTS))
        keys, _ = self.ctx.the_bank.top_k(CONCEPTS, 10.0 * q, k, metric="dot")
        truth = self.class_keys[self.test]
        return {"top1": float((keys[:, 0] == truth).mean()), "top5": float((keys == truth[:, None]).any(1).mean()),
                "n_test": float(len(self.test)), "classes": float(self.ctx.the_bank.size(CONCEPTS))}

    def finish(self) -> dict[str, float]:
        """:meth:`evaluate` plus ``sampled`` (classes per step) and ``step_ms`` (median step time, bank calls
        included; NaN when no step ran in this process)."""
        out = self.evaluate()
        out["sampled"] = float(min(self.n_sampled, self.ctx.the_bank.size(CONCEPTS))) if self.ctx is not None else 0.0
        out["step_ms"] = float(np.median(self.step_seconds) * 1e3) if self.step_seconds else float("nan")
        return out
