"""``carls-dask run --resume``: a run never loses a result.

Each rule of a resume has its test: a finished run is refused (and left byte for byte as it was) unless
it is extended past its last step; an extension keeps every segment; ``--steps`` at or below the
checkpoint is refused; every refusal comes before any write; a moved or copied run folder resumes;
Ctrl-C names the step reached, the checkpoint kept and the resume command.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dask
import pytest

from carls_dask.cli import main
from carls_dask.runtime import KnowledgeMaker, Paradigm, Trainer, resume_run, run_inline
from carls_dask.runtime.registry import register_paradigm, unregister_paradigm
from carls_dask.storage.runfolder import RunFolder
from tests.processes import CARLS_DASK, console_env, stop_process, wait_for


@dataclasses.dataclass(frozen=True)
class FitSettings:
    """Fit one weight while a maker watches.

    Parameters
    ----------
    steps
        Trainer steps.
    seed
        Unused seed.
    lr
        Learning rate.
    """

    steps: int = 30
    seed: int = 0
    lr: float = 0.1


class FitTrainer(Trainer):
    def __init__(self, s: FitSettings) -> None:
        super().__init__("trainer", max_steps=s.steps, publish_every=10, eval_every=10)
        self.s = s

    def setup(self, ctx: Any) -> None:
        import torch

        self.model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(self.model.weight)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.s.lr)

    def step(self, step: int) -> Mapping[str, float]:
        loss = (self.model.weight.sum() - 3.0) ** 2
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": float(loss.detach())}

    def evaluate(self) -> Mapping[str, float]:
        return {"weight": float(self.model.weight.item())}


class Watcher(KnowledgeMaker):
    """Looks at every published version; its figure needs a round."""

    def load_model(self, state: Mapping[str, Any], version: Any) -> None:
        self.weight = float(state["weight"].sum())

    def make(self, version: Any) -> Mapping[str, float]:
        return {"seen_step": float(version.step)}


class Fit(Paradigm):
    name = "fit-resume"
    description = "fit one weight, watched"
    settings_type = FitSettings
    headline = ("weight", "seen_step")
    cumulative = ("maker_rounds",)

    def loops(self, s: FitSettings) -> Sequence[Any]:
        return [FitTrainer(s), Watcher("watcher", source="trainer")]

    def summarize(self, s: FitSettings, results: Mapping[str, Any]) -> dict[str, Any]:
        maker = results["watcher"]
        return {"weight": results["trainer"].metrics["weight"], "maker_rounds": len(maker.rounds),
                "seen_step": maker.metrics.get("seen_step", float("nan"))}


@pytest.fixture
def fit() -> Iterator[Fit]:
    p = Fit()
    register_paradigm(p)
    try:
        with dask.config.set({"carls.run.snapshot-every": 10}):
            yield p
    finally:
        unregister_paradigm(p.name)


def folder_hash(path: pathlib.Path) -> str:
    """A hash of every file's relative path, bytes and mode below ``path`` (and of every folder's name)."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
            h.update(str(p.stat().st_mode).encode())
    return h.hexdigest()


class _Crash(Exception):
    pass


def _crashed_run(p: Fit, run: pathlib.Path, at: int, steps: int = 30) -> None:
    """A run whose process "died" after step ``at`` (its checkpoints every 10 steps stay)."""

    def crash(step: int, bank: object) -> None:
        if step == at:
            raise _Crash

    with pytest.raises(_Crash):
        run_inline(p, FitSettings(steps=steps), run_dir=run, on_step=crash)


def test_a_finished_run_is_refused_and_left_byte_for_byte_as_it_was(fit: Fit, tmp_path: pathlib.Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["run", fit.name, "--inline", "--run-dir", str(run)]) == 0
    capsys.readouterr()
    before = folder_hash(run)
    assert main(["run", "--resume", str(run)]) == 1
    err = capsys.readouterr().err
    assert f"the run finished at step 30; nothing to resume. Extend it with carls-dask run --resume {run} --steps N, " \
           "N above 30" in err
    for steps in ("30", "12"):
        assert main(["run", "--resume", str(run), "--steps", steps]) == 1
        assert f"--steps {steps} is not above step 30, where the run finished; expected N > 30" in capsys.readouterr().err
    assert folder_hash(run) == before


def test_extending_a_finished_run_keeps_every_segment(fit: Fit, tmp_path: pathlib.Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["run", fit.name, "--inline", "--run-dir", str(run)]) == 0
    first = json.loads((run / "result.json").read_text())
    capsys.readouterr()
    result = resume_run(run, steps=60, progress=True)
    bar = capsys.readouterr().err.replace("\r", "\n")
    # the bar starts at the checkpoint's step: its first drawing is 30/60, never 0/60
    drawn = [line for line in bar.splitlines() if "/60" in line]
    assert drawn and "30/60" in drawn[0] and not any(" 0/60" in line for line in drawn), drawn
    data = json.loads((run / "result.json").read_text())
    assert data == result.to_json() and data["schema"] == "carls-dask/result/2"
    one, two = data["segments"]
    assert (one["from_step"], one["to_step"], two["from_step"], two["to_step"]) == (None, 30, 30, 60)
    assert one["figures"] == first["figures"] and one["wall_seconds"] == first["wall_seconds"]
    # rounds, steps and wall time add up over the segments; the figures are the newest measurement
    assert one["loops"]["watcher"]["steps"] == 3 and two["loops"]["watcher"]["steps"] == 3
    assert data["loops"]["watcher"]["steps"] == 6 and data["figures"]["maker_rounds"] == 6
    assert data["loops"]["trainer"]["steps"] == 60 and data["loops"]["trainer"]["step"] == 60
    assert data["wall_seconds"] == pytest.approx(one["wall_seconds"] + two["wall_seconds"])
    assert data["started"] == first["started"] and data["figures"]["seen_step"] == 60
    assert data["settings"]["steps"] == 60 and data["run_id"] == first["run_id"]
    assert json.loads((run / "request.json").read_text())["settings"]["steps"] == 60
    straight = run_inline(fit, FitSettings(steps=60))
    assert data["figures"]["weight"] == straight["weight"]  # the extension continued the trained weight
    # a third segment keeps both earlier ones
    resume_run(run, steps=70)
    third = json.loads((run / "result.json").read_text())
    assert [s["to_step"] for s in third["segments"]] == [30, 60, 70] and third["figures"]["maker_rounds"] == 7


def test_steps_at_or_below_the_checkpoint_are_refused_before_any_write(fit: Fit, tmp_path: pathlib.Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    _crashed_run(fit, run, at=25)
    assert RunFolder(run).state_steps("trainer") == [10, 20] and not (run / "result.json").exists()
    before = folder_hash(run)
    for steps in ("20", "5"):
        assert main(["run", "--resume", str(run), "--steps", steps]) == 1
        assert (f"--steps {steps} is at or below the checkpoint at step 20; expected N > 20, or no --steps to "
                "continue to step 30") in capsys.readouterr().err
    assert folder_hash(run) == before
    # without --steps it continues to the requested 30
    assert main(["run", "--resume", str(run)]) == 0
    assert "resumed from step 20" in capsys.readouterr().out
    data = json.loads((run / "result.json").read_text())
    assert data["resumed_from"] == 20 and data["loops"]["trainer"]["step"] == 30


def test_a_run_that_mixes_two_runs_or_has_no_checkpoint_is_refused_before_any_write(
        fit: Fit, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    early = tmp_path / "early"
    _crashed_run(fit, early, at=5)
    before = folder_hash(early)
    assert main(["run", "--resume", str(early)]) == 1
    assert "no checkpoint of trainer 'trainer' to continue from" in capsys.readouterr().err
    assert folder_hash(early) == before

    mixed = tmp_path / "mixed"
    _crashed_run(fit, mixed, at=25)
    request = json.loads((mixed / "request.json").read_text())
    (mixed / "request.json").write_text(json.dumps({**request, "run_id": "another-run"}))
    before = folder_hash(mixed)
    assert main(["run", "--resume", str(mixed)]) == 1
    err = capsys.readouterr().err
    assert f"request.json names run 'another-run' but metrics.zarr belongs to run {request['run_id']!r}" in err
    assert "the folder mixes two runs, so it is left as it is" in err
    assert folder_hash(mixed) == before


def test_a_moved_or_copied_run_folder_resumes(fit: Fit, tmp_path: pathlib.Path) -> None:
    original = tmp_path / "original"
    _crashed_run(fit, original, at=25)
    copy = tmp_path / "elsewhere" / "copy-of-run"
    shutil.copytree(original, copy)
    moved = tmp_path / "moved"
    original.rename(moved)
    straight = run_inline(fit, FitSettings(steps=30))
    for run in (copy, moved):
        result = resume_run(run)
        assert result.resumed_from == 20 and result["weight"] == straight["weight"], run
        assert result.run_id == json.loads((run / "request.json").read_text())["run_id"]
    assert json.loads((copy / "result.json").read_text())["run_id"] == json.loads(
        (moved / "result.json").read_text())["run_id"]  # one run's identity, in two folders


@pytest.mark.parametrize("driver", [pytest.param(["--inline"], id="inline"),
                                    pytest.param([], id="workbench", marks=pytest.mark.slow)])
def test_ctrl_c_names_the_step_the_checkpoint_and_the_resume_command(driver: list[str],
                                                                      tmp_path: pathlib.Path) -> None:
    """The installed command, from a folder outside the checkout, stopped by SIGINT to its process group (a
    terminal's Ctrl-C, which on a LocalCluster reaches the workers too)."""
    run = tmp_path / "run"
    err = tmp_path / "err.txt"
    env = console_env(DASK_CARLS__RUN__SNAPSHOT_EVERY="20", DASK_CARLS__CLUSTER__N_WORKERS="1")
    with err.open("w") as errf:
        proc = subprocess.Popen(
            [CARLS_DASK, "run", "curriculum", "-o", "dataset=digits", "-o", "publish_every=20", "-o",
             "refresh_every=20", "--steps", "100000", "--run-dir", str(run), *driver],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=errf, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as a terminal starts it
    try:
        states = run / "checkpoints" / "trainer"
        wait_for(lambda: proc.poll() is not None or (states.is_dir() and len(list(states.glob("step-*.pt"))) >= 2),
                 "two checkpoints", 240)
        assert proc.poll() is None, err.read_text()[-3000:]
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        assert proc.wait(timeout=120) == 130, err.read_text()[-3000:]
        stopped_in = time.monotonic() - t0
    finally:
        stop_process(proc, group=True)
    text = err.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    lines = [line for line in text.replace("\r", "\n").splitlines() if line.startswith("carls-dask run:")]
    assert len(lines) == 1, lines
    kept = RunFolder(run).state_steps("trainer")[-1]
    assert lines[0].startswith("carls-dask run: interrupted at step ")
    reached = int(lines[0].split("interrupted at step ")[1].split(";")[0])
    assert lines[0].endswith(f"; checkpoint at step {kept} kept in {run}; continue with: carls-dask run --resume {run}")
    assert 40 <= kept <= reached and stopped_in < 60
    assert not (run / "result.json").exists()
    assert RunFolder(run).unknown() == []  # the Workbench's run.json included
