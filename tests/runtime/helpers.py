"""Helpers shared by the runtime tests."""

from __future__ import annotations

from carls_dask.runtime import Workbench
from tests.processes import wait_for


def run_until_knowledge_flows(wb: Workbench, min_steps: int, timeout: float = 300) -> None:
    """Wait until the trainer passed ``min_steps`` having read maker knowledge and the maker made 2 rounds.

    The trainer runs until stopped, so how fast the maker's worker starts cannot decide the outcome.
    """
    def flowing() -> bool:
        status = wb.status()
        if status["trainer"].future == "error" or status["maker"].future == "error":
            wb.results()  # raises the loop's failure
        t, m = status["trainer"].progress, status["maker"].progress
        return t.get("step", 0) >= min_steps and t.get("bank_found", 0) == 1.0 and m.get("round", 0) >= 2

    wait_for(flowing, lambda: f"knowledge did not flow within {timeout}s: {wb.status()}", timeout)
