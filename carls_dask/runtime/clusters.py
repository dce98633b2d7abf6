"""Starting or connecting to the Dask cluster a Workbench uses (``carls.cluster`` settings)."""

from __future__ import annotations

import contextlib
import logging
import pathlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from carls_dask import config
from carls_dask.errors import ConfigError

__all__ = ["JOBQUEUE_CLASSES", "SECURITY_KINDS", "gpu_workers", "make_security", "start_cluster"]

logger = logging.getLogger(__name__)

#: dask-jobqueue cluster class for each ``carls.cluster.jobqueue.system``.
JOBQUEUE_CLASSES = {
    "slurm": "SLURMCluster",
    "pbs": "PBSCluster",
    "sge": "SGECluster",
    "lsf": "LSFCluster",
    "htcondor": "HTCondorCluster",
    "oar": "OARCluster",
    "moab": "MoabCluster",
}

#: Values of ``carls.cluster.security``.
SECURITY_KINDS = ("none", "temporary", "files")


def make_security(security: Any = None) -> Any:
    """The :class:`distributed.security.Security` of the cluster, or ``None`` for plain TCP.

    Parameters
    ----------
    security
        A ``Security`` object (used as is); ``"none"`` / ``False``; ``"temporary"`` / ``True``
        (self-signed certificates made now, kept in memory, TLS required on every connection); or
        ``"files"`` (the PEM files of ``carls.cluster.tls``: ``ca-file``, ``cert``, ``key``).
        Default ``carls.cluster.security``.

    Raises
    ------
    ConfigError
        For an unknown kind, or ``"files"`` with a missing or unreadable file.
    """
    from distributed.security import Security

    if isinstance(security, Security):
        return security
    if security is True:
        security = "temporary"
    elif security is False:
        security = "none"
    kind = config.get("cluster.security", security)
    if kind in (None, "none"):
        return None
    if kind == "temporary":
        try:
            return Security.temporary()  # requires encryption: it is made with certificates
        except ImportError as exc:
            raise ConfigError("carls.cluster.security is 'temporary' but the 'cryptography' package is missing; "
                              "expected it installed (it is a carls-dask dependency)") from exc
    if kind == "files":
        files = {}
        for key in ("ca-file", "cert", "key"):
            value = config.get(f"cluster.tls.{key}")
            if not value or not pathlib.Path(str(value)).is_file():
                raise ConfigError(f"carls.cluster.tls.{key}: got {value!r}; expected the path of a PEM file "
                                  "(carls.cluster.security is 'files')")
            files[key] = str(value)
        roles = {f"tls_{role}_{part}": files[part] for role in ("client", "scheduler", "worker")
                 for part in ("cert", "key")}
        return Security(tls_ca_file=files["ca-file"], require_encryption=True, **roles)
    raise ConfigError(f"carls.cluster.security: got {kind!r}; expected one of {list(SECURITY_KINDS)} "
                      "or a distributed.security.Security")


def _local_gpus() -> int:
    import torch

    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def start_local(**overrides: Any) -> Any:
    """Start a :class:`distributed.LocalCluster` from ``carls.cluster`` (worker processes).

    Workers advertise a ``GPU`` resource when this machine has CUDA devices. A ``security``
    override (see :func:`make_security`) secures every connection with TLS.
    """
    from distributed import LocalCluster

    security = make_security(overrides.pop("security", None))

    n_workers = int(config.get("cluster.n-workers", overrides.pop("n_workers", None)))
    host = config.get("cluster.host", overrides.pop("host", None))
    dashboard = config.get("cluster.dashboard-address", overrides.pop("dashboard_address", None))
    if isinstance(dashboard, str) and dashboard.startswith(":") and host:
        dashboard = f"{host}{dashboard}"  # a bare port would bind every interface; keep it on the cluster's
    kwargs: dict[str, Any] = {
        "n_workers": n_workers,
        "threads_per_worker": int(config.get("cluster.threads-per-worker", overrides.pop("threads_per_worker", None))),
        "processes": True,
        "host": host,
        "dashboard_address": dashboard,
    }
    if security is not None:
        kwargs["security"] = security
        kwargs["protocol"] = "tls://"
    gpus = _local_gpus()
    if gpus:
        kwargs["resources"] = {"GPU": max(1, gpus // n_workers)}
    kwargs.update(overrides)
    with _children_ignore_ctrl_c():
        return LocalCluster(**kwargs)


@contextlib.contextmanager
def _children_ignore_ctrl_c() -> Iterator[None]:
    """Ignore SIGINT while the block starts worker processes, so that they start with it ignored.

    A Ctrl-C in a terminal goes to every process of its foreground group, local workers included. A
    worker that took it would die mid-task (its own traceback, a lost bank shard); with SIGINT ignored
    from birth only this process gets it, and the Workbench stops the loops in order and keeps the
    checkpoint. Signal handlers can be set from the main thread only; elsewhere nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def start_jobqueue(**overrides: Any) -> Any:
    """Start a dask-jobqueue cluster of ``carls.cluster.jobqueue.system`` and scale it.

    The cluster class reads its own ``jobqueue.<system>`` configuration (cores, memory, queue, ...);
    ``overrides`` go to its constructor. With ``gpus-per-job > 0`` each worker advertises that many
    ``GPU`` resources (and Slurm jobs ask for them with ``--gres``).
    """
    system = str(config.get("cluster.jobqueue.system", overrides.pop("system", None)))
    if system not in JOBQUEUE_CLASSES:
        raise ConfigError(f"carls.cluster.jobqueue.system: got {system!r}; expected one of {sorted(JOBQUEUE_CLASSES)}")
    try:
        import dask_jobqueue
    except ImportError as exc:
        raise ConfigError("carls.cluster.kind is 'jobqueue' but dask-jobqueue is not installed "
                          "(pip install 'carls-dask[hpc]')") from exc
    cls = getattr(dask_jobqueue, JOBQUEUE_CLASSES[system])
    security = make_security(overrides.pop("security", None))
    if security is not None:
        overrides["security"] = security
        overrides.setdefault("protocol", "tls://")
    jobs = int(config.get("cluster.jobqueue.jobs", overrides.pop("jobs", None)))
    gpus = int(config.get("cluster.jobqueue.gpus-per-job", overrides.pop("gpus_per_job", None)))
    if gpus:
        extra = list(overrides.pop("worker_extra_args", []) or [])
        overrides["worker_extra_args"] = [*extra, "--resources", f"GPU={gpus}"]
        if system == "slurm":
            directives = list(overrides.pop("job_extra_directives", []) or [])
            overrides["job_extra_directives"] = [*directives, f"--gres=gpu:{gpus}"]
    cluster = cls(**overrides)
    if jobs:
        cluster.scale(jobs=jobs)
    logger.info("started %s with %d job(s)", cls.__name__, jobs)
    return cluster


def start_cluster(kind: str | None = None, **overrides: Any) -> tuple[Any, str | None]:
    """Start or locate the cluster of ``kind`` (default ``carls.cluster.kind``).

    Returns
    -------
    (cluster, address)
        ``cluster`` is the cluster object this call started (the caller closes it) or ``None``
        when connecting to an existing scheduler at ``address``.
    """
    kind = str(config.get("cluster.kind", kind))
    if kind == "local":
        return start_local(**overrides), None
    if kind == "address":
        overrides.pop("security", None)  # the caller connects with it
        address = config.get("cluster.address", overrides.pop("address", None))
        if not address:
            raise ConfigError("carls.cluster.kind is 'address' but carls.cluster.address is not set; "
                              "expected a scheduler address such as 'tcp://10.0.0.5:8786'")
        return None, str(address)
    if kind == "jobqueue":
        return start_jobqueue(**overrides), None
    raise ConfigError(f"carls.cluster.kind: got {kind!r}; expected 'local', 'address' or 'jobqueue'")


def gpu_workers(client: Any) -> list[str]:
    """Addresses of the workers that advertise a ``GPU`` resource."""
    workers = client.scheduler_info(n_workers=-1).get("workers", {})
    return sorted(addr for addr, info in workers.items() if info.get("resources", {}).get("GPU", 0) > 0)
