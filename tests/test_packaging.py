"""The package as users install it: one import root, a light ``import carls_dask``, a wheel that works.

The wheel test builds a wheel of this checkout, installs it (not editable) into a fresh virtual
environment whose dependencies come from the test environment's site-packages (added as a plain path,
so that environment's editable install of carls-dask is not seen), and runs there, from a folder
outside the checkout and without PYTHONPATH, what a user runs: ``carls-dask --help``, a bank lookup
and a snapshot reopened with ``open_bank``, ``carls-dask demo`` (which first names the data setting,
then runs with it), ``carls-dask dashboard RUN`` serving ``/app``, ``carls-dask report RUN``,
``carls-dask run --resume RUN`` (refused on the finished run, then extending it) and ``carls-dask
bench`` (which says the benchmarks are not in the package).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import urllib.request
import venv
import zipfile

import pytest

from tests.processes import free_port, stop_process, wait_for

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUBPACKAGES = ("storage", "paradigms", "dashboards")


def _run(cmd: list[str], cwd: pathlib.Path, timeout: float = 300, env: dict[str, str] | None = None,
         status: int = 0) -> str:
    """Run ``cmd``; assert it exits with ``status``; returns its output (stdout, then stderr when it failed)."""
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == status, (f"{cmd} exited {proc.returncode}, expected {status}:\n{proc.stdout[-3000:]}\n"
                                       f"{proc.stderr[-3000:]}")
    return proc.stdout if status == 0 else proc.stdout + proc.stderr


def _run_together(cmds: dict[str, list[str]], cwd: pathlib.Path, env: dict[str, str], status: dict[str, int],
                  timeout: float = 300) -> dict[str, str]:
    """Run independent commands at the same time (each waits mostly on its own imports); assert each exits with
    its ``status`` (default 0); returns each one's output as :func:`_run` does."""
    procs = {name: subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, cmd in cmds.items()}
    out = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=timeout)
            want = status.get(name, 0)
            assert proc.returncode == want, (f"{cmds[name]} exited {proc.returncode}, expected {want}:\n"
                                             f"{stdout[-3000:]}\n{stderr[-3000:]}")
            out[name] = stdout if want == 0 else stdout + stderr
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def _folder_hash(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def test_import_carls_dask_is_light() -> None:
    code = (
        "import sys, carls_dask\n"
        "heavy = [m for m in ('torch', 'distributed', 'zarr', 'xarray', 'panel', 'carls_dask.bank') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert carls_dask.KnowledgeBank.__module__ == 'carls_dask.bank.client'\n"
        "assert 'distributed' in sys.modules\n"
    )
    _run([sys.executable, "-c", code], cwd=ROOT)


def test_notebook_names_import_from_the_package_root() -> None:
    import carls_dask
    from carls_dask.bank import Column, KnowledgeBank, TableSpec
    from carls_dask.dashboards.dashboard import Dashboard
    from carls_dask.runtime import KnowledgeMaker, Trainer, Workbench
    from carls_dask.storage import open_bank, open_metrics

    for obj in (Column, KnowledgeBank, TableSpec, Dashboard, KnowledgeMaker, Trainer, Workbench, open_bank,
                open_metrics):
        assert getattr(carls_dask, obj.__name__) is obj
    with pytest.raises(AttributeError, match="has no attribute 'Nonesuch'"):
        carls_dask.Nonesuch  # noqa: B018


def test_each_module_has_one_real_path() -> None:
    """No links in the package folders; the installation maps each package name to its folder in the checkout."""
    import tomllib

    links = [str(p.relative_to(ROOT)) for top in ("carls_dask", *SUBPACKAGES) for p in (ROOT / top).rglob("*")
             if p.is_symlink()]
    assert not links, f"links in the package folders (each file must have one path): {links}"
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"carls_dask": ROOT / "carls_dask", **{f"carls_dask.{s}": ROOT / s for s in SUBPACKAGES}}
    assert tool["package-dir"] == {k: str(v.relative_to(ROOT)) for k, v in folders.items()}
    found = sorted(
        name + "".join(f".{part}" for part in init.parent.relative_to(folder).parts)
        for name, folder in folders.items() for init in folder.rglob("__init__.py")
    )
    assert sorted(tool["packages"]) == found, "pyproject.toml [tool.setuptools] packages must list every package folder"
    # the editable install, from a folder outside the checkout, with no PYTHONPATH
    code = (
        "import importlib, importlib.util, json, sys\n"
        f"names = {found!r}\n"
        "print(json.dumps({n: importlib.import_module(n).__file__ for n in names}))\n"
        "assert all(importlib.util.find_spec(t) is None for t in ('storage', 'paradigms', 'dashboards'))\n"
    )
    import json

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    files = json.loads(_run([sys.executable, "-c", code], cwd=pathlib.Path("/"), env=env))
    for name, file in files.items():
        parts = name.split(".")
        top = ROOT / (parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else "carls_dask")
        rel = parts[2:] if top.name in SUBPACKAGES else parts[1:]
        assert pathlib.Path(file) == top.joinpath(*rel, "__init__.py"), (name, file)


def test_no_module_imports_the_old_top_level_names() -> None:
    pattern = r"^\s*(from|import) (storage|paradigms|dashboards)\b"
    proc = subprocess.run(
        ["git", "grep", "-nE", pattern, "--", "*.py", "*.ipynb", "*.md"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.stdout == "", f"imports of the old top-level packages:\n{proc.stdout}"


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path: pathlib.Path) -> None:
    # build from a copy of the working tree's files (tracked and new, not ignored): a build folder left in the
    # checkout by an earlier build cannot slip old modules into the wheel, and the checkout gets none
    src = tmp_path / "src"
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
         cwd=tmp_path)
    wheels = sorted(dist.glob("carls_dask-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as zf:
        names = zf.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"carls_dask"}, f"the wheel installs top-level names {sorted(tops)}; expected only carls_dask"
    for sub in SUBPACKAGES:
        assert f"carls_dask/{sub}/__init__.py" in names
        assert f"carls_dask/{sub}/py.typed" in names
    assert "carls_dask/carls.yaml" in names

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = pathlib.Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                cwd=tmp_path).strip())
    # the test environment's packages as a plain path entry: its own .pth files (the editable install) do not run
    (purelib / "test-env-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
          str(wheels[0])], cwd=tmp_path)

    work = tmp_path / "elsewhere"
    work.mkdir()
    # as a user's shell gives it: no PYTHONPATH, no virtual environment, no data location
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "CARLS_DATA_DIR")
           and not k.startswith("DASK_CARLS__DATA")}
    script = textwrap.dedent(
        """
        import importlib.util, pathlib
        import numpy as np
        from distributed import Client, LocalCluster
        import carls_dask
        from carls_dask import Column, KnowledgeBank, TableSpec, open_bank

        where = pathlib.Path(carls_dask.__file__).parent
        assert "site-packages" in str(where), where
        for name in ("storage", "paradigms", "dashboards"):
            assert importlib.util.find_spec(name) is None, name
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster, \\
                Client(cluster) as client:
            spec = TableSpec("items", columns=(Column("embedding", shape=(4,)),), optimizer="sgd")
            bank = KnowledgeBank.create(client, [spec], n_shards=2, log_root="store")
            keys = np.arange(10, dtype=np.int64)
            r = bank.lookup("items", keys, insert=True)
            assert r.found.all() and r.values["embedding"].shape == (10, 4)
            bank.update("items", keys[:3], {"embedding": np.ones((3, 4), dtype=np.float32)}, model_step=7)
            bank.snapshot("store", step=7)
            bank.close()
        ds = open_bank("store", table="items").load()
        assert ds.sizes["key"] == 10, ds
        ones = ds["embedding"].sel(key=[0, 1, 2]).values
        assert np.array_equal(ones, np.ones((3, 4), dtype=np.float32)), ones
        print("ok", str(where))
        """
    )
    # the commands a user runs, from this folder outside the checkout; these four do not depend on each other
    carls = str(env_dir / "bin" / "carls-dask")
    outs = _run_together({
        "help": [carls, "--help"],
        "script": [str(py), "-c", script],
        "bench": [carls, "bench", "--list"],
        # no data location configured: an installed package names the setting, and writes nothing
        "demo": [carls, "demo", "--steps", "30", "--run-dir", "demo"],
    }, cwd=work, env=env, status={"bench": 1, "demo": 1})
    assert "run" in outs["help"] and "bank" in outs["help"]
    assert outs["script"].startswith("ok ") and str(env_dir) in outs["script"], outs["script"]
    assert "the benchmark scripts are in the carls-dask source repository" in outs["bench"], outs["bench"]
    assert "set carls.data.dir (or the environment variable CARLS_DATA_DIR) to it" in outs["demo"], outs["demo"]
    assert not (work / "demo").exists()
    from carls_dask.paradigms.data.planetoid import find_data_dir

    try:
        data = find_data_dir()
    except FileNotFoundError as exc:
        pytest.skip(f"the Planetoid files are not present beside this checkout: {exc}")
    env = {**env, "CARLS_DATA_DIR": str(data), "DASK_CARLS__RUN__SNAPSHOT_EVERY": "10",
           "DASK_CARLS__CLUSTER__N_WORKERS": "1"}
    demo = _run([carls, "demo", "--steps", "30", "--run-dir", "demo"], cwd=work, env=env, timeout=600)
    run = work / "demo"
    assert "demo: semi-supervised bank+pseudo (seed 0): test_acc 0." in demo, demo
    # the next commands it prints run as printed: this venv's bin folder is not on PATH, so they name the script
    printed = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in demo.splitlines() if ln.startswith("  "))}
    assert shlex.split(printed["dashboard"]) == [carls, "dashboard", "demo"], printed
    assert json.loads((run / "result.json").read_text())["loops"]["trainer"]["step"] == 30

    port = free_port()
    log = work / "dashboard.log"
    with log.open("wb") as out_file:
        server = subprocess.Popen([*shlex.split(printed["dashboard"]), "--port", str(port)], cwd=work, env=env,
                                  stdout=out_file, stderr=subprocess.STDOUT, start_new_session=True)
    # the report reads the same run folder while the server starts
    report_proc = subprocess.Popen([carls, "report", "demo", "-o", "demo/report.html"], cwd=work, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        answers: list[int] = []

        def page() -> bool:
            assert server.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/app", timeout=60) as answer:
                    answers.append(answer.status)
                    return b"carls-dask run" in answer.read()
            except OSError:
                return False

        wait_for(page, "the dashboard's /app page", 300)
        assert answers[-1] == 200
        report, report_err = report_proc.communicate(timeout=600)
    finally:
        stop_process(server, group=True)
        if report_proc.poll() is None:
            report_proc.kill()
            report_proc.wait()
    assert report_proc.returncode == 0, f"carls-dask report exited {report_proc.returncode}: {report_err[-3000:]}"
    assert "carls-dask report: wrote demo/report.html" in report and (run / "report.html").stat().st_size > 100_000

    before = _folder_hash(run)
    refused = _run([carls, "run", "--resume", "demo"], cwd=work, env=env, status=1)
    assert f"the run finished at step 30; nothing to resume. Extend it with {carls} run --resume demo --steps N" \
        in refused, refused
    assert _folder_hash(run) == before  # refused before anything was written
    extended = _run([carls, "run", "--resume", "demo", "--steps", "40"], cwd=work, env=env, timeout=600)
    assert "resumed from step 30; run folder demo" in extended, extended
    result = json.loads((run / "result.json").read_text())
    assert [(s["from_step"], s["to_step"]) for s in result["segments"]] == [(None, 30), (30, 40)]
