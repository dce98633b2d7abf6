"""``carls-dask run``: the plumbing that finds a registered paradigm and hands it a RunRequest."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from carls_dask.cli import main
from carls_dask.errors import ConfigError
from carls_dask.runtime.registry import (
    RunRequest,
    available_paradigms,
    get_paradigm,
    register_paradigm,
    unregister_paradigm,
)


@pytest.fixture
def recorded() -> Iterator[list[RunRequest]]:
    calls: list[RunRequest] = []

    def runner(request: RunRequest) -> int:
        calls.append(request)
        return 3 if request.options.get("fail") == "yes" else 0

    register_paradigm("toy-paradigm", runner)
    try:
        yield calls
    finally:
        unregister_paradigm("toy-paradigm")


def test_run_hands_the_request_to_the_paradigm(recorded: list[RunRequest], tmp_path: pathlib.Path) -> None:
    assert main(["run", "toy-paradigm", "--run-dir", str(tmp_path), "--steps", "12", "-o", "lr=0.5"]) == 0
    assert recorded == [RunRequest("toy-paradigm", tmp_path, 12, {"lr": "0.5"})]
    assert main(["run", "toy-paradigm", "-o", "fail=yes"]) == 3  # the paradigm's status is the exit status
    assert recorded[-1].run_dir.parent == pathlib.Path("runs")
    assert recorded[-1].run_dir.name.startswith("toy-paradigm-")


def test_run_lists_and_rejects(recorded: list[RunRequest], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--list"]) == 0
    assert "toy-paradigm" in capsys.readouterr().out.split()
    assert main(["run", "no-such-thing"]) == 1
    err = capsys.readouterr().err
    assert "unknown paradigm 'no-such-thing'; available:" in err and "toy-paradigm" in err
    assert main(["run", "toy-paradigm", "-o", "novalue"]) == 1
    assert "got 'novalue'; expected KEY=VALUE" in capsys.readouterr().err
    assert recorded == []  # nothing ran after a refused request


def test_registry_refuses_duplicates_and_non_callables(recorded: list[RunRequest]) -> None:
    with pytest.raises(ConfigError, match="'toy-paradigm' is already registered"):
        register_paradigm("toy-paradigm", lambda r: 0)
    with pytest.raises(ConfigError, match="runner must be callable, got int"):
        register_paradigm("other", 5)  # type: ignore[arg-type]
    assert "other" not in available_paradigms()
    assert get_paradigm("toy-paradigm") is not None
