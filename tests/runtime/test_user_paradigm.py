"""A paradigm carls-dask knows nothing about (:mod:`tests.recsys`): run by import path on both drivers, resumed by
import path in a fresh process, and a plain Workbench writing the run folder a paradigm run writes."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import dask
import numpy as np
import pytest

from carls_dask.errors import ConfigError
from carls_dask.runtime import Workbench, run_paradigm
from carls_dask.runtime.registry import get_paradigm, load_paradigm, paradigm_path
from carls_dask.runtime.runner import recorded_paradigm, resume_run
from carls_dask.storage import list_snapshots, open_bank, open_metrics
from tests.processes import CARLS_DASK, console_env
from tests.recsys import HIST, ITEMS, STATS, USERS, NeighbourMaker, Recsys, TwoTowerTrainer, tables

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _steps(run: pathlib.Path) -> list[int]:
    return [int(s["step"]) for s in list_snapshots(run / "bank")]


def test_a_paradigm_named_by_its_import_path_runs_and_the_folder_records_it(recsys_run: pathlib.Path) -> None:
    request = json.loads((recsys_run / "request.json").read_text())
    assert (request["paradigm"], request["paradigm_path"], request["driver"]) == ("recsys", "tests.recsys:Recsys", "inline")
    result = json.loads((recsys_run / "result.json").read_text())
    assert set(result["figures"]) == {"recall@5", "nb_planted_cos", "rounds"} and result["figures"]["rounds"] == 3
    assert result["figures"]["recall@5"] > 0.5  # 4 planted groups: a user's top 5 by chance hold 0.25 of its own
    assert _steps(recsys_run) == [10, 20, 30]
    assert isinstance(recorded_paradigm(recsys_run), Recsys)
    assert paradigm_path(Recsys()) == "tests.recsys:Recsys" and isinstance(get_paradigm("tests.recsys:Recsys"), Recsys)
    with pytest.raises(ConfigError, match=r"unknown paradigm 'recsys'; available: .*or an import path package.module:Class"):
        get_paradigm("recsys")
    with pytest.raises(ConfigError, match=r"paradigm 'tests.nowhere:Recsys': cannot import module 'tests.nowhere'"):
        load_paradigm("tests.nowhere:Recsys")
    with pytest.raises(ConfigError, match=r"module 'tests.recsys' has no attribute 'Nope'"):
        load_paradigm("tests.recsys:Nope")
    with pytest.raises(ConfigError, match=r"expected a Paradigm subclass or instance, got function"):
        load_paradigm("tests.recsys:tables")


def test_a_fresh_process_resumes_it_by_its_import_path(recsys_run: pathlib.Path, tmp_path: pathlib.Path) -> None:
    run = shutil.copytree(recsys_run, tmp_path / "copy")  # a copied run folder resumes (its id is in request.json)
    # From the folder that holds the user's package, as a user types it; the console script's sys.path does not
    # hold that folder, so the module is found as `python -m` finds one.
    out = subprocess.run([CARLS_DASK, "run", "--resume", str(run), "--steps", "40"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env=console_env(DASK_CARLS__RUN__SNAPSHOT_EVERY="10"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "recsys default (seed 0): recall@5" in out.stdout and "resumed from step 30" in out.stdout
    result = json.loads((run / "result.json").read_text())
    assert [s["to_step"] for s in result["segments"]] == [30, 40] and result["figures"]["rounds"] >= 4
    assert _steps(run) == [10, 20, 30, 40]
    assert int(open_metrics(run / "metrics.zarr")["step"].max()) == 40

    # A folder whose request names no import path of an unregistered paradigm says what to do.
    request = json.loads((run / "request.json").read_text())
    del request["paradigm_path"]
    (run / "request.json").write_text(json.dumps(request))
    with pytest.raises(ConfigError, match=r"records no import path of the paradigm: register it, or start the run again "
                                          r"with carls-dask run package.module:Class"):
        resume_run(run, steps=50)


def test_the_dask_driver_runs_it_and_its_maker_loads_the_bank_layers_records(client: object, tmp_path: pathlib.Path) -> None:
    p = Recsys()
    with dask.config.set({"carls.run.snapshot-every": 10}):
        result = run_paradigm(p, p.settings(steps=20), run_dir=tmp_path / "run", cluster=client, progress=False)
    assert result.driver == "workbench" and [s["step"] for s in result.snapshots] == [10, 20]
    assert result.figures["rounds"] >= 1 and np.isfinite(result.figures["nb_planted_cos"])
    stats = open_bank(tmp_path / "run" / "bank", table=STATS)
    assert stats.sizes["key"] == 48 and set(np.unique(stats["maker"].values)) == {"neighbours"}
    assert json.loads((tmp_path / "run" / "request.json").read_text())["paradigm_path"] == "tests.recsys:Recsys"


def test_a_plain_workbench_writes_the_bank_store_snapshots_states_and_result(client: object, tmp_path: pathlib.Path) -> None:
    s = Recsys().settings(steps=20)
    run = tmp_path / "plain"
    with dask.config.set({"carls.run.snapshot-every": 10}), Workbench(client, run_dir=run, progress=False) as wb:
        wb.create_bank(tables(s), n_shards=2)  # no log_root: the Workbench keeps its run folder itself
        wb.submit_trainer(TwoTowerTrainer(s))
        wb.submit_maker(NeighbourMaker(s))
        wb.wait(timeout=300)
        results = wb.stop(timeout=60)
    assert _steps(run) == [10, 20]  # the primary trainer's checkpoint at 10, the Workbench's own at the end
    assert sorted(p.name for p in (run / "checkpoints" / "trainer").iterdir()) == ["step-000000010.pt", "step-000000020.pt"]
    result = json.loads((run / "result.json").read_text())
    assert result["driver"] == "workbench" and result["paradigm"] == "" and result["seed"] is None
    assert result["figures"] == {"recall@5": results["trainer"].value["recall@5"]}
    assert result["snapshots"] == [{"version": 1, "step": 10}, {"version": 2, "step": 20}]
    assert set(result["loops"]) == {"trainer", "neighbours"} and result["loops"]["trainer"]["steps"] == 20
    assert {t: open_bank(run / "bank", table=t).sizes["key"] for t in (ITEMS, USERS, STATS, HIST)} == \
        {ITEMS: 48, USERS: 40, STATS: 48, HIST: 40}
