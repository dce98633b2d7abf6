"""Worker loss while a Workbench runs a trainer, a maker and a bank (real LocalCluster, SIGKILL).

The maker and bank shard 0 share a worker, which is killed: the scheduler runs the maker again
(the Workbench counts the restart), the bank re-homes the shard, and the trainer carries on. Each
loop appends every acknowledged bank write to a file, which survives the kill; after the run every
one of them is read back with its acknowledged value. The Workbench learns of the loss through a
scheduler plugin of its own, so a user's handlers on the same client's topics keep working.
"""

from __future__ import annotations

import os
import pathlib
import signal
import time
from collections.abc import Iterator, Mapping
from typing import Any

import dask
import numpy as np
import pytest

from carls_dask.bank import Column, TableSpec
from carls_dask.errors import LoopFailedError
from carls_dask.runtime import KnowledgeMaker, Trainer, Workbench
from carls_dask.runtime.events import watch_name
from tests.processes import wait_for

REHOME_TIMEOUT = 60.0


def table(name: str) -> TableSpec:
    return TableSpec(name, columns=(Column("value", shape=(1,)),), optimizer="sgd", learning_rate=0.1,
                     initializer="zeros", init_scale=0.0)


def _ack(path: str, key: int, value: float) -> None:
    with open(path, "a") as fh:
        fh.write(f"{key} {value}\n")
        fh.flush()
        os.fsync(fh.fileno())


def acked(path: pathlib.Path) -> dict[int, float]:
    out: dict[int, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            k, v = line.split()
            out[int(k)] = float(v)
    return out


class WritingTrainer(Trainer):
    """Step i writes key i of ``steps`` (value i) and records it once acknowledged."""

    def __init__(self, name: str, ack_file: str) -> None:
        super().__init__(name, max_steps=None, publish_every=5, keep_state=False)
        self.ack_file = ack_file

    def step(self, step: int) -> Mapping[str, float]:
        keys = np.array([step + 1], dtype=np.int64)
        self.ctx.bank.update("steps", keys, {"value": np.array([[float(step)]], np.float32)}, model_step=step)
        _ack(self.ack_file, step + 1, float(step))
        time.sleep(0.02)
        return {"written": float(step + 1)}

    def publish_state(self) -> Mapping[str, Any]:
        return {"step": self.start_step}


class WritingMaker(KnowledgeMaker):
    """Each round writes the model version's step under a fresh key (value = step)."""

    def __init__(self, name: str, ack_file: str) -> None:
        super().__init__(name)
        self.ack_file = ack_file
        self.step = 0

    def load_model(self, state: Mapping[str, Any], version: Any) -> None:
        self.step = int(state["step"])

    def make(self, version: Any) -> Mapping[str, float]:
        key = int(time.time_ns() // 1000)  # unique across restarts of the maker
        self.ctx.bank.update("made", np.array([key], np.int64), {"value": np.array([[float(self.step)]], np.float32)})
        _ack(self.ack_file, key, float(self.step))
        return {"made_step": float(self.step)}


class TickingTrainer(Trainer):
    """Runs until stopped, publishing its step; no model, no bank."""

    def __init__(self, name: str) -> None:
        super().__init__(name, max_steps=None, publish_every=5, keep_state=False)

    def step(self, step: int) -> Mapping[str, float]:
        time.sleep(0.02)
        return {"ticks": float(step + 1)}

    def publish_state(self) -> Mapping[str, Any]:
        return {"step": self.start_step}


class EchoMaker(KnowledgeMaker):
    def load_model(self, state: Mapping[str, Any], version: Any) -> None:
        pass

    def make(self, version: Any) -> Mapping[str, float]:
        return {"step": float(version.step)}


@pytest.fixture
def cluster() -> Iterator[Any]:
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as c:
        yield c


def _pid(wb: Workbench, address: str) -> int:
    return int(wb.client.run(os.getpid, workers=[address])[address])


def _plugins(dask_scheduler: Any) -> list[str]:
    return sorted(dask_scheduler.plugins)


@pytest.mark.slow
def test_maker_and_shard_worker_killed_the_run_carries_on(cluster: Any, tmp_path: pathlib.Path) -> None:
    conf = {"carls.bank.rehome-timeout": f"{REHOME_TIMEOUT:g}s", "carls.runtime.maker-restarts": 2,
            "carls.runtime.poll-interval": "0.1s", "carls.runtime.report-interval": "0.2s"}
    with dask.config.set(conf), Workbench(cluster, progress=False, stop_timeout=60) as wb:
        a, b = sorted(wb.client.scheduler_info()["workers"])
        bank = wb.create_bank([table("steps"), table("made")], n_shards=2, buckets=64,
                              log_root=str(tmp_path / "bank"))
        assert bank.transport.table.addresses == [a, b]  # spread: shard 0 on a, shard 1 on b
        t_ack, m_ack = tmp_path / "trainer.acks", tmp_path / "maker.acks"
        wb.submit_trainer(WritingTrainer("trainer", str(t_ack)), workers=[b])
        wb.submit_maker(WritingMaker("maker", str(m_ack)), workers=[a])
        wait_for(lambda: len(acked(m_ack)) >= 3 and len(acked(t_ack)) >= 20, "first writes", 120)
        assert a in wb.client.processing()  # the maker runs on a
        os.kill(_pid(wb, a), signal.SIGKILL)
        killed_trainer, killed_maker = len(acked(t_ack)), len(acked(m_ack))
        wait_for(lambda: wb.status()["maker"].restarts == 1, "the maker restart", 60)
        wait_for(lambda: len(acked(m_ack)) >= killed_maker + 3 and len(acked(t_ack)) >= killed_trainer + 20,
                  "writes after the kill", REHOME_TIMEOUT + 60)
        wb.stop(timeout=60)
        status = wb.status()
        assert status["maker"].restarts == 1 and status["maker"].progress["restarts"] == 1.0
        assert status["trainer"].restarts == 0
        stats = bank.stats()["rehoming"]
        assert stats["count"] == 1 and stats["events"][0]["from"] == a
        assert stats["events"][0]["rehome_s"] < REHOME_TIMEOUT  # the pause was bounded by the deadline
        for name, path in (("steps", t_ack), ("made", m_ack)):  # zero acknowledged writes lost
            want = acked(path)
            keys = np.array(sorted(want), dtype=np.int64)
            got = bank.lookup(name, keys)
            assert got.found.all(), f"{name}: {int((~got.found).sum())} acknowledged keys missing"
            np.testing.assert_array_equal(got.values["value"][:, 0], np.array([want[int(k)] for k in keys]))


def test_trainer_worker_killed_fails_the_run_clearly(cluster: Any, tmp_path: pathlib.Path) -> None:
    conf = {"carls.runtime.poll-interval": "0.1s", "carls.runtime.report-interval": "0.2s"}
    with dask.config.set(conf), Workbench(cluster, progress=False, stop_timeout=60) as wb:
        _, b = sorted(wb.client.scheduler_info()["workers"])
        wb.create_bank([table("steps")], n_shards=1, buckets=16, log_root=str(tmp_path / "bank"))
        t_ack = tmp_path / "trainer.acks"
        wb.submit_trainer(WritingTrainer("trainer", str(t_ack)), workers=[b])
        wait_for(lambda: len(acked(t_ack)) >= 10, "first writes", 120)
        os.kill(_pid(wb, b), signal.SIGKILL)
        with pytest.raises(LoopFailedError, match="trainer 'trainer'") as info:
            wb.wait(timeout=60)
        assert "resume_from" in str(info.value.__cause__)
        assert wb.status()["trainer"].state == "failed"


def test_user_handler_on_all_topic_survives_a_workbench(cluster: Any) -> None:
    from distributed import Client

    seen: list[Any] = []
    conf = {"carls.runtime.poll-interval": "0.1s", "carls.runtime.report-interval": "0.2s",
            "carls.runtime.maker-restarts": 2}
    with Client(cluster) as client:
        client.subscribe_topic("all", seen.append)
        with dask.config.set(conf), Workbench(client, progress=False, stop_timeout=60) as wb:
            a, b = sorted(client.scheduler_info()["workers"])
            wb.submit_trainer(TickingTrainer("trainer"), workers=[b])
            maker = wb.submit_maker(EchoMaker("maker"), workers=[a])
            wait_for(lambda: maker.future.key in client.processing().get(a, ()), "the maker on its worker", 60)
            wait_for(lambda: wb.status()["maker"].progress.get("step", 0) > 0, "a first maker round", 60)
            os.kill(_pid(wb, a), signal.SIGKILL)
            wait_for(lambda: wb.status()["maker"].restarts == 1, "the maker restart", 60)
            # the scheduler's own event of the removal reached the user's handler during the run
            wait_for(lambda: any(isinstance(m, dict) and m.get("worker") == a for _, m in seen),
                      "the removal on the user's 'all' handler", 30)
            assert watch_name(wb.prefix) in client.run_on_scheduler(_plugins)
            wb.stop(timeout=60)
        assert wb.status()["maker"].restarts == 1 and wb.status()["trainer"].restarts == 0
        assert watch_name(wb.prefix) not in client.run_on_scheduler(_plugins)  # the watch was unregistered
        client.log_event("all", {"after": "the workbench"})
        wait_for(lambda: any(m == {"after": "the workbench"} for _, m in seen),
                  "the user's event after the Workbench closed", 30)
