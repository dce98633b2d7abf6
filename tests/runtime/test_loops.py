"""The pure parts of the runtime: lifecycle, the in-memory channel and the loops, run in threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch

from carls_dask.errors import ConfigError, LifecycleError
from carls_dask.runtime import (
    KnowledgeMaker,
    Lifecycle,
    LocalModelChannel,
    LoopContext,
    ModelVersion,
    State,
    ThreadStop,
    Trainer,
    run_maker,
    run_trainer,
)
from carls_dask.runtime.progress import ProgressBook


class CountingTrainer(Trainer):
    """Learns w -> 3.0 by gradient descent; records the hook calls."""

    def __init__(self, name: str = "t", *, max_steps: int | None = 40, publish_every: int | None = 10,
                 fail_at: int | None = None, step_sleep: float = 0.0) -> None:
        super().__init__(name, max_steps=max_steps, publish_every=publish_every)
        self.fail_at = fail_at
        self.step_sleep = step_sleep
        self.calls: list[str] = []

    def setup(self, ctx: LoopContext) -> None:
        self.calls.append("setup")
        self.model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(self.model.weight)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.2)

    def step(self, step: int) -> Mapping[str, float]:
        if self.fail_at is not None and step == self.fail_at:
            raise ValueError(f"planned failure at step {step}")
        time.sleep(self.step_sleep)
        loss = (self.model.weight.sum() - 3.0) ** 2
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": float(loss.detach())}

    def finish(self) -> float:
        return float(self.model.weight.item())

    def teardown(self) -> None:
        self.calls.append("teardown")


class WeightMaker(KnowledgeMaker):
    """Reads the published weight; remembers (version, step, weight) per round."""

    def setup(self, ctx: LoopContext) -> None:
        self.seen: list[tuple[int, int, float]] = []
        self.weight = float("nan")

    def load_model(self, state: Mapping[str, Any], version: ModelVersion) -> None:
        self.weight = float(state["weight"].item())

    def make(self, version: ModelVersion) -> Mapping[str, float]:
        self.seen.append((version.version, version.step, self.weight))
        return {"weight": self.weight}

    def finish(self) -> list[tuple[int, int, float]]:
        return self.seen


def _ctx(kind: str, channel: LocalModelChannel, stop: ThreadStop, reports: list[Any] | None = None,
         **kw: Any) -> LoopContext:
    sink = reports if reports is not None else []
    return LoopContext(name=kind, kind=kind, device="cpu", channel=channel, stop=stop,
                       report=lambda v: sink.append(dict(v)), **kw)


def test_lifecycle_allows_documented_transitions_and_refuses_others() -> None:
    life = Lifecycle("loop 'x'")
    assert life.state is State.CREATED
    assert life.to(State.RUNNING) is State.CREATED
    life.to(State.STOPPING)
    with pytest.raises(LifecycleError, match=r"loop 'x': cannot go from 'stopping' to 'running'"):
        life.to(State.RUNNING)
    assert life.state is State.STOPPING  # unchanged by the refused transition
    life.to(State.CLOSED)
    with pytest.raises(LifecycleError, match="allowed: none"):
        life.to(State.FAILED)
    with pytest.raises(LifecycleError, match="cannot submit while 'closed'; it must be 'running'"):
        life.require(State.RUNNING, action="submit")


def test_local_channel_keeps_only_the_newest_version() -> None:
    channel = LocalModelChannel("t")
    assert channel.fetch(0) is None
    w = torch.ones(2, requires_grad=True)
    v1 = channel.publish({"w": w * 1}, step=10, producer="t")
    v2 = channel.publish({"w": w * 2}, step=20, producer="t")
    assert (v1.version, v2.version, v2.step, v2.producer) == (1, 2, 20, "t")
    got = channel.fetch(newer_than=0)
    assert got is not None
    record, state = got
    assert record == v2
    assert torch.equal(state["w"], torch.full((2,), 2.0))
    assert not state["w"].requires_grad  # detached copy on the CPU
    assert channel.fetch(newer_than=2) is None
    t0 = time.monotonic()
    assert channel.fetch(newer_than=2, timeout=0.2) is None
    assert time.monotonic() - t0 >= 0.19


def test_trainer_publishes_every_n_steps_and_its_final_model() -> None:
    channel = LocalModelChannel("t")
    reports: list[Any] = []
    trainer = CountingTrainer(max_steps=45, publish_every=10)
    result = run_trainer(trainer, _ctx("trainer", channel, ThreadStop(), reports, report_interval=0.0))
    assert result.reason == "max_steps"
    assert result.steps == 45
    assert [v.step for v in result.published] == [10, 20, 30, 40, 45]
    assert result.versions == [1, 2, 3, 4, 5]
    assert result.value == pytest.approx(3.0, abs=1e-3)  # converged
    assert result.metrics["loss"] < 1e-5
    assert result.state is not None and result.state["step"] == 45
    assert trainer.calls == ["setup", "teardown"]
    assert reports[-1]["step"] == 45.0 and "steps_per_s" in reports[-1]
    got = channel.fetch(0)
    assert got is not None and got[0].step == 45


def test_trainer_resumes_from_a_checkpoint() -> None:
    first = run_trainer(CountingTrainer(max_steps=5, publish_every=5),
                        _ctx("trainer", LocalModelChannel("t"), ThreadStop()))
    assert first.state is not None and first.state["step"] == 5
    channel = LocalModelChannel("t")
    resumed = CountingTrainer(max_steps=12, publish_every=5)
    resumed.resume_from = first.state
    second = run_trainer(resumed, _ctx("trainer", channel, ThreadStop()))
    assert second.steps == 7  # steps 5..11
    assert [v.step for v in second.published] == [10, 12]
    straight = run_trainer(CountingTrainer(max_steps=12, publish_every=5),
                           _ctx("trainer", LocalModelChannel("t"), ThreadStop()))
    assert second.value == pytest.approx(straight.value, abs=1e-6)  # same weights as one uninterrupted run


def test_trainer_failure_propagates_unchanged_and_tears_down() -> None:
    trainer = CountingTrainer(fail_at=7)
    with pytest.raises(ValueError, match="planned failure at step 7"):
        run_trainer(trainer, _ctx("trainer", LocalModelChannel("t"), ThreadStop()))
    assert trainer.calls == ["setup", "teardown"]


def test_step_returning_a_non_number_is_a_clear_error() -> None:
    class Bad(CountingTrainer):
        def step(self, step: int) -> Mapping[str, Any]:  # type: ignore[override]
            return {"loss": "low"}

    with pytest.raises(TypeError, match=r"Bad.step returned loss='low'; expected a number"):
        run_trainer(Bad(), _ctx("trainer", LocalModelChannel("t"), ThreadStop()))


def test_bad_arguments_name_the_loop() -> None:
    with pytest.raises(ConfigError, match=r"Trainer 'x': max_steps must be a non-negative int or None, got -1"):
        Trainer("x", max_steps=-1)
    with pytest.raises(ConfigError, match="publish_every must be a positive int"):
        Trainer("x", publish_every=0)
    with pytest.raises(ConfigError, match="non-empty string"):
        KnowledgeMaker("")
    with pytest.raises(ConfigError, match=r"KnowledgeMaker 'm': max_rounds must be a positive int"):
        KnowledgeMaker("m", max_rounds=0)


def test_maker_sees_increasing_versions_and_stops_within_its_poll_interval() -> None:
    channel = LocalModelChannel("t")
    stop = ThreadStop()
    maker = WeightMaker("m")
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.setdefault("r", run_maker(maker, _ctx(
        "maker", channel, stop, poll_interval=0.02))))
    thread.start()
    trainer = CountingTrainer(max_steps=60, publish_every=5, step_sleep=0.005)
    tres = run_trainer(trainer, _ctx("trainer", channel, ThreadStop()))
    time.sleep(0.1)
    t0 = time.monotonic()
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert time.monotonic() - t0 < 5.0  # bounded by the poll interval (0.02 s) plus one round, with slack
    result = out["r"]
    assert result.reason == "stopped"
    versions = result.versions
    assert len(versions) >= 3
    assert versions == sorted(set(versions))  # strictly increasing
    assert versions[-1] == tres.versions[-1]  # it used the trainer's final model
    steps = [r.model_step for r in result.rounds]
    assert steps == sorted(steps) and steps[-1] == 60
    assert all(0.0 <= r.staleness < 5.0 for r in result.rounds)
    # the weights it saw move towards the trainer's target as versions increase
    weights = [w for _, _, w in result.value]
    assert weights[-1] == pytest.approx(tres.value, abs=1e-6)
    assert abs(weights[-1] - 3.0) < abs(weights[0] - 3.0)


def test_maker_final_pass_picks_up_a_version_published_before_the_stop() -> None:
    channel = LocalModelChannel("t")
    stop = ThreadStop()
    channel.publish({"weight": torch.tensor([[1.0]])}, step=5)
    stop.set()  # stop is already requested: only the final pass runs
    result = run_maker(WeightMaker("m"), _ctx("maker", channel, stop))
    assert result.versions == [1]
    no_pass = run_maker(WeightMaker("m", final_pass=False), _ctx("maker", channel, stop))
    assert no_pass.versions == []


def test_progress_book_flattens_and_aliases_for_dashboards() -> None:
    book = ProgressBook()
    book.update({"loop": "t", "kind": "trainer", "time": 1.0, "step": 30, "steps_per_s": 12.5, "loss": 0.5,
                 "worker": "tcp://127.0.0.1:1"})
    book.update({"loop": "m", "kind": "maker", "version": 3, "staleness_s": 0.25, "accuracy": None})
    row = book.row()
    assert row["t.step"] == 30.0 and row["train_loss"] == 0.5 and row["steps_per_s"] == 12.5
    assert row["maker_version"] == 3.0 and row["maker_staleness_s"] == 0.25
    assert "t.worker" not in row and "t.time" not in row
    assert book.trainer_step() == 30
    assert "m v3 stale 0.25s" in book.summary()


def test_trainer_checkpoints_every_n_steps_keeps_the_newest_and_continues_from_them(tmp_path: Any) -> None:
    from carls_dask.runtime import Checkpointer

    cp = Checkpointer(str(tmp_path), every=10, keep=2)
    first = run_trainer(CountingTrainer(max_steps=45, publish_every=10),
                        _ctx("trainer", LocalModelChannel("t"), ThreadStop(), checkpoint=cp))
    assert first.resumed_at is None and first.step == 45
    # states at 10, 20, 30, 40 and the final one at 45; the newest two are kept
    assert sorted(p.name for p in cp.state_dir("t").iterdir()) == ["step-000000040.pt", "step-000000045.pt"]
    assert cp.newest_step("t") == 45
    again = run_trainer(CountingTrainer(max_steps=60, publish_every=10),
                        _ctx("trainer", LocalModelChannel("t"), ThreadStop(), checkpoint=cp))
    assert (again.resumed_at, again.steps, again.step) == (45, 15, 60)
    straight = run_trainer(CountingTrainer(max_steps=60, publish_every=10),
                           _ctx("trainer", LocalModelChannel("t"), ThreadStop()))
    assert again.value == pytest.approx(straight.value, abs=1e-7)


def test_trainer_evaluates_every_n_steps_and_reports_by_step() -> None:
    class Evaluated(CountingTrainer):
        def evaluate(self) -> Mapping[str, float]:
            self.calls.append(f"evaluate@{self.start_step}")
            return {"weight": float(self.model.weight.item())}

    reports: list[Any] = []
    trainer = Evaluated(max_steps=25, publish_every=100)
    trainer.eval_every = 10
    result = run_trainer(trainer, _ctx("trainer", LocalModelChannel("t"), ThreadStop(), reports, metrics_every=5))
    assert [c for c in trainer.calls if c.startswith("evaluate")] == ["evaluate@10", "evaluate@20", "evaluate@25"]
    assert [r["step"] for r in reports] == [5.0, 10.0, 15.0, 20.0, 25.0, 25.0]  # every 5 steps, then the final one
    assert "weight" not in reports[0] and reports[-1]["weight"] == result.metrics["weight"]
    assert reports[1]["weight"] != reports[3]["weight"]  # the figures of each evaluation, as it happened
    assert [v.step for v in result.published] == [25]  # the final model is published at the end


class LayerTrainer(Trainer):
    """Trains a bank table through a BankEmbedding and a linear head: its pushes travel through the bank's queue."""

    def setup(self, ctx: LoopContext) -> None:
        from carls_dask.nn import BankEmbedding

        torch.manual_seed(0)
        self.model = torch.nn.Sequential(BankEmbedding(ctx.bank, "items"), torch.nn.Linear(4, 1))
        self.optimizer = torch.optim.SGD(self.model[1].parameters(), lr=0.1)

    def step(self, step: int) -> Mapping[str, float]:
        keys = torch.arange(8) + (step % 2) * 4
        self.model[0].prefetch(torch.arange(8) + ((step + 1) % 2) * 4)
        loss = (self.model(keys) ** 2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": float(loss.detach())}


def test_rows_a_trainer_s_layer_trains_carry_its_name_and_step_and_its_steps_report_their_bank_cost() -> None:
    from carls_dask.bank import Column, KnowledgeBank, TableSpec
    from carls_dask.storage.runfolder import BANK_MESSAGES_PER_STEP, TRAINER_CPU_MS_PER_STEP

    spec = TableSpec("items", columns=(Column("embedding", shape=(4,)),), optimizer="sgd", learning_rate=0.1)
    reports: list[Any] = []
    with KnowledgeBank.local([spec], n_shards=2) as bank:
        result = run_trainer(LayerTrainer("ranker", max_steps=6, publish_every=100),
                             _ctx("trainer", LocalModelChannel("ranker"), ThreadStop(), reports, bank=bank, metrics_every=3,
                                  report_interval=0.0))
        assert result.steps == 6
        # the last step's push landed by the end (flushed), with the trainer's name and step
        got = bank.lookup("items", np.arange(12))
        assert got.model_step[4:12].tolist() == [5] * 8 and got.model_step[:4].tolist() == [4] * 4
        makers = {s["meta"]["makers"][c] for s in bank.export_state() for c in s["tables"]["items"]["prov/maker"]}
        assert makers == {"ranker"}
    rows = [r for r in reports if BANK_MESSAGES_PER_STEP in r]
    # one message to each of the two shards per step (the previous step's push rides with the next prefetch)
    assert rows and all(r[BANK_MESSAGES_PER_STEP] == 2.0 for r in rows[1:]) and rows[0][TRAINER_CPU_MS_PER_STEP] > 0
