"""The ``carls`` namespace of :mod:`dask.config`.

Defaults ship in ``carls.yaml`` beside this module and are merged under the user's configuration
when :mod:`carls_dask` is imported, so YAML files in ``~/.config/dask`` and environment variables
such as ``DASK_CARLS__BANK__SHARDS=4`` override them. Dask reads ``DASK_*`` variables at import:
code that runs on workers should receive resolved values explicitly (see :func:`resolved`).
"""

from __future__ import annotations

import pathlib
from typing import Any

import dask.config
import yaml

from carls_dask.errors import ConfigError

__all__ = ["RENAMED", "SCHEMA_PATH", "YAML_PATH", "get", "get_bytes", "get_seconds", "load_defaults", "resolved"]

YAML_PATH = pathlib.Path(__file__).with_name("carls.yaml")
SCHEMA_PATH = pathlib.Path(__file__).with_name("carls-schema.yaml")

_MISSING = object()

#: Keys that were renamed, new name -> old name. A value set under the old name is refused with the new name,
#: so a setting is never silently ignored.
RENAMED = {"storage.keep-snapshots": "run.keep-snapshots"}


def load_defaults() -> dict[str, Any]:
    """Read the shipped defaults.

    Returns
    -------
    dict
        The parsed ``carls.yaml``, with the top-level ``carls`` key.
    """
    with YAML_PATH.open() as f:
        data: dict[str, Any] = yaml.safe_load(f)
    return data


def get(key: str, override: Any = None) -> Any:
    """Return ``carls.<key>`` from :mod:`dask.config`, unless ``override`` is given.

    Parameters
    ----------
    key
        Dotted key below the ``carls`` namespace, e.g. ``"bank.shards"``.
    override
        A value passed explicitly by the caller; returned as is when not ``None``.

    Raises
    ------
    ConfigError
        If the key is not known, or its old name (:data:`RENAMED`) is set.
    """
    if override is not None:
        return override
    old = RENAMED.get(key)
    if old is not None and dask.config.get(f"carls.{old}", default=_MISSING) is not _MISSING:
        raise ConfigError(f"configuration key 'carls.{old}' is set; it was renamed: set 'carls.{key}' instead")
    value = dask.config.get(f"carls.{key}", default=_MISSING)
    if value is _MISSING:
        raise ConfigError(f"unknown configuration key 'carls.{key}'; known sections: {sorted(dask.config.get('carls'))}")
    return value


def get_seconds(key: str, override: float | str | None = None) -> float:
    """Return a duration setting in seconds (accepts Dask time strings such as ``"30s"``)."""
    from dask.utils import parse_timedelta

    value = get(key, override)
    try:
        seconds = parse_timedelta(value, default="seconds")
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:  # dask's parser raises all of these
        raise ConfigError(f"carls.{key}: expected a duration such as '30s' or a number of seconds, got {value!r}") from exc
    if seconds is None or not seconds >= 0:  # also refuses NaN
        raise ConfigError(f"carls.{key}: expected a non-negative duration, got {value!r}")
    return float(seconds)


def get_bytes(key: str, override: int | str | None = None) -> int:
    """Return a size setting in bytes (accepts Dask size strings such as ``"1 GiB"`` or a number of bytes)."""
    from dask.utils import parse_bytes

    value = get(key, override)
    try:
        n = parse_bytes(value) if isinstance(value, str) else value
        ok = isinstance(n, int | float) and not isinstance(n, bool) and n >= 0
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"carls.{key}: expected a size such as '1 GiB' or a number of bytes, got {value!r}") from exc
    if not ok:
        raise ConfigError(f"carls.{key}: expected a non-negative size such as '1 GiB', got {value!r}")
    return int(n)


def resolved() -> dict[str, Any]:
    """Return a plain copy of the whole ``carls`` namespace, to ship to actors and tasks."""
    import copy

    return copy.deepcopy(dask.config.get("carls"))


dask.config.update_defaults(load_defaults())
