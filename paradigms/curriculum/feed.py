"""Where a curriculum loop gets its data: loaded by the loop itself, or from the node's shared loader.

:class:`CurriculumFeed` gives a trainer or maker the run's :class:`~carls_dask.paradigms.curriculum.settings.CurriculumData`
and, per epoch, the training images it trains on or scores (augmented when ``settings.augment``).

- **Separate loading** (``shared_loading="off"``): the loop loads the data set and augments the rows it
  needs itself (a maker only its part).
- **Shared loading** (``shared_loading="on"``): the first loop on a node creates a
  :class:`~carls_dask.loading.shared.SharedLoader` named after the data settings, holding the data set and
  each epoch's augmented images, filled once by a producer thread in that loop's process; the other
  loops on the node attach to it and read views of it. Augmentation is a pure function of
  (seed, epoch, example), so both ways give the same images and the same run.
- ``shared_loading="auto"`` (the default) is shared loading when the run augments and has makers (the
  per-epoch augmentation is what sharing saves) and the node has a writable ``/dev/shm``, and separate loading otherwise, or when the node's shared memory cannot
  hold the loader (a warning says so); with ``"on"`` those are errors.

The loop that created the loader keeps it open after it ends, until the last loop reading it left.
A loop detached for falling behind (its epoch was overwritten), finding the loader closed or losing
its producer (the producer's process died with its worker, say) continues with separate loading,
with a warning naming the cause: the same images, computed by itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from carls_dask.errors import ConfigError
from carls_dask.loading.shared import (
    SHM_DIR,
    ConsumerDetached,
    LoaderClosed,
    LoaderConsumer,
    LoaderError,
    ProducerLost,
    SharedLoader,
    attach,
    shared_memory_available,
)
from carls_dask.paradigms.curriculum.augment import augment_images, epoch_of
from carls_dask.paradigms.curriculum.data import CurriculumData, load_data
from carls_dask.paradigms.curriculum.noise import NoisyLabels
from carls_dask.paradigms.curriculum.settings import CurriculumSettings
from carls_dask.paradigms.data.fashion_mnist import FASHION_MNIST_CLASSES, ImageData
from carls_dask.storage.fsutil import short_lock

__all__ = ["CurriculumFeed", "LoadingOptions", "loader_name"]

logger = logging.getLogger(__name__)

_DATA_FIELDS = ("dataset", "n_train", "n_test", "noise", "seed", "holdout", "data_dir", "augment", "steps",
                "batch_size")


@dataclasses.dataclass(frozen=True)
class LoadingOptions:
    """The ``carls.loading`` settings a loop uses, resolved on the client.

    Attributes
    ----------
    slots
        Epochs the shared loader's ring holds.
    consumers
        Most loops attached to one loader.
    wait_timeout
        Deadline of one wait for an epoch (seconds).
    producer_timeout
        A producer silent this long is lost (seconds).
    """

    slots: int = 3
    consumers: int = 16
    wait_timeout: float = 120.0
    producer_timeout: float = 60.0

    @classmethod
    def from_config(cls, resolved: Mapping[str, Any] | None = None) -> LoadingOptions:
        """From a resolved ``carls`` namespace (a loop's ``ctx.config``), else from :mod:`dask.config`."""
        from dask.utils import parse_timedelta

        from carls_dask import config

        if resolved is not None and "loading" in resolved:
            d = resolved["loading"]
        else:
            d = {k: config.get(f"loading.{k}") for k in ("slots", "consumers", "wait-timeout", "producer-timeout")}
        try:
            return cls(int(d["slots"]), int(d["consumers"]), float(parse_timedelta(d["wait-timeout"], "seconds")),
                       float(parse_timedelta(d["producer-timeout"], "seconds")))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"carls.loading: {d!r}; expected slots, consumers, wait-timeout and "
                              "producer-timeout") from exc


def loader_name(settings: CurriculumSettings) -> str:
    """The shared loader's name for these settings: loops whose data settings agree share it."""
    key = repr([getattr(settings, f) for f in _DATA_FIELDS]).encode()
    return f"carls-curriculum-{hashlib.sha1(key).hexdigest()[:16]}"


def _classes(s: CurriculumSettings) -> tuple[str, ...]:
    return FASHION_MNIST_CLASSES if s.dataset == "fashion-mnist" else tuple(str(i) for i in range(10))


def _static(data: CurriculumData) -> dict[str, np.ndarray]:
    out = {"x_train": data.images.x_train, "y_train": data.images.y_train, "x_test": data.images.x_test,
           "y_test": data.images.y_test, "given": data.labels.labels, "clean": data.labels.clean,
           "flipped": data.labels.flipped}
    if data.x_val is not None and data.val is not None:
        out.update(x_val=data.x_val, val_given=data.val.labels, val_clean=data.val.clean, val_flipped=data.val.flipped)
    return out


def _data(s: CurriculumSettings, a: Mapping[str, np.ndarray]) -> CurriculumData:
    images = ImageData(s.dataset, a["x_train"], a["y_train"], a["x_test"], a["y_test"], _classes(s))
    labels = NoisyLabels(a["given"], a["clean"], a["flipped"], s.noise)
    if "x_val" not in a:
        return CurriculumData(images, labels)
    return CurriculumData(images, labels, a["x_val"], NoisyLabels(a["val_given"], a["val_clean"], a["val_flipped"],
                                                                  s.noise))


@contextlib.contextmanager
def _creating(name: str, timeout: float) -> Iterator[None]:
    """Hold the node-wide right to create loader ``name`` (an ``flock`` on ``/dev/shm/<name>.init``).

    Whoever holds it removes the file before letting go, so none is left behind; a loop waiting on
    the removed file then gets it, finds the loader and attaches.
    """
    path = SHM_DIR / f"{name}.init"
    with short_lock(path, f"shared loader {name!r} (being created by another loop)", timeout):
        try:
            yield
        finally:
            path.unlink(missing_ok=True)


class CurriculumFeed:
    """The data of one curriculum loop, loaded separately or read from the node's shared loader.

    Parameters
    ----------
    settings
        The run's settings (``shared_loading`` picks the way).
    loop
        The loop's name (the consumer's name in the shared loader's errors).
    options
        The resolved ``carls.loading`` settings.

    Attributes
    ----------
    data
        The run's data (views of the shared segment with shared loading).
    cpu_seconds
        CPU time this loop spent loading and transforming data (with the producer's, when this loop
        owns the shared loader).
    """

    def __init__(self, settings: CurriculumSettings, loop: str, options: LoadingOptions | None = None) -> None:
        self.settings = settings
        self.loop = loop
        self.options = options or LoadingOptions()
        self.producer: SharedLoader | None = None
        self.consumer: LoaderConsumer | None = None
        self._cpu = 0.0
        self._cache: tuple[int, Any, np.ndarray] | None = None
        self.data: CurriculumData
        t0 = time.thread_time()
        if self._wants_shared():
            self._open_shared()
        if self.consumer is not None:
            self.data = _data(settings, self.consumer.static)
        else:
            self.data = load_data(settings)
        self._cpu += time.thread_time() - t0

    def _wants_shared(self) -> bool:
        """Whether to read from a shared loader, by ``settings.shared_loading`` and this node."""
        s = self.settings
        if s.shared_loading == "off":
            return False
        if shared_memory_available():
            return s.shared_loading == "on" or (s.augment and s.uses_bank and s.makers > 0)
        if s.shared_loading == "on":
            raise ConfigError(f"{self.loop}: shared_loading='on', but this node has no writable {SHM_DIR}; "
                              "expected a Linux node, or shared_loading 'auto' or 'off'")
        return False

    @property
    def n(self) -> int:
        """Training examples."""
        return int(self.data.labels.labels.shape[0])

    @property
    def epochs(self) -> int:
        """Epochs a run of ``settings.steps`` steps reads (one more for the makers' pass after the last step)."""
        return epoch_of(self.settings.steps, self.settings.batch_size, self.n) + 1

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds spent loading and transforming, this loop's and its producer's."""
        return self._cpu + (self.producer.cpu_seconds if self.producer is not None else 0.0)

    @property
    def mode(self) -> str:
        """``"produced"`` (this loop created the shared loader), ``"shared"`` (it reads one) or ``"separate"``
        (it loads by itself, from the start or since it fell behind or found the loader closed)."""
        if self.producer is not None:
            return "produced"
        return "shared" if self.consumer is not None else "separate"

    @property
    def shared(self) -> bool:
        """Whether this feed reads from a shared loader now."""
        return self.consumer is not None

    def _attach(self, name: str) -> bool:
        o = self.options
        try:
            self.consumer = attach(name, self.loop, wait_timeout=o.wait_timeout, producer_timeout=o.producer_timeout)
        except ConfigError:
            raise
        except LoaderError as exc:  # none yet, or one left by a dead producer (attach unlinked it)
            logger.debug("%s: no usable shared loader %r (%s)", self.loop, name, exc)
            return False
        logger.info("%s: reads the shared loader %r", self.loop, name)
        return True

    def _open_shared(self) -> None:
        """Attach to, or create, the node's loader; with ``shared_loading="auto"``, a loader that cannot
        be made (too little shared memory, say) leaves this loop to load by itself."""
        try:
            self._open_or_create()
        except ConfigError:
            raise
        except (LoaderError, OSError) as exc:
            if self.settings.shared_loading == "on":
                raise
            logger.warning("%s: loads separately; no shared loader could be opened (%s)", self.loop, exc)
            self.consumer = None

    def _open_or_create(self) -> None:
        s, o = self.settings, self.options
        name = loader_name(s)  # the name fixes the data settings, so an attached loader holds this run's data
        for _ in range(3):
            if self._attach(name):
                return
            # one loop at a time loads and creates; the others wait, then attach
            with _creating(name, o.wait_timeout):
                if self._attach(name):
                    return
                data = load_data(s)
                x = data.images.x_train
                try:
                    self.producer = SharedLoader(
                        name, static=_static(data), epoch={"x": (x.shape, x.dtype)} if s.augment else {},
                        transform=self._produce, slots=o.slots, consumers=o.consumers,
                        epochs=epoch_of(s.steps, s.batch_size, x.shape[0]) + 1 if s.augment else 0, start=False)
                except LoaderError:
                    continue  # another one created it meanwhile: attach to it
                self.producer.start()
                logger.info("%s: created the shared loader %r", self.loop, name)
                self.consumer = attach(name, self.loop, wait_timeout=o.wait_timeout,
                                       producer_timeout=o.producer_timeout)
                return
        raise LoaderError(f"{self.loop}: could neither attach to nor create the shared loader {name!r}")

    def _produce(self, epoch: int, out: dict[str, np.ndarray]) -> None:
        assert self.producer is not None
        augment_images(self.producer.static["x_train"], seed=self.settings.seed, epoch=epoch, out=out["x"])

    def images(self, epoch: int, rows: slice | None = None) -> np.ndarray:
        """The training images of epoch ``epoch`` (rows ``rows`` only when given), augmented when the run augments.

        With shared loading, a view of the shared segment, valid until the next call or :meth:`release`
        (check with :meth:`intact`); else the loop's own array, overwritten by the next call for
        another epoch.
        """
        x = self.data.images.x_train
        if not self.settings.augment:
            return x if rows is None else x[rows]
        t0 = time.thread_time()
        try:
            if self.consumer is not None:
                try:
                    view = self.consumer.get(epoch)["x"]
                    return view if rows is None else view[rows]
                except (ConsumerDetached, LoaderClosed, ProducerLost) as exc:
                    self._go_separate(exc)
            key = slice(None) if rows is None else rows
            if self._cache is not None and self._cache[0] == epoch and self._cache[1] == (key.start, key.stop,
                                                                                          key.step):
                return self._cache[2]
            reuse = self._cache[2] if self._cache is not None and self._cache[1] == (key.start, key.stop,
                                                                                      key.step) else None
            # the previous epoch's buffer is reused: a loop holds one epoch at a time
            got = augment_images(x[key], seed=self.settings.seed, epoch=epoch, rows=key, n=self.n, out=reuse)
            self._cache = (epoch, (key.start, key.stop, key.step), got)
            return got
        finally:
            self._cpu += time.thread_time() - t0

    def intact(self) -> bool:
        """Whether the images last returned are still intact; ``False`` (and separate loading from now on) when
        a shared slot was overwritten under this loop."""
        if self.consumer is None or not self.settings.augment or self.consumer.valid():
            return True
        self._go_separate(ConsumerDetached(f"{self.loop}: its epoch was overwritten"))
        return False

    def release(self) -> None:
        """Hold no epoch of the shared loader (a maker between rounds)."""
        if self.consumer is not None and self.consumer.epoch is not None:
            try:
                self.consumer.release()
            except LoaderError:
                pass

    def _go_separate(self, exc: Exception) -> None:
        logger.warning("%s: continues with separate loading (%s)", self.loop, exc)
        assert self.consumer is not None
        t0 = time.thread_time()
        self.data = load_data(self.settings)  # the shared views may go away
        self._cpu += time.thread_time() - t0
        self.consumer.close()
        self.consumer = None

    def close(self) -> None:
        """Leave the shared loader; when this loop created it, it closes once the last loop reading it left
        (or after ``wait_timeout``), its producer serving them until then."""
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None
        if self.producer is not None:
            self.producer.close_when_unused(self.options.wait_timeout)
