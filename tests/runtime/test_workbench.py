"""The Workbench on a real two-worker LocalCluster: the digits pair with a bank, failures, stops."""

from __future__ import annotations

import json
import math
import pathlib
import time
import traceback
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from carls_dask.errors import ConfigError, DeadlineExceeded, LifecycleError, LoopFailedError
from carls_dask.examples.digits import DigitsMaker, DigitsTrainer, digits_table, load_digits_arrays
from carls_dask.runtime import KnowledgeMaker, LoopContext, ModelVersion, State, Trainer, Workbench
from tests.processes import wait_for
from tests.runtime.helpers import run_until_knowledge_flows


class ExplodingTrainer(Trainer):
    """Raises at a given step, from a named function, so the traceback can be checked."""

    def __init__(self, name: str = "boom", fail_at: int = 5) -> None:
        super().__init__(name, max_steps=None, publish_every=2)
        self.fail_at = fail_at

    def setup(self, ctx: LoopContext) -> None:
        import torch

        self.model = torch.nn.Linear(2, 2)

    def step(self, step: int) -> Mapping[str, float]:
        time.sleep(0.01)
        if step == self.fail_at:
            explode_here(step)
        return {"loss": 1.0 / (step + 1)}


def explode_here(step: int) -> None:
    raise ArithmeticError(f"exploded at step {step}")


class SleepyTrainer(Trainer):
    """Each step sleeps longer than the stop deadline, so a stop cannot be honoured in time."""

    def setup(self, ctx: LoopContext) -> None:
        import torch

        self.model = torch.nn.Linear(1, 1)

    def step(self, step: int) -> Mapping[str, float]:
        time.sleep(3.0)
        return {}


class EchoMaker(KnowledgeMaker):
    def load_model(self, state: Mapping[str, Any], version: ModelVersion) -> None:
        pass

    def make(self, version: ModelVersion) -> Mapping[str, float]:
        return {"step": float(version.step)}


def test_digits_pair_converges_through_the_bank(client: Any, tmp_path: pathlib.Path) -> None:
    from carls_dask.storage.metrics import open_metrics

    run = tmp_path / "run"
    with Workbench(client, run_dir=run, name="digits", progress=False) as wb:
        assert wb.state is State.RUNNING
        bank = wb.create_bank([digits_table()], n_shards=2)
        wb.submit_trainer(DigitsTrainer("trainer", max_steps=None, publish_every=15, lr=0.02))
        wb.submit_maker(DigitsMaker("maker"))
        run_until_knowledge_flows(wb, min_steps=150)
        results = wb.stop(timeout=30)
        assert wb.state is State.STOPPING
        status = wb.status()
        # read the bank before it closes with the Workbench
        _, labels = load_digits_arrays()
        got = bank.lookup("digits", np.arange(len(labels), dtype=np.int64), columns=["pseudo_label", "confidence"])
    assert wb.state is State.CLOSED
    trainer, maker = results["trainer"], results["maker"]

    # the trainer converged, by numbers
    n = trainer.steps
    assert trainer.reason == "stopped" and n >= 150
    assert trainer.value["train_accuracy"] > 0.95
    assert trainer.value["test_accuracy"] > 0.85
    # it read the maker's knowledge back from the bank, with its age
    assert trainer.value["bank_hits"] > 0
    assert 0.0 <= trainer.metrics["bank_age_s"] < 60.0
    assert trainer.metrics["bank_found"] == 1.0
    # the maker saw increasing model versions
    expected = [15 * i for i in range(1, n // 15 + 1)]
    assert [v.step for v in trainer.published] == (expected if n % 15 == 0 else [*expected, n])
    assert len(maker.rounds) >= 2
    assert maker.versions == sorted(set(maker.versions))
    last = maker.rounds[-1].model_step
    assert [r.model_step for r in maker.rounds] == sorted({r.model_step for r in maker.rounds})
    assert 15 <= last <= n
    assert all(math.isfinite(r.staleness) and 0.0 <= r.staleness < 60.0 for r in maker.rounds)
    assert maker.metrics["accuracy"] > 0.85
    # what the maker wrote carries provenance and agrees with the labels
    assert got.found.all()
    assert (got.model_step == last).all()  # the bank holds the maker's newest knowledge
    assert (got.values["pseudo_label"] == labels).mean() > 0.9
    assert status["trainer"].state == "closed" and status["maker"].state == "closed"
    # the run folder: what ran, and the progress metrics
    record = json.loads((run / "run.json").read_text())
    assert record["loops"]["trainer"]["steps"] == n and record["state"] == "closed"
    ds = open_metrics(run / "metrics.zarr")
    steps = ds["step"].values
    assert (np.diff(steps) > 0).all() and steps[-1] == n
    seen = ds["maker_version"].dropna("step").values
    assert (np.diff(seen) >= 0).all() and 1 <= seen[-1] <= maker.versions[-1]
    assert np.nanmax(ds["steps_per_s"].values) > 0


def test_a_failing_loop_raises_with_its_traceback_and_stops_the_others(client: Any) -> None:
    wb = Workbench(client, progress=False, stop_timeout=20)
    with pytest.raises(LoopFailedError, match=r"trainer 'boom' failed with ArithmeticError: exploded at step 5") as info:
        with wb:
            wb.submit_trainer(ExplodingTrainer("boom", fail_at=5))
            wb.submit_maker(EchoMaker("echo"))
            wb.wait(timeout=120)
    cause = info.value.__cause__
    assert isinstance(cause, ArithmeticError)
    frames = [f.name for f in traceback.extract_tb(cause.__traceback__)]
    assert "explode_here" in frames and "step" in frames
    assert wb.state is State.CLOSED
    assert wb.loops["boom"].life.state is State.FAILED
    assert wb.loops["echo"].life.state is State.CLOSED  # stopped cleanly, not left running
    assert wb.loops["echo"].result is not None and wb.loops["echo"].result.reason == "stopped"


def test_failure_is_raised_once_by_results(client: Any) -> None:
    with Workbench(client, progress=False) as wb:
        wb.submit_trainer(ExplodingTrainer("boom", fail_at=0))
        wait_for(lambda: wb.status()["boom"].state == "failed", "the loop failing", 120, interval=0.05)
        assert wb.status()["boom"].future == "error"
        with pytest.raises(LoopFailedError) as info:
            wb.results()
        assert isinstance(info.value.__cause__, ArithmeticError)
        assert wb.results() == {}  # already reported; leaving the block does not raise again
        with pytest.raises(LoopFailedError):  # but waiting on a failed Workbench always says why
            wb.wait(timeout=30)
        assert wb.state is State.FAILED


def test_stop_past_its_deadline_cancels_and_says_so(client: Any) -> None:
    import dask

    with pytest.raises(DeadlineExceeded, match=r"\['sleepy'\] did not stop within 0.5s"), \
            dask.config.set({"carls.run.metrics-every": 1}):  # a report after each 3-second step
        with Workbench(client, progress=False) as wb:
            wb.submit_trainer(SleepyTrainer("sleepy"))
            wait_for(lambda: "step" in wb.status()["sleepy"].progress, "a first progress report", 120)
            with pytest.raises(DeadlineExceeded, match=r"\['sleepy'\] still running after 0.2s"):
                wb.wait(timeout=0.2)
            assert wb.status()["sleepy"].state == "running"  # a missed wait deadline stops nothing
            t0 = time.monotonic()
            try:
                wb.stop(timeout=0.5)
            finally:
                assert time.monotonic() - t0 < 5.0
                assert wb.loops["sleepy"].life.state is State.FAILED


def test_lifecycle_and_argument_errors(client: Any) -> None:
    wb = Workbench(client, progress=False)
    with pytest.raises(LifecycleError, match=r"Workbench 'run': cannot submit trainer 't' while 'created'"):
        wb.submit_trainer(DigitsTrainer("t"))
    with wb:
        with pytest.raises(ConfigError, match=r"maker 'm': source=None needs exactly one submitted trainer, found none"):
            wb.submit_maker(EchoMaker("m"))
        with pytest.raises(TypeError, match="expected a Trainer, got EchoMaker"):
            wb.submit_trainer(EchoMaker("m"))  # type: ignore[arg-type]
        wb.submit_trainer(DigitsTrainer("t", max_steps=1))
        with pytest.raises(ConfigError, match=r"a loop named 't' was already submitted"):
            wb.submit_trainer(DigitsTrainer("t"))
        with pytest.raises(ConfigError, match=r"placement 'nearby'; expected 'spread' or 'colocate'"):
            wb.create_bank([digits_table()], placement="nearby")
        assert wb.bank is None  # nothing was created by the refused call
        wb.wait(timeout=120)
    with pytest.raises(LifecycleError, match="while 'closed'"):
        wb.submit_trainer(DigitsTrainer("t2"))
    wb.close()  # idempotent


def test_colocated_shards_live_on_the_first_trainers_worker(client: Any) -> None:
    with Workbench(client, progress=False) as wb:
        bank = wb.create_bank([digits_table()], n_shards=2, placement="colocate")
        handle = wb.submit_trainer(DigitsTrainer("trainer", max_steps=20, publish_every=10, lr=0.02))
        wb.wait(timeout=180)
        home = wb.home_worker()
        prefix = f"{bank.name}-shard-"
        actors = wb.client.run(lambda dask_worker: sorted(k for k in dask_worker.state.actors
                                                          if str(k).startswith(prefix)))
        ran_on = wb.client.who_has(handle.future)[handle.future.key]
        results = wb.stop(timeout=30)
        assert bank.n_shards == 2
    assert len(actors[home]) == 2 and all(not keys for addr, keys in actors.items() if addr != home)
    assert list(ran_on) == [home]
    assert results["trainer"].steps == 20


def test_connecting_by_address_leaves_the_cluster_running(local_cluster: Any) -> None:
    address = local_cluster.scheduler_address  # type: ignore[attr-defined]
    with Workbench(address, progress=False) as wb:
        assert wb.cluster is None and wb.client.scheduler.address == address
        wb.submit_trainer(DigitsTrainer("trainer", max_steps=10, publish_every=5, lr=0.02))
        wb.wait(timeout=180)
        results = wb.stop(timeout=30)
    assert results["trainer"].versions == [1, 2]
    assert wb.client.status == "closed"  # its own client is closed ...
    assert len(local_cluster.scheduler_info["workers"]) == 2  # type: ignore[attr-defined]  # ... the cluster is not


def test_a_publisher_run_again_continues_the_channels_versions(client: Any) -> None:
    import torch

    from carls_dask.runtime import ModelChannel

    first = ModelChannel("restarted", prefix="t-restart")
    first.open()
    for step in (10, 20, 30):
        first.publish({"w": torch.zeros(1)}, step=step)
    again = ModelChannel("restarted", prefix="t-restart")  # as a trainer run again on another worker has it
    record = again.publish({"w": torch.ones(1)}, step=20)
    assert record.version == 4  # newer than every version readers have seen
    got = ModelChannel("restarted", prefix="t-restart").fetch(newer_than=3)
    assert got is not None and got[0].step == 20 and float(got[1]["w"][0]) == 1.0
    first.delete()


def test_a_reader_keeps_its_version_when_the_newest_payload_died_with_its_worker() -> None:
    """The worker holding the newest payload is SIGKILLed: a reader that asks for it afterwards (the
    scheduler has forgotten the key) gets the version it had within seconds, not after a long wait."""
    import os
    import signal

    import torch
    from distributed import Client, LocalCluster

    from carls_dask.runtime import ModelChannel
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        channel = ModelChannel("lost", prefix="t-lost")
        channel.open()
        channel.publish({"w": torch.zeros(1)}, step=10)
        reader = ModelChannel("lost", prefix="t-lost")
        first = reader.fetch()
        assert first is not None and first[0].version == 1
        channel.publish({"w": torch.ones(1)}, step=20)
        (holder,) = client.who_has([channel._published])[channel._published.key]
        os.kill(int(client.run(os.getpid, workers=[holder])[holder]), signal.SIGKILL)
        wait_for(lambda: channel._published.cancelled(), "the payload forgotten", 30)
        began = time.monotonic()
        got = reader.fetch(newer_than=0)
        assert time.monotonic() - began < 10
        assert got is not None and got[0].version == 1 and float(got[1]["w"][0]) == 0.0  # the version it had
        assert reader.fetch(newer_than=1) is None
        channel.publish({"w": torch.full((1,), 3.0)}, step=30)  # the restarted publisher publishes again
        again = reader.fetch(newer_than=1)
        assert again is not None and again[0].version == 3 and float(again[1]["w"][0]) == 3.0
        channel.delete()
