"""The ``carls-dask`` console entry point."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

from carls_dask import __version__
from carls_dask.cli import build_parser, main
from tests.processes import CARLS_DASK, console_env


def test_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in ("version", "demo", "bank", "run", "dashboard", "report", "bench"):
        assert name in out


def test_version_prints_package_and_dependency_versions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    out = capsys.readouterr().out
    assert f"carls-dask {__version__}" in out
    assert "torch 2.13.0" in out


def test_unknown_subcommand_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["frobnicate"])
    assert exc.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_console_script_is_installed(tmp_path: pathlib.Path) -> None:
    out = subprocess.run([CARLS_DASK, "--help"], capture_output=True, text=True, timeout=120, check=True,
                         cwd=tmp_path, env=console_env())
    assert "usage: carls-dask" in out.stdout


@pytest.mark.slow
def test_demo_runs_the_semi_supervised_paradigm_and_writes_a_run_folder(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from carls_dask.paradigms.data.planetoid import find_data_dir

    try:
        find_data_dir()
    except FileNotFoundError as exc:
        pytest.skip(f"Planetoid data not found: {exc}")
    import dask

    from carls_dask.storage import list_snapshots

    run_dir = tmp_path / "demo"
    with dask.config.set({"carls.run.snapshot-every": 10}):
        assert main(["demo", "--run-dir", str(run_dir), "--steps", "40"]) == 0
    out = capsys.readouterr().out
    assert f"carls-dask dashboard {run_dir}" in out
    assert "demo: semi-supervised bank+pseudo (seed 0): test_acc 0." in out
    for part in ("bank", "metrics.zarr", "run.json", "result.json", "checkpoints"):
        assert (run_dir / part).exists(), part
    # durable by default: step-tied snapshots, a delta log and the trainer's states
    assert [snap["step"] for snap in list_snapshots(run_dir / "bank")] == [10, 20, 30, 40]
    assert any(p.is_file() for p in (run_dir / "bank" / "delta").rglob("*"))
    assert len(list((run_dir / "checkpoints" / "trainer").glob("step-*.pt"))) == 4


def test_bench_lists_the_benchmark_scripts_and_rejects_unknown_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert {"bank_throughput", "snapshot", "graph_regularization", "curriculum", "multimodal"} <= set(listed)
    assert main(["bench", "no_such_benchmark"]) == 1
    assert "unknown benchmark 'no_such_benchmark'" in capsys.readouterr().err


def test_bench_runs_a_script_with_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "snapshot", "--help"]) == 0


def test_bench_in_an_installed_package_says_the_scripts_are_in_the_repository(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from carls_dask import locations

    monkeypatch.setattr(locations, "checkout_root", lambda: None)  # as in a wheel (the wheel test runs the real one)
    assert main(["bench", "--list"]) == 1
    assert ("carls-dask bench: error: the benchmark scripts are in the carls-dask source repository (its "
            "benchmarks/ folder), which this installation does not include") in capsys.readouterr().err


def _bank_run(path: pathlib.Path) -> pathlib.Path:
    """A run folder holding a committed bank snapshot (written by the storage code)."""
    from tests.dashboards.runfolder import nodes, write_snapshot

    keys, columns = nodes(30, step=1)
    write_snapshot(path / "bank", 1, keys, columns)
    return path


def test_dashboard_passes_every_run_and_each_run_of_a_folder_to_the_app(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _bank_run(tmp_path / "a"), _bank_run(tmp_path / "b")
    assert main(["dashboard", str(a), str(b), "--port", "5123", "--dry-run"]) == 0
    cmd = capsys.readouterr().out.split()
    assert cmd[cmd.index("--args") + 1 :] == [str(a), str(b)]
    folder = tmp_path / "runs"
    _bank_run(folder / "r2")
    _bank_run(folder / "r1")
    (folder / "notes").mkdir()  # not a run: left out
    later = tmp_path / "not-yet"  # a run that does not exist yet is passed on as given
    assert main(["dashboard", str(folder), str(later), "--dry-run"]) == 0
    cmd = capsys.readouterr().out.split()
    assert cmd[cmd.index("--args") + 1 :] == [str(folder / "r1"), str(folder / "r2"), str(later)]


def test_report_names_a_missing_run_a_missing_output_folder_and_an_output_folder(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _bank_run(tmp_path / "run")
    out = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "nope"), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"report: run folder {tmp_path / 'nope'} does not exist" in err
    assert main(["report", str(run / "bank" / "manifest.json"), "-o", str(out)]) == 1
    assert "is a file; expected a run folder" in capsys.readouterr().err
    assert main(["report", str(run), "-o", str(tmp_path / "missing" / "report.html")]) == 1
    assert f"the folder of output {tmp_path / 'missing' / 'report.html'} ({tmp_path / 'missing'}) does not exist" in capsys.readouterr().err
    assert main(["report", str(run), "-o", str(tmp_path)]) == 1
    assert f"output {tmp_path} is a folder; expected the path of an HTML file" in capsys.readouterr().err
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing written, not even a partial file
