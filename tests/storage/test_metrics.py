"""The metric store: buffered appends, new series mid-run, readers during writes, no rewrites, bad input."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from carls_dask.errors import (
    IncompatibleStoreError,
    InvalidBatchError,
    InvalidShapeError,
    LifecycleError,
    StoreLockedError,
    StoreNotFoundError,
)
from carls_dask.storage.metrics import MetricWriter, open_metrics
from tests.processes import wait_for

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_append_flush_and_new_series(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "metrics.zarr"
    with MetricWriter(path, run="r1", flush_rows=4, flush_seconds=1e9, chunk_steps=3) as w:
        for s in range(6):
            w.append(s * 10, drift=s / 10, **({"bank_size": 100.0 + s} if s >= 3 else {}))
        assert w.rows == 4  # one flush of 4 rows; 2 still buffered
        ds = open_metrics(path)
        assert ds.sizes["step"] == 4
        w.append(60, per_class=np.array([0.5, 0.25, 1.0]))
    ds = open_metrics(path)
    assert ds.attrs == {"run": "r1", "rows": 7}
    np.testing.assert_array_equal(ds["step"].values, [0, 10, 20, 30, 40, 50, 60])
    np.testing.assert_allclose(ds["drift"].values, [0, 0.1, 0.2, 0.3, 0.4, 0.5, np.nan])
    np.testing.assert_allclose(ds["bank_size"].values, [np.nan] * 3 + [103, 104, 105, np.nan])
    assert ds["per_class"].dims == ("step", "per_class_dim")
    assert np.isnan(ds["per_class"].values[:6]).all()
    np.testing.assert_array_equal(ds["per_class"].values[6], [0.5, 0.25, 1.0])
    assert np.all(np.diff(ds["wall_time"].values) >= 0)
    # a later writer continues the same run
    with MetricWriter(path, run="r1") as w:
        w.append(70, drift=0.7)
    assert open_metrics(path)["drift"].values[-1] == 0.7
    with pytest.raises(IncompatibleStoreError, match="belongs to run 'r1'; given run 'r2'"):
        MetricWriter(path, run="r2")


def test_full_chunks_are_never_rewritten(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "m.zarr"
    with MetricWriter(path, flush_rows=1, chunk_steps=4) as w:
        for s in range(8):
            w.append(s, loss=float(s))
        chunks = sorted((path / "series/0/c").iterdir())
        assert [c.name for c in chunks] == ["0", "1"]
        before = {c.name: (c.stat().st_ino, c.stat().st_mtime_ns) for c in chunks}
        for s in range(8, 13):
            w.append(s, loss=float(s))
        after = {c.name: (c.stat().st_ino, c.stat().st_mtime_ns) for c in (path / "series/0/c").iterdir()}
    assert after["0"] == before["0"] and after["1"] == before["1"]
    assert sorted(after) == ["0", "1", "2", "3"]


def test_bad_input_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(StoreNotFoundError, match="no such folder"):
        open_metrics(tmp_path / "nope")
    path = tmp_path / "m.zarr"
    w = MetricWriter(path, flush_rows=100)
    with pytest.raises(StoreLockedError, match="another writer"):
        MetricWriter(path)
    w.append(5, acc=0.5, vec=np.zeros(2))
    with pytest.raises(InvalidBatchError, match="step 5 after step 5; expected increasing steps"):
        w.append(5, acc=0.6)
    with pytest.raises(InvalidShapeError, match=r"series 'vec': shape \(3,\); expected \(2,\)"):
        w.append(6, vec=np.zeros(3))
    with pytest.raises(InvalidBatchError, match="series 'acc': got str"):
        w.append(6, acc="high")
    w.close()
    with pytest.raises(LifecycleError, match="closed"):
        w.append(7, acc=1.0)
    ds = open_metrics(path)
    assert ds.sizes["step"] == 1 and ds["acc"].item() == 0.5
    (path / "metrics.json").write_text('{"kind": "other", "format": 1}')
    with pytest.raises(IncompatibleStoreError, match="expected 'carls-dask metrics'"):
        open_metrics(path)


_WRITER = textwrap.dedent(
    """
    import sys, time
    from carls_dask.storage.metrics import MetricWriter
    with MetricWriter(sys.argv[1], run="live", flush_rows=7, chunk_steps=16) as w:
        for s in range(400):
            w.append(s, a=float(s), b=2.0 * s, **({"late": -float(s)} if s >= 150 else {}))
            time.sleep(0.001)
    """
)


def test_reader_sees_consistent_prefix_while_writer_runs(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "live.zarr"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], cwd=REPO)
    seen = []
    try:

        def read_once() -> bool:
            """Read the store as it is now and check it; true once the writer ended and all 400 rows were read."""
            if not (path / "metrics.json").exists():
                return False
            ds = open_metrics(path)
            n = ds.sizes["step"]
            steps = np.arange(n)
            np.testing.assert_array_equal(ds["step"].values, steps)
            if n:
                np.testing.assert_array_equal(ds["a"].values, steps)
                np.testing.assert_array_equal(ds["b"].values, 2.0 * steps)
            if "late" in ds:
                late = ds["late"].values
                assert np.isnan(late[:150]).all()
                np.testing.assert_array_equal(late[150:], -steps[150:])
            seen.append(n)
            return proc.poll() is not None and n == 400

        wait_for(read_once, "the writer finishing", 120, interval=0.01)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == 0
    assert seen == sorted(seen) and seen[-1] == 400
    assert len(set(seen)) > 3  # it really read during the run
