"""Process targets for the shared-loader tests (importable by spawned processes)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np

from carls_dask.loading import SharedLoader, attach

ROWS, COLS = 64, 10


def epoch_data(epoch: int) -> np.ndarray:
    """What the test producer's transform writes for ``epoch``: a seeded random ``float32[ROWS, COLS]``."""
    return np.random.default_rng([7, epoch]).standard_normal((ROWS, COLS)).astype(np.float32)


def static_labels() -> np.ndarray:
    """The static array of the test loader."""
    return np.arange(ROWS, dtype=np.int64) % 3


def transform(epoch: int, out: dict[str, np.ndarray]) -> None:
    """Fill ``out["x"]`` with :func:`epoch_data`; epochs from ``SLOW_FROM`` take a minute (a producer to kill)."""
    if epoch >= SLOW_FROM:
        time.sleep(60)
    out["x"][...] = epoch_data(epoch)


SLOW_FROM = 10**9


def produce(name: str, slots: int, slow_from: int, epochs: int | None, ready: Any, stop: Any) -> None:
    """Run a producer until ``stop`` is set (or the process is killed)."""
    global SLOW_FROM
    SLOW_FROM = slow_from
    with SharedLoader(name, static={"y": static_labels()}, epoch={"x": ((ROWS, COLS), "float32")},
                      transform=transform, slots=slots, epochs=epochs):
        ready.set()
        stop.wait(60)


def consume(name: str, epochs: list[int], order_seed: int | None, results: Any) -> None:
    """Read ``epochs`` in order, each epoch's rows in a seeded order (``None``: in order), and report digests."""
    try:
        with attach(name, f"consumer-{order_seed}", wait_timeout=30, producer_timeout=30) as c:
            out = []
            for e in epochs:
                x = c.get(e)["x"]
                order = np.arange(ROWS) if order_seed is None else np.random.default_rng(order_seed).permutation(ROWS)
                rows = c.rows("x", order)
                back = np.empty_like(rows)
                back[order] = rows
                out.append(hashlib.sha256(back.tobytes()).hexdigest())
                assert np.shares_memory(x, c.get(e)["x"])
            out.append(hashlib.sha256(c.static["y"].tobytes()).hexdigest())
            results.put(("ok", out))
    except Exception as exc:  # reported to the test
        results.put((type(exc).__name__, str(exc)))
