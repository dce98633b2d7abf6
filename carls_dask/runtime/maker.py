"""The :class:`KnowledgeMaker` base class: the hooks a knowledge maker implements."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from carls_dask.errors import ConfigError, HookNotImplementedError
from carls_dask.runtime.channel import ModelVersion
from carls_dask.runtime.context import LoopContext

__all__ = ["KnowledgeMaker"]


class KnowledgeMaker:
    """Turns the newest model version into knowledge written to the bank, as a long-lived future.

    Subclass it and implement :meth:`load_model` and :meth:`make`. The runtime calls, on a worker::

        setup(ctx)                               # once: load data, build an empty model
        until stopped or max_rounds:
            wait for a version newer than the last one used (ctx.channel)
            load_model(state_dict, version)      # load the newest weights
            metrics = make(version)              # recompute knowledge, write it to ctx.bank with
                                                 # model_step=version.step, maker=self.name
        on stop, with final_pass: one more round if a newer version is waiting
        finish() -> the future's value; teardown() always

    Parameters
    ----------
    name
        Unique name of the loop in its Workbench; written to the bank as the ``maker`` provenance.
    source
        Name of the trainer whose versions to use; ``None`` means the Workbench's only trainer.
    max_rounds
        Rounds after which the loop ends by itself; ``None`` runs until stopped.
    final_pass
        On a stop, make one more round when a version newer than the last one used is waiting,
        so the bank ends with knowledge from the trainer's final model.
    """

    kind = "maker"

    def __init__(self, name: str = "maker", *, source: str | None = None, max_rounds: int | None = None,
                 final_pass: bool = True) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"KnowledgeMaker name: expected a non-empty string, got {name!r}")
        if max_rounds is not None and (not isinstance(max_rounds, int) or max_rounds < 1):
            raise ConfigError(f"KnowledgeMaker {name!r}: max_rounds must be a positive int or None, got {max_rounds!r}")
        self.name = name
        self.source = source
        self.max_rounds = max_rounds
        self.final_pass = final_pass
        self.ctx: LoopContext | None = None

    # -- hooks -------------------------------------------------------------------------------
    def setup(self, ctx: LoopContext) -> None:
        """Load data and build the model skeleton on ``ctx.device``. Called once on the worker."""

    def load_model(self, state: Mapping[str, Any], version: ModelVersion) -> None:
        """Load a published state dict (the newest version)."""
        raise HookNotImplementedError(f"{type(self).__name__} must implement load_model()")

    def make(self, version: ModelVersion) -> Mapping[str, float] | None:
        """Recompute knowledge with the loaded model and write it; return numbers to report."""
        raise HookNotImplementedError(f"{type(self).__name__} must implement make()")

    def state(self) -> dict[str, Any]:
        """A checkpoint of the maker's own state (most makers have none)."""
        return {}

    def finish(self) -> Any:
        """Return the value of the loop's result; ``None`` by default."""
        return None

    def teardown(self) -> None:
        """Release what :meth:`setup` acquired. Always called, also after an exception."""
