"""The ``carls-dask`` command as a printed hint names it: typeable from the user's folder."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

from carls_dask.console import command_name

SCRIPT = pathlib.Path(sys.executable).parent / "carls-dask"

pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="carls-dask is not installed beside this interpreter")


def test_the_bare_name_when_path_finds_this_installation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{SCRIPT.parent}{os.pathsep}/usr/bin")
    assert command_name() == "carls-dask"


def test_the_scripts_path_when_path_does_not_find_it(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(SCRIPT.parents[2])  # the folder holding the virtual environment, as after ./dev demo
    assert command_name() == str(SCRIPT.relative_to(SCRIPT.parents[2]))  # e.g. .venv/bin/carls-dask
    monkeypatch.chdir(tmp_path)  # a folder the script does not lie below: its whole path
    assert command_name() == str(SCRIPT)
