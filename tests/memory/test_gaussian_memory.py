"""CARLS's dynamic Gaussian memory: the documented numbers, the three modes, growth, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from carls_dask.errors import ConfigError, InvalidBatchError, InvalidShapeError
from carls_dask.memory import GaussianMemory, LookupMode, MemoryConfig, MemoryState, memory_lookup


def _cfg(**kw: object) -> MemoryConfig:
    base: dict[str, object] = {"dim": 2, "per_cluster_buffer_size": 2, "max_num_clusters": 1, "min_variance": 1.0}
    base.update(kw)
    return MemoryConfig(**base)  # type: ignore[arg-type]


def test_carls_documented_numbers_first_input_then_fifo_buffer_of_two() -> None:
    mem = GaussianMemory(_cfg())
    r = mem.lookup([[1.0, 2.0]], LookupMode.UPDATE)
    assert r.mean.tolist() == [[1.0, 2.0]] and r.variance.tolist() == [[1.0, 1.0]]
    assert r.distance.tolist() == [1.0] and r.cluster_index.tolist() == [0]
    r = mem.lookup([[5.0, 2.0], [3.0, 4.0]], LookupMode.UPDATE)
    # the buffer of 2 now holds [5,2] and [3,4]: the first input left it
    np.testing.assert_allclose(r.mean, [[4.0, 3.0], [4.0, 3.0]])
    np.testing.assert_allclose(r.distance, [math.exp(-0.5)] * 2, rtol=1e-6)
    assert round(float(r.distance[0]), 4) == 0.6065


def test_squared_l2_distance_and_population_variance_with_floor() -> None:
    cfg = _cfg(per_cluster_buffer_size=3, min_variance=0.5, distance="squared_l2")
    mem = GaussianMemory(cfg)
    mem.lookup([[0.0, 0.0], [2.0, 0.0], [4.0, 0.0]], LookupMode.UPDATE)
    r = mem.lookup([[2.0, 1.0]], LookupMode.LOOKUP)
    np.testing.assert_allclose(r.mean, [[2.0, 0.0]])
    np.testing.assert_allclose(r.variance, [[8.0 / 3.0, 0.5]])  # var of (0,2,4); dim 2 floored
    np.testing.assert_allclose(r.distance, [1.0])


def test_answers_are_computed_after_the_whole_batch() -> None:
    mem = GaussianMemory(_cfg(per_cluster_buffer_size=4))
    r = mem.lookup([[0.0, 0.0], [2.0, 2.0]], LookupMode.UPDATE)
    # both inputs see the cluster holding both of them, not the one-input cluster of the first
    np.testing.assert_allclose(r.mean, [[1.0, 1.0], [1.0, 1.0]])


def test_lookup_mode_changes_nothing_and_needs_a_cluster() -> None:
    mem = GaussianMemory(_cfg())
    with pytest.raises(InvalidBatchError, match=r"mode 1.*without clusters"):
        mem.lookup([[1.0, 1.0]], LookupMode.LOOKUP)
    mem.lookup([[1.0, 1.0]], LookupMode.UPDATE)
    before = mem.state.to_arrays()
    mem.lookup([[7.0, 7.0], [9.0, 1.0]], LookupMode.LOOKUP)
    after = mem.state.to_arrays()
    assert before["steps"] == after["steps"] == 1
    np.testing.assert_array_equal(before["buffers"], after["buffers"])


def test_grow_creates_clusters_beyond_the_threshold_only_after_bootstrap() -> None:
    cfg = _cfg(max_num_clusters=3, distance_to_cluster_threshold=0.5, bootstrap_steps=1)
    mem = GaussianMemory(cfg)
    mem.lookup([[0.0, 0.0]], LookupMode.GROW)          # call 1: seeds cluster 0
    r = mem.lookup([[10.0, 10.0]], LookupMode.GROW)    # call 1 was the bootstrap: call 2 may grow
    assert r.cluster_index.tolist() == [1] and mem.state.n_clusters == 2
    np.testing.assert_allclose(r.mean, [[10.0, 10.0]])
    r = mem.lookup([[0.2, 0.1]], LookupMode.GROW)      # close to cluster 0: joins it
    assert r.cluster_index.tolist() == [0] and mem.state.n_clusters == 2
    mem.lookup([[-20.0, 5.0]], LookupMode.GROW)
    mem.lookup([[50.0, -50.0]], LookupMode.GROW)        # the cap of 3 clusters: joins the nearest
    assert mem.state.n_clusters == 3


def test_bootstrap_steps_hold_growth_back() -> None:
    cfg = _cfg(max_num_clusters=3, distance_to_cluster_threshold=0.5, bootstrap_steps=3)
    mem = GaussianMemory(cfg)
    for x in ([0.0, 0.0], [10.0, 10.0], [-10.0, 10.0]):
        mem.lookup([x], LookupMode.GROW)                 # calls 1-3: no growth
    assert mem.state.n_clusters == 1
    mem.lookup([[30.0, 30.0]], LookupMode.GROW)           # call 4 > 3
    assert mem.state.n_clusters == 2


def test_update_mode_never_grows_and_three_d_inputs_keep_their_shape() -> None:
    cfg = _cfg(max_num_clusters=4, distance_to_cluster_threshold=0.99)
    mem = GaussianMemory(cfg)
    r = mem.lookup(np.arange(12, dtype=np.float32).reshape(2, 3, 2), LookupMode.UPDATE)
    assert mem.state.n_clusters == 1
    assert r.mean.shape == (2, 3, 2) and r.distance.shape == (2, 3) and r.cluster_index.shape == (2, 3)


def test_state_round_trips_and_restored_memory_answers_the_same() -> None:
    cfg = _cfg(max_num_clusters=3, distance_to_cluster_threshold=0.5, bootstrap_steps=2)
    mem = GaussianMemory(cfg)
    mem.lookup([[1.0, 1.0]], LookupMode.GROW)
    mem.lookup([[2.0, 2.0]], LookupMode.GROW)
    copy = GaussianMemory(cfg, MemoryState(**mem.state.to_arrays()))
    # CARLS's restore example: mean (1.5, 1.5), Gaussian distance exp(-0.125) = 0.8825
    r = copy.lookup([[2.0, 2.0]], LookupMode.LOOKUP)
    np.testing.assert_allclose(r.mean, [[1.5, 1.5]])
    assert round(float(r.distance[0]), 4) == 0.8825
    # the call counter came along: call 3 may grow in both
    a = mem.lookup([[40.0, 40.0]], LookupMode.GROW)
    b = copy.lookup([[40.0, 40.0]], LookupMode.GROW)
    assert a.cluster_index.tolist() == b.cluster_index.tolist() == [1]


@pytest.mark.parametrize("mode", [0, 4, "grow", None, 2.5])
def test_mode_outside_one_to_three_is_refused(mode: object) -> None:
    mem = GaussianMemory(_cfg())
    with pytest.raises(ConfigError, match=r"lookup mode is .*expected 1 \(lookup\), 2 \(update\) or 3 \(grow\)"):
        mem.lookup([[1.0, 1.0]], mode)  # type: ignore[arg-type]
    assert mem.state.n_clusters == 0 and mem.state.steps == 0


def test_wrong_dimension_and_nan_change_nothing() -> None:
    mem = GaussianMemory(_cfg())
    mem.lookup([[1.0, 1.0]], LookupMode.UPDATE)
    before = mem.state.to_arrays()
    with pytest.raises(InvalidShapeError, match=r"inputs of shape \(1, 3\).*\[\.\.\., 2\]"):
        mem.lookup([[1.0, 2.0, 3.0]], LookupMode.UPDATE)
    with pytest.raises(InvalidBatchError, match=r"NaN or inf.*row 1"):
        mem.lookup([[1.0, 2.0], [np.nan, 0.0]], LookupMode.UPDATE)
    after = mem.state.to_arrays()
    assert before["steps"] == after["steps"]
    np.testing.assert_array_equal(before["buffers"], after["buffers"])


@pytest.mark.parametrize("field,value", [("dim", 0), ("per_cluster_buffer_size", 0), ("max_num_clusters", 0),
                                         ("min_variance", 0.0), ("distance", "cosine"), ("bootstrap_steps", -1)])
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"MemoryConfig.{field} is"):
        _cfg(**{field: value})


def test_state_that_does_not_fit_the_config_is_refused() -> None:
    state = MemoryState.empty(_cfg(max_num_clusters=2))
    with pytest.raises(InvalidBatchError, match="buffers shape"):
        GaussianMemory(_cfg(max_num_clusters=3), state)


def test_pure_function_matches_the_object() -> None:
    cfg = _cfg(max_num_clusters=2, distance="squared_l2", distance_to_cluster_threshold=4.0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 2)) * 3
    state = MemoryState.empty(cfg)
    mem = GaussianMemory(cfg)
    for chunk in np.split(x, 4):
        a = memory_lookup(state, cfg, chunk, 3)
        b = mem.lookup(chunk, 3)
        np.testing.assert_array_equal(a.cluster_index, b.cluster_index)
    assert state.n_clusters == mem.state.n_clusters == 2
