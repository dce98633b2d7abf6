"""Which run folders a dashboard shows: given run folders, folders of runs, or a mix."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

from carls_dask.errors import ConfigError
from carls_dask.storage.runfolder import RUN_MARKERS, RunFolder

__all__ = ["RUN_MARKERS", "find_runs", "is_run"]

PathLike = str | os.PathLike[str]


def is_run(path: pathlib.Path) -> bool:
    """Whether ``path`` is a run folder: it holds a metric store, a bank, or a run record."""
    return RunFolder(path).is_run()


def _runs_in(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in folder.iterdir() if is_run(p))


def find_runs(paths: PathLike | Sequence[PathLike]) -> list[pathlib.Path]:
    """The run folders named by ``paths``: each a run folder or a folder of runs (its run subfolders, by name).

    A path that is not there yet (or a single empty folder) is taken as a run that has not written
    anything yet: a dashboard waits for it; a report says it is missing.

    Parameters
    ----------
    paths
        One path or a sequence of paths.

    Returns
    -------
    list of pathlib.Path
        The run folders, in the order given (a folder of runs expands in place), each once.

    Raises
    ------
    ConfigError
        When no path is given, or (among several paths) a path is neither a run folder nor a folder
        holding run folders.
    """
    if isinstance(paths, str | os.PathLike):
        given = [pathlib.Path(paths)]
    else:
        given = [pathlib.Path(p) for p in paths]
    if not given:
        raise ConfigError("no run given: expected a run folder, a folder of runs, or several of them")
    out: list[pathlib.Path] = []
    for path in given:
        if is_run(path):
            found = [path]
        elif path.is_dir() and (inner := _runs_in(path)):
            found = inner
        elif not path.exists() or (len(given) == 1 and path.is_dir() and not any(path.iterdir())):
            found = [path]  # a run that has not started writing (yet)
        elif not path.is_dir():
            raise ConfigError(f"run path {path} is a file; expected a run folder or a folder of run folders")
        else:
            raise ConfigError(
                f"run path {path} is neither a run folder (none of {', '.join(RUN_MARKERS)} in it) "
                "nor a folder of run folders"
            )
        out.extend(p for p in found if p not in out)
    return out
