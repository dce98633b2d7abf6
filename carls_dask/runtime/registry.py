"""The paradigms ``carls-dask run NAME`` can start.

``carls_dask`` does not import the paradigms; they register themselves, either through the
``carls_dask.paradigms`` entry-point group in their package metadata, naming a
:class:`~carls_dask.runtime.paradigm.Paradigm` subclass::

    [project.entry-points."carls_dask.paradigms"]
    semi-supervised = "carls_dask.paradigms.semi_supervised.paradigm:SemiSupervised"

or at run time with :func:`register_paradigm`.
"""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Any

from carls_dask.errors import ConfigError
from carls_dask.runtime.paradigm import Paradigm

__all__ = ["ENTRY_POINT_GROUP", "available_paradigms", "get_paradigm", "register_paradigm", "unregister_paradigm"]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "carls_dask.paradigms"

_REGISTERED: dict[str, Paradigm] = {}


def _instance(obj: Any, where: str) -> Paradigm:
    if isinstance(obj, type) and issubclass(obj, Paradigm):
        obj = obj()
    if not isinstance(obj, Paradigm):
        raise ConfigError(f"{where}: expected a Paradigm subclass or instance, got {type(obj).__name__}")
    return obj


def register_paradigm(paradigm: Paradigm | type[Paradigm], *, name: str | None = None, replace: bool = False) -> None:
    """Make ``paradigm`` available as ``carls-dask run NAME`` (``NAME``: ``name`` or ``paradigm.name``).

    Raises
    ------
    ConfigError
        If the name is empty or already registered (unless ``replace``), or ``paradigm`` is not a Paradigm.
    """
    obj = _instance(paradigm, "register_paradigm")
    key = name if name is not None else obj.name
    if not isinstance(key, str) or not key.strip():
        raise ConfigError(f"register_paradigm: expected a non-empty name, got {key!r}")
    if key in _REGISTERED and not replace:
        raise ConfigError(f"register_paradigm: {key!r} is already registered; pass replace=True to override")
    _REGISTERED[key] = obj


def unregister_paradigm(name: str) -> None:
    """Forget a paradigm registered with :func:`register_paradigm` (no error if unknown)."""
    _REGISTERED.pop(name, None)


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_paradigms() -> list[str]:
    """Names of every registered paradigm (run-time registrations and entry points), sorted."""
    return sorted(set(_REGISTERED) | set(_entry_points()))


def get_paradigm(name: str) -> Paradigm:
    """Return the paradigm registered as ``name``.

    Raises
    ------
    ConfigError
        If no paradigm of that name is registered; the message lists the known ones.
    """
    if name in _REGISTERED:
        return _REGISTERED[name]
    eps = _entry_points()
    if name in eps:
        return _instance(eps[name].load(), f"entry point {name!r} of {ENTRY_POINT_GROUP}")
    known = available_paradigms()
    raise ConfigError(f"unknown paradigm {name!r}; available: {', '.join(known) if known else 'none registered'}")
