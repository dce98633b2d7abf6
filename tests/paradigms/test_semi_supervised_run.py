"""The semi-supervised paradigm end to end on a real LocalCluster: bank, makers, run folder."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from carls_dask.paradigms.data.planetoid import find_data_dir
from carls_dask.paradigms.semi_supervised.core import SemiSupervisedConfig
from carls_dask.paradigms.semi_supervised.run import ALL_NODES, config_from_options, run_semi_supervised
from carls_dask.storage.errors import ConfigError, StoreNotFoundError


@pytest.fixture(scope="module")
def data_dir() -> pathlib.Path:
    try:
        return find_data_dir()
    except StoreNotFoundError as exc:
        pytest.skip(f"the Planetoid files are not present: {exc}")


def test_bank_run_writes_knowledge_with_provenance_and_pseudo_label_quality(
    client: object, data_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    from carls_dask.storage import open_bank, open_metrics

    cfg = SemiSupervisedConfig(mode="bank", pseudo_labels=True, k=3, steps=24, unlabelled_batch=64,
                               hidden=(32,), threshold=0.3, eval_every=8, seed=1)
    run = tmp_path / "run"
    result = run_semi_supervised(cfg, cluster=client, run_dir=run, data_dir=data_dir, publish_every=6,
                                 progress=False, timeout=240)
    assert result["steps"] == 24 and result["bank_lookups"] == 24  # one neighbour lookup per step
    assert 0.0 <= result["test_acc"] <= 1.0 and result["best_step"] in (8, 16, 24)
    assert result["maker_rounds"]["neighbour-maker"] >= 1 and result["maker_rounds"]["pseudo-labeller"] >= 1
    pl = result["makers"]["pseudo-labeller"]
    assert 0.0 < pl["pl_coverage"] <= 1.0 and 0.0 <= pl["pl_precision"] <= 1.0  # threshold 0.3 < 1/7 * 7 labels some

    nodes = open_bank(run / "bank", table="nodes")
    assert nodes.sizes["key"] == 2708  # every node, test nodes included
    assert sorted(nodes["key"].values.tolist()) == list(range(2708))
    assert nodes["logits"].shape == (2708, 7) and nodes["embedding"].shape == (2708, 32)
    assert set(np.unique(nodes["maker"].values)) == {"neighbour-maker"}
    assert int(nodes["model_step"].min()) >= 6  # written from a published model version
    assert bool(np.isfinite(nodes["logits"].values).all()) and float(np.abs(nodes["logits"].values).sum()) > 0

    labels = open_bank(run / "bank", table="pseudo_labels")
    keys = labels["key"].values
    truth = np.load(run / "truth.npz")
    assert not set(keys.tolist()) & set(range(140))  # labelled-train nodes never get a pseudo label
    assert set(keys.tolist()) <= set(truth["keys"].tolist())
    assert bool((labels["confidence"].values >= 0.3).all())
    assert set(np.unique(labels["maker"].values)) == {"pseudo-labeller"}
    # the reported precision is the share of stored labels that match held-out truth
    lookup = dict(zip(truth["keys"].tolist(), truth["labels"].tolist(), strict=True))
    precision = float(np.mean([lookup[k] == p for k, p in zip(keys.tolist(), labels["pseudo_label"].values.tolist(),
                                                                strict=True)]))
    assert precision == pytest.approx(pl["pl_precision"])

    metrics = open_metrics(run / "metrics.zarr")
    # (maker reports that arrive after the trainer's last step are not rows of the store, so the
    # pseudo-label series are checked on the run's result above)
    for name in ("trainer.neighbour_found", "trainer.val_acc", "train_loss", "steps_per_s"):
        assert name in metrics.data_vars, name
    # a fast trainer can end its 24 steps before the maker's first rows land: the age series exists
    # once a step found neighbour rows
    if np.isfinite(result["mean_neighbour_age_s"]):
        assert "trainer.neighbour_age_s" in metrics.data_vars or int(metrics.sizes["step"]) == 1
    else:
        assert float(metrics["trainer.neighbour_found"].max()) == 0.0
    assert int(metrics["step"].max()) <= 24
    record = json.loads((run / "semi_supervised.json").read_text())
    assert record["config"]["k"] == 3 and record["result"]["steps"] == 24

    # a folder that already holds a run is refused, and left as it was
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(ConfigError, match="already holds files"):
        run_semi_supervised(cfg, cluster=client, run_dir=run, data_dir=data_dir, progress=False)
    assert sorted(p.name for p in run.iterdir()) == before


def test_baseline_runs_need_no_bank(client: object, data_dir: pathlib.Path) -> None:
    cfg = SemiSupervisedConfig(mode="in-graph", k=2, steps=10, unlabelled_batch=32, hidden=(16,), eval_every=5)
    result = run_semi_supervised(cfg, cluster=client, data_dir=data_dir, progress=False, timeout=120)
    assert result["bank_lookups"] == 0 and result["makers"] == {} and result["steps"] == 10


def test_options_from_the_command_line() -> None:
    cfg = config_from_options({"dataset": "citeseer", "k": "10", "hidden": "128,32", "pseudo-labels": "false",
                               "threshold": "0.8", "data_dir": "/x"}, steps=50)
    assert (cfg.dataset, cfg.k, cfg.hidden, cfg.pseudo_labels, cfg.threshold, cfg.steps) == (
        "citeseer", 10, (128, 32), False, 0.8, 50)
    assert config_from_options({}).pseudo_labels is True
    assert config_from_options({"mode": "base"}).pseudo_labels is False
    bank = config_from_options({})
    assert (bank.unlabelled_batch, bank.neighbour_temperature, bank.threshold) == (ALL_NODES, 0.5, 0.99)
    assert bank.unlabelled_batch >= 2708
    assert (bank.pseudo_selection, bank.pseudo_fraction, bank.pseudo_alpha, bank.pseudo_agreement,
            bank.pseudo_warmup, bank.pseudo_ramp) == ("balanced", 0.4, 0.9, False, 20, 50)
    agree = config_from_options({"pseudo_agreement": "true", "pseudo_selection": "threshold", "pseudo_warmup": "5"})
    assert (agree.pseudo_agreement, agree.pseudo_selection, agree.pseudo_warmup) == (True, "threshold", 5)
    mine = config_from_options({"neighbour-temperature": "0.7", "unlabelled_batch": "64"})
    assert (mine.unlabelled_batch, mine.neighbour_temperature) == (64, 0.7)
    base = config_from_options({"mode": "in-graph"})
    assert (base.unlabelled_batch, base.neighbour_temperature, base.threshold) == (512, 1.0, 0.6)
    with pytest.raises(ConfigError, match=r"'colour': unknown; expected one of"):
        config_from_options({"colour": "red"})
    with pytest.raises(ConfigError, match=r"k='many'"):
        config_from_options({"k": "many"})


@pytest.mark.slow
def test_cli_run_semi_supervised_writes_a_run_folder(data_dir: pathlib.Path, tmp_path: pathlib.Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from carls_dask.cli import main
    from carls_dask.storage import open_bank, open_metrics

    run = tmp_path / "cli-run"
    status = main(["run", "semi-supervised", "--dataset", "cora", "--steps", "12", "--run-dir", str(run),
                   "-o", "unlabelled_batch=32", "-o", "hidden=16", "-o", f"data_dir={data_dir}"])
    assert status == 0
    assert "cora bank + pseudo labels: test accuracy" in capsys.readouterr().out
    assert {"bank", "metrics.zarr", "run.json", "truth.npz"} <= {p.name for p in run.iterdir()}
    assert open_bank(run / "bank", table="nodes").sizes["key"] == 2708
    assert int(open_metrics(run / "metrics.zarr")["step"].max()) <= 12


def test_balanced_pseudo_labels_on_the_cluster_keep_each_class_quota(
    client: object, data_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    from carls_dask.storage import open_bank

    cfg = SemiSupervisedConfig(mode="bank", pseudo_labels=True, pseudo_selection="balanced", pseudo_fraction=0.2,
                               pseudo_warmup=6, k=3, steps=24, unlabelled_batch=64, hidden=(16,), eval_every=8)
    run = tmp_path / "run"
    result = run_semi_supervised(cfg, cluster=client, run_dir=run, data_dir=data_dir, publish_every=6,
                                 progress=False, timeout=240)
    pl = result["makers"]["pseudo-labeller"]
    labels = open_bank(run / "bank", table="pseudo_labels")
    keys = labels["key"].values
    # share 0.2 of the 2568 unlabelled nodes, at most round(0.2 * 2568 / 7) = 73 per class
    assert 0 < len(keys) <= 7 * 73 and pl["pl_count"] == len(keys)
    assert int(np.bincount(labels["pseudo_label"].values, minlength=7).max()) <= 73
    assert not set(keys.tolist()) & set(range(140))
    assert int(labels["model_step"].min()) >= 6  # nothing from before the warm-up
    truth = np.load(run / "truth.npz")
    lookup = dict(zip(truth["keys"].tolist(), truth["labels"].tolist(), strict=True))
    right = np.mean([lookup[k] == p for k, p in zip(keys.tolist(), labels["pseudo_label"].values.tolist(), strict=True)])
    assert float(right) == pytest.approx(pl["pl_precision"])
