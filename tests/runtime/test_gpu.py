"""Trainers and makers on CUDA (skipped where no CUDA device is present).

- In-process: a trainer on :func:`pick_device` publishes CPU state, so makers without a GPU can load it.
- Through the Workbench, on a LocalCluster whose workers advertise ``GPU``: the trainer (placement
  ``auto``) and the maker (``carls.placement.maker: {GPU: 1}``) each get a ``cuda:<i>`` device and
  their tensors live there. The trainer looks up the bank every step while the maker writes it;
  its steps/s are printed beside those of the same run on CPU-only workers (``-s`` shows them).
"""

from __future__ import annotations

from typing import Any

import dask.config
import pytest
import torch

from carls_dask.examples.digits import DigitsMaker, DigitsTrainer, digits_table
from carls_dask.runtime import (
    LocalModelChannel,
    LoopContext,
    LoopResult,
    ThreadStop,
    Workbench,
    pick_device,
    run_trainer,
)
from tests.runtime.helpers import run_until_knowledge_flows

MIN_STEPS = 300  # trainer steps (with the maker's knowledge read back) before a run is stopped


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


class DeviceTrainer(DigitsTrainer):
    """The digits trainer, reporting where its model and data lived."""

    def finish(self) -> Any:
        out: dict[str, Any] = dict(super().finish())
        out["device"] = str(self.ctx.device if self.ctx is not None else "")
        out["model_device"] = str(next(self.model.parameters()).device)
        out["data_device"] = str(self.x.device)
        return out


class DeviceMaker(DigitsMaker):
    """The digits maker, reporting where its model and data lived."""

    def finish(self) -> Any:
        return {"device": str(self.ctx.device if self.ctx is not None else ""),
                "model_device": str(next(self.model.parameters()).device), "data_device": str(self.x.device)}


def _run(**cluster_options: Any) -> dict[str, LoopResult]:
    """The digits trainer and maker with a bank, until knowledge flows, on a fresh two-worker LocalCluster."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, host="127.0.0.1", dashboard_address=":0",
                      **cluster_options) as cluster, Client(cluster) as client, \
            Workbench(client, run_dir=None, progress=False, stop_timeout=60) as wb:
        wb.create_bank([digits_table()], n_shards=2)
        wb.submit_trainer(DeviceTrainer("trainer", max_steps=None, publish_every=25, lr=0.02))
        wb.submit_maker(DeviceMaker("maker"))
        run_until_knowledge_flows(wb, min_steps=MIN_STEPS, timeout=180)
        return wb.stop(timeout=60)


def _steps_per_s(result: LoopResult) -> float:
    return result.steps / result.elapsed


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_workbench_runs_trainer_and_maker_on_cuda_and_compares_with_cpu() -> None:
    n_devices = torch.cuda.device_count()
    with dask.config.set({"carls.placement.maker": {"GPU": 1}}):  # the trainer asks for GPU by default (auto)
        gpu = _run(resources={"GPU": 1})
    trainer, maker = gpu["trainer"], gpu["maker"]
    for loop in (trainer, maker):
        value = loop.value
        assert value["device"].startswith("cuda:") and int(value["device"].split(":")[1]) < n_devices, value
        assert value["model_device"] == value["data_device"] == value["device"], value  # tensors lived on CUDA
    assert trainer.steps >= MIN_STEPS and trainer.value["bank_hits"] > 0
    assert trainer.value["train_accuracy"] > 0.9
    assert maker.rounds and maker.metrics["accuracy"] > 0.8

    # the same run on CPU-only workers: their processes see no CUDA device
    cpu = _run(env={"CUDA_VISIBLE_DEVICES": ""})
    assert cpu["trainer"].value["model_device"] == cpu["maker"].value["model_device"] == "cpu"
    print(f"\ntrainer steps/s with a bank lookup per step and a maker running: "
          f"GPU {_steps_per_s(trainer):.1f} ({trainer.steps} steps), "
          f"CPU {_steps_per_s(cpu['trainer']):.1f} ({cpu['trainer'].steps} steps)")
