"""``carls-dask run multimodal``: one contrastive run (trainer + corpus maker) and one large-output run.

Options (``-o KEY=VALUE``): ``negatives`` (in_batch, uniform, log_uniform, hard; default uniform),
``reencode`` (1: the trainer encodes the bank-drawn negatives with its current model, the default;
0: it uses the bank's stored embeddings), ``logq`` (1: logQ correction of sampled negatives;
default 0), ``seed``, ``batch_size``, ``n_negatives`` (default 256), ``n_hard``, ``limit``
(concepts; default all), ``n_test`` (held-out concepts), ``n_val`` (validation concepts held out
of training; default 0), ``classifier_steps`` (0 skips the classifier), ``cache_dir``.
The defaults are the settings chosen on the validation split by ``benchmarks/multimodal.py``.
The run folder holds ``bank/`` (a snapshot of the bank), ``metrics.zarr``, ``run.json`` and
``results.json`` (the held-out figures).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
from typing import Any

from carls_dask.paradigms.multimodal.loops import (
    ConceptClassifierTrainer,
    ContrastiveTrainer,
    CorpusMaker,
    CorpusSpec,
    corpus_tables,
    default_cache_dir,
    initialise_bank,
)
from carls_dask.runtime.registry import RunRequest
from carls_dask.storage.errors import ConfigError

__all__ = ["ExperimentResult", "main", "run_contrastive"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ExperimentResult:
    """What one contrastive run measured."""

    negatives: str
    seed: int
    steps: int
    steps_per_s: float
    metrics: dict[str, float]
    maker_rounds: int
    mean_staleness_s: float
    classifier: dict[str, float] | None = None
    reencode: bool = True
    logq_correction: bool = False


def run_contrastive(wb: Any, corpus: CorpusSpec, *, negatives: str, seed: int = 0, steps: int = 400,
                    batch_size: int = 32, n_negatives: int = 256, n_hard: int = 8, reencode: bool = True,
                    logq_correction: bool = False, dim: int = 64, bank_wait_s: float = 0.0,
                    publish_every: int = 20, classifier_steps: int = 0, timeout: float = 1800.0) -> ExperimentResult:
    """Run a :class:`ContrastiveTrainer` and a :class:`CorpusMaker` in the running Workbench ``wb``.

    The bank (``texts``, ``images`` and, with ``classifier_steps``, ``concepts``) is created in
    ``wb``; its ``images.pretrained`` column is first filled by the frozen pretrained encoder in a
    task on the cluster. Waits at most ``timeout`` seconds for the loops.
    """
    bank = wb.create_bank(corpus_tables(dim, dim if classifier_steps else None))
    written = wb.client.submit(initialise_bank, bank, corpus, pure=False).result(timeout=timeout)
    logger.info("pretrained features written for %d corpus rows", written)
    trainer = ContrastiveTrainer(corpus, negatives=negatives, seed=seed, max_steps=steps, batch_size=batch_size,
                                 n_negatives=n_negatives, n_hard=n_hard, reencode=reencode, logq_correction=logq_correction, dim=dim,
                                 bank_wait_s=bank_wait_s,
                                 publish_every=publish_every)
    wb.submit_trainer(trainer)
    wb.submit_maker(CorpusMaker(corpus, dim=dim, source=trainer.name))
    if classifier_steps:
        wb.submit_trainer(ConceptClassifierTrainer(corpus, seed=seed, max_steps=classifier_steps, dim=dim))
    wb.wait(timeout=timeout)
    results = wb.stop()
    tr, mk = results[trainer.name], results["corpus-maker"]
    rounds = mk.rounds
    staleness = sum(r.staleness for r in rounds) / len(rounds) if rounds else float("nan")
    return ExperimentResult(negatives, seed, tr.steps, tr.steps / tr.elapsed if tr.elapsed > 0 else float("nan"),
                            dict(tr.value), len(rounds), staleness,
                            dict(results["classifier"].value) if classifier_steps else None, reencode,
                            logq_correction)


def _int(options: dict[str, str], key: str, default: int | None) -> int | None:
    if key not in options:
        return default
    try:
        return int(options[key])
    except ValueError:
        raise ConfigError(f"run multimodal -o {key}={options[key]!r}: expected an integer") from None


def main(request: RunRequest) -> int:
    """Run the multimodal paradigm into ``request.run_dir``; returns the exit status."""
    from carls_dask.runtime.workbench import Workbench

    opts = dict(request.options)
    known = {"negatives", "reencode", "logq", "seed", "batch_size", "n_negatives", "n_hard", "limit", "n_test",
             "n_val", "classifier_steps", "cache_dir"}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise ConfigError(f"run multimodal: unknown options {unknown}; expected some of {sorted(known)}")
    negatives = opts.get("negatives", "uniform")
    limit = _int(opts, "limit", None)
    corpus = CorpusSpec(limit=limit, n_test=_int(opts, "n_test", 300 if limit is None else max(2, limit // 5)) or 2,
                        n_val=_int(opts, "n_val", 0) or 0, seed=_int(opts, "seed", 0) or 0, cache_dir=opts.get("cache_dir", str(default_cache_dir())))
    run_dir = pathlib.Path(request.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with Workbench(run_dir=run_dir, name=run_dir.name) as wb:
        res = run_contrastive(
            wb, corpus, negatives=negatives, seed=corpus.seed, steps=request.steps if request.steps is not None else 400,
            batch_size=_int(opts, "batch_size", 32) or 32, n_negatives=_int(opts, "n_negatives", 256) or 256,
            n_hard=_int(opts, "n_hard", 8) or 8, reencode=bool(_int(opts, "reencode", 1)),
            logq_correction=bool(_int(opts, "logq", 0)), classifier_steps=_int(opts, "classifier_steps", 300) or 0)
        version = wb.bank.snapshot(str(run_dir / "bank"), step=res.steps)
        logger.info("bank snapshot version %d written to %s", version, run_dir / "bank")
    out = dataclasses.asdict(res)
    (run_dir / "results.json").write_text(json.dumps(out, indent=2, default=float))
    logger.info("multimodal results: %s", out)
    return 0
