"""Run one semi-supervised variant in this process, deterministically: the benchmark's tuning driver.

The trainer and the makers are the same classes the Workbench runs as Dask futures, driven here in
lock step: every ``publish_every`` trainer steps each maker loads the new version and makes its
round before training goes on. The bank is the :class:`~carls_dask.bank.KnowledgeBank` client over one
in-process shard (:meth:`~carls_dask.bank.KnowledgeBank.local`), so a run depends only on its
settings and seeds, and figures of different settings can be compared seed by seed.
"""

from __future__ import annotations

import os
import time
from typing import Any

from carls_dask.bank import KnowledgeBank
from carls_dask.paradigms.data.planetoid import find_data_dir, load_planetoid
from carls_dask.paradigms.semi_supervised.core import SemiSupervisedConfig
from carls_dask.paradigms.semi_supervised.loops import (
    GraphTrainer,
    NeighbourMaker,
    PseudoLabelMaker,
    bank_tables,
)
from carls_dask.runtime.channel import LocalModelChannel
from carls_dask.runtime.context import LoopContext, ThreadStop, pick_device

__all__ = ["run_inline"]


def run_inline(config: SemiSupervisedConfig, *, data_dir: str | os.PathLike[str] | None = None,
               publish_every: int = 10, torch_threads: int = 1) -> dict[str, Any]:
    """Train one variant (``config.mode``) in this process and return its figures.

    Parameters
    ----------
    config
        The variant and its hyper-parameters.
    data_dir
        Data folder (see :func:`~carls_dask.paradigms.data.planetoid.find_data_dir`).
    publish_every
        Trainer steps between the makers' rounds.
    torch_threads
        Intra-op threads torch may use.

    Returns
    -------
    dict
        The trainer's figures (as :func:`~carls_dask.paradigms.semi_supervised.run.run_semi_supervised`
        returns them) and each maker's last numbers under ``makers``.
    """
    t0 = time.monotonic()
    folder = str(find_data_dir(data_dir))
    n_classes = load_planetoid(config.dataset, folder).n_classes
    bank = (KnowledgeBank.local(bank_tables(n_classes, config.hidden[-1]), n_shards=1, buckets=64)
            if config.mode == "bank" else None)
    stop = ThreadStop()
    channel = LocalModelChannel("trainer")
    device = pick_device()
    trainer = GraphTrainer("trainer", config, data_dir=folder, publish_every=publish_every,
                           torch_threads=torch_threads)
    makers: list[Any] = []
    if config.mode == "bank":
        makers.append(NeighbourMaker("neighbour-maker", config, source="trainer", data_dir=folder,
                                     torch_threads=torch_threads))
        if config.pseudo_labels:
            makers.append(PseudoLabelMaker("pseudo-labeller", config, source="trainer", data_dir=folder,
                                           torch_threads=torch_threads))

    def ctx(name: str, kind: str) -> LoopContext:
        return LoopContext(name=name, kind=kind, device=device, channel=channel, stop=stop, bank=bank)

    made: dict[str, dict[str, float]] = {m.name: {} for m in makers}
    try:
        trainer.ctx = ctx(trainer.name, "trainer")
        trainer.setup(trainer.ctx)
        for m in makers:
            m.ctx = ctx(m.name, "maker")
            m.setup(m.ctx)

        def round_(done: int) -> None:
            record = channel.publish(trainer.publish_state(), step=done, producer=trainer.name)
            got = channel.fetch(newer_than=record.version - 1)
            assert got is not None
            for m in makers:
                m.load_model(got[1], got[0])
                made[m.name] = {k: float(v) for k, v in m.make(got[0]).items()}

        if makers:
            round_(0)
        for step in range(config.steps):
            trainer.step(step)
            done = step + 1
            if makers and done % publish_every == 0 and done < config.steps:
                round_(done)
        out: dict[str, Any] = dict(trainer.finish())
    finally:
        trainer.teardown()
        for m in makers:
            m.teardown()
        if bank is not None:
            bank.close()
    out["makers"] = made
    out["wall_seconds"] = time.monotonic() - t0
    return out
