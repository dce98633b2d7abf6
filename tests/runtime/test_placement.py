"""Placement by configuration (``carls.placement``): the pure rules, then a cluster of unlike workers.

The cluster is a :class:`distributed.SpecCluster` of two in-process workers, one thread each: one
advertises ``GPU`` (a resource label: placement needs no CUDA) and the other ``MEM``. Each loop
records the address of the worker it ran on and returns it from ``finish()``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import dask.config
import numpy as np
import pytest

from carls_dask.bank import Column, TableSpec
from carls_dask.errors import ConfigError
from carls_dask.runtime import KnowledgeMaker, LoopContext, ModelVersion, Trainer, Workbench
from carls_dask.runtime.placement import device_for, resources_for, workers_with

GPU_BOX = {"tcp://a:1": {"GPU": 2, "MEM": 1}, "tcp://b:1": {"MEM": 4}, "tcp://c:1": {}}
CPU_BOX = {"tcp://a:1": {}, "tcp://b:1": {"MEM": 1}}
DEFAULTS = {"trainer": "auto", "maker": {}, "shard": {}, "names": {}}


def settings(**changes: Any) -> dict[str, Any]:
    return {**DEFAULTS, **changes}


# -- the rules ---------------------------------------------------------------------------------------
def test_defaults_put_trainers_on_gpu_workers_and_nothing_else_anywhere_special() -> None:
    assert resources_for("trainer", "t", GPU_BOX) == {"GPU": 1}
    assert resources_for("trainer", "t", CPU_BOX) is None  # auto: no worker advertises GPU
    assert resources_for("maker", "m", GPU_BOX) is None
    assert resources_for("shard", "bank", GPU_BOX) is None
    with dask.config.set({"carls.placement.maker": {"MEM": 1}}):  # read from dask.config by default
        assert resources_for("maker", "m", GPU_BOX) == {"MEM": 1}


def test_a_name_replaces_its_kinds_resources() -> None:
    s = settings(maker={"MEM": 1}, names={"labeller": {"CPU": 2}, "bank": {"MEM": 2}, "fast": "auto", "free": {}})
    assert resources_for("maker", "labeller", GPU_BOX, s) == {"CPU": 2}
    assert resources_for("maker", "other", GPU_BOX, s) == {"MEM": 1}
    assert resources_for("shard", "bank", GPU_BOX, s) == {"MEM": 2}
    assert resources_for("maker", "fast", GPU_BOX, s) == {"GPU": 1}
    assert resources_for("trainer", "free", GPU_BOX, s) is None  # {} replaces auto: any worker
    assert resources_for("trainer", None, GPU_BOX, s) == {"GPU": 1}  # no name: the kind's entry


@pytest.mark.parametrize(("changes", "message"), [
    ({"maker": {"GPU": 0}}, r"carls\.placement\.maker\.GPU: got 0; expected a positive number"),
    ({"shard": {"MEM": -1.5}}, r"carls\.placement\.shard\.MEM: got -1\.5; expected a positive number"),
    ({"trainer": {"GPU": "one"}}, r"carls\.placement\.trainer\.GPU: got 'one'; expected a positive number"),
    ({"trainer": {"GPU": True}}, r"carls\.placement\.trainer\.GPU: got True"),
    ({"trainer": {"GPU": math.nan}}, r"carls\.placement\.trainer\.GPU: got nan"),
    ({"trainer": "gpu"}, r"carls\.placement\.trainer: got 'gpu'; expected 'auto' or a mapping"),
    ({"maker": [1]}, r"carls\.placement\.maker: got list \[1\]; expected 'auto' or a mapping"),
    ({"names": {"m": {"CPU": 0}}}, r"carls\.placement\.names\.m\.CPU: got 0"),
    ({"names": ["m"]}, r"carls\.placement\.names: got list \['m'\]; expected a mapping"),
    ({"makers": {}}, r"carls\.placement: unknown key\(s\) \['makers'\]; expected keys among"),
])
def test_bad_settings_are_named(changes: dict[str, Any], message: str) -> None:
    kind = "shard" if "shard" in changes else "trainer" if "trainer" in changes else "maker"
    with pytest.raises(ConfigError, match=message):
        resources_for(kind, "m", GPU_BOX, settings(**changes))


def test_unknown_kinds_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"placement: unknown kind 'bank'; expected one of \['trainer', 'maker', 'shard'\]"):
        resources_for("bank", None, GPU_BOX)


def test_workers_with_the_resources() -> None:
    assert workers_with(None, GPU_BOX) == ["tcp://a:1", "tcp://b:1", "tcp://c:1"]
    assert workers_with({"MEM": 1}, GPU_BOX) == ["tcp://a:1", "tcp://b:1"]
    assert workers_with({"MEM": 2}, GPU_BOX) == ["tcp://b:1"]
    assert workers_with({"GPU": 1, "MEM": 1}, GPU_BOX) == ["tcp://a:1"]
    assert workers_with({"TPU": 1}, GPU_BOX) == []


def test_loops_take_the_devices_round_robin() -> None:
    assert [device_for(slot, 2) for slot in range(5)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert [device_for(slot, 1) for slot in range(2)] == ["cuda:0", "cuda:0"]
    assert device_for(3, 0) == "cpu"
    with pytest.raises(ValueError, match="slot must be a non-negative int, got -1"):
        device_for(-1, 2)
    with pytest.raises(ValueError, match="n_devices must be a non-negative int, got -2"):
        device_for(0, -2)


# -- a cluster of unlike workers ---------------------------------------------------------------------
def _table() -> TableSpec:
    return TableSpec("seen", columns=(Column("step", shape=()),), optimizer=None, initializer="zeros")


def _here() -> str:
    from distributed import get_worker

    return str(get_worker().address)


class WhereTrainer(Trainer):
    """A tiny trainer that writes its step to the bank, and reports where it ran."""

    def setup(self, ctx: LoopContext) -> None:
        import torch

        self.model = torch.nn.Linear(2, 1).to(ctx.device)
        self.address = _here()

    def step(self, step: int) -> Mapping[str, float]:
        if self.ctx is not None and self.ctx.bank is not None:
            self.ctx.bank.update("seen", np.array([step], dtype=np.int64), {"step": np.array([float(step)])})
        time.sleep(0.005)
        return {"loss": 1.0}

    def finish(self) -> dict[str, str]:
        return {"address": self.address, "device": str(self.ctx.device if self.ctx else "")}


class WhereMaker(KnowledgeMaker):
    """Reports where it ran."""

    def setup(self, ctx: LoopContext) -> None:
        self.address = _here()

    def load_model(self, state: Mapping[str, Any], version: ModelVersion) -> None:
        pass

    def make(self, version: ModelVersion) -> Mapping[str, float]:
        return {"step": float(version.step)}

    def finish(self) -> dict[str, str]:
        return {"address": self.address}


@pytest.fixture(scope="module")
def unlike() -> Iterator[tuple[Any, dict[str, str]]]:
    """A client of a two-worker SpecCluster (``GPU`` worker, ``MEM`` worker) and the workers' addresses by label."""
    from distributed import Client, Scheduler, SpecCluster, Worker

    options = {"nthreads": 1, "host": "127.0.0.1"}
    workers = {"gpu": {"cls": Worker, "options": {**options, "resources": {"GPU": 1}}},
               "mem": {"cls": Worker, "options": {**options, "resources": {"MEM": 1}}}}
    scheduler = {"cls": Scheduler, "options": {"host": "127.0.0.1", "dashboard_address": ":0"}}
    with SpecCluster(workers=workers, scheduler=scheduler) as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        by_name = {info["name"]: addr for addr, info in client.scheduler_info(n_workers=-1)["workers"].items()}
        yield client, by_name


def _run(client: Any, *, trainer: str = "trainer", placement: str = "spread") -> tuple[dict[str, Any], list[str]]:
    with Workbench(client, run_dir=None, progress=False, stop_timeout=30) as wb:
        bank = wb.create_bank([_table()], n_shards=2, placement=placement)
        wb.submit_trainer(WhereTrainer(trainer, max_steps=15, publish_every=5))
        wb.submit_maker(WhereMaker("maker"))
        wb.wait(timeout=60)
        results = wb.stop(timeout=30)
        addresses = list(bank.transport.table.addresses)
        assert bank.size("seen") == 15  # the trainer reached the shards wherever they were
    return {name: r.value for name, r in results.items()}, addresses


def test_trainer_maker_and_shards_go_where_placement_says(unlike: tuple[Any, dict[str, str]]) -> None:
    client, at = unlike
    with dask.config.set({"carls.placement.maker": {"MEM": 1}, "carls.placement.shard": {"MEM": 1}}):
        values, shards = _run(client)
    assert values["trainer"]["address"] == at["gpu"]  # auto: the worker that advertises GPU
    assert values["trainer"]["device"] == "cpu"  # the GPU here is a label: no CUDA in this process
    assert values["maker"]["address"] == at["mem"]
    assert shards == [at["mem"], at["mem"]]


def test_names_replace_the_kinds_placement(unlike: tuple[Any, dict[str, str]]) -> None:
    client, at = unlike
    names = {"mem-trainer": {"MEM": 1}, "maker": {"GPU": 1}, "bank": {"GPU": 1}}
    with dask.config.set({"carls.placement.names": names, "carls.placement.shard": {"MEM": 1}}):
        values, shards = _run(client, trainer="mem-trainer")
    assert values["mem-trainer"]["address"] == at["mem"]
    assert values["maker"]["address"] == at["gpu"]
    assert shards == [at["gpu"], at["gpu"]]


def test_shards_need_a_worker_with_their_resources(unlike: tuple[Any, dict[str, str]]) -> None:
    client, at = unlike
    with Workbench(client, run_dir=None, progress=False) as wb:
        with dask.config.set({"carls.placement.shard": {"TPU": 1}}):
            with pytest.raises(ConfigError, match=r"bank shards need workers with resources \{'TPU': 1\} "
                                                  r"\(carls\.placement\.shard or carls\.placement\.names\.bank\) "
                                                  r"but no worker advertises them"):
                wb.create_bank([_table()])
        with dask.config.set({"carls.placement.shard": {"MEM": 1}}):
            home = wb.home_worker()
            assert home == at["gpu"]  # the first trainer's worker: it has the trainer's resources
            with pytest.raises(ConfigError, match=rf"placement 'colocate' puts the shards on the first trainer's "
                                                  rf"worker {home}, which lacks the shard resources \{{'MEM': 1\}}"):
                wb.create_bank([_table()], placement="colocate")
        assert wb.bank is None
