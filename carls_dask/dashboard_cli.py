"""``carls-dask dashboard RUN [RUN ...]`` and ``carls-dask report RUN [RUN ...] -o FILE``.

``dashboard`` serves the Panel dashboard of one or more run folders (or folders of runs), bound to
localhost by default; ``report`` writes the same figures into one self-contained HTML file.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import pathlib
import sys
from collections.abc import Sequence

from carls_dask import config
from carls_dask.errors import ConfigError
from carls_dask.storage.runfolder import REPORT

__all__ = [
    "add_arguments",
    "add_report_arguments",
    "app_path",
    "bind_address",
    "panel_command",
    "run",
    "run_report",
]

logger = logging.getLogger(__name__)

def app_path() -> pathlib.Path:
    """Where the Panel app of :mod:`carls_dask.dashboards` is (located without importing the package).

    Raises
    ------
    ConfigError
        If the installation holds no ``carls_dask/dashboards/app.py``.
    """
    spec = importlib.util.find_spec("carls_dask.dashboards")
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    for folder in locations:
        app = pathlib.Path(folder) / "app.py"
        if app.is_file():
            return app
    raise ConfigError(f"the dashboard app carls_dask/dashboards/app.py is not installed (looked in {locations}); "
                      "expected it in the carls-dask installation: reinstall carls-dask")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``dashboard`` subcommand's arguments."""
    parser.add_argument(
        "run_paths", metavar="RUN", type=pathlib.Path, nargs="+",
        help="run folder (metrics.zarr, bank/), several of them, or a folder of runs",
    )
    _add_table(parser)
    parser.add_argument("--address", default=None, help="interface to bind (default: carls.dashboard.address, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default: carls.dashboard.port, 5006)")
    parser.add_argument("--refresh", default=None, help="refresh period, e.g. 2s (default: carls.dashboard.refresh)")
    parser.add_argument("--show", action="store_true", help="open a browser tab")
    parser.add_argument("--dry-run", action="store_true", help="print the panel serve command instead of running it")


def _add_table(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--table", default=None, metavar="NAME",
        help="bank table the views show first (default: the first table, in the order the run created them, "
             "that has a float vector column); bank health covers every table either way",
    )


def bind_address(address: str | None = None, port: int | None = None) -> tuple[str, int]:
    """The interface and port to serve on: the given ones, else ``carls.dashboard.address`` / ``port``.

    Raises
    ------
    ConfigError
        If the port is outside 1-65535.
    """
    address = str(config.get("dashboard.address", address))
    port = int(config.get("dashboard.port", port))
    if not 0 < port < 65536:
        raise ConfigError(f"dashboard port {port} (--port or carls.dashboard.port) is out of range; expected 1-65535")
    return address, port


def panel_command(
    runs: pathlib.Path | Sequence[pathlib.Path], address: str | None = None, port: int | None = None, show: bool = False,
    table: str | None = None,
) -> list[str]:
    """The ``panel serve`` command line that serves the run folder(s) ``runs`` (each becomes one ``--args`` value;
    ``table`` goes there as ``--table NAME``).

    Raises
    ------
    ConfigError
        If the port is outside 1-65535, or no run is given.
    """
    paths = [pathlib.Path(runs)] if isinstance(runs, (str, os.PathLike)) else [pathlib.Path(r) for r in runs]
    if not paths:
        raise ConfigError("dashboard: no run folder given; expected at least one RUN")
    address, port = bind_address(address, port)
    cmd = [
        sys.executable, "-m", "panel", "serve", str(app_path()),
        "--address", address, "--port", str(port),
        "--allow-websocket-origin", f"{address}:{port}",
        "--liveness",  # GET /liveness answers while the server's event loop does: for health checks and proxies
    ]
    if address in ("127.0.0.1", "localhost"):
        cmd += ["--allow-websocket-origin", f"localhost:{port}" if address == "127.0.0.1" else f"127.0.0.1:{port}"]
    if show:
        cmd.append("--show")
    return [*cmd, "--args", *(["--table", table] if table else []), *(str(p) for p in paths)]


def run(args: argparse.Namespace) -> int:
    """Handler of ``carls-dask dashboard``: become ``panel serve`` (Ctrl-C or SIGTERM stops it).

    The server replaces this process (``exec``), so the pid that was started is the server's: a
    SIGTERM or SIGINT sent to it stops the server itself, which closes its port and exits, and no
    child is left behind to hold the port (a child would outlive a signal sent to its parent).
    """
    from carls_dask.dashboards.runs import find_runs

    bind_address(args.address, args.port)  # settings are refused before the runs are looked at
    env = dict(os.environ)
    if args.refresh is not None:
        config.get_seconds("dashboard.refresh", args.refresh)  # validate before starting the server
        env["DASK_CARLS__DASHBOARD__REFRESH"] = str(args.refresh)
    runs = find_runs(args.run_paths)
    cmd = panel_command(runs, args.address, args.port, args.show, table=args.table)
    for line in _damage_lines(runs):
        sys.stderr.write(f"carls-dask dashboard: {line}\n")
    if args.dry_run:
        sys.stdout.write(" ".join(cmd) + "\n")
        return 0
    for path in runs:
        if not path.exists():
            logger.warning("run folder %s does not exist yet; the dashboard will wait for it", path)
    shown = ", ".join(str(p) for p in runs)
    sys.stderr.write(
        f"carls-dask dashboard: serving {shown} at http://{cmd[cmd.index('--address') + 1]}:{cmd[cmd.index('--port') + 1]}/app\n"
    )
    sys.stderr.flush()
    os.execvpe(cmd[0], cmd, env)


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``report`` subcommand's arguments."""
    parser.add_argument(
        "run_paths", metavar="RUN", type=pathlib.Path, nargs="+",
        help="run folder (metrics.zarr, bank/), several of them, or a folder of runs",
    )
    parser.add_argument(
        "-o", "--output", type=pathlib.Path, default=pathlib.Path(REPORT),
        help="HTML file to write (default: report.html); its folder must exist",
    )
    parser.add_argument("--title", default=None, help="title of the page (default: the runs' names)")
    _add_table(parser)


def _damage_lines(runs: Sequence[pathlib.Path]) -> list[str]:
    """One line per finished run that lacks a part, naming what it lacks."""
    from carls_dask.storage.runcheck import run_damage

    lines = []
    for path in runs:
        damage = run_damage(path)
        if damage:
            lines.append(f"run {path} finished, but {'; '.join(damage)}; it cannot be shown whole")
    return lines


def run_report(args: argparse.Namespace) -> int:
    """Handler of ``carls-dask report``: write the static HTML report of the runs and name the file written.

    A finished run that lacks a part (its metric store, its bank) is reported with what it has; the
    command then names each missing part and exits with status 1.
    """
    from carls_dask.dashboards.report import write_report
    from carls_dask.dashboards.runs import find_runs

    out = write_report(args.run_paths, args.output, title=args.title, table=args.table)
    sys.stdout.write(f"carls-dask report: wrote {out} ({out.stat().st_size / 1e6:.1f} MB)\n")
    damaged = _damage_lines(find_runs(args.run_paths))
    for line in damaged:
        sys.stderr.write(f"carls-dask report: error: {line}\n")
    return 1 if damaged else 0
