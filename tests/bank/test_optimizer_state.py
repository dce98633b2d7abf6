"""Optimizer state on the shard: the column's precision, Adam's per-row step, all-zero gradients."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from carls_dask.bank.core import ShardCore
from carls_dask.bank.optimizers import apply_optimizer, compute_dtype, initial_slots
from carls_dask.bank.schema import Column, TableSpec


def table(optimizer: str, dtype: str = "float32", dim: int = 3, learning_rate: float = 0.1) -> TableSpec:
    return TableSpec("t", columns=(Column("embedding", dtype, (dim,)),), optimizer=optimizer,
                     learning_rate=learning_rate, initializer="zeros", init_scale=0.0)


def reference_adam(w: np.ndarray, gs: list[np.ndarray], lr: float, b1: float = 0.9, b2: float = 0.999,
                   eps: float = 1e-8) -> np.ndarray:
    """Adam in float64, step by step, bias-corrected by the number of steps taken."""
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(gs, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        lr_t = np.float64(lr * (np.sqrt(1.0 - np.power(b2, float(t))) / (1.0 - np.power(b1, float(t)))))
        w = w - lr_t * m / (np.sqrt(v) + eps)
    return w


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_float64_columns_stay_float64_with_float64_arithmetic(optimizer: str) -> None:
    core = ShardCore([table(optimizer, "float64", learning_rate=1e-12)])
    w0 = np.array([[1.0, -2.0, 0.5]])
    core.update("t", np.array([5]), {"embedding": w0})
    g = np.array([[1.0, 1.0, -1.0]])  # float64 gradients reach the shard as float64
    core.apply_gradients("t", np.array([5]), g)
    got = core.lookup("t", np.array([5])).values["embedding"]
    assert got.dtype == np.float64
    assert not np.array_equal(got, w0)  # a 1e-12 step is lost in float32 but visible in float64
    assert np.array_equal(got.astype(np.float32), w0.astype(np.float32))
    if optimizer == "sgd":
        want = w0 - 1e-12 * g
    elif optimizer == "adagrad":
        want = w0 - (g / np.sqrt(0.1 + g * g)) * 1e-12
    else:
        want = reference_adam(w0, [g], 1e-12)
    assert got.tobytes() == want.tobytes()
    slots = {n: a for n, a in core.export_state()["tables"]["t"].items() if n.startswith("slot/")}
    for name, a in slots.items():
        assert a.dtype == (np.int64 if name.endswith("/step") else np.float64), name


def test_float64_adam_over_many_steps_equals_a_float64_reference() -> None:
    core = ShardCore([table("adam", "float64")])
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(1, 3))
    core.update("t", np.array([1]), {"embedding": w0})
    gs = [rng.normal(size=(1, 3)) for _ in range(7)]
    for g in gs:
        core.apply_gradients("t", np.array([1]), g)
    got = core.lookup("t", np.array([1])).values["embedding"]
    assert got.tobytes() == reference_adam(w0, gs, 0.1).tobytes()


def test_adam_bias_correction_counts_each_rows_own_updates() -> None:
    core = ShardCore([table("adam", "float64")])
    keys = np.array([1, 2])
    core.lookup("t", keys, insert=True)
    g = np.array([[1.0, -1.0, 0.5]])
    for _ in range(4):
        core.apply_gradients("t", keys[:1], g)  # row 1 takes four steps ...
    core.apply_gradients("t", np.array([2, 2]), np.r_[g, g] / 2)  # ... row 2 one (duplicates are one step)
    state = core.export_state()["tables"]["t"]
    steps = dict(zip(state["keys"].tolist(), state["slot/embedding/step"].tolist(), strict=True))
    assert steps == {1: 4, 2: 1}
    r = core.lookup("t", keys).values["embedding"]
    assert r[0].tobytes() == reference_adam(np.zeros((1, 3)), [g] * 4, 0.1)[0].tobytes()
    # row 2's first update is bias-corrected as a first step, whatever the other rows did
    assert r[1].tobytes() == reference_adam(np.zeros((1, 3)), [g], 0.1)[0].tobytes()
    assert core.stats()["tables"]["t"]["optimizer_steps"] == {"embedding": 4}
    core.delete("t", keys[:1])
    core.lookup("t", keys[:1], insert=True)  # a key that comes back starts from fresh slots
    state = core.export_state()["tables"]["t"]
    assert state["slot/embedding/step"][state["keys"] == 1].tolist() == [0]


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_all_zero_gradients_answer_without_warnings(optimizer: str, dtype: str) -> None:
    core = ShardCore([table(optimizer, dtype)])
    keys = np.array([3, 4, 3])
    core.update("t", keys[:2], {"embedding": np.array([[1.0, 2.0, 3.0], [-1.0, 0.0, 1.0]])})
    before = core.lookup("t", keys[:2]).values["embedding"].copy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            found = core.apply_gradients("t", keys, np.zeros((3, 3)))
            found2 = core.apply_gradients("t", keys[:2], np.zeros((2, 3)))
    assert found.all() and found2.all()
    after = core.lookup("t", keys[:2])
    # zero gradients leave the weights as they are (Adam's moments are zero too) but count as updates
    assert np.array_equal(after.values["embedding"], before)
    assert after.version.tolist() == [3, 3]
    state = core.export_state()["tables"]["t"]
    if optimizer == "adagrad":
        assert np.all(state["slot/embedding/accumulator"] == np.asarray(0.1, dtype))
    if optimizer == "adam":
        assert state["slot/embedding/step"].tolist() == [2, 2]
        assert not state["slot/embedding/m"].any() and not state["slot/embedding/v"].any()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_adagrad_entries_with_a_zero_accumulator_and_zero_gradient_stay_put(dtype: str) -> None:
    # a table spec refuses adagrad_initial_accumulator=0, but rows imported with zero accumulators reach
    # the optimizer; an entry that has only seen zero gradients is left unchanged instead of 0/0 = NaN
    dt = np.dtype(dtype)
    with np.errstate(all="raise"):
        w, slots = apply_optimizer("adagrad", np.ones((2, 3), dt), np.array([[0, 2, 0], [0, 0, 0]], dt),
                                   {"accumulator": np.zeros((2, 3), dt)}, learning_rate=0.1)
    assert w.dtype == dt and w.tolist() == [[1.0, float(dt.type(1) - dt.type(0.1)), 1.0], [1.0, 1.0, 1.0]]
    assert slots["accumulator"].tolist() == [[0.0, 4.0, 0.0], [0.0, 0.0, 0.0]]
    core = ShardCore([table("adagrad", dtype)])
    core.import_rows("t", {"keys": np.array([1, 2]), "col/embedding": np.ones((2, 3), dt),
                           "slot/embedding/accumulator": np.zeros((2, 3), dt)})
    with np.errstate(all="raise"):
        core.apply_gradients("t", np.array([1, 2]), np.array([[0, 2, 0], [0, 0, 0]], dt))
    assert core.lookup("t", np.array([1, 2])).values["embedding"].tolist() == w.tolist()


def test_slots_and_arithmetic_follow_the_column_dtype() -> None:
    assert compute_dtype("float32") == np.float32 and compute_dtype("float64") == np.float64
    assert compute_dtype("float16") == np.float32  # half precision computes (and keeps slots) in float32
    with pytest.raises(TypeError, match="float column"):
        compute_dtype("int64")
    s = initial_slots("adam", 4, (2,), np.float64, 0.1)
    assert s["m"].dtype == s["v"].dtype == np.float64 and s["m"].shape == (4, 2)
    assert s["step"].dtype == np.int64 and s["step"].shape == (4,)
    assert initial_slots("adagrad", 2, (), np.float64, 0.5)["accumulator"].tolist() == [0.5, 0.5]
    w, new = apply_optimizer("adam", np.ones((4, 2), np.float32), np.ones((4, 2), np.float32),
                             initial_slots("adam", 4, (2,), np.float32, 0.1), learning_rate=0.1)
    assert w.dtype == np.float32 and new["m"].dtype == np.float32 and new["step"].tolist() == [1] * 4


def test_float16_column_keeps_its_dtype_and_float32_slots() -> None:
    core = ShardCore([table("adam", "float16")])
    core.lookup("t", np.array([1]), insert=True)
    core.apply_gradients("t", np.array([1]), np.ones((1, 3), np.float32))
    state = core.export_state()["tables"]["t"]
    assert state["col/embedding"].dtype == np.float16 and state["slot/embedding/m"].dtype == np.float32
    assert np.allclose(state["col/embedding"], -0.1, atol=1e-3)
