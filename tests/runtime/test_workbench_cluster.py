"""A Workbench that starts its own LocalCluster leaves no process or thread behind."""

from __future__ import annotations

import threading
from typing import Any

import dask.config
import psutil
import pytest

from carls_dask.examples.digits import DigitsMaker, DigitsTrainer
from carls_dask.runtime import State, Workbench
from tests.processes import wait_for

# Thread pools that distributed creates once per process and keeps (not owned by a Workbench).
PROCESS_WIDE = ("Dask-Offload",)


def _threads() -> set[tuple[str, int | None]]:
    return {(t.name, t.ident) for t in threading.enumerate() if not t.name.startswith(PROCESS_WIDE)}


def _children() -> list[Any]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            # multiprocessing's resource tracker is started once per process and shared by all users
            if any("multiprocessing.resource_tracker" in part for part in p.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        out.append(p)
    return out


@pytest.mark.slow  # starts and stops a cluster of its own
def test_own_local_cluster_is_started_and_fully_released() -> None:
    threads_before = _threads()
    children_before = {p.pid for p in _children()}
    with dask.config.set({"carls.cluster.n-workers": 1, "carls.cluster.threads-per-worker": 2}):
        # the worker advertises a GPU resource (a label here: no CUDA), so the trainer asks for one
        # (carls.placement.trainer: auto) and the maker for none (carls.placement.maker: {})
        with Workbench(progress=True, stop_timeout=30, cluster_options={"resources": {"GPU": 2}}) as wb:
            assert wb.cluster is not None and len(wb.client.scheduler_info()["workers"]) == 1
            trainer = wb.submit_trainer(DigitsTrainer("trainer", max_steps=40, publish_every=10, lr=0.02))
            maker = wb.submit_maker(DigitsMaker("maker"))
            keys = [trainer.future.key, maker.future.key]

            def restrictions(dask_scheduler: Any) -> list[Any]:
                return [(k in dask_scheduler.tasks, dask_scheduler.tasks[k].resource_restrictions
                         if k in dask_scheduler.tasks else None) for k in keys]

            # submit reaches the scheduler asynchronously
            wait_for(lambda: all(known for known, _ in wb.client.run_on_scheduler(restrictions)),
                     "both loops known to the scheduler", 30, interval=0.05)
            assert [r for _, r in wb.client.run_on_scheduler(restrictions)] == [{"GPU": 1}, None]
            assert len(_children()) > len(children_before)  # the worker process is up
            wb.wait(timeout=300)
            results = wb.stop()
    assert wb.state is State.CLOSED
    assert results["trainer"].steps == 40
    assert results["maker"].rounds[-1].model_step == 40
    leftover = [p for p in _children() if p.pid not in children_before]
    for p in leftover:  # give the nanny's worker a moment to be reaped
        try:
            p.wait(timeout=10)
        except psutil.TimeoutExpired:
            pass
    assert [(p.pid, p.cmdline()) for p in _children() if p.pid not in children_before] == []
    assert _threads() - threads_before == set()
