"""The ``carls-dask run`` subcommand: run a registered paradigm into a run folder, or resume one."""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
import textwrap
import time
from typing import Any

from carls_dask.errors import ConfigError

__all__ = ["add_arguments", "run"]

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``run`` subcommand's arguments to ``p`` (built with ``add_help=False``)."""
    p.add_argument("paradigm", nargs="?",
                   help="the paradigm to run: a registered name (see --list) or an import path package.module:Class")
    p.add_argument("-h", "--help", action="store_true",
                   help="show this help; after a paradigm name, also every setting of that paradigm")
    p.add_argument("--list", action="store_true", help="list the available paradigms and their variants, and exit")
    p.add_argument("--variant", default=None, help="named variant of the paradigm (default: its default variant)")
    p.add_argument("--run-dir", type=pathlib.Path, default=None,
                   help="run folder to write (default: runs/<paradigm>-<time>)")
    p.add_argument("--steps", type=int, default=None, help="steps of the primary trainer (same as -o steps=N)")
    p.add_argument("--seed", type=int, default=None, help="seed of the run (same as -o seed=N)")
    p.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the paradigm (repeatable; see carls-dask run NAME --help)")
    p.add_argument("--dataset", default=None, help="data set of the paradigm (same as -o dataset=NAME)")
    p.add_argument("--inline", action="store_true",
                   help="run in this process in lock step (deterministic) instead of on the Dask cluster")
    p.add_argument("--resume", type=pathlib.Path, default=None, metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its newest checkpoint; a finished run is extended with "
                        "--steps N, N above the step it finished at")
    p.set_defaults(run_parser=p)


def _shown(value: Any) -> str:
    """A default as ``-o`` would take it: ``none``, ``true``/``false``, tuples as ``a,b``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _given(args: argparse.Namespace) -> dict[str, str]:
    """The settings the command line gives: ``-o KEY=VALUE`` pairs, then ``--steps``, ``--seed`` and ``--dataset``."""
    options = _options(args.option)
    for key in ("steps", "seed", "dataset"):
        if getattr(args, key, None) is not None:
            options[key] = str(getattr(args, key))
    return options


def _options(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"run --option: got {pair!r}; expected KEY=VALUE")
        out[key] = value
    return out


def settings_help(paradigm: Any, variant: str | None = None, options: dict[str, str] | None = None) -> str:
    """The settings of ``paradigm`` as ``--help`` shows them: name, type, default and meaning, one setting each.

    The defaults are those a run of ``variant`` with ``options`` (``--dataset``, ``-o``...) really uses:
    a data set's presets are applied. Meanings are the settings' docstrings in plain words.
    """
    name = paradigm.variant_name(variant)
    given = ", ".join(f"{k}={v}" for k, v in (options or {}).items())
    lines = [f"paradigm {paradigm.name}: {paradigm.description}".rstrip(": "),
             f"variants: {', '.join(paradigm.variants)} (default {paradigm.variant_name(None)})",
             f"settings (-o KEY=VALUE), defaults of variant {name!r}" + (f" with {given}" if given else "") + ":"]
    for info in paradigm.describe(name, options):
        lines.append(f"  {info.name} ({info.type}, default {_shown(info.default)})")
        if info.meaning:
            lines.extend(textwrap.wrap(info.meaning, width=100, initial_indent=" " * 6, subsequent_indent=" " * 6,
                                       break_on_hyphens=False))
    renamed = dict(getattr(paradigm.settings_type, "renamed", {}))
    if renamed:
        older = ", ".join(f"{old} ({new})" for old, new in renamed.items())
        lines.extend(textwrap.wrap(f"older names still read: {older}", width=100, subsequent_indent="  ",
                                   break_on_hyphens=False))
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Handle ``carls-dask run``; returns the exit status."""
    from carls_dask.runtime.registry import available_paradigms, get_paradigm, is_import_path
    from carls_dask.runtime.runner import recorded_paradigm, resume_run, run_inline, run_paradigm

    out = sys.stdout
    if args.help:
        out.write(args.run_parser.format_help())
        if args.paradigm:
            out.write("\n" + settings_help(get_paradigm(args.paradigm), args.variant, _given(args)))
        return 0
    if args.list:
        names = available_paradigms()
        for n in names:
            p = get_paradigm(n)
            out.write(f"{n}: {p.description} (variants: {', '.join(p.variants)})\n")
        if not names:
            out.write("no paradigms registered\n")
        return 0
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"run --steps: got {args.steps}; expected a positive number of steps")
    if args.resume is not None:
        if args.paradigm or args.option or args.variant:
            raise ConfigError("run --resume RUN_DIR: takes its paradigm, variant and settings from RUN_DIR/request.json; "
                              "give no paradigm name, --variant or -o with it")
        result = resume_run(args.resume, steps=args.steps, inline=True if args.inline else None)
        p = recorded_paradigm(args.resume)
        out.write(f"{result.headline(p.headline)}; resumed from step {result.resumed_from}; run folder {args.resume}\n")
        _write_notes(out, result, p.headline)
        return 0
    if not args.paradigm:
        raise ConfigError(f"run: expected a paradigm name; available: {', '.join(available_paradigms()) or 'none'}")
    paradigm = get_paradigm(args.paradigm)
    settings = paradigm.settings(args.variant, _given(args))
    label = (paradigm.name or type(paradigm).__name__) if is_import_path(args.paradigm) else args.paradigm
    run_dir = args.run_dir or pathlib.Path("runs") / f"{label}-{time.strftime('%Y%m%d-%H%M%S')}"
    logger.info("running %s (%s) into %s", args.paradigm, paradigm.variant_name(args.variant), run_dir)
    if args.inline:
        result = run_inline(paradigm, settings, variant=args.variant, run_dir=run_dir, progress=True)
    else:
        result = run_paradigm(paradigm, settings, variant=args.variant, run_dir=run_dir)
    out.write(f"{result.headline(paradigm.headline)}; run folder {run_dir}\n")
    _write_notes(out, result, paradigm.headline)
    return 0


def _write_notes(out: Any, result: Any, names: Any) -> None:
    """Say why each headline figure without a value has none (a run too short for it, ...)."""
    for line in result.notes(names):
        out.write(f"  {line}\n")
