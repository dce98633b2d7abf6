"""``carls-dask run``: finding a paradigm, its generated ``--help``, typed ``-o`` settings, result.json, --resume."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import dask.config
import pytest

from carls_dask.cli import main
from carls_dask.errors import ConfigError
from carls_dask.runtime import Paradigm, Trainer
from carls_dask.runtime.registry import (
    available_paradigms,
    get_paradigm,
    register_paradigm,
    unregister_paradigm,
)
from carls_dask.runtime.settings import (
    check_settings,
    describe_settings,
    field_docs,
    get_setting,
    settings_from_json,
    settings_from_options,
    settings_to_json,
)
from tests.processes import CARLS_DASK, console_env


@dataclasses.dataclass(frozen=True)
class LineSettings:
    """Fit a line.

    Parameters
    ----------
    steps
        Trainer steps.
    seed
        Seed of nothing in particular.
    lr, target
        Learning rate and the value the weight should reach.
    widths
        Unused widths, to test tuple parsing.
    note
        Free text or none.
    """

    steps: int = 30
    seed: int = 0
    lr: float = 0.2
    target: float = 3.0
    widths: tuple[int, ...] = (4, 2)
    note: str | None = None

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"LineSettings: lr={self.lr!r}; expected > 0")


class LineTrainer(Trainer):
    def __init__(self, s: LineSettings) -> None:
        super().__init__("trainer", max_steps=s.steps, publish_every=10, eval_every=10)
        self.s = s

    def setup(self, ctx: Any) -> None:
        import torch

        self.model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(self.model.weight)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.s.lr)

    def step(self, step: int) -> Mapping[str, float]:
        loss = (self.model.weight.sum() - self.s.target) ** 2
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": float(loss.detach())}

    def evaluate(self) -> Mapping[str, float]:
        return {"weight": float(self.model.weight.item()), "nan_figure": float("nan")}


class Line(Paradigm):
    name = "line"
    description = "fit one weight"
    settings_type = LineSettings
    variants = {"slow": {"lr": 0.05}, "fast": {}}
    default_variant = "fast"
    headline = ("weight",)

    def loops(self, s: LineSettings) -> Sequence[Any]:
        return [LineTrainer(s)]

    def summarize(self, s: LineSettings, results: Mapping[str, Any]) -> dict[str, Any]:
        return dict(results["trainer"].metrics)


@pytest.fixture
def line() -> Iterator[Line]:
    p = Line()
    register_paradigm(p)
    try:
        yield p
    finally:
        unregister_paradigm("line")


def test_settings_parse_typed_values_and_name_the_bad_one() -> None:
    s = settings_from_options(LineSettings, {"lr": "0.5", "widths": "8,4,2", "note": "none", "steps": "7"})
    assert (s.lr, s.widths, s.note, s.steps) == (0.5, (8, 4, 2), None, 7)
    with pytest.raises(ConfigError, match=r"setting steps='many': expected int"):
        settings_from_options(LineSettings, {"steps": "many"})
    with pytest.raises(ConfigError, match=r"setting 'colour'='red': unknown; expected one of \['lr', 'note'"):
        settings_from_options(LineSettings, {"colour": "red"})
    with pytest.raises(ConfigError, match=r"LineSettings: lr=-1.0; expected > 0"):
        settings_from_options(LineSettings, {"lr": "-1"})
    docs = field_docs(LineSettings)
    assert docs["lr"] == docs["target"] == "Learning rate and the value the weight should reach."
    info = {i.name: i for i in describe_settings(LineSettings)}
    assert (info["widths"].type, info["note"].type, info["steps"].default) == ("ints a,b,...", "str or none", 30)


@dataclasses.dataclass(frozen=True)
class Noise:
    """Noise added to the target.

    Attributes
    ----------
    scale
        Standard deviation of the ``noise`` (see :func:`numpy.random.normal`).
    seed
        Seed of the noise.
    """

    scale: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_settings("noise", ((self.scale >= 0, f"scale {self.scale!r}, expected >= 0"),))


@dataclasses.dataclass(frozen=True)
class NoisyLineSettings:
    """Fit a line to a noisy target.

    Attributes
    ----------
    steps
        Trainer steps.
    noise
        The noise.
    """

    renamed: ClassVar[dict[str, str]] = {"noise_scale": "noise.scale"}

    steps: int = 30
    noise: Noise = dataclasses.field(default_factory=Noise)


def test_a_group_is_named_group_dot_field_and_old_names_still_work() -> None:
    s = settings_from_options(NoisyLineSettings, {"noise.scale": "0.5", "noise.seed": "3"})
    assert s.noise == Noise(0.5, 3) and s.steps == 30
    assert settings_from_options(NoisyLineSettings, {"noise_scale": "0.25"}).noise == Noise(0.25, 0)
    assert settings_from_options(NoisyLineSettings, {}, base={"noise": {"seed": 4}}).noise == Noise(0.0, 4)
    assert settings_from_options(NoisyLineSettings, {"noise.seed": "5"}, base={"noise": Noise(1.0, 4)}).noise == \
        Noise(1.0, 5)
    with pytest.raises(ConfigError, match=r"^noise: scale -1.0, expected >= 0$"):
        settings_from_options(NoisyLineSettings, {"noise.scale": "-1"})
    with pytest.raises(ConfigError, match=r"setting 'noise.colour'='red': unknown; expected one of "
                                          r"\['noise.scale', 'noise.seed', 'steps'\]"):
        settings_from_options(NoisyLineSettings, {"noise.colour": "red"})
    # what a run folder keeps (groups nested), and the flat names of a folder written before the group
    assert settings_from_json(NoisyLineSettings, settings_to_json(s)) == s
    assert settings_from_json(NoisyLineSettings, {"steps": 30, "noise_scale": 0.5, "noise.seed": 3}) == s
    assert [(i.name, i.default, i.meaning) for i in describe_settings(NoisyLineSettings, s)] == [
        ("steps", 30, "Trainer steps."), ("noise.scale", 0.5, "Standard deviation of the noise (see normal)."),
        ("noise.seed", 3, "Seed of the noise.")]
    assert get_setting(s, "noise.seed") == 3


def test_run_help_lists_every_setting_with_type_default_and_meaning(line: Line,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "line", "--variant", "slow", "--help"]) == 0
    out = capsys.readouterr().out
    assert "variants: slow, fast (default fast)" in out
    assert "  lr (float, default 0.05)\n      Learning rate and the value the weight should reach." in out
    for field in dataclasses.fields(LineSettings):
        assert f"  {field.name} (" in out


def test_run_writes_strict_result_json_and_prints_the_headline(line: Line, tmp_path: pathlib.Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    assert main(["run", "line", "--inline", "--run-dir", str(run), "--steps", "40", "-o", "lr=0.1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("line fast (seed 0): weight 2.99") and f"run folder {run}" in out
    text = (run / "result.json").read_text()
    result = json.loads(text, parse_constant=lambda c: pytest.fail(f"result.json holds {c}"))
    assert result["schema"] == "carls-dask/result/2"
    assert (result["paradigm"], result["variant"], result["driver"]) == ("line", "fast", "inline")
    assert result["settings"]["lr"] == 0.1 and result["settings"]["steps"] == 40
    assert result["figures"]["nan_figure"] is None  # NaN is written as null
    assert result["loops"]["trainer"]["steps"] == 40 and result["loops"]["trainer"]["reason"] == "max_steps"
    assert {"carls-dask", "torch", "dask"} <= set(result["versions"])
    assert result["wall_seconds"] > 0
    # --resume --steps extends it from the newest saved state: the weight then matches 80 uninterrupted steps
    assert main(["run", "--resume", str(run), "--steps", "80"]) == 0
    resumed = json.loads((run / "result.json").read_text())
    assert resumed["resumed_from"] == 40 and resumed["loops"]["trainer"]["steps"] == 80
    assert [s["loops"]["trainer"]["steps"] for s in resumed["segments"]] == [40, 40]
    straight = tmp_path / "straight"
    assert main(["run", "line", "--inline", "--run-dir", str(straight), "--steps", "80", "-o", "lr=0.1"]) == 0
    assert resumed["figures"]["weight"] == json.loads((straight / "result.json").read_text())["figures"]["weight"]


def test_a_run_keeps_the_newest_storage_keep_snapshots_checkpoints(line: Line, tmp_path: pathlib.Path) -> None:
    from carls_dask.runtime import run_inline

    with dask.config.set({"carls.run.snapshot-every": 5, "carls.storage.keep-snapshots": 2}):
        run_inline(line, line.settings(None, steps=30), run_dir=tmp_path / "run")
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints" / "trainer").iterdir())
    assert kept == ["step-000000025.pt", "step-000000030.pt"], kept


def test_run_lists_and_refuses_without_running(line: Line, tmp_path: pathlib.Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--list"]) == 0
    assert "line: fit one weight (variants: slow, fast)" in capsys.readouterr().out
    assert main(["run", "no-such-thing"]) == 1
    err = capsys.readouterr().err
    assert "unknown paradigm 'no-such-thing'; available:" in err and "line" in err
    run = tmp_path / "refused"
    assert main(["run", "line", "--run-dir", str(run), "-o", "novalue"]) == 1
    assert "got 'novalue'; expected KEY=VALUE" in capsys.readouterr().err
    assert main(["run", "line", "--run-dir", str(run), "-o", "lr=fast"]) == 1
    assert "paradigm 'line' setting lr='fast': expected float" in capsys.readouterr().err
    assert main(["run", "line", "--run-dir", str(run), "--variant", "medium"]) == 1
    assert "unknown variant 'medium'; expected one of ['slow', 'fast']" in capsys.readouterr().err
    assert not run.exists()  # nothing ran after a refused request
    assert main(["run", "--resume", str(tmp_path / "nothing")]) == 1
    assert f"resume {tmp_path / 'nothing'}: no such folder; expected a run folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["run", "--resume", str(tmp_path / "empty")]) == 1
    assert "no request.json there" in capsys.readouterr().err


def test_registry_refuses_duplicates_and_non_paradigms(line: Line) -> None:
    with pytest.raises(ConfigError, match="'line' is already registered"):
        register_paradigm(Line())
    with pytest.raises(ConfigError, match="expected a Paradigm subclass or instance, got int"):
        register_paradigm(5)  # type: ignore[arg-type]
    assert "line" in available_paradigms()
    assert get_paradigm("line") is line
    assert {"semi-supervised", "curriculum", "multimodal"} <= set(available_paradigms())


# -- the help of the installed command --------------------------------------------------------------------------
_ROW = re.compile(r"^  (?P<name>[a-z_.]+) \((?P<type>[^)]*), default (?P<default>.*)\)$")
_MARKUP = re.compile(r"``|:[a-z]+:`")


def _help(tmp_path: pathlib.Path, *argv: str) -> tuple[str, dict[str, tuple[str, str]]]:
    """``carls-dask run ... --help`` as a user runs it: its text and ``{setting: (default, meaning)}``."""
    proc = subprocess.run([CARLS_DASK, "run", *argv, "--help"], cwd=tmp_path, env=console_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows: dict[str, tuple[str, list[str]]] = {}
    name = None
    for line in proc.stdout.splitlines():
        row = _ROW.match(line)
        if row:
            name = row["name"]
            rows[name] = (row["default"], [])
        elif name and line.startswith(" " * 6):
            rows[name][1].append(line.strip())
        else:
            name = None
    return proc.stdout, {k: (d, " ".join(m)) for k, (d, m) in rows.items()}


@pytest.mark.parametrize(("paradigm", "datasets"), [
    ("semi-supervised", ("Cora", "CiteSeer", "WordNet")),
    ("curriculum", ("Fashion-MNIST", "digits")),
    ("multimodal", ("OpenMoji",)),
])
def test_run_help_gives_each_setting_its_own_plain_words(paradigm: str, datasets: tuple[str, ...],
                                                          tmp_path: pathlib.Path) -> None:
    text, rows = _help(tmp_path, paradigm)
    description = next(line for line in text.splitlines() if line.startswith(f"paradigm {paradigm}: "))
    for dataset in datasets:
        assert dataset in description, f"the description of {paradigm} does not name {dataset}: {description!r}"
    settings = get_paradigm(paradigm).describe()
    assert sorted(rows) == sorted(info.name for info in settings), "--help lists other settings than the paradigm has"
    assert not _MARKUP.search(text), f"docstring markup in the help: {_MARKUP.findall(text)}"
    meanings = [meaning for _, meaning in rows.values()]
    assert all(meanings), f"settings without a meaning: {[k for k, (_, m) in rows.items() if not m]}"
    shared = {m for m in meanings if meanings.count(m) > 1}
    assert not shared, f"settings sharing one line of help: {shared}"


def test_run_help_shows_the_defaults_the_chosen_data_set_uses(tmp_path: pathlib.Path) -> None:
    _, cora = _help(tmp_path, "semi-supervised")
    _, citeseer = _help(tmp_path, "semi-supervised", "--dataset", "citeseer")
    _, wordnet = _help(tmp_path, "semi-supervised", "--dataset", "wordnet", "-o", "pseudo_weight=2")
    assert (cora["dataset"][0], cora["pseudo.teacher"][0], cora["pseudo.selection"][0]) == ("cora", "student", "soft")
    assert (citeseer["dataset"][0], citeseer["pseudo.teacher"][0]) == ("citeseer", "graph")  # its preset's teacher
    assert (wordnet["pseudo.selection"][0], wordnet["pseudo.weight"][0], wordnet["unlabelled_batch"][0]) == (
        "balanced", "2.0", "2048")  # the preset, the old name's value, and "every node" as WordNet reads it
    assert cora["unlabelled_batch"][0] == "1000000" and cora["data_dir"][0] == "none"
