"""The runtime: trainers and knowledge makers as long-lived Dask futures, run by a :class:`Workbench`.

- :class:`Trainer` and :class:`KnowledgeMaker` are the base classes whose hooks a user implements;
- :class:`ModelChannel` carries a trainer's model versions to makers (newest only);
- :class:`Workbench` starts or connects to a cluster, creates the bank, runs the loops, shows
  progress, stops them within a deadline and raises a loop's failure to the caller.
"""

from __future__ import annotations

from carls_dask.runtime.channel import LocalModelChannel, ModelChannel, ModelVersion
from carls_dask.runtime.context import LoopContext, LoopResult, MakerRound, ThreadStop, pick_device
from carls_dask.runtime.lifecycle import Lifecycle, State
from carls_dask.runtime.loops import run_loop, run_maker, run_trainer
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.registry import RunRequest, available_paradigms, register_paradigm
from carls_dask.runtime.trainer import Trainer
from carls_dask.runtime.workbench import LoopHandle, LoopStatus, Workbench

__all__ = [
    "KnowledgeMaker",
    "Lifecycle",
    "LocalModelChannel",
    "LoopContext",
    "LoopHandle",
    "LoopResult",
    "LoopStatus",
    "MakerRound",
    "ModelChannel",
    "ModelVersion",
    "RunRequest",
    "State",
    "ThreadStop",
    "Trainer",
    "Workbench",
    "available_paradigms",
    "pick_device",
    "register_paradigm",
    "run_loop",
    "run_maker",
    "run_trainer",
]
