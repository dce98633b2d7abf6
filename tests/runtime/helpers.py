"""Helpers shared by the runtime tests."""

from __future__ import annotations

import time

from carls_dask.runtime import Workbench


def run_until_knowledge_flows(wb: Workbench, min_steps: int, timeout: float = 300) -> None:
    """Wait until the trainer passed ``min_steps`` having read maker knowledge and the maker made 2 rounds.

    The trainer runs until stopped, so how fast the maker's worker starts cannot decide the outcome.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = wb.status()
        if status["trainer"].future == "error" or status["maker"].future == "error":
            wb.results()  # raises the loop's failure
        t, m = status["trainer"].progress, status["maker"].progress
        if t.get("step", 0) >= min_steps and t.get("bank_found", 0) == 1.0 and m.get("round", 0) >= 2:
            return
        time.sleep(0.1)
    raise AssertionError(f"knowledge did not flow within {timeout}s: {wb.status()}")
