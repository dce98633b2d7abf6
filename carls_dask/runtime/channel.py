"""Model channels: how a trainer's model versions (state dicts) reach the knowledge makers.

A channel has one publisher (a trainer) and any number of readers (makers). Readers only ever
want the newest version, so a channel holds exactly one: publishing replaces it.

:class:`LocalModelChannel` keeps the version in memory (threads of one process; used by tests and
by loops run in-process). :class:`ModelChannel` is the cluster form: the publisher scatters the
payload to the cluster and stores its future in a :class:`distributed.Variable`; a reader checks
the future's key (one ~1 ms scheduler round trip) and fetches the payload only when it changed.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import CancelledError
from typing import Any, Protocol

__all__ = ["LocalModelChannel", "ModelChannel", "ModelChannelLike", "ModelVersion", "to_cpu_state"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ModelVersion:
    """The record of one published model version.

    Attributes
    ----------
    version
        Counter of publications on the channel, starting at 1.
    step
        The trainer step the state was taken at.
    wall_time
        Unix time of publication; a maker's staleness is measured against it.
    producer
        Name of the publishing trainer.
    """

    version: int
    step: int
    wall_time: float
    producer: str = ""


class ModelChannelLike(Protocol):
    """What loops need from a channel."""

    name: str

    def publish(self, state: Mapping[str, Any], *, step: int, producer: str = "") -> ModelVersion: ...

    def fetch(self, newer_than: int = 0, timeout: float = 0.0) -> tuple[ModelVersion, dict[str, Any]] | None: ...


def to_cpu_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """Copy a state dict with every tensor detached and moved to the CPU.

    A GPU trainer's versions can then be loaded by makers that have no GPU.
    """
    import torch

    out: dict[str, Any] = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            out[key] = value.detach().to("cpu", copy=True)
        elif isinstance(value, Mapping):
            out[key] = to_cpu_state(value)
        else:
            out[key] = value
    return out


class LocalModelChannel:
    """An in-memory channel for loops that run as threads of one process.

    Parameters
    ----------
    name
        Name of the channel (usually the trainer's name).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._cond = threading.Condition()
        self._latest: tuple[ModelVersion, dict[str, Any]] | None = None

    def publish(self, state: Mapping[str, Any], *, step: int, producer: str = "") -> ModelVersion:
        """Replace the newest version with ``state`` and return its record."""
        payload = to_cpu_state(state)
        with self._cond:
            number = 1 if self._latest is None else self._latest[0].version + 1
            record = ModelVersion(number, int(step), time.time(), producer)
            self._latest = (record, payload)
            self._cond.notify_all()
        return record

    def fetch(self, newer_than: int = 0, timeout: float = 0.0) -> tuple[ModelVersion, dict[str, Any]] | None:
        """Return the newest version if its number is above ``newer_than``, waiting up to ``timeout`` s."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while self._latest is None or self._latest[0].version <= newer_than:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._latest


class ModelChannel:
    """A channel that lives on a Dask cluster.

    Two :class:`distributed.Variable` objects hold it: ``<prefix>-model-<name>-data`` holds the
    future of the scattered ``(record, state)`` payload, ``<prefix>-model-<name>-record`` a small
    dict with the record. Readers poll the record (one ~1 ms scheduler round trip) and fetch the
    payload only when the version changed. The publisher sets the data before the record, so a
    reader that sees version ``n`` in the record gets version ``n`` or newer from the data.

    The object is small and picklable: create it on the client, pass it into tasks, and it binds
    to the worker's client there.

    Parameters
    ----------
    name
        Name of the channel; two channels with the same name and prefix are the same channel.
    prefix
        Prefix of the variable names, so separate Workbenches on one scheduler do not meet.
    """

    def __init__(self, name: str, *, prefix: str = "carls") -> None:
        self.name = name
        self.variable_name = f"{prefix}-model-{name}"
        self._published: Any = None  # our own reference to the newest scattered payload
        self._count = 0
        self._seen: tuple[ModelVersion, dict[str, Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "variable_name": self.variable_name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.name = state["name"]
        self.variable_name = state["variable_name"]
        self._published = None
        self._count = 0
        self._seen = None

    @staticmethod
    def _client() -> Any:
        from distributed import get_client

        return get_client()

    def _variable(self, part: str) -> Any:
        from distributed import Variable

        return Variable(f"{self.variable_name}-{part}", client=self._client())

    def open(self) -> None:
        """Mark the channel empty (version 0), so readers never block waiting for a first version.

        The Workbench calls it before it submits the loops that use the channel.
        """
        self._variable("record").set({"version": 0})

    def publish(self, state: Mapping[str, Any], *, step: int, producer: str = "") -> ModelVersion:
        """Scatter ``state`` (moved to CPU) as the newest version and return its record.

        Versions keep counting from the channel's newest one, so a publisher that was run again (a
        trainer restarted on another worker) publishes versions its readers see as newer.
        """
        if self._count == 0:
            try:
                self._count = int(self._variable("record").get(timeout=1.0).get("version", 0))
            except TimeoutError:
                pass
        self._count += 1
        record = ModelVersion(self._count, int(step), time.time(), producer)
        client = self._client()
        # scatter a one-element list: scattering the tuple itself would scatter each item apart
        [future] = client.scatter([(record, to_cpu_state(state))], hash=False)
        self._variable("data").set(future)
        self._variable("record").set(dataclasses.asdict(record))
        # Keep a reference until the next publication, then let the old payload go.
        self._published = future
        return record

    def latest(self, timeout: float = 0.001) -> ModelVersion | None:
        """The newest record without its payload, or ``None`` when nothing was published yet."""
        try:
            raw = self._variable("record").get(timeout=max(timeout, 0.001))
        except TimeoutError:
            return None
        if int(raw.get("version", 0)) < 1:
            return None
        return ModelVersion(int(raw["version"]), int(raw["step"]), float(raw["wall_time"]), str(raw["producer"]))

    def fetch(self, newer_than: int = 0, timeout: float = 0.0) -> tuple[ModelVersion, dict[str, Any]] | None:
        """Return the newest version if its number is above ``newer_than``, else ``None``.

        Costs one scheduler round trip unless the version changed, in which case the payload is
        fetched. ``timeout`` bounds the wait for the channel to exist (see :meth:`open`).
        """
        record = self.latest(timeout)
        if record is None or record.version <= newer_than:
            return None
        if self._seen is None or self._seen[0].version < record.version:
            future = self._variable("data").get(timeout=60.0)
            got = self._gather(future, record.version)
            if got is None:
                # The payload died with the worker holding it; the publisher (restarted from its saved
                # state) publishes again, so the reader keeps the version it has until then.
                return self._seen if self._seen is not None and self._seen[0].version > newer_than else None
            self._seen = got
        return self._seen

    def _gather(self, future: Any, number: int, limit: float = 60.0) -> tuple[ModelVersion, dict[str, Any]] | None:
        """The payload of ``future``, or ``None`` when it was lost with its worker.

        Waits in one-second slices; between them the scheduler is asked who holds the payload. A
        scattered payload whose worker died is forgotten by the scheduler, and a client that asks for
        it afterwards would wait for it forever, so an unheld payload ends the wait at once.
        """
        deadline = time.monotonic() + limit
        while True:
            try:
                try:
                    version, payload = future.result(timeout=1.0)
                    return version, payload
                except TimeoutError:
                    if time.monotonic() >= deadline:
                        reason = f"not fetched within {limit:g}s"
                    elif self._client().who_has([future]).get(future.key):
                        continue
                    else:
                        reason = "no worker holds it"
            except CancelledError as exc:
                reason = f"cancelled: {exc}"
            logger.warning("model channel %s: version %d was lost with its worker (%s); keeping version %s",
                           self.variable_name, number, reason, self._seen[0].version if self._seen else None)
            return None

    def delete(self) -> None:
        """Remove the channel's variables from the scheduler (the Workbench does this on close)."""
        self._published = None
        for part in ("data", "record"):
            try:
                self._variable(part).delete()
            except Exception:  # the scheduler may already be gone
                logger.debug("could not delete channel variable %s-%s", self.variable_name, part, exc_info=True)


def unique_prefix() -> str:
    """A prefix for channel and event names unique to one Workbench."""
    return f"carls-{uuid.uuid4().hex[:10]}"
