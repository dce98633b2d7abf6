"""A small worked example: a digits classifier trainer and a maker that writes its outputs to the bank.

It runs in seconds on a CPU and uses scikit-learn's bundled 8x8 digits (1797 images, no download).
The quickstart notebook, the documentation, the benchmarks of the runtime, the Slurm check and the tests use it.

- :class:`DigitsTrainer` trains a 64-32-10 MLP. When the Workbench has a bank with a ``digits``
  table, each step also looks up the maker's logits for its batch (with their age) and adds a
  small distillation term towards them; it reports the mean age of what it read (``bank_age_s``).
- :class:`DigitsMaker` loads the newest published model, computes every image's embedding
  (hidden layer), logits, pseudo label and confidence, and writes them to the bank with
  ``model_step`` and its own name as provenance. Without a bank it only measures accuracy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from carls_dask.runtime.channel import ModelVersion
from carls_dask.runtime.context import LoopContext
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.trainer import Trainer

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["EMBED_DIM", "N_CLASSES", "DigitsMaker", "DigitsTrainer", "digits_table", "load_digits_arrays"]

EMBED_DIM = 32
N_CLASSES = 10
TABLE = "digits"


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 digits as float32 ``[n, 64]`` in [0, 1] and int64 labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target.astype(np.int64)


def digits_table() -> Any:
    """The bank table the example writes: embedding[32], logits[10], pseudo_label, confidence."""
    from carls_dask.bank.schema import Column, TableSpec

    return TableSpec(TABLE, columns=(
        Column("embedding", dtype="float32", shape=(EMBED_DIM,), dims=("dim",)),
        Column("logits", dtype="float32", shape=(N_CLASSES,), dims=("class",)),
        Column("pseudo_label", dtype="int64", shape=(), dims=()),
        Column("confidence", dtype="float32", shape=(), dims=()),
    ), optimizer=None)


def _model() -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(64, EMBED_DIM), torch.nn.Tanh(), torch.nn.Linear(EMBED_DIM, N_CLASSES))


def _has_table(bank: KnowledgeBank | None) -> bool:
    if bank is None:
        return False
    try:
        return bool(bank.size(TABLE) >= 0)
    except Exception:
        return False


class DigitsTrainer(Trainer):
    """Trains the digits MLP; see the module docstring.

    Parameters
    ----------
    name, max_steps, publish_every
        See :class:`~carls_dask.runtime.trainer.Trainer`.
    batch_size
        Images per step.
    lr
        Adam learning rate.
    distill
        Weight of the distillation term towards the bank's logits.
    n_train
        Images used for training; the rest measure test accuracy.
    seed
        Seed of the model initialisation and batch order.
    threads
        Torch intra-op threads of the worker process (one suits this tiny model best);
        ``None`` leaves torch's setting alone.
    """

    def __init__(self, name: str = "trainer", *, max_steps: int | None = 300, publish_every: int | None = 25,
                 batch_size: int = 128, lr: float = 0.01, distill: float = 0.1, n_train: int = 1400,
                 seed: int = 0, threads: int | None = 1) -> None:
        super().__init__(name, max_steps=max_steps, publish_every=publish_every)
        self.threads = threads
        self.batch_size = batch_size
        self.lr = lr
        self.distill = distill
        self.n_train = n_train
        self.seed = seed

    def setup(self, ctx: LoopContext) -> None:
        import torch

        torch.manual_seed(self.seed)
        if self.threads:
            torch.set_num_threads(self.threads)
        x, y = load_digits_arrays()
        self.device = torch.device(ctx.device)
        self.x = torch.from_numpy(x).to(self.device)
        self.y = torch.from_numpy(y).to(self.device)
        self.model = _model().to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        self.rng = np.random.default_rng(self.seed)
        self.use_bank = _has_table(ctx.bank)
        self.bank_reads = 0
        self.bank_hits = 0

    def step(self, step: int) -> Mapping[str, float]:
        import torch

        idx = self.rng.choice(self.n_train, size=self.batch_size, replace=False)
        logits = self.model(self.x[idx])
        loss = torch.nn.functional.cross_entropy(logits, self.y[idx])
        out: dict[str, float] = {}
        if self.use_bank:
            assert self.ctx is not None
            got = self.ctx.the_bank.lookup(TABLE, idx.astype(np.int64), columns=["logits"])
            self.bank_reads += 1
            found = np.asarray(got.found, dtype=bool)
            if found.any():
                self.bank_hits += 1
                teacher = torch.from_numpy(np.asarray(got.values["logits"])[found]).to(self.device)
                mask = torch.from_numpy(found).to(self.device)
                kl = torch.nn.functional.kl_div(torch.log_softmax(logits[mask], dim=1),
                                                torch.softmax(teacher, dim=1), reduction="batchmean")
                loss = loss + self.distill * kl
                out["bank_age_s"] = float(np.nanmean(np.asarray(got.age)[found]))
            out["bank_found"] = float(found.mean())
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        out["loss"] = float(loss.detach())
        return out

    def accuracy(self, part: str = "test") -> float:
        """Accuracy on the held-out images (``"test"``) or the training images (``"train"``)."""
        import torch

        sl = slice(self.n_train, None) if part == "test" else slice(0, self.n_train)
        with torch.no_grad():
            pred = self.model(self.x[sl]).argmax(dim=1)
        return float((pred == self.y[sl]).float().mean())

    def finish(self) -> dict[str, float]:
        return {"test_accuracy": self.accuracy("test"), "train_accuracy": self.accuracy("train"),
                "bank_reads": float(self.bank_reads), "bank_hits": float(self.bank_hits)}


class DigitsMaker(KnowledgeMaker):
    """Writes the newest digits model's embeddings, logits and pseudo labels to the bank.

    Parameters
    ----------
    name, source, max_rounds, final_pass
        See :class:`~carls_dask.runtime.maker.KnowledgeMaker`.
    n_train
        Images the trainer trains on; the rest measure the accuracy reported per round.
    threads
        Torch intra-op threads of the worker process; ``None`` leaves torch's setting alone.
    """

    def __init__(self, name: str = "maker", *, source: str | None = None, max_rounds: int | None = None,
                 final_pass: bool = True, n_train: int = 1400, threads: int | None = 1) -> None:
        super().__init__(name, source=source, max_rounds=max_rounds, final_pass=final_pass)
        self.threads = threads
        self.n_train = n_train

    def setup(self, ctx: LoopContext) -> None:
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        x, y = load_digits_arrays()
        self.device = torch.device(ctx.device)
        self.x = torch.from_numpy(x).to(self.device)
        self.y = y
        self.keys = np.arange(len(y), dtype=np.int64)
        self.model = _model().to(self.device)
        self.use_bank = _has_table(ctx.bank)

    def load_model(self, state: Mapping[str, Any], version: ModelVersion) -> None:
        self.model.load_state_dict(state)

    def make(self, version: ModelVersion) -> Mapping[str, float]:
        import torch

        with torch.no_grad():
            hidden = self.model[1](self.model[0](self.x))
            logits = self.model[2](hidden)
            prob = torch.softmax(logits, dim=1)
            confidence, label = prob.max(dim=1)
        label_np = label.cpu().numpy().astype(np.int64)
        test = slice(self.n_train, None)
        accuracy = float((label_np[test] == self.y[test]).mean())
        if self.use_bank:
            assert self.ctx is not None
            self.ctx.the_bank.update(TABLE, self.keys, {
                "embedding": hidden.cpu().numpy().astype(np.float32),
                "logits": logits.cpu().numpy().astype(np.float32),
                "pseudo_label": label_np,
                "confidence": confidence.cpu().numpy().astype(np.float32),
            }, model_step=version.step, maker=self.name)
        return {"accuracy": accuracy, "mean_confidence": float(confidence.mean())}
