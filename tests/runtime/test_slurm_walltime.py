"""A SLURMCluster worker with a walltime (``--lifetime``) hands its bank shard over before it ends.

Needs the local Slurm (``scripts/slurm-ci.sh up``, as root); skips, saying so, when none answers.
The worker that stays is a plain ``dask worker`` process on this machine.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import dask
import pytest

from tests.bank.rehome import lifetime_handover, workers
from tests.runtime.slurm import PARTITION, controller_answers

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_slurm_worker_at_its_walltime_hands_its_shard_over(tmp_path: pathlib.Path) -> None:
    reason = controller_answers()
    if reason is not None:
        pytest.skip(reason)
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    conf = {"carls.bank.rehome-timeout": "60s", "carls.bank.walltime-margin": "20s"}
    with dask.config.set(conf), SLURMCluster(
        cores=1, processes=1, memory="2GB", walltime="00:10:00", queue=PARTITION,
        job_name=f"carls-walltime-{os.getpid()}", python=sys.executable, interface="lo",
        log_directory=str(tmp_path / "slurm-logs"), death_timeout=60,
        scheduler_options={"dashboard_address": ":0"}, worker_extra_args=["--lifetime", "60s"],
    ) as cluster, Client(cluster) as client:
        cluster.scale(jobs=1)
        proc = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address, "--nthreads", "1",
             "--no-dashboard", "--name", "stays"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            client.wait_for_workers(2, timeout=180)
            jobs = client.run(lambda: os.environ.get("SLURM_JOB_ID"))
            (leaves,) = [w for w, job in jobs.items() if job]
            (stays,) = [w for w in workers(client) if w != leaves]
            lifetime_handover(client, leaves, stays, tmp_path / "bank", timeout=150)
        finally:
            proc.kill()
            proc.wait(timeout=30)
