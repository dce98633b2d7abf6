"""The run folder has one owner (``carls_dask.storage.runfolder``); damaged runs and misplaced paths are named.

A real inline run is walked entry by entry: an entry the module does not know fails the test. No module
of the package spells a run file's name itself. The readers say what a finished run lacks, and the
Python API answers a run folder given where its bank or metric store was meant with that hint.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import dask
import pytest

from carls_dask.cli import main
from carls_dask.errors import StoreNotFoundError
from carls_dask.storage import open_bank, open_metrics
from carls_dask.storage.runcheck import run_damage
from carls_dask.storage.runfolder import ENTRIES, RESULT, RunFolder

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A finished inline run with a bank, makers, checkpoints and held-out truth (curriculum on digits)."""
    from carls_dask.paradigms.curriculum import Curriculum
    from carls_dask.runtime import run_inline

    run = tmp_path_factory.mktemp("runs") / "run"
    p = Curriculum()
    settings = p.settings(None, dataset="digits", n_train=None, n_test=None, steps=40, publish_every=10,
                          refresh_every=10, batch_size=32)
    with dask.config.set({"carls.run.snapshot-every": 20}):
        run_inline(p, settings, run_dir=run)
    return run


def _copy(run: pathlib.Path, to: pathlib.Path) -> pathlib.Path:
    shutil.copytree(run, to)
    return to


def test_every_entry_of_a_real_run_folder_is_known(finished: pathlib.Path, tmp_path: pathlib.Path) -> None:
    run = RunFolder(finished)
    names = sorted(p.name for p in finished.iterdir())
    assert {"request.json", "result.json", "metrics.zarr", "bank", "checkpoints", "truth.npz"} <= set(names)
    assert set(names) <= set(ENTRIES), names
    assert run.unknown() == []
    assert run.state_steps("trainer") == [20, 40] and run.finished() and run.is_run()
    request = run.read_json("request.json")
    assert request is not None and request["primary"] == "trainer" and len(request["run_id"]) == 32
    # a stray file or folder, at the top or among the states, is named
    odd = RunFolder(_copy(finished, tmp_path / "odd"))
    (odd.path / "notes.txt").write_text("mine")
    (odd.path / "truth.npz").unlink()
    (odd.path / "truth.npz").mkdir()  # a folder where a file belongs
    (odd.state_dir("trainer") / "old.pt").write_bytes(b"")
    (odd.path / ".result.json.tmp").write_text("{}")  # a result being written belongs to the result
    assert odd.unknown() == ["notes.txt", "truth.npz", "checkpoints/trainer/old.pt"]


def test_no_module_spells_a_run_file_name_itself() -> None:
    """Writers and readers take the names from carls_dask.storage.runfolder (this test's literals aside)."""
    names = "|".join(re.escape(n) for n, kind in ENTRIES.items() if kind == "file" or "." in n)
    pattern = rf"[\"']({names}|checkpoints)[\"']|/ [\"']bank[\"']"
    proc = subprocess.run(["git", "grep", "-nE", pattern, "--", "carls_dask", "storage", "paradigms", "dashboards",
                           "benchmarks", ":!storage/runfolder.py"], cwd=ROOT, capture_output=True, text=True)
    assert proc.stdout == "", f"run-file names spelled outside storage/runfolder.py:\n{proc.stdout}"


def test_open_bank_and_open_metrics_answer_in_the_users_terms(finished: pathlib.Path, tmp_path: pathlib.Path) -> None:
    run = RunFolder(finished)
    with pytest.raises(StoreNotFoundError, match=re.escape(f"; {finished} is a run folder: its bank store is {run.bank}")):
        open_bank(finished)
    with pytest.raises(StoreNotFoundError,
                       match=re.escape(f"; {finished} is a run folder: its metric store is {run.metrics}")):
        open_metrics(finished)
    with pytest.raises(StoreNotFoundError, match=r"no such folder; expected a run's bank folder \(RUN/bank\)"):
        open_bank(tmp_path / "nowhere")
    with pytest.raises(StoreNotFoundError, match=r"no such folder; expected a run's metrics.zarr folder"):
        open_metrics(tmp_path / "nowhere")
    # a step past the newest the store holds is an error naming the newest step
    assert int(open_bank(run.bank, step=40).attrs["step"]) == 40
    with pytest.raises(StoreNotFoundError, match=r"step 99999 is past the newest step it holds, 40 \(newest snapshot "
                                                 r"v\d+ at step 40, then the delta log\); expected a step <= 40"):
        open_bank(run.bank, step=99999)


def test_a_finished_run_that_lacks_a_part_is_named_by_report_and_dashboard(
        finished: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    from carls_dask.dashboards.runreader import RunReader
    from carls_dask.dashboards.views.learning import LearningView

    assert run_damage(finished) == []
    run = _copy(finished, tmp_path / "damaged")
    shutil.rmtree(run / "metrics.zarr")
    (run / "bank" / "manifest.json").write_text("{not json")
    damage = run_damage(run)
    assert damage[0] == "metrics.zarr (the metric store: the learning curves) is missing"
    assert damage[1].startswith("bank/ cannot be read (") and "manifest.json is not valid JSON" in damage[1]
    out = tmp_path / "report.html"
    assert main(["report", str(run), "-o", str(out)]) == 1
    said = capsys.readouterr()
    assert f"carls-dask report: wrote {out}" in said.out and out.is_file()  # what there is, is reported
    assert (f"carls-dask report: error: run {run} finished, but metrics.zarr (the metric store: the learning "
            "curves) is missing; bank/ cannot be read") in said.err
    assert "finished, but metrics.zarr (the metric store: the learning curves) is missing" in out.read_text()
    assert main(["dashboard", str(run), "--dry-run"]) == 0
    assert f"carls-dask dashboard: run {run} finished, but metrics.zarr" in capsys.readouterr().err
    view = LearningView(reader=RunReader(run))
    view.refresh()
    assert view.message.startswith("This run finished, but metrics.zarr (the metric store: the learning curves) "
                                   "is missing") and view.message.endswith(": the curves cannot be shown.")
    from carls_dask.dashboards.dashboard import Dashboard

    dash = Dashboard(run)
    dash.refresh()
    assert "**finished, but metrics.zarr (the metric store: the learning curves) is missing" in dash.status.object
    # a run still going (no result.json yet) is not damaged: it has not written everything yet
    (run / RESULT).unlink()
    assert run_damage(run) == []
    view.refresh()
    assert view.message == "No metric store yet: the curves appear when the run writes its first metrics."


def test_a_result_whose_snapshot_is_gone_is_named(finished: pathlib.Path, tmp_path: pathlib.Path) -> None:
    run = _copy(finished, tmp_path / "pruned")
    result = json.loads((run / RESULT).read_text())
    newest = result["snapshots"][-1]
    result["snapshots"].append({"version": newest["version"] + 5, "step": 80})
    (run / RESULT).write_text(json.dumps(result))
    (damage,) = run_damage(run)
    assert damage.startswith(f"bank/ lacks snapshot v{newest['version'] + 5} (step 80) that result.json lists")
