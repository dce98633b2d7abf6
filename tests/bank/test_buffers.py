"""Answer buffers: handed out again only once nothing refers to them, bounded in bytes and count."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from carls_dask.bank.buffers import BufferPool


def test_a_buffer_comes_back_only_when_nothing_refers_to_it() -> None:
    pool = BufferPool(1 << 24, min_bytes=1024)
    a = pool.empty((1000, 8), np.float32)
    a[:] = 1.0
    b = pool.empty((1000, 8), np.float32)  # `a` is alive: a second buffer
    assert not np.shares_memory(a, b)
    assert pool.allocated == 2 and pool.reused == 0
    addr = a.__array_interface__["data"][0]
    del a
    gc.collect()
    c = pool.empty((900, 8), np.float32)  # same size class: the freed buffer again
    assert c.__array_interface__["data"][0] == addr
    assert pool.reused == 1
    assert c.shape == (900, 8) and c.dtype == np.float32 and c.flags.c_contiguous and c.flags.writeable


@pytest.mark.parametrize("holder", ["view", "memoryview", "tensor", "row"])
def test_anything_derived_from_an_answer_keeps_its_buffer(holder: str) -> None:
    pool = BufferPool(1 << 24, min_bytes=1024, per_size=1)
    a = pool.empty((512, 16), np.float32)
    a[:] = 7.0
    kept = {"view": lambda x: x[10:20], "memoryview": memoryview, "tensor": torch.from_numpy,
            "row": lambda x: x[3]}[holder](a)
    del a
    gc.collect()
    b = pool.empty((512, 16), np.float32)  # the only pooled buffer of this size is still in use
    b[:] = -1.0
    assert float(np.asarray(kept).ravel()[0]) == 7.0
    assert pool.reused == 0


def test_small_requests_and_a_full_pool_get_plain_arrays() -> None:
    pool = BufferPool(4096, min_bytes=1024, per_size=2)
    small = pool.empty((10,), np.int64)  # 80 bytes
    assert pool.allocated == 0 and small.shape == (10,)
    held = [pool.empty((256,), np.int64) for _ in range(3)]  # 2 kB each: two fit in 4 kB
    assert pool.allocated == 2 and pool.bytes == 4096
    assert all(h.shape == (256,) for h in held)
    off = BufferPool(0)
    x = off.empty((1 << 20,), np.uint8)
    assert off.allocated == 0 and x.nbytes == 1 << 20
