"""A run too short for a figure says why: ``none`` and a reason on the console, ``null`` and the reason in result.json."""

from __future__ import annotations

import json
import pathlib

import pytest

from carls_dask.cli import main


def test_a_curriculum_run_too_short_to_flag_labels_says_why(tmp_path: pathlib.Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    # the default publish_every (469) is far above 60 steps: the makers score once, at the end; nothing is flagged
    assert main(["run", "curriculum", "--inline", "--steps", "60", "-o", "dataset=digits", "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    head, *notes = out.splitlines()
    assert "flag_precision none, flag_recall none" in head and "nan" not in out
    assert notes == [
        "  flag_precision, flag_recall: not measured: in 60 steps the makers made 1 round(s) (they score each "
        "version the trainer publishes every 469 steps, publish_every) and the trainer read their scores every 469 "
        "steps (refresh_every); run more steps or lower publish_every and refresh_every"]
    result = json.loads((run / "result.json").read_text())
    assert result["figures"]["flag_precision"] is None and result["figures"]["flag_recall"] is None
    assert result["reasons"]["flag_precision"] == notes[0].split(": ", 1)[1]
    assert set(result["reasons"]) == {k for k, v in result["figures"].items() if v is None}


def test_the_uniform_variant_says_it_has_no_makers(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "curriculum", "--inline", "--variant", "uniform", "--steps", "20", "-o", "dataset=digits",
                 "--run-dir", str(tmp_path / "run")]) == 0
    notes = capsys.readouterr().out.splitlines()[1:]
    assert notes == ["  flag_precision, flag_recall: not measured: the variant (pacing 'uniform', clean 'none') runs "
                     "no makers, so nothing is scored or flagged"]
