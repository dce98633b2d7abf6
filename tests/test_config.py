"""The ``carls`` dask.config namespace: defaults, schema and environment overrides."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import dask.config
import jsonschema
import pytest
import yaml

import carls_dask
from carls_dask import config
from carls_dask.errors import ConfigError


def _schema() -> dict[str, Any]:
    with config.SCHEMA_PATH.open() as f:
        return yaml.safe_load(f)


def _walk(defaults: dict[str, Any], schema: dict[str, Any], path: str) -> None:
    props = schema.get("properties", {})
    assert set(defaults) == set(props), (
        f"{path}: keys in carls.yaml {sorted(defaults)} differ from carls-schema.yaml {sorted(props)}"
    )
    for key, value in defaults.items():
        sub = props[key]
        assert sub.get("description"), f"{path}.{key} has no description in carls-schema.yaml"
        if isinstance(value, dict):
            _walk(value, sub, f"{path}.{key}")


def test_every_default_is_documented_in_the_schema() -> None:
    defaults = config.load_defaults()
    _walk(defaults["carls"], _schema()["properties"]["carls"], "carls")


def test_defaults_validate_against_the_schema() -> None:
    jsonschema.validate(config.load_defaults(), _schema())


def test_schema_rejects_a_bad_value() -> None:
    bad = config.load_defaults()
    bad["carls"]["bank"]["optimizer"] = "rmsprop"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, _schema())


def test_defaults_are_loaded_on_import() -> None:
    assert carls_dask.config.get("bank.buckets") == 4096
    assert dask.config.get("carls.dashboard.address") == "127.0.0.1"


def test_dask_config_set_overrides_and_explicit_argument_wins() -> None:
    with dask.config.set({"carls.bank.shards": 7}):
        assert config.get("bank.shards") == 7
        assert config.get("bank.shards", override=3) == 3


def test_environment_variable_overrides_default() -> None:
    env = dict(os.environ, DASK_CARLS__BANK__SHARDS="5")
    out = subprocess.run(
        [sys.executable, "-c", "import carls_dask; print(carls_dask.config.get('bank.shards'))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == "5"


def test_unknown_key_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"carls\.bank\.nope"):
        config.get("bank.nope")


def test_durations_parse_and_bad_durations_are_named() -> None:
    assert config.get_seconds("runtime.stop-timeout") == 30.0
    assert config.get_seconds("runtime.stop-timeout", "2m") == 120.0
    with pytest.raises(ConfigError, match=r"runtime\.stop-timeout.*'soon'"):
        config.get_seconds("runtime.stop-timeout", "soon")


def test_one_key_keeps_snapshots_and_its_old_name_is_refused_not_ignored() -> None:
    assert config.get("storage.keep-snapshots") == 10
    assert "keep-snapshots" not in config.load_defaults()["carls"]["run"]
    with dask.config.set({"carls.run.keep-snapshots": 4}), pytest.raises(
            ConfigError, match=r"'carls.run.keep-snapshots' is set; it was renamed: set 'carls.storage.keep-snapshots'"):
        config.get("storage.keep-snapshots")
