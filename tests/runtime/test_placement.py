"""Placement by configuration (``carls.placement``): the pure rules."""

from __future__ import annotations

import math
from typing import Any

import dask.config
import pytest

from carls_dask.errors import ConfigError
from carls_dask.runtime.placement import resources_for, workers_with

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

