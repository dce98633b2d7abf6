"""Faults under each durability policy: kill -9 of a shard worker mid-run and of the driver.

- ``every-write`` and ``group`` tables: every acknowledged write is read back after the kill (lost: 0). A
  killed process loses nothing of ``group`` either (its frames were in the operating system); what a
  machine crash could lose, the frames waiting for their group sync, is measured by the shard's log.
- ``snapshot`` tables (the two-tower recommender of ``benchmarks/durability.py``, trained by the bank's
  Adagrad): a lost shard brings them back at the newest snapshot, the Workbench rolls the bank and the
  trainer back to that checkpoint (one consistent cut) and the run finishes within 2 points of recall@10
  of an undisturbed run; a killed driver's run resumes from the same cut.

A real two-worker LocalCluster of its own (its workers are killed; the nannies start them again).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import dask
import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, TableSpec
from tests.processes import read_count, wait_for

REHOME_TIMEOUT = 60.0
REPO = pathlib.Path(__file__).resolve().parents[2]


def made(name: str, durability: str) -> TableSpec:
    return TableSpec(name, columns=(Column("value", shape=(4,)),), optimizer=None, durability=durability)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as c:
        yield c


def _workers(client: Any) -> list[str]:
    return sorted(client.scheduler_info(n_workers=-1)["workers"])


def _kill(client: Any, address: str) -> None:
    os.kill(int(client.run(os.getpid, workers=[address])[address]), signal.SIGKILL)
    wait_for(lambda: address not in _workers(client), f"worker {address} still registered after SIGKILL", 30)


def test_a_killed_shard_worker_loses_no_acknowledged_write_of_every_write_or_group(
        cluster: Any, tmp_path: pathlib.Path, artifacts_dir: pathlib.Path) -> None:
    from distributed import Client

    conf = {"carls.bank.rehome-timeout": f"{REHOME_TIMEOUT:g}s", "carls.bank.log.group-interval": "1s"}
    with dask.config.set(conf), Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        a, b = _workers(client)
        banks = {p: KnowledgeBank.create(client, [made("t", p)], n_shards=2, buckets=64, workers=[a, b],
                                         log_root=str(tmp_path / p)) for p in ("every-write", "group")}
        try:
            keys = np.arange(1, 61, dtype=np.int64)  # both shards of each bank
            acked: dict[str, dict[int, float]] = {p: {} for p in banks}
            window: dict[str, Any] = {}
            for i in range(40):
                if i == 20:  # mid-run: what waits for a group sync now, then the kill
                    window = {p: bank.stats()["shards"][0]["log"] for p, bank in banks.items()}
                    _kill(client, a)
                for p, bank in banks.items():
                    assert bank.update("t", keys, {"value": np.full((keys.size, 4), float(i), np.float32)}) == 60
                    acked[p].update(dict.fromkeys(keys.tolist(), float(i)))
            lost: dict[str, int] = {}
            for p, bank in banks.items():
                got = bank.lookup("t", keys)
                want = np.array([acked[p][int(k)] for k in keys], np.float32)
                lost[p] = int((~got.found).sum() + (got.values["value"][got.found, 0] != want[got.found]).sum())
                assert bank.stats()["rehoming"]["count"] == 1
            assert lost == {"every-write": 0, "group": 0}
            group = window["group"]
            assert group["frames"] == 20 and group["syncs"] < group["frames"]  # frames synced together
            assert window["every-write"]["syncs"] == window["every-write"]["frames"] == 20
            (artifacts_dir / "durability-shard-kill.json").write_text(json.dumps({"lost": lost, "logs": window},
                                                                                indent=1))
        finally:
            for bank in banks.values():
                bank.close()


_DRIVER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from carls_dask.bank import Column, KnowledgeBank, TableSpec
    root = sys.argv[1]
    tables = [TableSpec(p, columns=(Column("value", shape=(4,)),), optimizer=None, durability=p)
              for p in ("every-write", "group")]
    bank = KnowledgeBank.local(tables, n_shards=2, buckets=64, log_root=root)
    bank.snapshot(root, 0)
    keys = np.arange(1, 61, dtype=np.int64)
    i = 0
    while True:
        i += 1
        for p in ("every-write", "group"):
            bank.update(p, keys + 1000 * i, {"value": np.full((keys.size, 4), float(i), np.float32)})
        print(i, flush=True)  # both writes of round i acknowledged
    """
)


def test_a_killed_driver_loses_no_acknowledged_write_of_every_write_or_group(tmp_path: pathlib.Path,
                                                                           artifacts_dir: pathlib.Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        acked = read_count(proc.stdout, 30, "the driver's 30th round of writes", 120)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
    with KnowledgeBank.restore_local(str(tmp_path), log_root=None) as bank:
        keys = np.arange(1, 61, dtype=np.int64)
        lost = dict.fromkeys(("every-write", "group"), 0)
        for p in lost:
            for i in range(1, acked + 1):
                got = bank.lookup(p, keys + 1000 * i)
                lost[p] += int((~got.found).sum()) + int((got.values["value"][got.found, 0] != i).sum())
    assert lost == {"every-write": 0, "group": 0}
    (artifacts_dir / "durability-driver-kill.json").write_text(json.dumps({"acknowledged_rounds": acked, "lost": lost}))


def _two_tower(steps: int) -> Any:
    from benchmarks.durability import TwoTowerSettings

    return TwoTowerSettings(steps=steps, users=2000, items=600, batch=256, eval_users=1000)


@pytest.mark.slow
def test_a_killed_shard_worker_rolls_snapshot_tables_and_the_trainer_back_and_the_run_finishes(
        cluster: Any, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
        artifacts_dir: pathlib.Path) -> None:
    from distributed import Client

    from benchmarks.durability import TwoTower
    from carls_dask.runtime.runner import run_inline, run_paradigm

    conf = {"carls.bank.rehome-timeout": f"{REHOME_TIMEOUT:g}s", "carls.run.snapshot-every": 20,
            "carls.runtime.progress": False, "carls.runtime.poll-interval": "0.1s"}
    settings = _two_tower(120)
    with dask.config.set(conf):
        undisturbed = run_inline(TwoTower(), settings)
    run = tmp_path / "run"
    killed: list[str] = []

    def kill_after_first_checkpoint() -> None:
        from carls_dask.storage import list_snapshots

        def checkpointed() -> bool:  # the bank snapshot of step 20 committed (its trainer state is saved before it)
            return (run / "bank" / "manifest.json").exists() and any(e["step"] >= 20 for e in list_snapshots(run / "bank"))

        with Client(cluster) as client:
            wait_for(checkpointed, "the first checkpoint", 300)
            busy = {w for w, keys in client.processing().items() if any(k.startswith("trainer-") for k in keys)}
            victim = next(w for w in _workers(client) if w not in busy)  # a shard's worker, not the trainer's
            _kill(client, victim)
            killed.append(victim)

    killer = threading.Thread(target=kill_after_first_checkpoint)
    killer.start()
    with dask.config.set(conf), caplog.at_level(logging.WARNING, logger="carls_dask"):
        disturbed = run_paradigm(TwoTower(), settings, run_dir=run, cluster=cluster)
    killer.join(60)
    assert killed and disturbed.loops["trainer"]["restarts"] == 1 and disturbed.loops["trainer"]["step"] == 120
    recall, base = disturbed["recall_at_10"], undisturbed["recall_at_10"]
    assert abs(recall - base) <= 0.02, f"recall@10 {recall:.4f} after the rollback, {base:.4f} undisturbed"
    assert base > 0.02  # the recommender learned (random: 10 of 575 items, 0.017)
    lines = [r.getMessage() for r in caplog.records if "rolled back to snapshot" in r.getMessage()]
    assert len(lines) == 1 and "running again on" in lines[0]
    cut = re.search(r"trainer trainer run again from step (\d+)", lines[0])
    assert cut is not None and int(cut.group(1)) >= 20 and int(cut.group(1)) % 20 == 0  # a checkpoint, not step 0
    assert not [r for r in caplog.records if r.exc_info]  # a recovered fault is one line, no traceback
    console = capfd.readouterr().err  # the workers' too: their processes write to this one's stderr
    assert "Exception in callback" not in console and "FutureCancelledError" not in console
    (artifacts_dir / "durability-snapshot-shard-kill.json").write_text(json.dumps(
        {"recall_at_10_undisturbed": base, "recall_at_10_after_rollback": recall, "line": lines[0]}, indent=1))


_RUN = textwrap.dedent(
    """
    import sys
    import dask
    from benchmarks.durability import TwoTower, TwoTowerSettings
    from carls_dask.runtime.runner import run_inline
    settings = TwoTowerSettings(steps=120, users=2000, items=600, batch=256, eval_users=1000)
    with dask.config.set({"carls.run.snapshot-every": 20, "carls.runtime.progress": False}):
        run_inline(TwoTower(), settings, run_dir=sys.argv[1])
    """
)


@pytest.mark.slow
def test_a_killed_driver_resumes_snapshot_tables_and_the_trainer_from_one_cut(tmp_path: pathlib.Path,
                                                                            artifacts_dir: pathlib.Path) -> None:
    from benchmarks.durability import TwoTower
    from carls_dask.runtime.registry import register_paradigm, unregister_paradigm
    from carls_dask.runtime.runner import resume_run, run_inline
    from carls_dask.storage import list_snapshots

    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", _RUN, str(run)], cwd=REPO)
    try:
        wait_for(lambda: any(e["step"] >= 60 for e in list_snapshots(run / "bank")) if (run / "bank").is_dir()
                 else False, "a checkpoint at step 60", 300)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    cut = max(int(e["step"]) for e in list_snapshots(run / "bank"))
    register_paradigm(TwoTower(), replace=True)
    try:
        with dask.config.set({"carls.run.snapshot-every": 20, "carls.runtime.progress": False}):
            resumed = resume_run(run)
            undisturbed = run_inline(TwoTower(), _two_tower(120))
    finally:
        unregister_paradigm(TwoTower.name)
    assert resumed.resumed_from == cut and resumed.loops["trainer"]["step"] == 120
    assert abs(resumed["recall_at_10"] - undisturbed["recall_at_10"]) <= 0.02
    (artifacts_dir / "durability-snapshot-driver-kill.json").write_text(json.dumps(
        {"cut": cut, "recall_at_10_undisturbed": undisturbed["recall_at_10"],
         "recall_at_10_resumed": resumed["recall_at_10"]}, indent=1))


def test_a_run_at_the_disk_reserve_stops_with_its_last_checkpoint_and_resumes(tmp_path: pathlib.Path) -> None:
    import shutil

    from benchmarks.durability import TwoTower
    from carls_dask.errors import RunStopped
    from carls_dask.runtime.registry import register_paradigm, unregister_paradigm
    from carls_dask.runtime.runner import resume_run, run_inline

    run, ballast = tmp_path / "run", tmp_path / "ballast"
    reserve = shutil.disk_usage(tmp_path).free - (1 << 30)  # 1 GiB to spare now ...

    def fill_the_disk(step: int, bank: Any) -> None:
        if step == 7 and not ballast.exists():  # ... and none after the checkpoint at step 5
            with open(ballast, "wb") as fh:
                os.posix_fallocate(fh.fileno(), 0, 2 << 30)

    conf = {"carls.run.snapshot-every": 5, "carls.runtime.progress": False, "carls.storage.disk-reserve": reserve}
    register_paradigm(TwoTower(), replace=True)
    try:
        with dask.config.set(conf):
            with pytest.raises(RunStopped, match=r"run stopped cleanly at step 10: .* below the reserve .*; "
                                                 r"checkpoint at step 5 kept in .*; then continue with: .* run "
                                                 r"--resume") as info:
                run_inline(TwoTower(), _two_tower(20), run_dir=run, on_step=fill_the_disk)
            assert info.value.checkpoint == 5 and not (run / "result.json").exists()
            ballast.unlink()
            resumed = resume_run(run)
    finally:
        ballast.unlink(missing_ok=True)
        unregister_paradigm(TwoTower.name)
    assert resumed.resumed_from == 5 and resumed.loops["trainer"]["step"] == 20
