"""The :class:`Trainer` base class: the hooks a model trainer implements."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from carls_dask.errors import ConfigError, HookNotImplementedError
from carls_dask.runtime.context import LoopContext

__all__ = ["Trainer"]


class Trainer:
    """A PyTorch model trainer that runs as a long-lived Dask future.

    Subclass it and implement :meth:`setup` and :meth:`step`. The runtime calls, on a worker::

        setup(ctx)                       # once: build model, optimizer, data on ctx.device
        load_state(resume_from)          # when given: continue from a checkpoint
        for step in count(start_step):   # until max_steps or a stop
            metrics = step(step)         # one optimisation step; returns numbers to report
            every publish_every steps: ctx.channel.publish(publish_state())
            every eval_every steps: metrics += evaluate()
            every carls.run.metrics-every steps, and after evaluate(): report the metrics
            every carls.run.snapshot-every steps (in a run): save state() (and a bank snapshot)
        publish_state() once more        # so makers see the final model
        finish() -> the future's value; state() -> the checkpoint kept in the result
        teardown()                       # always, also after an exception

    The object is pickled to the worker before :meth:`setup`, so build heavy things (models,
    tensors, data) in :meth:`setup`, not in ``__init__``.

    Parameters
    ----------
    name
        Unique name of the loop in its Workbench; also the name of its model channel.
    max_steps
        Steps after which the loop ends by itself; ``None`` runs until stopped.
    publish_every
        Steps between published model versions; ``None`` takes ``carls.runtime.publish-every``.
    eval_every
        Steps between calls of :meth:`evaluate` (also called at the end); ``None`` never evaluates.
    keep_state
        Whether the result carries the :meth:`state` checkpoint at the end.
    resume_from
        A :meth:`state` checkpoint (e.g. ``LoopResult.state`` of an earlier run) loaded right after
        :meth:`setup`; the loop then continues from its step.

    Attributes
    ----------
    model
        The :class:`torch.nn.Module` being trained; set it in :meth:`setup`. The default
        :meth:`publish_state` and :meth:`state` use it.
    optimizer
        The torch optimizer, if any; its state goes into :meth:`state`.
    ctx
        The loop's :class:`~carls_dask.runtime.context.LoopContext`, set before :meth:`setup`.
    """

    kind = "trainer"

    def __init__(self, name: str = "trainer", *, max_steps: int | None = None, publish_every: int | None = None,
                 keep_state: bool = True, resume_from: Mapping[str, Any] | None = None,
                 eval_every: int | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"Trainer name: expected a non-empty string, got {name!r}")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 0):
            raise ConfigError(f"Trainer {name!r}: max_steps must be a non-negative int or None, got {max_steps!r}")
        if publish_every is not None and (not isinstance(publish_every, int) or publish_every < 1):
            raise ConfigError(f"Trainer {name!r}: publish_every must be a positive int or None, got {publish_every!r}")
        if eval_every is not None and (not isinstance(eval_every, int) or eval_every < 1):
            raise ConfigError(f"Trainer {name!r}: eval_every must be a positive int or None, got {eval_every!r}")
        self.name = name
        self.max_steps = max_steps
        self.publish_every = publish_every
        self.eval_every = eval_every
        self.keep_state = keep_state
        self.resume_from = resume_from
        self.start_step = 0
        self.model: Any = None
        self.optimizer: Any = None
        self.ctx: LoopContext | None = None

    # -- hooks -------------------------------------------------------------------------------
    def setup(self, ctx: LoopContext) -> None:
        """Build the model, optimizer and data on ``ctx.device``. Called once on the worker."""

    def step(self, step: int) -> Mapping[str, float] | None:
        """Run one training step and return the numbers to report (e.g. ``{"loss": ...}``)."""
        raise HookNotImplementedError(f"{type(self).__name__} must implement step()")

    def evaluate(self) -> Mapping[str, float] | None:
        """Measure the model (e.g. ``train_acc``, ``val_acc``, ``test_acc``); called every ``eval_every`` steps."""
        return None

    def publish_state(self) -> Mapping[str, Any]:
        """The state dict makers receive; by default ``self.model.state_dict()``."""
        if self.model is None:
            raise HookNotImplementedError(f"{type(self).__name__}: set self.model in setup() or override publish_state()")
        state: Mapping[str, Any] = self.model.state_dict()
        return state

    def state(self) -> dict[str, Any]:
        """A checkpoint: model and optimizer state dicts, the next step and torch's random state.

        Subclasses add what else their steps depend on (their own random generators, running
        figures), so a run continued from the checkpoint takes the same steps as one that was not
        interrupted.
        """
        import torch

        out: dict[str, Any] = {"step": self.start_step, "torch_rng": torch.get_rng_state()}
        if self.model is not None:
            out["model"] = self.model.state_dict()
        if self.optimizer is not None:
            out["optimizer"] = self.optimizer.state_dict()
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state` checkpoint; the loop calls it after :meth:`setup` with ``resume_from``."""
        if "model" in state and self.model is not None:
            self.model.load_state_dict(state["model"])
        if "optimizer" in state and self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if "torch_rng" in state:
            import torch

            torch.set_rng_state(state["torch_rng"])
        self.start_step = int(state.get("step", 0))

    def finish(self) -> Any:
        """Return the value of the loop's result (e.g. final accuracy); ``None`` by default."""
        return None

    def teardown(self) -> None:
        """Release what :meth:`setup` acquired. Always called, also after an exception."""
