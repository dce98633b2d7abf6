"""How to name the ``carls-dask`` command in the next commands a program prints for its user.

``./dev demo`` runs ``.venv/bin/carls-dask`` without putting ``.venv/bin`` on the user's ``PATH``, so a hint
that says ``carls-dask dashboard RUN`` would fail when pasted. The hint names the command as the user's shell
can run it: its bare name when ``PATH`` finds this installation's script, else the script's path.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

__all__ = ["command_name"]

COMMAND = "carls-dask"


def command_name() -> str:
    """The ``carls-dask`` command as the user can type it from the working folder.

    Returns
    -------
    str
        ``"carls-dask"`` when ``PATH`` finds the script installed beside the running interpreter (or when there is
        none, e.g. a ``python -m`` run from a checkout without an install); otherwise the script's path, relative to
        the working folder when it lies below it (``.venv/bin/carls-dask``).
    """
    script = pathlib.Path(sys.executable).parent / COMMAND
    if not script.exists():
        return COMMAND
    found = shutil.which(COMMAND)
    if found is not None and os.path.realpath(found) == os.path.realpath(script):
        return COMMAND
    try:
        return str(script.relative_to(pathlib.Path.cwd()))
    except ValueError:
        return str(script)
