"""A run's side of the bank's durability: the policies its tables get, and the consistent cut after a loss.

A table's durability (:attr:`TableSpec.durability <carls_dask.bank.schema.TableSpec.durability>`) says what an
acknowledged write survives. A run gives the tables whose spec names none a policy by what writes them
(:func:`run_tables`): ``carls.run.durability.trained`` (``snapshot``) for a table with an optimizer, trained
by the trainer's gradients, which a trainer resumed from its checkpoint redoes anyway;
``carls.run.durability.written`` (``every-write``) for one without, written by makers, whose knowledge
costs a model pass to make again.

A table kept by snapshots alone comes back at its newest snapshot when its shard is lost, so its trainer
must come back to the same step: one consistent cut of the bank's snapshot-kept tables and the primary
trainer's state. :func:`newest_cut` finds it in the run folder (the newest snapshot whose step the primary
trainer saved a state at; a trainer saves its state before the bank snapshot of the same step, so the
newest snapshot normally is one), :func:`drop_states_after` removes saved states past it, and the
Workbench rolls the bank back (:meth:`KnowledgeBank.rollback <carls_dask.bank.client.KnowledgeBank.rollback>`)
and runs the trainer again from that state.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from carls_dask import config
from carls_dask.bank.schema import check_durability
from carls_dask.errors import RolledBackError

__all__ = ["cause_of", "cut_line", "drop_states_after", "newest_cut", "rolled_back", "run_tables", "snapshot_kept"]

logger = logging.getLogger(__name__)

E = TypeVar("E", bound=BaseException)


def run_tables(tables: Iterable[Any]) -> list[Any]:
    """``tables`` with the run's durability defaults where a spec names no policy (see the module notes).

    Raises
    ------
    ConfigError
        If ``carls.run.durability.trained`` or ``.written`` is not a policy.
    """
    trained = check_durability(config.get("run.durability.trained"), "carls.run.durability.trained")
    written = check_durability(config.get("run.durability.written"), "carls.run.durability.written")
    return [t if t.durability is not None else dataclasses.replace(t, durability=trained if t.trained else written)
            for t in tables]


def snapshot_kept(tables: Iterable[Any]) -> list[str]:
    """Names of the tables (specs or their JSON) kept by snapshots alone."""
    out = []
    for t in tables:
        name, policy = (t.get("name"), t.get("durability")) if isinstance(t, dict) else (t.name, t.durability)
        if policy == "snapshot":
            out.append(str(name))
    return out


def newest_cut(bank_root: str, state_steps: Iterable[int]) -> tuple[int | None, int]:
    """``(version, step)`` of the newest snapshot of ``bank_root`` at a step the primary trainer saved a state at.

    ``state_steps`` are the steps of the primary trainer's saved states. A snapshot at step 0 needs no
    state (the trainer starts afresh there). ``(None, 0)`` when there is none: the tables come back empty
    and the trainer starts afresh.
    """
    from carls_dask.storage.manifest import list_snapshots

    states = {int(s) for s in state_steps}
    snaps = sorted(list_snapshots(bank_root), key=lambda e: (int(e["step"]), int(e["version"])))
    for e in reversed(snaps):
        if int(e["step"]) == 0 or int(e["step"]) in states:
            return int(e["version"]), int(e["step"])
    return None, 0


def drop_states_after(checkpointer: Any, trainer: str, step: int) -> list[int]:
    """Remove ``trainer``'s saved states past ``step`` (they belong to the steps a cut undoes); returns their steps."""
    dropped = []
    for s, path in checkpointer.states(trainer):
        if s > step:
            path.unlink(missing_ok=True)
            dropped.append(s)
    return dropped


def cause_of(exc: BaseException | None, kind: type[E]) -> E | None:
    """``exc`` or the first exception it was raised from (``__cause__``, else ``__context__``) that is a ``kind``."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def rolled_back(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a :class:`RolledBackError`."""
    return cause_of(exc, RolledBackError) is not None


def cut_line(loops: Sequence[str], version: int | None, step: int, tables: Sequence[str], seconds: float,
             lost: str) -> str:
    """One line for a consistent cut: what was lost, what took over, how long it took."""
    source = f"snapshot v{version} (step {step})" if version is not None else "an empty bank (no snapshot yet)"
    return (f"{lost}: tables {list(tables)} rolled back to {source} and {', '.join(loops)} run again from "
            f"step {step}, in {seconds:.2f}s")
