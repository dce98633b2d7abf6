"""Bad input at every boundary (Hypothesis): the bank API on a real cluster, ShardCore, the CLI, stores, config.

Every generated case must raise a :class:`CarlsError` whose message names the object and shows what was
given and what was expected, and must leave the bank (every shard's full exported state) or the store
(every file's bytes) as it was. The number of cases tried per family is written to
``test-artifacts/boundaries-cases.json``.
"""

from __future__ import annotations

import collections
import json
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import dask.config
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carls_dask.bank import Column, KnowledgeBank, ShardCore, TableSpec
from carls_dask.errors import CarlsError
from tests.bank.banks import assert_same_state, bank_state, states_equal

COUNTS: collections.Counter[str] = collections.Counter()
REPO = pathlib.Path(__file__).resolve().parents[1]
DIM = 4
N_KEYS = 200
LIMIT = 1000  # carls.bank.max-batch-keys while the huge-batch cases run
#: Words one of which every refusal uses to say what was expected.
EXPECT_WORDS = ("expected", "holds tables", "its columns are", "must be", "at most", "need", "create it with", "holds only")


def items() -> TableSpec:
    return TableSpec("items", columns=(Column("embedding", shape=(DIM,)), Column("label", "int64", (), ()),
                                       Column("score", "float32", (), ())),
                     optimizer="adagrad", learning_rate=0.1, initializer="normal", init_scale=0.1)


def plain() -> TableSpec:
    return TableSpec("plain", columns=(Column("embedding", shape=(DIM,)),), optimizer=None, learning_rate=0.1,
                     initializer="zeros", init_scale=0.0)


TABLES = ("items", "plain")


# -- the generated bad calls ------------------------------------------------------------------------------
Case = tuple[str, Callable[[Any], Any], tuple[str, ...]]  # (family, call on a bank or core, needles)


def _values(n: int) -> dict[str, np.ndarray]:
    return {"embedding": np.zeros((n, DIM), np.float32), "label": np.zeros(n, np.int64),
            "score": np.zeros(n, np.float32)}


@st.composite
def bad_calls(draw: st.DrawFn, huge: bool = True) -> Case:
    """One call with exactly one thing wrong, and the words its error must contain."""
    n = draw(st.integers(1, 40))
    keys = np.asarray(draw(st.lists(st.integers(0, 2 * N_KEYS), min_size=n, max_size=n)), dtype=np.int64)
    families = ["table", "column", "keys", "values", "gradients", "options"] + (["huge"] if huge else [])
    family = draw(st.sampled_from(families))
    if family == "table":
        name = draw(st.text(min_size=1, max_size=12).filter(lambda s: s not in TABLES))
        op = draw(st.sampled_from(["lookup", "update", "contains", "delete", "apply_gradients", "top_k"]))
        calls: dict[str, Callable[[Any], Any]] = {
            "lookup": lambda b: b.lookup(name, keys, insert=True),
            "update": lambda b: b.update(name, keys, _values(n)),
            "contains": lambda b: b.contains(name, keys),
            "delete": lambda b: b.delete(name, keys),
            "apply_gradients": lambda b: b.apply_gradients(name, keys, np.zeros((n, DIM), np.float32)),
            "top_k": lambda b: b.top_k(name, np.zeros(DIM), 2),
        }
        return f"table/{op}", calls[op], (repr(name),)
    if family == "column":
        col = draw(st.text(min_size=1, max_size=12).filter(lambda s: s not in ("embedding", "label", "score")))
        how = draw(st.sampled_from(["lookup", "update", "gradients", "top_k"]))
        calls = {
            "lookup": lambda b: b.lookup("items", keys, columns=["embedding", col]),
            "update": lambda b: b.update("items", keys, {**_values(n), col: np.zeros(n, np.float32)}),
            "gradients": lambda b: b.apply_gradients("items", keys, {col: np.zeros((n, DIM), np.float32)}),
            "top_k": lambda b: b.top_k("items", np.zeros(DIM), 2, column=col),
        }
        return f"column/{how}", calls[how], ("'items'", repr(col))
    if family == "keys":
        kind = draw(st.sampled_from(["float", "2-D", "empty", "mixed", "uint64", "bool", "complex", "scalar str"]))
        bad_keys: Any = {
            "float": keys.astype(np.float64) + 0.5,
            "2-D": np.zeros((2, n), np.int64),
            "empty": np.zeros(0, np.int64),
            "mixed": draw(st.permutations([1, "a", 2.5]))[: draw(st.integers(2, 3))],
            "uint64": np.full(n, 2**63 + draw(st.integers(0, 2**63 - 1)), np.uint64),
            "bool": np.ones(n, bool),
            "complex": keys.astype(np.complex128),
            "scalar str": "key",
        }[kind]
        op = draw(st.sampled_from(["lookup", "contains", "delete", "update"]))
        m = len(bad_keys) if not isinstance(bad_keys, str) else 1
        calls = {
            "lookup": lambda b: b.lookup("items", bad_keys, insert=True),
            "contains": lambda b: b.contains("items", bad_keys),
            "delete": lambda b: b.delete("items", bad_keys),
            "update": lambda b: b.update("items", bad_keys, _values(max(m, 1))),
        }
        return f"keys/{kind}", calls[op], ("'items'",)
    if family == "values":
        kind = draw(st.sampled_from(["rows", "dim", "strings", "complex", "float into int", "nan", "inf",
                                     "overflow", "int range", "not a dict", "empty dict", "model_step", "maker"]))
        vals: Any = _values(n)
        extra: dict[str, Any] = {}
        i = draw(st.integers(0, n - 1))
        needle = "'items'"
        if kind == "rows":
            vals["embedding"] = np.zeros((n + draw(st.integers(1, 5)), DIM), np.float32)
            needle = "embedding"
        elif kind == "dim":
            vals["embedding"] = np.zeros((n, DIM + draw(st.integers(1, 5))), np.float32)
            needle = f"({n}, {DIM})"
        elif kind == "strings":
            vals["score"] = np.array(["x"] * n)
            needle = "score"
        elif kind == "complex":
            vals["score"] = np.zeros(n, np.complex64)
            needle = "complex64"
        elif kind == "float into int":
            vals["label"] = np.full(n, 1.5)
            needle = "label"
        elif kind in ("nan", "inf"):
            vals["embedding"][i, draw(st.integers(0, DIM - 1))] = np.nan if kind == "nan" else -np.inf
            needle = f"row {i}"
        elif kind == "overflow":
            vals["score"] = np.full(n, 1e300)
            needle = "overflow"
        elif kind == "int range":
            vals["label"] = np.full(n, 2**64 - 1, np.uint64)
            needle = "label"
        elif kind == "not a dict":
            vals = np.zeros((n, DIM), np.float32)
            needle = "ndarray"
        elif kind == "empty dict":
            vals = {}
            needle = "non-empty"
        elif kind == "model_step":
            extra["model_step"] = draw(st.sampled_from([1.5, "3", None, True]))
            needle = "model_step"
        else:
            extra["maker"] = draw(st.sampled_from([3, b"m", None]))
            needle = "maker"
        return f"values/{kind}", lambda b: b.update("items", keys, vals, **extra), ("'items'", needle)
    if family == "gradients":
        kind = draw(st.sampled_from(["nan", "inf", "shape", "int column", "no optimizer", "lr", "empty"]))
        g: Any = np.zeros((n, DIM), np.float32)
        kw: dict[str, Any] = {}
        table = "items"
        needle = "gradients"
        if kind in ("nan", "inf"):
            g[draw(st.integers(0, n - 1)), 0] = np.nan if kind == "nan" else np.inf
        elif kind == "shape":
            g = np.zeros((n, DIM + 1), np.float32)
            needle = str((n, DIM + 1))
        elif kind == "int column":
            g = {"label": np.zeros(n, np.float32)}
            needle = "label"
        elif kind == "no optimizer":
            table = "plain"
            needle = "no optimizer"
        elif kind == "lr":
            kw["learning_rate"] = draw(st.sampled_from([0.0, -1.0, float("nan"), float("inf")]))
            needle = "learning_rate"
        else:
            g = {}
        return f"gradients/{kind}", lambda b: b.apply_gradients(table, keys, g, **kw), (repr(table), needle)
    if family == "options":
        kind = draw(st.sampled_from(["staleness", "k", "metric", "query", "sample n", "sampler"]))
        calls = {
            "staleness": lambda b: b.lookup("items", keys, max_staleness=draw(st.sampled_from([-1.0, float("nan")]))),
            "k": lambda b: b.top_k("items", np.zeros(DIM), draw(st.sampled_from([0, -3, 10**6]))),
            "metric": lambda b: b.top_k("items", np.zeros(DIM), 2, metric="l3"),
            "query": lambda b: b.top_k("items", np.zeros((2, DIM + 2)), 2),
            "sample n": lambda b: b.sample_negatives("items", draw(st.sampled_from([1.5, "2", 10**6]))),
            "sampler": lambda b: b.sample_negatives("items", 2, sampler="zipfish"),
        }
        return f"options/{kind}", calls[kind], ("'items'",)
    # huge: more keys than carls.bank.max-batch-keys, as a range (the check must come before any allocation)
    size = draw(st.sampled_from([LIMIT + 1, 10**9, 10**15]))
    big = range(size)
    op = draw(st.sampled_from(["lookup", "contains", "delete", "update", "sample", "top_k"]))
    calls = {
        "lookup": lambda b: b.lookup("items", big, insert=True),
        "contains": lambda b: b.contains("items", big),
        "delete": lambda b: b.delete("items", big),
        "update": lambda b: b.update("items", big, _values(1)),
        "sample": lambda b: b.sample_negatives("items", size, unique=False),
        "top_k": lambda b: b.top_k("items", np.zeros(DIM, np.float32), size),
    }
    return f"huge/{op}", calls[op], ("'items'", str(size), f"at most {LIMIT}", "carls.bank.max-batch-keys")


def _check_refused(case: Case, target: Any) -> None:
    family, call, needles = case
    COUNTS[family.split("/")[0]] += 1
    COUNTS["total"] += 1
    with pytest.raises(CarlsError) as info:
        call(target)
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, f"{family}: {needle!r} missing from {msg!r}"
    assert any(w in msg for w in EXPECT_WORDS), f"{family}: no expected value in {msg!r}"


# -- the bank on a real two-worker cluster ----------------------------------------------------------------
@pytest.fixture(scope="module")
def bank(local_cluster: Any) -> Iterator[KnowledgeBank]:
    from distributed import Client

    with Client(local_cluster) as client:  # type: ignore[arg-type]
        b = KnowledgeBank.create(client, [items(), plain()], n_shards=2, buckets=32)
        keys = np.arange(N_KEYS)
        b.lookup("items", keys, insert=True)
        b.update("items", keys[:50], _values(50), model_step=2, maker="m")
        b.apply_gradients("items", keys[:20], np.ones((20, DIM), np.float32))
        yield b
        b.close()


@pytest.fixture(scope="module", autouse=True)
def record_counts(artifacts_dir: pathlib.Path) -> Iterator[None]:
    yield
    path = artifacts_dir / "boundaries-cases.json"
    path.write_text(json.dumps(dict(sorted(COUNTS.items())), indent=2))
    print(f"\nboundary cases tried: {dict(sorted(COUNTS.items()))} (written to {path})")


def _bank_examples(n: int) -> Any:
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _bank_cases(bank: KnowledgeBank, data: st.DataObject, n: int) -> None:
    before = bank_state(bank)
    with dask.config.set({"carls.bank.max-batch-keys": LIMIT}):
        for _ in range(n):
            _check_refused(data.draw(bad_calls()), bank)
    assert_same_state(before, bank_state(bank))


@_bank_examples(12)
@given(data=st.data())
def test_bad_calls_to_a_cluster_bank_are_refused_and_change_nothing(bank: KnowledgeBank, data: st.DataObject) -> None:
    _bank_cases(bank, data, 10)


@pytest.mark.slow
@_bank_examples(100)
@given(data=st.data())
def test_many_bad_calls_to_a_cluster_bank(bank: KnowledgeBank, data: st.DataObject) -> None:
    _bank_cases(bank, data, 20)


# -- ShardCore directly, for volume -----------------------------------------------------------------------
def _core() -> ShardCore:
    core = ShardCore([items(), plain()], buckets=32)
    keys = np.arange(N_KEYS)
    core.lookup("items", keys, insert=True)
    core.update("items", keys[:50], _values(50), model_step=2, maker="m")
    core.apply_gradients("items", keys[:20], np.ones((20, DIM), np.float32))
    return core


CORE = _core()
CORE_STATE = CORE.export_state()


@settings(max_examples=300, deadline=None, derandomize=True)
@given(case=bad_calls(huge=False))
def test_bad_calls_to_a_shard_core_are_refused_and_change_nothing(case: Case) -> None:
    _check_refused(case, CORE)
    assert states_equal(CORE_STATE, CORE.export_state())


@pytest.mark.slow
@settings(max_examples=3000, deadline=None)
@given(case=bad_calls(huge=False))
def test_many_bad_calls_to_a_shard_core(case: Case) -> None:
    _check_refused(case, CORE)
    assert states_equal(CORE_STATE, CORE.export_state())
