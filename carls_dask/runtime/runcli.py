"""The ``carls-dask run`` subcommand: start a registered paradigm with a run folder."""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
import time

from carls_dask.storage.errors import ConfigError

__all__ = ["add_arguments", "run"]

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``run`` subcommand's arguments to ``p``."""
    p.add_argument("paradigm", nargs="?", help="name of the paradigm to run (see --list)")
    p.add_argument("--list", action="store_true", help="list the available paradigms and exit")
    p.add_argument("--run-dir", type=pathlib.Path, default=None,
                   help="run folder to write (default: runs/<paradigm>-<time>)")
    p.add_argument("--steps", type=int, default=None, help="trainer steps (default: the paradigm's own)")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option for the paradigm (repeatable)")
    p.add_argument("--dataset", default=None,
                   help="data set for the paradigm (same as --option dataset=NAME), e.g. cora or citeseer")


def _options(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"run --option: got {pair!r}; expected KEY=VALUE")
        out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    """Handle ``carls-dask run``; returns the exit status."""
    from carls_dask.runtime.registry import RunRequest, available_paradigms, get_paradigm

    if args.list:
        names = available_paradigms()
        sys.stdout.write("".join(f"{n}\n" for n in names) if names else "no paradigms registered\n")
        return 0
    if not args.paradigm:
        raise ConfigError(f"run: expected a paradigm name; available: {', '.join(available_paradigms()) or 'none'}")
    if args.steps is not None and args.steps < 0:
        raise ConfigError(f"run --steps: got {args.steps}; expected a non-negative number of steps")
    runner = get_paradigm(args.paradigm)
    run_dir = args.run_dir or pathlib.Path("runs") / f"{args.paradigm}-{time.strftime('%Y%m%d-%H%M%S')}"
    options = _options(args.option)
    if getattr(args, "dataset", None):
        options["dataset"] = args.dataset
    request = RunRequest(args.paradigm, run_dir, args.steps, options)
    logger.info("running %s into %s", args.paradigm, run_dir)
    status = runner(request)
    return 0 if status is None else int(status)
