"""The curriculum on a real two-worker LocalCluster: the run folder the dashboards open, and the CLI registration."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from carls_dask.errors import ConfigError
from carls_dask.paradigms.curriculum import CurriculumSettings
from carls_dask.paradigms.curriculum.run import main, run_curriculum
from carls_dask.runtime.registry import RunRequest, available_paradigms, get_paradigm


def test_run_curriculum_writes_a_run_folder(client: object, tmp_path: pathlib.Path) -> None:
    from carls_dask.dashboards.curriculum import pacing_vs_realised
    from carls_dask.storage import open_bank
    from carls_dask.storage.metrics import open_metrics
    from carls_dask.storage.snapshots import list_snapshots

    settings = CurriculumSettings(dataset="digits", n_train=None, n_test=None, noise=0.3, steps=200, batch_size=64,
                                  hidden=64, lr=3e-3, publish_every=40, refresh_every=10, warmup=0.2,
                                  clean_confidence=0.6, threads=1)
    run = tmp_path / "run"
    summary = run_curriculum(settings, run, makers=2, cluster=client, progress=False, timeout=240)
    assert summary["trainer_steps"] == 200
    assert set(summary["maker_rounds"]) == {"maker-0", "maker-1"}
    assert all(n >= 1 for n in summary["maker_rounds"].values())
    assert 0.5 < summary["test_accuracy"] <= 1.0
    ds = open_bank(run / "bank", table="nodes").load()
    # the two makers each scored their half of the 1348 training images, with provenance
    assert ds.sizes["key"] == 1348
    assert set(np.unique(ds["maker"].values)) <= {"maker-0", "maker-1"}
    assert (ds["maker"].values[ds["key"].values % 2 == 0] != "maker-1").all()
    assert int(ds["model_step"].min()) >= 40 and np.isfinite(ds["difficulty"].values).all()
    assert len(list_snapshots(run / "bank")) >= 1
    metrics = open_metrics(run / "metrics.zarr").load()
    pv = pacing_vs_realised(metrics)
    assert pv is not None
    realised = pv["realised"].dropna("step").values
    assert realised.size and (realised > 0).all() and (realised <= 1).all()
    truth = np.load(run / "truth.npz")
    assert truth["labels"].shape == (1348,)
    saved = json.loads((run / "curriculum.json").read_text())
    assert saved["settings"]["noise"] == 0.3
    assert json.loads((run / "run.json").read_text())["state"] == "closed"


def test_curriculum_is_a_registered_paradigm_and_checks_its_options(tmp_path: pathlib.Path) -> None:
    assert "curriculum" in available_paradigms()
    assert get_paradigm("curriculum") is main
    with pytest.raises(ConfigError, match="option 'speed'"):
        main(RunRequest("curriculum", tmp_path / "r", 10, {"speed": "fast"}))
    with pytest.raises(ConfigError, match="makers='0'"):
        main(RunRequest("curriculum", tmp_path / "r", 10, {"makers": "0"}))
    assert not (tmp_path / "r").exists()  # bad options change nothing
