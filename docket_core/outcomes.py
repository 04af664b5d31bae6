"""What a run's end or block means to the extension points (``extensions``):
``TaskOutcome``, ``AdmissionBlocked`` and the follow-up a block leads to;
when a ``ForcedRetry`` asks to run again, and the error of a run whose
dependencies did not resolve.
A leaf module, so that the resolution of dependencies can use them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from .sansio.errors import ForcedRetry
from .sansio.inputs import BlockedAction, FollowUp

_F = TypeVar("_F", bound=Callable[..., Any])

#: the wait before a blocked run is tried again, unless it says (as pydocket)
ADMISSION_BLOCKED_RETRY_DELAY = timedelta(milliseconds=100)


def carried_out_by_the_core(method: _F) -> _F:
    """Mark a built-in handler method the core carries out: the worker does
    not call it (a subclass that overrides it is called)."""
    method._by_core = True  # type: ignore[attr-defined]
    return method


def overridden(value: object, name: str) -> bool:
    """Whether ``value``'s method ``name`` is a user's, not one the core carries out."""
    method = getattr(type(value), name, None)
    return method is not None and not getattr(method, "_by_core", False)


@dataclass
class TaskOutcome:
    """How a run went, for the handlers: its duration, and its result or
    exception."""

    duration: timedelta
    result: Any = field(default=None)
    exception: BaseException | None = field(default=None)


class AdmissionBlocked(Exception):
    """A run may not start now: raised by a dependency as it resolves (or by
    the task itself).  ``reschedule`` (the default) runs it again after
    ``retry_delay`` (``ADMISSION_BLOCKED_RETRY_DELAY``), the same attempt;
    otherwise it is dropped (recorded cancelled).  ``handled``: the gate
    settled it itself; it is recorded failed unless the gate superseded the
    key (a ``replace``)."""

    def __init__(
        self,
        execution: Any,
        reason: str = "admission control",
        *,
        handled: bool = False,
        reschedule: bool = True,
        retry_delay: timedelta | None = None,
    ) -> None:
        self.execution = execution
        self.reason = reason
        self.handled = handled
        self.reschedule = reschedule
        self.retry_delay = retry_delay
        super().__init__(f"Task {getattr(execution, 'key', execution)} blocked by {reason}")


def blocked_follow_up(error: BaseException | None, now: float) -> FollowUp | None:
    """What follows a run that ``error`` stopped, when it is an ``AdmissionBlocked``."""
    if not isinstance(error, AdmissionBlocked):
        return None
    if error.handled:
        return FollowUp(blocked=BlockedAction.HANDLED)
    if not error.reschedule:
        return FollowUp(blocked=BlockedAction.DROP)
    delay = error.retry_delay if error.retry_delay is not None else ADMISSION_BLOCKED_RETRY_DELAY
    return FollowUp(blocked=BlockedAction.RESCHEDULE, blocked_until=now + delay.total_seconds())


def blocked_line(key: str, follow_up: FollowUp) -> str:
    """The DEBUG line of a run an ``AdmissionBlocked`` stopped (pydocket's words)."""
    if follow_up.blocked is BlockedAction.RESCHEDULE:
        return f"⏳ Task {key} blocked by admission control, rescheduling"
    if follow_up.blocked is BlockedAction.DROP:
        return f"⏭ Task {key} blocked by admission control, dropping"
    return f"Task {key} blocked by admission control, handled by its gate"


def forced_retry_at(error: BaseException, now: float) -> float | None:
    """When ``error`` is a ``ForcedRetry``, the time it asks to retry at."""
    if not isinstance(error, ForcedRetry):
        return None
    return error.when if error.when is not None else now + error.delay


#: how the error a task fails with when dependencies did not resolve begins
DEPENDENCY_FAILURES = "Failed to resolve dependencies for parameter(s): "


def dependency_failures(failures: Mapping[str, Exception]) -> ExceptionGroup[Exception]:
    """The error of a run whose dependencies (by parameter) failed to resolve,
    as pydocket raises it: one ``ExceptionGroup`` holding every cause."""
    return ExceptionGroup(DEPENDENCY_FAILURES + ", ".join(failures), list(failures.values()))
