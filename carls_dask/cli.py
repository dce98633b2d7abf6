"""The ``carls-dask`` command line.

Each subcommand lives in a function ``_cmd_<name>`` taking the parsed arguments and returning an
exit status. Subcommands import their heavy dependencies lazily, so ``carls-dask --help`` is fast.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
from collections.abc import Callable, Sequence

from carls_dask import __version__, bank_cli, dashboard_cli
from carls_dask.errors import CarlsError, ConfigError
from carls_dask.runtime import runcli

__all__ = ["build_parser", "main"]

logger = logging.getLogger(__name__)

Handler = Callable[[argparse.Namespace], int]


def _cmd_version(args: argparse.Namespace) -> int:
    import dask
    import distributed
    import numpy
    import torch
    import xarray
    import zarr

    out = sys.stdout
    out.write(f"carls-dask {__version__}\n")
    for mod in (dask, distributed, numpy, torch, xarray, zarr):
        out.write(f"  {mod.__name__} {mod.__version__}\n")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from carls_dask.demo import run_demo

    return run_demo(run_dir=args.run_dir, dataset=args.dataset, steps=args.steps)


def benchmarks_dir() -> pathlib.Path | None:
    """The ``benchmarks/`` folder of the source checkout this package runs from; ``None`` in an installed package.

    The benchmark scripts are part of the repository, not of the package a wheel installs.
    """
    from carls_dask.locations import checkout_root

    root = checkout_root()
    folder = root / "benchmarks" if root is not None else None
    return folder if folder is not None and folder.is_dir() else None


def _benchmarks(folder: pathlib.Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_"))


def _cmd_bench(args: argparse.Namespace) -> int:
    import subprocess

    folder = benchmarks_dir()
    if folder is None:
        raise ConfigError("the benchmark scripts are in the carls-dask source repository (its benchmarks/ "
                          "folder), which this installation does not include; clone the repository, run ./dev setup "
                          "there and run carls-dask bench from that environment")
    names = _benchmarks(folder)
    if args.list or not args.name:
        sys.stdout.write("".join(f"{n}\n" for n in names) if names else f"no benchmarks in {folder}\n")
        return 0 if args.list else 2
    if args.name not in names:
        raise ConfigError(f"bench: unknown benchmark {args.name!r}; expected one of {names} (in {folder})")
    script = folder / f"{args.name}.py"
    return subprocess.call([sys.executable, str(script), *args.script_args], cwd=folder.parent)


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="carls-dask",
        description="Trainers, knowledge makers and a sharded knowledge bank on a Dask cluster.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("version", help="print the versions of carls-dask and its main dependencies")
    p.set_defaults(handler=_cmd_version)

    p = sub.add_parser(
        "demo", help="run the semi-supervised paradigm end to end on a LocalCluster and write a run folder"
    )
    p.add_argument("--run-dir", type=pathlib.Path, default=None, help="run folder to write (default: runs/demo-<time>)")
    p.add_argument("--dataset", default="cora", choices=("cora", "citeseer"), help="citation graph to learn on")
    p.add_argument("--steps", type=int, default=None, help="trainer steps (default: the paradigm's own)")
    p.set_defaults(handler=_cmd_demo)

    p = sub.add_parser("bank", help="inspect, list, prune or restore a knowledge bank store")
    bank_cli.add_arguments(p)
    p.set_defaults(handler=bank_cli.run)

    p = sub.add_parser("run", help="run a learning paradigm and write a run folder (or resume one)", add_help=False)
    runcli.add_arguments(p)
    p.set_defaults(handler=runcli.run)

    p = sub.add_parser("dashboard", help="serve the Panel dashboard of run folders")
    dashboard_cli.add_arguments(p)
    p.set_defaults(handler=dashboard_cli.run)

    p = sub.add_parser("report", help="write the dashboard of run folders as one self-contained HTML file")
    dashboard_cli.add_report_arguments(p)
    p.set_defaults(handler=dashboard_cli.run_report)

    p = sub.add_parser("bench", help="run a benchmark script and print its measured ratios")
    p.add_argument("name", nargs="?", help="benchmark to run (see --list), e.g. bank_throughput")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments passed to the benchmark script")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.set_defaults(handler=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``carls-dask`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Dask's own INFO chatter (cluster start/stop) only with -vv.
    dask_level = logging.DEBUG if args.verbose >= 2 else logging.WARNING
    for name in ("distributed", "distributed.scheduler", "distributed.nanny", "distributed.core", "distributed.http"):
        logging.getLogger(name).setLevel(dask_level)
    if args.verbose < 2:  # a LocalCluster's closing ("worker process still alive ..., killing") is not news
        logging.getLogger("distributed.nanny").setLevel(logging.ERROR)
    try:
        status: int = args.handler(args)
    except CarlsError as exc:
        sys.stderr.write(f"carls-dask {args.command}: error: {exc}\n")
        return 1
    except KeyboardInterrupt as exc:  # Ctrl-C: one line (a run names its checkpoint and the resume command)
        runner = sys.modules.get("carls_dask.runtime.runner")  # loaded whenever a run was interrupted
        said = exc if runner is not None and isinstance(exc, runner.RunInterrupted) else "interrupted"
        sys.stderr.write(f"\ncarls-dask {args.command}: {said}\n")
        return 130
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
