"""The runtime: trainers and knowledge makers as long-lived Dask futures, run by a :class:`Workbench`.

- :class:`Trainer` and :class:`KnowledgeMaker` are the base classes whose hooks a user implements;
- :class:`ModelChannel` carries a trainer's model versions to makers (newest only);
- :class:`Workbench` starts or connects to a cluster, creates the bank, runs the loops, shows
  progress, stops them within a deadline and raises a loop's failure to the caller;
- :class:`Paradigm` is the shape of a learning paradigm (settings, variants, tables, loops,
  figures); :func:`run_paradigm` runs one on a Workbench, :func:`run_inline` in this process in lock
  step, :func:`resume_run` continues a run folder, each returning a :class:`RunResult`.
"""

from __future__ import annotations

from carls_dask.runtime.channel import LocalModelChannel, ModelChannel, ModelVersion
from carls_dask.runtime.checkpoints import Checkpointer
from carls_dask.runtime.context import LoopContext, LoopResult, MakerRound, ThreadStop, pick_device
from carls_dask.runtime.lifecycle import Lifecycle, State
from carls_dask.runtime.loops import MakerDriver, TrainerDriver, run_loop, run_maker, run_trainer
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.paradigm import Paradigm
from carls_dask.runtime.registry import available_paradigms, get_paradigm, register_paradigm
from carls_dask.runtime.runner import RunResult, resume_run, run_inline, run_paradigm
from carls_dask.runtime.trainer import Trainer
from carls_dask.runtime.workbench import LoopHandle, LoopStatus, Workbench

__all__ = [
    "Checkpointer",
    "KnowledgeMaker",
    "Lifecycle",
    "LocalModelChannel",
    "LoopContext",
    "LoopHandle",
    "LoopResult",
    "LoopStatus",
    "MakerDriver",
    "MakerRound",
    "ModelChannel",
    "ModelVersion",
    "Paradigm",
    "RunResult",
    "State",
    "ThreadStop",
    "Trainer",
    "TrainerDriver",
    "Workbench",
    "available_paradigms",
    "get_paradigm",
    "pick_device",
    "register_paradigm",
    "resume_run",
    "run_inline",
    "run_loop",
    "run_maker",
    "run_paradigm",
    "run_trainer",
]
