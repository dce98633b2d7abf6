"""Which workers run what: the Dask resources of trainers, makers and bank shards (``carls.placement``).

CARLS separates its components by hardware: a trainer on a GPU worker, knowledge makers on CPU
workers, bank shards on memory-rich workers. Here each component asks for Dask worker resources
(``distributed`` ``resources=``), looked up by its kind and, when given, by its name::

    placement:
      trainer: auto   # auto: {GPU: 1} when any worker advertises GPU, else none
      maker: {}       # none: any worker
      shard: {}       # the resources a worker needs to hold bank shards
      names: {}       # per loop name (or "bank" for the shards): replaces the kind's entry

Workers advertise resources when they start (``dask worker --resources "GPU=1 MEM=1"``,
``LocalCluster(resources=...)``, ``carls.cluster.jobqueue.gpus-per-job``). Within a worker,
:func:`device_for` gives the loops of one process its CUDA devices round-robin. Everything here
except :func:`worker_resources` and :func:`loop_resources` (which ask the scheduler) is pure: it
takes the workers' resources as a mapping.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from carls_dask import config
from carls_dask.errors import ConfigError, InvalidArgumentError

__all__ = ["AUTO", "BANK", "KINDS", "device_for", "loop_resources", "resources_for", "worker_resources",
           "workers_with"]

logger = logging.getLogger(__name__)

#: Kinds of components that ``carls.placement`` places.
KINDS = ("trainer", "maker", "shard")

#: The placement value meaning ``{"GPU": 1}`` when any worker advertises ``GPU``, else no resources.
AUTO = "auto"

#: The name under ``carls.placement.names`` that places the bank's shards.
BANK = "bank"

#: Keys of the ``carls.placement`` section.
_SECTION_KEYS = (*KINDS, "names")


def _resources(value: Any, where: str) -> dict[str, float] | str:
    """``value`` checked as a placement entry: ``"auto"``, or resource names mapped to positive numbers."""
    if value is None:
        return {}
    if isinstance(value, str):
        if value == AUTO:
            return AUTO
        raise ConfigError(f"{where}: got {value!r}; expected {AUTO!r} or a mapping of Dask resource names "
                          "to positive numbers such as {GPU: 1}")
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: got {type(value).__name__} {value!r}; expected {AUTO!r} or a mapping of "
                          "Dask resource names to positive numbers such as {GPU: 1}")
    out: dict[str, float] = {}
    for key, amount in value.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{where}: resource name {key!r}; expected a non-empty string")
        if isinstance(amount, bool) or not isinstance(amount, int | float) or not math.isfinite(amount) or amount <= 0:
            raise ConfigError(f"{where}.{key}: got {amount!r}; expected a positive number of resource units")
        out[key] = float(amount) if isinstance(amount, float) else int(amount)
    return out


def _section(settings: Mapping[str, Any] | None) -> Mapping[str, Any]:
    section = config.get("placement") if settings is None else settings
    if not isinstance(section, Mapping):
        raise ConfigError(f"carls.placement: got {type(section).__name__} {section!r}; expected a mapping with "
                          f"keys among {list(_SECTION_KEYS)}")
    unknown = sorted(str(k) for k in section if k not in _SECTION_KEYS)
    if unknown:
        raise ConfigError(f"carls.placement: unknown key(s) {unknown}; expected keys among {list(_SECTION_KEYS)}")
    return section


def resources_for(kind: str, name: str | None, workers: Mapping[str, Mapping[str, float]],
                  settings: Mapping[str, Any] | None = None) -> dict[str, float] | None:
    """The Dask resources a component asks for, from ``carls.placement``.

    Parameters
    ----------
    kind
        ``"trainer"``, ``"maker"`` or ``"shard"``.
    name
        The loop's name, or :data:`BANK` (``"bank"``) for the shards; an entry of
        ``carls.placement.names`` under it replaces the kind's entry. ``None`` looks up the kind only.
    workers
        Each worker's advertised resources by address (see :func:`worker_resources`); ``"auto"``
        resolves against them.
    settings
        The placement section; default ``carls.placement`` of :mod:`dask.config`.

    Returns
    -------
    dict or None
        Resource names and amounts, for ``Client.submit(resources=...)``; ``None`` when the
        component asks for none (it may run on any worker).

    Raises
    ------
    ConfigError
        For an unknown kind, an unknown key of the section, or an entry that is neither ``"auto"``
        nor a mapping of resource names to positive numbers.
    """
    if kind not in KINDS:
        raise ConfigError(f"placement: unknown kind {kind!r}; expected one of {list(KINDS)}")
    section = _section(settings)
    names = section.get("names") or {}
    if not isinstance(names, Mapping):
        raise ConfigError(f"carls.placement.names: got {type(names).__name__} {names!r}; expected a mapping of "
                          "loop names (or 'bank') to resources")
    if name is not None and name in names:
        entry = _resources(names[name], f"carls.placement.names.{name}")
    else:
        entry = _resources(section.get(kind), f"carls.placement.{kind}")
    if isinstance(entry, str):  # auto
        has_gpu = any(float((res or {}).get("GPU", 0) or 0) > 0 for res in workers.values())
        return {"GPU": 1} if has_gpu else None
    return entry or None


def workers_with(resources: Mapping[str, float] | None, workers: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Addresses (sorted) of the workers that advertise at least ``resources``; all of them for none.

    Parameters
    ----------
    resources
        Resource names and the amounts needed, as :func:`resources_for` returns them.
    workers
        Each worker's advertised resources by address.
    """
    need = dict(resources or {})
    return sorted(addr for addr, have in workers.items()
                  if all(float((have or {}).get(key, 0) or 0) >= float(amount) for key, amount in need.items()))


def worker_resources(client: Any) -> dict[str, dict[str, float]]:
    """Each worker's advertised resources by address, as the scheduler reports them.

    Reads ``client.scheduler_info(n_workers=-1)["workers"][address]["resources"]`` (``{}`` for a
    worker that advertises none).
    """
    workers = client.scheduler_info(n_workers=-1).get("workers", {})
    return {str(addr): dict(info.get("resources") or {}) for addr, info in workers.items()}


def loop_resources(client: Any, kind: str, name: str) -> dict[str, float] | None:
    """The resources the loop ``name`` of ``kind`` asks for on ``client``'s cluster (:func:`resources_for`).

    Logs a warning when no worker advertises them now: the loop then waits until such a worker
    joins (a batch job may still be queued).
    """
    workers = worker_resources(client)
    resources = resources_for(kind, name, workers)
    if resources and not workers_with(resources, workers):
        logger.warning("%s %s asks for resources %s (carls.placement) but no worker advertises them yet; it waits "
                       "for such a worker (workers advertise %s)", kind, name, resources,
                       {addr: res for addr, res in sorted(workers.items())})
    return resources


def device_for(slot: int, n_devices: int) -> str:
    """The torch device of the ``slot``-th loop started in a process that sees ``n_devices`` CUDA devices.

    Loops take the devices round-robin: ``"cuda:<slot mod n_devices>"``, or ``"cpu"`` when
    ``n_devices`` is 0.

    Raises
    ------
    ValueError
        For a negative ``slot`` or ``n_devices``.
    """
    if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
        raise InvalidArgumentError(f"device_for: slot must be a non-negative int, got {slot!r}")
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 0:
        raise InvalidArgumentError(f"device_for: n_devices must be a non-negative int, got {n_devices!r}")
    return f"cuda:{slot % n_devices}" if n_devices else "cpu"
