"""``carls-dask dashboard RUN_PATH``: serve the Panel dashboard of a run folder, bound to localhost by default."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import pathlib
import sys

from carls_dask import config
from carls_dask.storage.errors import ConfigError

__all__ = ["add_arguments", "app_path", "panel_command", "run"]

logger = logging.getLogger(__name__)


def app_path() -> pathlib.Path:
    """Where ``dashboards/app.py`` is (located without importing the dashboards package)."""
    spec = importlib.util.find_spec("dashboards")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the 'dashboards' package is not installed; expected it beside carls_dask")
    return pathlib.Path(next(iter(spec.submodule_search_locations))) / "app.py"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``dashboard`` subcommand's arguments."""
    parser.add_argument("run_path", metavar="RUN_PATH", type=pathlib.Path, help="run folder (metrics.zarr, bank/)")
    parser.add_argument("--address", default=None, help="interface to bind (default: carls.dashboard.address, 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default: carls.dashboard.port, 5006)")
    parser.add_argument("--refresh", default=None, help="refresh period, e.g. 2s (default: carls.dashboard.refresh)")
    parser.add_argument("--show", action="store_true", help="open a browser tab")
    parser.add_argument("--dry-run", action="store_true", help="print the panel serve command instead of running it")


def panel_command(
    run_path: pathlib.Path, address: str | None = None, port: int | None = None, show: bool = False
) -> list[str]:
    """The ``panel serve`` command line that serves ``run_path``.

    Raises
    ------
    ConfigError
        If the port is outside 1-65535.
    """
    address = str(config.get("dashboard.address", address))
    port = int(config.get("dashboard.port", port))
    if not 0 < port < 65536:
        raise ConfigError(f"dashboard port {port} (--port or carls.dashboard.port) is out of range; expected 1-65535")
    cmd = [
        sys.executable, "-m", "panel", "serve", str(app_path()),
        "--address", address, "--port", str(port),
        "--allow-websocket-origin", f"{address}:{port}",
    ]
    if address in ("127.0.0.1", "localhost"):
        cmd += ["--allow-websocket-origin", f"localhost:{port}" if address == "127.0.0.1" else f"127.0.0.1:{port}"]
    if show:
        cmd.append("--show")
    return [*cmd, "--args", str(run_path)]


def run(args: argparse.Namespace) -> int:
    """Handler of ``carls-dask dashboard``: become ``panel serve`` (Ctrl-C or SIGTERM stops it)."""
    cmd = panel_command(args.run_path, args.address, args.port, args.show)
    env = dict(os.environ)
    if args.refresh is not None:
        config.get_seconds("dashboard.refresh", args.refresh)  # validate before starting the server
        env["DASK_CARLS__DASHBOARD__REFRESH"] = str(args.refresh)
    if args.dry_run:
        sys.stdout.write(" ".join(cmd) + "\n")
        return 0
    if not args.run_path.exists():
        logger.warning("run folder %s does not exist yet; the dashboard will wait for it", args.run_path)
    sys.stderr.write(f"carls-dask dashboard: serving {args.run_path} at http://{cmd[cmd.index('--address') + 1]}:{cmd[cmd.index('--port') + 1]}/app\n")
    sys.stderr.flush()
    # the server takes this process's place, so a signal that stops `carls-dask dashboard` stops the server
    # itself (a child process would outlive a SIGTERM sent to its parent)
    os.execvpe(cmd[0], cmd, env)
