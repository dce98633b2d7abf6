"""Cluster selection from ``carls.cluster``: jobqueue job scripts with GPUs, and clear errors."""

from __future__ import annotations

import pathlib

import dask.config
import pytest

from carls_dask.errors import ConfigError
from carls_dask.runtime.clusters import start_cluster


def test_slurm_jobs_ask_for_gpus_and_workers_advertise_them(tmp_path: pathlib.Path) -> None:
    settings = {"carls.cluster.kind": "jobqueue", "carls.cluster.jobqueue.system": "slurm",
                "carls.cluster.jobqueue.jobs": 0, "carls.cluster.jobqueue.gpus-per-job": 2}
    with dask.config.set(settings):
        cluster, address = start_cluster(cores=1, memory="1GB", queue="gpu", interface="lo",
                                         log_directory=str(tmp_path), scheduler_options={"dashboard_address": ":0"})
    try:
        assert address is None and type(cluster).__name__ == "SLURMCluster"
        script = cluster.job_script()
        assert "#SBATCH --gres=gpu:2" in script
        assert "--resources GPU=2" in script
        assert "#SBATCH -p gpu" in script
        assert len(cluster.worker_spec) == 0  # jobs=0: nothing was submitted
    finally:
        cluster.close()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"carls.cluster.kind": "cloud"}, "carls.cluster.kind: got 'cloud'; expected 'local', 'address' or 'jobqueue'"),
        ({"carls.cluster.kind": "address", "carls.cluster.address": None},
         "carls.cluster.address is not set; expected a scheduler address"),
        ({"carls.cluster.kind": "jobqueue", "carls.cluster.jobqueue.system": "torque"},
         "carls.cluster.jobqueue.system: got 'torque'; expected one of"),
    ],
)
def test_bad_cluster_settings_are_named(settings: dict[str, object], message: str) -> None:
    with dask.config.set(settings), pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        start_cluster()


def test_address_kind_returns_the_address_without_starting_anything() -> None:
    with dask.config.set({"carls.cluster.kind": "address", "carls.cluster.address": "tcp://10.1.2.3:8786"}):
        assert start_cluster() == (None, "tcp://10.1.2.3:8786")
