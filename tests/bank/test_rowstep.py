"""The in-place compiled optimizer step gives the reference's bits, and a step that would overflow changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from carls_dask.bank.gradsum import group_by_row, sum_by_row
from carls_dask.bank.jit import numba
from carls_dask.bank.optimizers import STEP_SLOT, apply_optimizer, initial_slots
from carls_dask.bank.rowstep import plan_step
from carls_dask.bank.segments import SegmentedArray

pytestmark = pytest.mark.skipif(numba is None, reason="the compiled step needs numba")


def _stored(values: np.ndarray, segment_rows: int) -> SegmentedArray:
    arr = SegmentedArray(values.shape[1:], values.dtype, values.shape[0], segment_rows=segment_rows)
    arr[0: values.shape[0]] = values
    return arr


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_the_compiled_step_gives_the_reference_bits(optimizer: str, dtype: type) -> None:
    rng = np.random.default_rng(7)
    n, d, seg = 5000, 16, 1024  # several segments, rows visited out of order
    w0 = rng.normal(size=(n, d)).astype(dtype)
    slots0 = initial_slots(optimizer, n, (d,), dtype, 0.1)
    for name, a in slots0.items():  # slots as a trained table holds them
        slots0[name] = (rng.integers(0, 50, n) if name == STEP_SLOT else rng.random(a.shape) * 0.5).astype(a.dtype)
    w = _stored(w0, seg)
    slots = {name: _stored(a, seg) for name, a in slots0.items()}
    rows = rng.permutation(n)[:1500].astype(np.int64)
    grads = (rng.normal(size=(rows.size, d)) * 3).astype(dtype)
    plan = plan_step(optimizer, w, slots, rows, grads, learning_rate=0.05, betas=(0.9, 0.999), epsilon=1e-8)
    assert plan is not None and plan.run()
    want_w, want_slots = apply_optimizer(optimizer, w0[rows], grads, {k: v[rows] for k, v in slots0.items()},
                                         learning_rate=0.05, betas=(0.9, 0.999), epsilon=1e-8)
    np.testing.assert_array_equal(w[rows], want_w)
    for name, a in want_slots.items():
        np.testing.assert_array_equal(slots[name][rows], a, err_msg=name)
    untouched = np.setdiff1d(np.arange(n), rows)
    np.testing.assert_array_equal(w[untouched], w0[untouched])


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_a_step_that_would_overflow_is_reported_before_anything_is_written(optimizer: str) -> None:
    n, d = 100, 4
    w0 = np.full((n, d), 3e38, dtype=np.float32)
    slots0 = initial_slots(optimizer, n, (d,), np.float32, 1e-30)
    w = _stored(w0, 1024)
    slots = {name: _stored(a, 1024) for name, a in slots0.items()}
    rows = np.arange(0, n, 3, dtype=np.int64)
    grads = np.full((rows.size, d), -1.0, dtype=np.float32)  # each step adds about 1e38 to 3e38
    grads[: rows.size // 2] = 0.0  # the rows visited first step fine and are written back
    plan = plan_step(optimizer, w, slots, rows, grads, learning_rate=1e38)
    assert plan is not None and not plan.run()
    np.testing.assert_array_equal(w[0:n], w0)
    for name, a in slots0.items():
        np.testing.assert_array_equal(slots[name][0:n], a, err_msg=name)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_a_step_taken_back_leaves_the_rows_as_they_were(optimizer: str) -> None:
    rng = np.random.default_rng(3)
    n, d = 3000, 8
    w0 = rng.normal(size=(n, d)).astype(np.float32)
    slots0 = initial_slots(optimizer, n, (d,), np.float32, 0.1)
    w = _stored(w0, 1024)
    slots = {name: _stored(a, 1024) for name, a in slots0.items()}
    rows = rng.permutation(n)[:700].astype(np.int64)
    plan = plan_step(optimizer, w, slots, rows, rng.normal(size=(700, d)).astype(np.float32), learning_rate=0.1)
    assert plan is not None and plan.run()
    assert not np.array_equal(w[rows], w0[rows])
    plan.undo()
    np.testing.assert_array_equal(w[0:n], w0)
    for name, a in slots0.items():
        np.testing.assert_array_equal(slots[name][0:n], a, err_msg=name)


def test_columns_the_compiled_step_does_not_cover_take_the_reference_path() -> None:
    w = _stored(np.zeros((10, 4), np.float16), 1024)
    assert plan_step("sgd", w, {}, np.arange(3), np.zeros((3, 4), np.float32), learning_rate=0.1) is None
    w32 = _stored(np.zeros((10, 4), np.float32), 1024)
    assert plan_step("adagrad", w32, {}, np.arange(3), np.zeros((3, 4), np.float32), learning_rate=0.1) is None


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_duplicate_keys_gradients_are_added_in_batch_order_as_the_rows_are_read(optimizer: str) -> None:
    rng = np.random.default_rng(11)
    n, d = 2000, 8
    w0 = rng.normal(size=(n, d)).astype(np.float32)
    slots0 = initial_slots(optimizer, n, (d,), np.float32, 0.1)
    w = _stored(w0, 1024)
    slots = {name: _stored(a, 1024) for name, a in slots0.items()}
    batch = rng.integers(0, 300, 1500).astype(np.int64)  # many rows come several times
    grads = rng.normal(size=(batch.size, d)).astype(np.float32)
    grouped = group_by_row(batch)
    assert grouped is not None
    urows, first, nxt = grouped
    want_rows, summed = sum_by_row(batch, grads)
    np.testing.assert_array_equal(urows, want_rows)
    plan = plan_step(optimizer, w, slots, urows, grads, learning_rate=0.05, first=first, nxt=nxt)
    assert plan is not None and plan.run()
    want_w, want_slots = apply_optimizer(optimizer, w0[urows], summed, {k: v[urows] for k, v in slots0.items()},
                                         learning_rate=0.05)
    np.testing.assert_array_equal(w[urows], want_w)
    for name, a in want_slots.items():
        np.testing.assert_array_equal(slots[name][urows], a, err_msg=name)
