"""A trainer, a maker and bank shards on dask-jobqueue SLURMCluster workers of a real local Slurm.

``scripts/services-up`` (called by ``./dev test``) starts munged, slurmctld and slurmd on this
machine; the test skips, saying so, only when no Slurm controller answers.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import dask.config
import numpy as np
import pytest

from carls_dask.examples.digits import DigitsMaker, DigitsTrainer, digits_table
from carls_dask.runtime import State, Workbench
from tests.processes import wait_for
from tests.runtime.helpers import run_until_knowledge_flows
from tests.runtime.slurm import PARTITION, controller_answers

pytestmark = pytest.mark.slurm


def _our_jobs(name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i %T"], capture_output=True, text=True, timeout=15)
    return out.stdout.split("\n") if out.stdout.strip() else []


def test_trainer_maker_and_bank_on_slurm_workers(tmp_path: pathlib.Path) -> None:
    reason = controller_answers()
    if reason is not None:
        pytest.skip(reason)
    job_name = f"carls-test-{os.getpid()}"
    options = {
        "cores": 1, "processes": 1, "memory": "3GB", "walltime": "00:15:00", "queue": PARTITION,
        "job_name": job_name,
        "python": sys.executable,  # the compute node is this machine: same venv path
        "interface": "lo",
        "log_directory": str(tmp_path / "slurm-logs"),
        "death_timeout": 60,
        "scheduler_options": {"dashboard_address": ":0"},
    }
    settings = {"carls.cluster.kind": "jobqueue", "carls.cluster.jobqueue.system": "slurm",
                "carls.cluster.jobqueue.jobs": 2, "carls.cluster.start-timeout": "180s"}
    with dask.config.set(settings), Workbench(run_dir=tmp_path / "run", progress=False, cluster_options=options) as wb:
        assert type(wb.cluster).__name__ == "SLURMCluster"
        jobs = wb.client.run(lambda: os.environ.get("SLURM_JOB_ID"))
        assert len(jobs) == 2 and len(set(jobs.values())) == 2 and all(jobs.values())  # two real Slurm jobs
        bank = wb.create_bank([digits_table()], n_shards=2)
        wb.submit_trainer(DigitsTrainer("trainer", max_steps=None, publish_every=15, lr=0.02))
        wb.submit_maker(DigitsMaker("maker"))
        run_until_knowledge_flows(wb, min_steps=60)
        results = wb.stop(timeout=60)
        got = bank.lookup("digits", np.arange(100, dtype=np.int64), columns=["pseudo_label"])
        workers_with_shards = {a for a, n in wb.client.run(
            lambda dask_worker: len(dask_worker.state.actors)).items() if n}
        assert len(workers_with_shards) == 2  # shards spread over both Slurm workers
    assert wb.state is State.CLOSED
    assert results["trainer"].steps >= 60
    assert results["trainer"].value["bank_hits"] > 0
    assert results["maker"].versions == sorted(set(results["maker"].versions))
    last = results["maker"].rounds[-1].model_step
    assert 15 <= last <= results["trainer"].steps
    assert got.found.all() and (got.model_step == last).all()
    # closing the Workbench cancelled its Slurm jobs
    wait_for(lambda: _our_jobs(job_name) == [], lambda: f"Slurm jobs {_our_jobs(job_name)} still queued 60 s after close",
             60, interval=0.5)
