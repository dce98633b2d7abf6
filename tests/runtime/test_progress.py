"""Progress a user sees: the run's bar counts the primary trainer's steps, to its step budget."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

from carls_dask.runtime import Trainer, Workbench
from carls_dask.runtime.progress import ProgressBook, ProgressSink


class Ticker(Trainer):
    def setup(self, ctx: Any) -> None:
        import torch

        self.model = torch.nn.Linear(1, 1)

    def step(self, step: int) -> Mapping[str, float]:
        time.sleep(0.002)
        return {"loss": 1.0}


def test_the_book_counts_the_primary_trainer() -> None:
    book = ProgressBook(primary="main")
    book.update({"loop": "side", "kind": "trainer", "step": 50})
    book.update({"loop": "main", "kind": "trainer", "step": 20})
    assert (book.primary_step(), book.trainer_step()) == (20, 50)
    assert ProgressBook().primary_step() == 0


def test_a_second_shorter_trainer_leaves_the_bar_on_the_primary_trainers_steps(
        client: object, capsys: pytest.CaptureFixture[str]) -> None:
    """As in a multimodal run: the contrastive trainer (100 steps) and a concept classifier (30 steps)."""
    with Workbench(client, progress=True, name="two-trainers") as wb:
        wb.submit_trainer(Ticker("main", max_steps=100, publish_every=10))
        wb.submit_trainer(Ticker("side", max_steps=30, publish_every=10))
        wb.wait(timeout=120)
        wb.stop()
    drawn = capsys.readouterr().err.replace("\r", "\n").splitlines()
    totals = {line.split("|")[2].split()[0].split("/")[1] for line in drawn if line.count("|") >= 2 and "/" in line}
    assert totals == {"100"}, drawn[-5:]
    assert any("100/100" in line for line in drawn), drawn[-5:]


def test_a_sink_started_at_a_checkpoint_draws_from_there(capsys: pytest.CaptureFixture[str]) -> None:
    book = ProgressBook(primary="t")
    sink = ProgressSink(book, total=80, initial=40, desc="resumed")
    book.update({"loop": "t", "kind": "trainer", "step": 60})
    sink.flush()
    sink.close()
    drawn = capsys.readouterr().err.replace("\r", "\n")
    assert "40/80" in drawn and "60/80" in drawn and " 0/80" not in drawn
