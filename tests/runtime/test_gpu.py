"""A trainer step on a CUDA device (skipped where none is present)."""

from __future__ import annotations

import pytest
import torch

from carls_dask.runtime import LocalModelChannel, LoopContext, ThreadStop, pick_device, run_trainer
from carls_dask.runtime.toy import DigitsTrainer


@pytest.mark.gpu
def test_trainer_steps_on_cuda_and_publishes_cpu_state() -> None:
    assert pick_device() == "cuda"
    channel = LocalModelChannel("trainer")
    ctx = LoopContext(name="trainer", kind="trainer", device=pick_device(), channel=channel, stop=ThreadStop())
    trainer = DigitsTrainer("trainer", max_steps=50, publish_every=25, lr=0.02)
    result = run_trainer(trainer, ctx)
    assert next(trainer.model.parameters()).device.type == "cuda"
    assert result.steps == 50 and result.value["train_accuracy"] > 0.8
    got = channel.fetch(0)
    assert got is not None
    assert all(t.device == torch.device("cpu") for t in got[1].values())  # makers without a GPU can load it
