"""Crash safety beyond one kill: repeated kills, a kill during the manifest swap, a kill while a torn tail is cut.

After every SIGKILL the store must open with every acknowledged record or snapshot present; at most the
unacknowledged tail is missing.
"""

from __future__ import annotations

import pathlib
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

from carls_dask.storage.bankstore import prune_snapshots
from carls_dask.storage.deltalog import DeltaLog, replay
from carls_dask.storage.manifest import list_snapshots, read_manifest
from carls_dask.storage.snapshots import read_snapshot
from tests.processes import read_count
from tests.storage.states import assert_same, make_states, merged, sort_by_key, table_rows

REPO = pathlib.Path(__file__).resolve().parents[2]

_APPENDER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from carls_dask.storage.deltalog import DeltaLog
    from tests.storage.states import table_rows
    log = DeltaLog(sys.argv[1], 0, segment_bytes=200_000)  # small segments: kills also land in rolls
    seq = log.seq
    while True:
        seq += 1
        keys = np.arange(seq * 100, seq * 100 + 300, dtype=np.int64)
        assert log.append(seq, "nodes", "upsert", table_rows(keys, 64, seed=seq, dim=16)) == seq
        print(seq, flush=True)
    """
)


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdout=subprocess.PIPE, text=True)


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.stdout is not None
    proc.stdout.close()


def _check_log(root: pathlib.Path, acked: int) -> int:
    """Every acknowledged record is present, in order and intact; returns how many records there are."""
    recs = list(replay(root))
    assert [r.seq for r in recs] == list(range(1, len(recs) + 1))
    assert len(recs) >= acked  # at most the unacknowledged tail is missing
    for r in recs:
        keys = np.arange(r.seq * 100, r.seq * 100 + 300, dtype=np.int64)
        want = table_rows(keys, 64, seed=r.seq, dim=16)
        assert all(r.arrays[k].tobytes() == want[k].tobytes() for k in want), r.seq
    return len(recs)


def test_repeated_kills_mid_append_lose_no_acknowledged_record(tmp_path: pathlib.Path) -> None:
    rng = random.Random(7)
    acked = 0
    for _ in range(5):
        proc = _start(_APPENDER, str(tmp_path))
        try:
            assert proc.stdout is not None
            target = acked + rng.randint(3, 25)
            acked = read_count(proc.stdout, target, f"the writer's record {target}", 60)
            time.sleep(rng.random() * 0.02)  # land somewhere inside a later append
        finally:
            _kill(proc)
        acked = max(acked, _check_log(tmp_path, acked))  # the next writer resumes after the last record
    assert len(list((tmp_path / "delta/shard-0000").glob("seg-*.log"))) > 1  # segments rolled on the way
    with DeltaLog(tmp_path, 0) as log:
        assert log.seq == _check_log(tmp_path, acked)


_SNAPSHOTTER = textwrap.dedent(
    """
    import os, sys, time
    from carls_dask.storage import fsutil
    from carls_dask.storage.bankstore import prune_snapshots
    from carls_dask.storage.manifest import list_snapshots
    from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, write_shard
    from tests.storage.states import make_states
    root, pause = sys.argv[1], sys.argv[2] == "pause"
    real = os.replace
    def replace(src, dst):
        if pause and str(dst).endswith(os.sep + "manifest.json"):
            print("swap", flush=True)  # the new manifest is written and synced; the swap comes next
            time.sleep(30)
        real(src, dst)
    fsutil.os.replace = replace
    snaps = list_snapshots(root) if os.path.isdir(root) else []
    v = (snaps[-1]["step"] if snaps else 0) + 1
    while True:
        h = begin_snapshot(root, v, chunk_rows=512)
        for st in make_states(1500, n_shards=2, seed=v, dim=8):
            write_shard(h, st, delta_seq=0)
        commit_snapshot(h, {"seed": v})
        prune_snapshots(root, keep=2)
        print(v, flush=True)
        v += 1
    """
)


def _check_snapshot(root: pathlib.Path, acked_step: int) -> int:
    """The newest snapshot is complete, holds the rows of its seed, and is no older than the last acknowledged."""
    newest = list_snapshots(root)[-1]
    seed = read_manifest(root)["meta"]["seed"]
    assert newest["step"] == seed >= acked_step
    assert_same(sort_by_key(read_snapshot(root)["nodes"]), merged(make_states(1500, n_shards=2, seed=seed, dim=8)))
    return int(seed)


def test_killed_during_the_manifest_swap_keeps_the_acknowledged_snapshot(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "bank"
    proc = _start(_SNAPSHOTTER, str(root), "run")
    try:
        assert proc.stdout is not None
        acked = 0
        while acked < 3:
            acked = int(proc.stdout.readline())
    finally:
        _kill(proc)
    acked = _check_snapshot(root, acked)
    for _ in range(2):  # twice: a store killed mid-swap must take the next swap and the next kill
        proc = _start(_SNAPSHOTTER, str(root), "pause")
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            while line != "swap":
                acked = int(line)
                line = proc.stdout.readline().strip()
        finally:
            _kill(proc)
        before = list_snapshots(root)
        seed = _check_snapshot(root, acked)
        assert seed == acked  # the half-swapped commit is not visible
        assert list(root.glob(".manifest.json.*.tmp"))  # the new manifest was written, never swapped in
        assert len(before) >= 1
    # a later writer commits over the debris, and prune clears it
    proc = _start(_SNAPSHOTTER, str(root), "run")
    try:
        assert proc.stdout is not None
        first = int(proc.stdout.readline())
    finally:
        _kill(proc)
    assert _check_snapshot(root, first) >= first
    prune_snapshots(root, keep=1)
    kept = list_snapshots(root)
    assert len(kept) == 1
    # the orphans of the killed swaps are gone; only a folder newer than the kept one (the last writer's
    # unfinished snapshot, which prune leaves to a possibly live writer) may remain
    assert all(int(p.name[1:]) >= kept[0]["version"] for p in (root / "snapshots").iterdir())


def test_repeated_random_kills_of_a_snapshot_writer(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "bank"
    rng = random.Random(3)
    acked = 0
    for _ in range(4):
        proc = _start(_SNAPSHOTTER, str(root), "run")
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            acked = max(acked, int(line))
            time.sleep(rng.random() * 0.3)  # anywhere: shard writes, commit, manifest swap, prune
        finally:
            _kill(proc)
        _check_snapshot(root, acked)


_TRUNCATOR = textwrap.dedent(
    """
    import sys, time
    import carls_dask.storage.deltalog as d
    class Pause:
        def warning(self, *args):
            print("cutting", flush=True)  # DeltaLog logs the torn tail, then truncates it
            time.sleep(30)
        def __getattr__(self, name):
            return lambda *a, **k: None
    d.logger = Pause()
    d.DeltaLog(sys.argv[1], 0)
    """
)


def test_killed_while_a_torn_tail_is_cut_leaves_a_log_that_opens(tmp_path: pathlib.Path) -> None:
    with DeltaLog(tmp_path, 0) as log:
        for seq in range(1, 6):
            keys = np.arange(seq * 100, seq * 100 + 300, dtype=np.int64)
            log.append(seq, "nodes", "upsert", table_rows(keys, 64, seed=seq, dim=16))
    seg = next((tmp_path / "delta/shard-0000").glob("seg-*.log"))
    whole = seg.stat().st_size
    with open(seg, "ab") as fh:  # a frame torn by a crash: its header and part of its payload
        fh.write(b"CDL1" + b"\x10\x00\x00\x00" + b"\xff" * 40)
    for _ in range(2):
        proc = _start(_TRUNCATOR, str(tmp_path))
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "cutting"
        finally:
            _kill(proc)
        assert seg.stat().st_size > whole  # killed before the cut
        assert _check_log(tmp_path, 5) == 5
    with DeltaLog(tmp_path, 0) as log:  # an undisturbed writer cuts the tail and carries on
        assert log.seq == 5 and seg.stat().st_size == whole
        keys = np.arange(600, 900, dtype=np.int64)
        log.append(6, "nodes", "upsert", table_rows(keys, 64, seed=6, dim=16))
    assert _check_log(tmp_path, 6) == 6
