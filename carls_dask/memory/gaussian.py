"""CARLS's dynamic Gaussian memory as a pure state machine (NumPy, no Dask, no I/O).

The memory keeps up to ``max_num_clusters`` clusters of activation vectors. Each cluster holds a FIFO
buffer of its last ``per_cluster_buffer_size`` inputs; its mean is the buffer's average and its variance
the buffer's per-dimension population variance, floored at ``min_variance`` (a cluster of one input has
``min_variance`` everywhere). :func:`memory_lookup` answers a batch of inputs with the nearest cluster's
mean, variance, distance and index, in one of three modes:

1. :attr:`LookupMode.LOOKUP` (CARLS ``LOOKUP_WITHOUT_UPDATE``): read only; needs at least one cluster.
2. :attr:`LookupMode.UPDATE` (``LOOKUP_WITH_UPDATE``): each input joins its nearest cluster.
3. :attr:`LookupMode.GROW` (``LOOKUP_WITH_GROW``): as 2, except that an input whose nearest cluster is
   beyond ``distance_to_cluster_threshold`` seeds a new cluster, once more than ``bootstrap_steps``
   update/grow calls have been made (this one counted) and while fewer than ``max_num_clusters`` exist.

In modes 2 and 3 the very first input of an empty memory seeds cluster 0. A batch is applied in order,
and every answer is computed after the whole batch was applied (as CARLS does). Two distances:
``cwise_mean_gaussian`` = ``exp(-0.5 * mean_i((x_i - mu_i)^2 / var_i))`` (larger is closer; "beyond the
threshold" means below it) and ``squared_l2`` = ``||x - mu||^2`` (smaller is closer; beyond means above).

Unlike CARLS, the state includes the count of update/grow calls (CARLS does not save it, so a restored
memory started bootstrapping again); :class:`MemoryState` round-trips through :meth:`MemoryState.to_arrays`.

>>> import numpy as np
>>> cfg = MemoryConfig(dim=2, per_cluster_buffer_size=2, max_num_clusters=1, min_variance=1.0)
>>> state = MemoryState.empty(cfg)
>>> r = memory_lookup(state, cfg, np.array([[1.0, 2.0]]), LookupMode.UPDATE)
>>> r = memory_lookup(state, cfg, np.array([[5.0, 2.0], [3.0, 4.0]]), LookupMode.UPDATE)
>>> r.mean[0].tolist(), [round(float(d), 4) for d in r.distance]
([4.0, 3.0], [0.6065, 0.6065])
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

import numpy as np

from carls_dask.errors import ConfigError, InvalidBatchError, InvalidShapeError

__all__ = ["DISTANCES", "GaussianMemory", "LookupMode", "MemoryConfig", "MemoryLookupResult", "MemoryState",
           "memory_lookup"]

DISTANCES = ("cwise_mean_gaussian", "squared_l2")


class LookupMode(enum.IntEnum):
    """The three lookup modes of CARLS's ``MemoryLookup`` (same numbers)."""

    LOOKUP = 1
    UPDATE = 2
    GROW = 3


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """Settings of a Gaussian memory (CARLS's ``GaussianMemoryConfig`` plus the vector size).

    Parameters
    ----------
    dim
        Size of an activation vector (the last dimension of the inputs).
    per_cluster_buffer_size
        Inputs kept per cluster (FIFO); mean and variance are computed over them.
    max_num_clusters
        Most clusters the memory grows to.
    distance_to_cluster_threshold
        In mode 3, an input farther than this from its nearest cluster seeds a new one.
    bootstrap_steps
        Growing starts once more than this many update/grow calls were made.
    min_variance
        Floor of every cluster's per-dimension variance.
    distance
        ``"cwise_mean_gaussian"`` or ``"squared_l2"``.
    """

    dim: int
    per_cluster_buffer_size: int = 16
    max_num_clusters: int = 1
    distance_to_cluster_threshold: float = 0.5
    bootstrap_steps: int = 0
    min_variance: float = 1.0
    distance: str = "cwise_mean_gaussian"

    def __post_init__(self) -> None:
        checks = [
            ("dim", self.dim, isinstance(self.dim, int) and self.dim >= 1, "an int >= 1"),
            ("per_cluster_buffer_size", self.per_cluster_buffer_size,
             isinstance(self.per_cluster_buffer_size, int) and self.per_cluster_buffer_size >= 1, "an int >= 1"),
            ("max_num_clusters", self.max_num_clusters,
             isinstance(self.max_num_clusters, int) and self.max_num_clusters >= 1, "an int >= 1"),
            ("bootstrap_steps", self.bootstrap_steps,
             isinstance(self.bootstrap_steps, int) and self.bootstrap_steps >= 0, "an int >= 0"),
            ("min_variance", self.min_variance,
             isinstance(self.min_variance, (int, float)) and math.isfinite(self.min_variance)
             and self.min_variance > 0, "a finite number > 0"),
            ("distance_to_cluster_threshold", self.distance_to_cluster_threshold,
             isinstance(self.distance_to_cluster_threshold, (int, float))
             and math.isfinite(self.distance_to_cluster_threshold), "a finite number"),
            ("distance", self.distance, self.distance in DISTANCES, f"one of {DISTANCES}"),
        ]
        for name, value, ok, expected in checks:
            if not ok:
                raise ConfigError(f"MemoryConfig.{name} is {value!r}; expected {expected}")

    def as_vector(self) -> np.ndarray:
        """The settings as ``float64[7]`` (how a bank-held memory stores them)."""
        return np.array([self.dim, self.per_cluster_buffer_size, self.max_num_clusters,
                         self.distance_to_cluster_threshold, self.bootstrap_steps, self.min_variance,
                         DISTANCES.index(self.distance)], dtype=np.float64)

    @classmethod
    def from_vector(cls, v: np.ndarray) -> MemoryConfig:
        """Inverse of :meth:`as_vector`."""
        return cls(dim=int(v[0]), per_cluster_buffer_size=int(v[1]), max_num_clusters=int(v[2]),
                   distance_to_cluster_threshold=float(v[3]), bootstrap_steps=int(v[4]),
                   min_variance=float(v[5]), distance=DISTANCES[int(v[6])])


@dataclasses.dataclass
class MemoryState:
    """The whole state of a memory: clusters, their buffers and the call counter.

    Attributes
    ----------
    buffers
        ``float64[max_num_clusters, per_cluster_buffer_size, dim]``: each cluster's last inputs (a ring).
    fill
        ``int64[max_num_clusters]``: inputs held per cluster (at most the buffer size).
    head
        ``int64[max_num_clusters]``: the ring slot the next input of each cluster goes to.
    n_clusters
        Clusters in use (clusters ``0 .. n_clusters-1``).
    steps
        Update/grow calls made so far (CARLS's bootstrap counter, kept here).
    """

    buffers: np.ndarray
    fill: np.ndarray
    head: np.ndarray
    n_clusters: int = 0
    steps: int = 0

    @classmethod
    def empty(cls, config: MemoryConfig) -> MemoryState:
        """A memory without clusters."""
        c, b, d = config.max_num_clusters, config.per_cluster_buffer_size, config.dim
        return cls(np.zeros((c, b, d)), np.zeros(c, np.int64), np.zeros(c, np.int64))

    def statistics(self, config: MemoryConfig) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, variance)``, each ``float64[n_clusters, dim]``, of the clusters in use."""
        n = self.n_clusters
        fill = self.fill[:n].astype(np.float64)
        slots = np.arange(config.per_cluster_buffer_size)[None, :] < self.fill[:n, None]
        buf = np.where(slots[:, :, None], self.buffers[:n], 0.0)
        mean = buf.sum(axis=1) / np.maximum(fill, 1.0)[:, None]
        dev = np.where(slots[:, :, None], self.buffers[:n] - mean[:, None, :], 0.0)
        var = (dev ** 2).sum(axis=1) / np.maximum(fill, 1.0)[:, None]
        return mean, np.maximum(var, config.min_variance)

    def to_arrays(self) -> dict[str, Any]:
        """The state as plain arrays and ints (copies)."""
        return {"buffers": self.buffers.copy(), "fill": self.fill.copy(), "head": self.head.copy(),
                "n_clusters": int(self.n_clusters), "steps": int(self.steps)}

    def copy(self) -> MemoryState:
        """A deep copy."""
        return MemoryState(**self.to_arrays())

    def check(self, config: MemoryConfig, owner: str = "MemoryState") -> None:
        """Raise :class:`InvalidBatchError` unless this state fits ``config``."""
        c, b, d = config.max_num_clusters, config.per_cluster_buffer_size, config.dim
        problems = []
        if self.buffers.shape != (c, b, d):
            problems.append(f"buffers shape {self.buffers.shape}, expected {(c, b, d)}")
        if self.fill.shape != (c,) or self.head.shape != (c,):
            problems.append(f"fill/head shapes {self.fill.shape}/{self.head.shape}, expected {(c,)}")
        elif not 0 <= self.n_clusters <= c:
            problems.append(f"n_clusters {self.n_clusters}, expected 0..{c}")
        elif (np.any(self.fill[:self.n_clusters] < 1) or np.any(self.fill > b) or np.any(self.head < 0)
              or np.any(self.head >= b) or np.any(self.fill[self.n_clusters:] != 0)):
            problems.append(f"fill {self.fill.tolist()} / head {self.head.tolist()} do not describe "
                            f"{self.n_clusters} clusters of buffers of {b}")
        if self.steps < 0:
            problems.append(f"steps {self.steps}, expected >= 0")
        if problems:
            raise InvalidBatchError(f"{owner}: " + "; ".join(problems))


@dataclasses.dataclass(frozen=True)
class MemoryLookupResult:
    """The answer of :func:`memory_lookup`, shaped like the inputs' leading dimensions.

    Attributes
    ----------
    mean, variance
        ``float32[..., dim]``: the nearest cluster's statistics.
    distance
        ``float32[...]``: the distance to it (Gaussian: larger is closer; squared L2: smaller is closer).
    cluster_index
        ``int64[...]``: its index.
    """

    mean: np.ndarray
    variance: np.ndarray
    distance: np.ndarray
    cluster_index: np.ndarray


def _distances(x: np.ndarray, mean: np.ndarray, var: np.ndarray, kind: str) -> np.ndarray:
    """``[n, C]`` distances of ``x[n, D]`` to clusters of ``mean/var[C, D]``."""
    diff2 = (x[:, None, :] - mean[None, :, :]) ** 2
    if kind == "squared_l2":
        return diff2.sum(axis=2)
    return np.exp(-0.5 * (diff2 / var[None, :, :]).mean(axis=2))


def _nearest(d: np.ndarray, kind: str) -> np.ndarray:
    return d.argmax(axis=1) if kind == "cwise_mean_gaussian" else d.argmin(axis=1)


def _beyond(d: float, threshold: float, kind: str) -> bool:
    return d < threshold if kind == "cwise_mean_gaussian" else d > threshold


def _push(state: MemoryState, cluster: int, x: np.ndarray, buffer_size: int) -> None:
    state.buffers[cluster, state.head[cluster]] = x
    state.head[cluster] = (state.head[cluster] + 1) % buffer_size
    state.fill[cluster] = min(state.fill[cluster] + 1, buffer_size)


def check_inputs(inputs: Any, config: MemoryConfig, mode: Any, owner: str) -> tuple[np.ndarray, LookupMode]:
    """Validate a lookup: finite ``[..., dim]`` numbers and a mode 1-3; returns ``(float64[n, dim], mode)``."""
    if isinstance(mode, bool) or not isinstance(mode, int | np.integer) or int(mode) not in (1, 2, 3):
        raise ConfigError(f"{owner}: lookup mode is {mode!r}; expected 1 (lookup), 2 (update) or 3 (grow)")
    m = LookupMode(int(mode))
    x = np.asarray(inputs)
    if x.dtype.kind not in "fiu" or x.ndim < 1 or x.shape[-1] != config.dim:
        raise InvalidShapeError(f"{owner}: inputs of shape {x.shape} and dtype {x.dtype}; expected numbers "
                                f"shaped [..., {config.dim}]")
    flat = x.reshape(-1, config.dim).astype(np.float64)
    bad = ~np.isfinite(flat).all(axis=1)
    if bad.any():
        raise InvalidBatchError(f"{owner}: {int(bad.sum())} input row(s) hold NaN or inf (first: row "
                                f"{int(np.flatnonzero(bad)[0])}); expected finite activations")
    return flat, m


def memory_lookup(state: MemoryState, config: MemoryConfig, inputs: Any, mode: int | LookupMode) -> MemoryLookupResult:
    """Look ``inputs`` up (and in modes 2 and 3 apply them) in ``state``, in place.

    Parameters
    ----------
    state
        The memory; changed in place by modes 2 and 3, only when the whole batch is valid.
    config
        Its settings.
    inputs
        ``[..., dim]`` finite numbers; leading dimensions are the batch.
    mode
        1, 2 or 3 (:class:`LookupMode`).

    Returns
    -------
    MemoryLookupResult
        Per input, the nearest cluster after the whole batch was applied.

    Raises
    ------
    ConfigError
        If ``mode`` is not 1, 2 or 3.
    InvalidShapeError, InvalidBatchError
        If the inputs are not ``[..., dim]`` finite numbers, or mode 1 meets an empty memory.
    """
    x, m = check_inputs(inputs, config, mode, "memory_lookup")
    lead = np.asarray(inputs).shape[:-1]
    if m is LookupMode.LOOKUP and state.n_clusters == 0:
        raise InvalidBatchError("memory_lookup: mode 1 (lookup without update) on a memory without clusters; "
                                "expected at least one (update or grow first)")
    if m is not LookupMode.LOOKUP and x.shape[0]:
        state.steps += 1
        may_grow = m is LookupMode.GROW and state.steps > config.bootstrap_steps
        kind, b = config.distance, config.per_cluster_buffer_size
        for row in x:
            if state.n_clusters == 0:
                state.n_clusters = 1
                _push(state, 0, row, b)
                continue
            mean, var = state.statistics(config)
            d = _distances(row[None, :], mean, var, kind)[0]
            near = int(_nearest(d[None, :], kind)[0])
            if (may_grow and state.n_clusters < config.max_num_clusters
                    and _beyond(float(d[near]), config.distance_to_cluster_threshold, kind)):
                near = state.n_clusters
                state.n_clusters += 1
            _push(state, near, row, b)
    mean, var = state.statistics(config)
    if x.shape[0] == 0 or state.n_clusters == 0:
        empty = np.zeros((*lead, config.dim), np.float32)
        return MemoryLookupResult(empty, empty.copy(), np.zeros(lead, np.float32), np.zeros(lead, np.int64))
    d = _distances(x, mean, var, config.distance)
    idx = _nearest(d, config.distance)
    return MemoryLookupResult(
        mean=mean[idx].astype(np.float32).reshape(*lead, config.dim),
        variance=var[idx].astype(np.float32).reshape(*lead, config.dim),
        distance=d[np.arange(len(idx)), idx].astype(np.float32).reshape(lead),
        cluster_index=idx.astype(np.int64).reshape(lead),
    )


class GaussianMemory:
    """An in-process memory: a :class:`MemoryState` and its settings behind CARLS's lookup call.

    :class:`carls_dask.memory.BankGaussianMemory` has the same ``config`` and ``lookup``, with the state in
    a bank table instead; :class:`carls_dask.memory.DynamicNormalization` takes either.

    Parameters
    ----------
    config
        The settings.
    state
        A state to start from (checked against ``config``); ``None`` starts empty.
    """

    def __init__(self, config: MemoryConfig, state: MemoryState | None = None) -> None:
        self.config = config
        if state is not None:
            state.check(config, "GaussianMemory")
        self.state = state.copy() if state is not None else MemoryState.empty(config)

    def lookup(self, inputs: Any, mode: int | LookupMode = LookupMode.LOOKUP, *,
               model_step: int = 0) -> MemoryLookupResult:
        """See :func:`memory_lookup` (``model_step`` is accepted for the bank-held memory's signature)."""
        return memory_lookup(self.state, self.config, inputs, mode)

    def __repr__(self) -> str:
        return f"GaussianMemory({self.config}, n_clusters={self.state.n_clusters}, steps={self.state.steps})"
