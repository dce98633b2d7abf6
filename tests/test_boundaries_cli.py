"""Bad input at the command line, in stores and in configuration (Hypothesis where the space is large).

A refusal is an exit status of 1 (a :class:`CarlsError`, printed as ``carls-dask CMD: error: ...``) or 2
(argparse), never a traceback, and the store's files are byte for byte what they were. The number of
cases tried is written to ``test-artifacts/boundaries-cli-cases.json``.
"""

from __future__ import annotations

import collections
import json
import pathlib
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import dask.config
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from carls_dask import config
from carls_dask.cli import main
from carls_dask.errors import CarlsError, ConfigError, CorruptStoreError
from carls_dask.storage.bankview import open_bank
from carls_dask.storage.deltalog import replay
from carls_dask.storage.snapshots import read_snapshot
from tests.processes import CARLS_DASK, console_env
from tests.storage.states import nodes_store

COUNTS: collections.Counter[str] = collections.Counter()
REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURE_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


@pytest.fixture(scope="module", autouse=True)
def record_counts(artifacts_dir: pathlib.Path) -> Iterator[None]:
    yield
    path = artifacts_dir / "boundaries-cli-cases.json"
    path.write_text(json.dumps(dict(sorted(COUNTS.items())), indent=2))
    print(f"\nCLI, store and config cases tried: {dict(sorted(COUNTS.items()))} (written to {path})")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("store") / "bank"
    root.mkdir()
    nodes_store(root, versions=2)
    return root


def _files(root: pathlib.Path) -> dict[pathlib.Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse
        status = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, err


# -- bad arguments ---------------------------------------------------------------------------------------
BAD_ARGS: list[tuple[list[str], int, str]] = [
    (["bank", "inspect", "{missing}"], 1, "no such folder"),
    (["bank", "inspect", "{store}", "--version", "99"], 1, "no snapshot version 99; committed versions are [1, 2]"),
    (["bank", "inspect", "{store}", "--version", "two"], 2, "invalid int value: 'two'"),
    (["bank", "snapshots", "{missing}"], 1, "no such folder"),
    (["bank", "prune", "{store}", "--keep", "0"], 1, "keep=0; expected an integer >= 1"),
    (["bank", "prune", "{store}", "--keep", "-3"], 1, "keep=-3"),
    (["bank", "frobnicate", "{store}"], 2, "invalid choice: 'frobnicate'"),
    (["bank"], 2, "required"),
    (["run"], 1, "expected a paradigm name"),
    (["run", "no-such-paradigm"], 1, "no-such-paradigm"),
    (["run", "semi-supervised", "--steps", "-1"], 1, "run --steps: got -1; expected a positive number"),
    (["run", "semi-supervised", "-o", "novalue"], 1, "got 'novalue'; expected KEY=VALUE"),
    (["run", "semi-supervised", "--steps", "many"], 2, "invalid int value: 'many'"),
    (["bench", "nope"], 1, "unknown benchmark 'nope'; expected one of"),
    (["dashboard", "{store}", "--port", "70000", "--dry-run"], 1, "port 70000"),
    (["dashboard", "{store}", "--port", "0", "--dry-run"], 1, "expected 1-65535"),
    (["dashboard", "{store}", "--refresh", "soon", "--dry-run"], 1, "carls.dashboard.refresh: expected a duration"),
    (["nosuchcommand"], 2, "invalid choice"),
]


@pytest.mark.parametrize(("argv", "status", "needle"), BAD_ARGS, ids=[" ".join(a[0]) for a in BAD_ARGS])
def test_bad_arguments_are_refused_clearly(pristine: pathlib.Path, tmp_path: pathlib.Path,
                                           capsys: pytest.CaptureFixture[str], argv: list[str], status: int,
                                           needle: str) -> None:
    store = tmp_path / "bank"
    shutil.copytree(pristine, store)
    before = _files(store)
    args = [a.format(store=store, missing=tmp_path / "missing") for a in argv]
    COUNTS["arguments"] += 1
    got, err = _run(args, capsys)
    assert got == status, err
    assert needle in err, err
    if status == 1:
        assert err.startswith(f"carls-dask {args[0]}: error: ")
    assert _files(store) == before


# -- corrupt stores --------------------------------------------------------------------------------------
JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats(allow_nan=False)
                    | st.text(max_size=5), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c,
                                                                                              max_size=3), max_leaves=6)


def _leaf_paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _leaf_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            out += _leaf_paths(v, (*prefix, i))
    return out


@st.composite
def corruptions(draw: st.DrawFn, root: pathlib.Path) -> tuple[str, pathlib.Path, bytes]:
    """``(kind, file, new bytes)``: one damaged file of the store."""
    kind = draw(st.sampled_from(["manifest field", "manifest bytes", "truncate chunk", "flip chunk byte",
                                 "flip log byte"]))
    if kind.startswith("manifest"):
        path = draw(st.sampled_from([root / "manifest.json", root / "snapshots/v000002/snapshot.json"]))
        raw = path.read_bytes()
        if kind == "manifest bytes":
            cut = draw(st.integers(0, len(raw) - 1))
            return kind, path, raw[:cut] + draw(st.binary(max_size=8))
        obj = json.loads(raw)
        where = draw(st.sampled_from(_leaf_paths(obj)))
        cur = obj
        for k in where[:-1]:
            cur = cur[k]
        cur[where[-1]] = draw(JSON)
        return kind, path, json.dumps(obj).encode()
    if kind == "flip log byte":
        path = sorted((root / "delta").rglob("seg-*.log"))[0]
    else:
        path = draw(st.sampled_from(sorted(p for p in (root / "snapshots/v000002").rglob("c/*") if p.is_file()) +
                                    sorted(p for p in (root / "snapshots/v000002").rglob("c/*/*") if p.is_file())))
    raw = bytearray(path.read_bytes())
    if kind == "truncate chunk":
        return kind, path, bytes(raw[: draw(st.integers(0, len(raw) - 1))])
    i = draw(st.integers(0, len(raw) - 1))
    raw[i] ^= draw(st.integers(1, 255))
    return kind, path, bytes(raw)


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory, pristine: pathlib.Path) -> pathlib.Path:
    """The pristine store plus two delta-log records after its newest snapshot."""
    import numpy as np

    from carls_dask.storage.deltalog import DeltaLog
    from tests.storage.states import table_rows

    root = tmp_path_factory.mktemp("logged") / "bank"
    shutil.copytree(pristine, root)
    with DeltaLog(root, 0) as log:
        for seq in (1, 2, 3):
            log.append(30, "nodes", "upsert", table_rows(np.arange(seq * 7, seq * 7 + 5, dtype=np.int64), 64, seed=seq))
    return root


def _readers(root: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> list[tuple[str, Any]]:
    """Every way of reading the store: (what, the outcome: None, a CarlsError, or a CLI exit status)."""
    out: list[tuple[str, Any]] = []
    for name, fn in (("read_snapshot", lambda: read_snapshot(root)), ("open_bank", lambda: open_bank(root).load()),
                     ("read_buckets", lambda: read_snapshot(root, buckets=range(0, 64, 3))),
                     ("replay", lambda: list(replay(root, since_version=2)))):
        try:
            fn()
            out.append((name, None))
        except CarlsError as exc:
            out.append((name, exc))
    for cmd in ("inspect", "snapshots"):
        status, err = _run(["bank", cmd, str(root)], capsys)
        assert status in (0, 1), err
        assert status == 0 or err.startswith("carls-dask bank: error: "), err
        out.append((cmd, status))
    return out


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=FIXTURE_OK)
@given(data=st.data())
def test_corrupt_stores_are_refused_and_left_as_they_are(logged: pathlib.Path, tmp_path_factory: pytest.TempPathFactory,
                                                          capsys: pytest.CaptureFixture[str],
                                                          data: st.DataObject) -> None:
    root = tmp_path_factory.mktemp("corrupt") / "bank"
    shutil.copytree(logged, root)
    kind, path, raw = data.draw(corruptions(root))
    path.write_bytes(raw)
    COUNTS[f"store/{kind}"] += 1
    before = _files(root)
    outcomes = dict(_readers(root, capsys))  # no reader raises anything but a CarlsError (or exits 0/1)
    assert _files(root) == before
    if kind in ("truncate chunk", "flip chunk byte"):  # a whole read or a bucket read (bucket_offsets) notices
        errors = [outcomes[r] for r in ("read_snapshot", "read_buckets") if outcomes[r] is not None]
        assert errors, f"damage to {path} went unnoticed"
        assert all(isinstance(e, CorruptStoreError) and str(root) in str(e) for e in errors), errors
    if kind == "manifest bytes":
        assert outcomes["inspect"] == 1
    if kind == "flip log byte" and outcomes["replay"] is None:  # only the newest record may be torn
        assert len(list(replay(root, since_version=2))) <= 3
    shutil.rmtree(root.parent)


# -- bad configuration -----------------------------------------------------------------------------------
DURATIONS = ["runtime.stop-timeout", "runtime.poll-interval", "runtime.wait-timeout", "bank.call-timeout",
             "cluster.start-timeout", "dashboard.refresh"]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(key=st.sampled_from(DURATIONS), value=st.one_of(st.text(max_size=6), st.integers(-10, 10),
                                                        st.floats(allow_nan=True), st.lists(st.integers(), max_size=2)))
def test_bad_duration_settings_are_refused_naming_the_key(key: str, value: Any) -> None:
    COUNTS["config/duration"] += 1
    with dask.config.set({f"carls.{key}": value}):
        try:
            seconds = config.get_seconds(key)
        except ConfigError as exc:
            assert f"carls.{key}" in str(exc) and "expected" in str(exc) and repr(value)[:10] in str(exc)
        else:
            assert seconds >= 0 and seconds == seconds  # a valid duration: a non-negative number


ENV_CASES = [
    ({"DASK_CARLS__DASHBOARD__PORT": "99999"}, ["dashboard", "{store}", "--dry-run"], "port 99999"),
    ({"DASK_CARLS__STORAGE__KEEP_SNAPSHOTS": "0"}, ["bank", "prune", "{store}"], "keep=0"),
    ({"DASK_CARLS__CLUSTER__KIND": "cloud"}, ["bank", "restore", "{store}"],
     "carls.cluster.kind: got 'cloud'; expected 'local', 'address' or 'jobqueue'"),
    ({"DASK_CARLS__CLUSTER__SECURITY": "ssl"}, ["bank", "restore", "{store}"],
     "carls.cluster.security: got 'ssl'; expected one of"),
]


@pytest.mark.parametrize(("env", "argv", "needle"), ENV_CASES, ids=[next(iter(c[0])) for c in ENV_CASES])
def test_bad_settings_from_the_environment_are_refused(pristine: pathlib.Path, tmp_path: pathlib.Path,
                                                        env: dict[str, str], argv: list[str], needle: str) -> None:
    store = tmp_path / "bank"
    shutil.copytree(pristine, store)
    before = _files(store)
    COUNTS["config/environment"] += 1
    proc = subprocess.run([CARLS_DASK, *[a.format(store=store) for a in argv]],
                          env=console_env(**env), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert _files(store) == before
