"""Process targets for the curriculum feed tests (importable by spawned processes)."""

from __future__ import annotations

from typing import Any

from carls_dask.paradigms.curriculum import Curriculum
from carls_dask.paradigms.curriculum.feed import CurriculumFeed, LoadingOptions


def own_feed(settings: dict[str, Any], ready: Any, stop: Any) -> None:
    """Create the node's shared loader for ``settings`` (a ``curriculum+clean`` run) and serve it until ``stop``
    is set or the process is killed."""
    feed = CurriculumFeed(Curriculum().settings("curriculum+clean", **settings), "owner", LoadingOptions(slots=2))
    assert feed.mode == "produced", feed.mode
    ready.set()
    stop.wait(60)
    feed.close()
