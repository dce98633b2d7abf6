"""The paradigms ``carls-dask run NAME`` can start.

``carls_dask`` does not import the paradigms; they register themselves, either through the
``carls_dask.paradigms`` entry-point group in their package metadata, naming a
:class:`~carls_dask.runtime.paradigm.Paradigm` subclass::

    [project.entry-points."carls_dask.paradigms"]
    semi-supervised = "carls_dask.paradigms.semi_supervised.paradigm:SemiSupervised"

or at run time with :func:`register_paradigm`. A paradigm that is registered nowhere is named by its
import path, ``package.module:Class`` (:func:`get_paradigm` imports it; the current folder is searched
as ``python -m`` searches it). :func:`paradigm_path` is the import path of a paradigm, which the runner
records in the run folder so that ``--resume`` finds the same class again.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys
from typing import Any

from carls_dask.errors import ConfigError
from carls_dask.runtime.paradigm import Paradigm

__all__ = [
    "ENTRY_POINT_GROUP", "available_paradigms", "get_paradigm", "is_import_path", "load_paradigm", "paradigm_path",
    "register_paradigm", "unregister_paradigm",
]

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


def is_import_path(name: str) -> bool:
    """Whether ``name`` is an import path ``package.module:Class`` rather than a registered name."""
    module, sep, attr = name.partition(":")
    return bool(sep and module and attr)


def paradigm_path(paradigm: Paradigm) -> str:
    """The import path ``package.module:Class`` of ``paradigm``'s class (what :func:`load_paradigm` takes)."""
    cls = type(paradigm)
    return f"{cls.__module__}:{cls.__qualname__}"


def load_paradigm(path: str) -> Paradigm:
    """Import the paradigm named by ``path`` (``package.module:Class``, or an attribute path after the colon).

    The module is imported as ``python -m`` would find it: when it is not importable from ``sys.path``,
    the current folder is added to ``sys.path`` (workers a Workbench starts afterwards inherit it).

    Raises
    ------
    ConfigError
        If the module cannot be imported, has no such attribute, or it is no Paradigm subclass or instance.
    """
    module_name, _, attr = path.partition(":")
    where = f"paradigm {path!r}"
    try:
        module = _import(module_name)
    except ImportError as exc:
        raise ConfigError(f"{where}: cannot import module {module_name!r} ({type(exc).__name__}: {exc}); expected "
                          "an importable module (from the current folder or an installed package)") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{where}: module {module_name!r} has no attribute {attr!r}; expected the name of "
                              "a Paradigm subclass in it")
        obj = getattr(obj, part)
    return _instance(obj, where)


def _import(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        top = module_name.split(".")[0]
        if exc.name != top or here in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, here)  # as `python -m` runs a module of the current folder
        logger.info("importing %s from the current folder %s", module_name, here)
        return importlib.import_module(module_name)


def get_paradigm(name: str) -> Paradigm:
    """Return the paradigm registered as ``name``, or the one at import path ``package.module:Class``.

    Raises
    ------
    ConfigError
        If no paradigm of that name is registered (the message lists the known ones), or an import
        path does not lead to a paradigm (see :func:`load_paradigm`).
    """
    if name in _REGISTERED:
        return _REGISTERED[name]
    eps = _entry_points()
    if name in eps:
        return _instance(eps[name].load(), f"entry point {name!r} of {ENTRY_POINT_GROUP}")
    if is_import_path(name):
        return load_paradigm(name)
    known = available_paradigms()
    raise ConfigError(f"unknown paradigm {name!r}; available: {', '.join(known) if known else 'none registered'}, "
                      "or an import path package.module:Class")
