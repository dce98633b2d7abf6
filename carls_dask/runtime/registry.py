"""The paradigms ``carls-dask run NAME`` can start.

``carls_dask`` does not import the paradigms; they register themselves, either through the
``carls_dask.paradigms`` entry-point group in their package metadata::

    [project.entry-points."carls_dask.paradigms"]
    semi-supervised = "carls_dask.paradigms.semi_supervised.run:main"

or at run time with :func:`register_paradigm`. A runner takes a :class:`RunRequest` and returns
an exit status (``None`` means 0).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import pathlib
from collections.abc import Callable
from typing import Any

from carls_dask.storage.errors import ConfigError

__all__ = ["ENTRY_POINT_GROUP", "RunRequest", "available_paradigms", "get_paradigm", "register_paradigm"]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "carls_dask.paradigms"


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """What ``carls-dask run`` asks a paradigm to do.

    Attributes
    ----------
    name
        The paradigm's registered name.
    run_dir
        The run folder to write (``RUN/bank``, ``RUN/metrics.zarr``, ``RUN/run.json``).
    steps
        Trainer steps to run, or ``None`` for the paradigm's default.
    options
        Extra ``key=value`` options from ``--option``, as strings.
    """

    name: str
    run_dir: pathlib.Path
    steps: int | None = None
    options: dict[str, str] = dataclasses.field(default_factory=dict)


Runner = Callable[[RunRequest], Any]

_REGISTERED: dict[str, Runner] = {}


def register_paradigm(name: str, runner: Runner, *, replace: bool = False) -> None:
    """Make ``runner`` available as ``carls-dask run name``.

    Raises
    ------
    ConfigError
        If ``name`` is empty or already registered (unless ``replace``).
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"register_paradigm: expected a non-empty name, got {name!r}")
    if not callable(runner):
        raise ConfigError(f"register_paradigm({name!r}): runner must be callable, got {type(runner).__name__}")
    if name in _REGISTERED and not replace:
        raise ConfigError(f"register_paradigm: {name!r} is already registered; pass replace=True to override")
    _REGISTERED[name] = runner


def unregister_paradigm(name: str) -> None:
    """Forget a paradigm registered with :func:`register_paradigm` (no error if unknown)."""
    _REGISTERED.pop(name, None)


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available_paradigms() -> list[str]:
    """Names of every registered paradigm (run-time registrations and entry points), sorted."""
    return sorted(set(_REGISTERED) | set(_entry_points()))


def get_paradigm(name: str) -> Runner:
    """Return the runner registered as ``name``.

    Raises
    ------
    ConfigError
        If no paradigm of that name is registered; the message lists the known ones.
    """
    if name in _REGISTERED:
        return _REGISTERED[name]
    eps = _entry_points()
    if name in eps:
        runner: Runner = eps[name].load()
        return runner
    known = available_paradigms()
    raise ConfigError(f"unknown paradigm {name!r}; available: {', '.join(known) if known else 'none registered'}")
