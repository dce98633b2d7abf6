"""Lifecycle states of loops and of the Workbench, as a small pure state machine."""

from __future__ import annotations

import enum
import threading

from carls_dask.errors import LifecycleError

__all__ = ["Lifecycle", "State"]


class State(enum.StrEnum):
    """Where a loop or a Workbench is in its life.

    ``created -> running -> stopping -> closed``; ``failed`` can be reached from any state except
    ``closed`` and is final except that a failed Workbench may still be closed.
    """

    CREATED = "created"
    RUNNING = "running"
    STOPPING = "stopping"
    CLOSED = "closed"
    FAILED = "failed"


_ALLOWED: dict[State, frozenset[State]] = {
    State.CREATED: frozenset({State.RUNNING, State.CLOSED, State.FAILED}),
    State.RUNNING: frozenset({State.STOPPING, State.CLOSED, State.FAILED}),
    State.STOPPING: frozenset({State.CLOSED, State.FAILED}),
    State.FAILED: frozenset({State.CLOSED}),
    State.CLOSED: frozenset(),
}


class Lifecycle:
    """A thread-safe holder of one :class:`State` that only allows the documented transitions.

    Parameters
    ----------
    what
        Name of the object whose life this is; used in error messages.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._state = State.CREATED
        self._lock = threading.Lock()

    @property
    def state(self) -> State:
        """The current state."""
        return self._state

    def to(self, new: State) -> State:
        """Move to ``new`` and return the previous state.

        Raises
        ------
        LifecycleError
            If the transition is not allowed; the state is left unchanged.
        """
        with self._lock:
            old = self._state
            if new is old:
                return old
            if new not in _ALLOWED[old]:
                allowed = ", ".join(sorted(s.value for s in _ALLOWED[old])) or "none"
                raise LifecycleError(f"{self.what}: cannot go from {old.value!r} to {new.value!r} (allowed: {allowed})")
            self._state = new
            return old

    def require(self, *states: State, action: str) -> None:
        """Raise :class:`LifecycleError` unless the current state is one of ``states``."""
        if self._state not in states:
            wanted = " or ".join(repr(s.value) for s in states)
            raise LifecycleError(f"{self.what}: cannot {action} while {self._state.value!r}; it must be {wanted}")

    def __repr__(self) -> str:
        return f"Lifecycle({self.what!r}, {self._state.value!r})"
