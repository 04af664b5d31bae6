"""Errors, split by blame.

``UsageError``: the caller did something docket cannot do (an unknown task
name, an argument that cannot be pickled, a limit on a missing argument).
``StoreError``: the store failed or answered nonsense (an unexpected reply,
a refused script); its subclass ``StoreUnavailable``: the store cannot be
reached right now (connection lost), worth retrying.  ``InvalidTransition``:
an input arrived that the state machine's table has no row for, which is a bug
in docket itself; so is ``InternalError``, which a machine that met such a bug
raises for every later input (as h11 does).  ``ExecutionCancelled`` and ``ForcedRetry`` are outcomes
rather than faults (as in pydocket, plain ``Exception`` subclasses to a task's
``except Exception``): ``get_result`` of a cancelled execution, and a task
asking to be run again.
"""

from __future__ import annotations


class DocketError(Exception):
    """Base of docket's own errors."""


class UsageError(DocketError, ValueError):
    """The caller's fault: fix the call."""


class StoreError(DocketError):
    """The store's fault: it failed or answered something unexpected."""


class StoreUnavailable(StoreError):
    """The store cannot be reached right now (connection lost, timed out);
    the same request may succeed once it is back."""


class InvalidTransition(DocketError):
    """An input the lifecycle table does not allow in the current phase."""

    def __init__(self, phase: object, event: object) -> None:
        super().__init__(f"can't handle {event} in phase {phase}")
        self.phase = phase
        self.event = event


class InternalError(DocketError):
    """Docket's own bug, not the caller's: its state machine met a state it
    cannot be in (an input for a delivery it does not hold), or was used
    after it had failed so (a failed machine refuses further input)."""


class ExecutionCancelled(DocketError):
    """``get_result`` of an execution that was cancelled."""


class ForcedRetry(DocketError):
    """Raised by ``retry.after``/``in_``/``at``: run the task again (attempts
    permitting) ``delay`` seconds after this attempt ends, or at ``when``.

    The worker catches it before any other failure, so a task that lets it
    propagate is retried at the time it asked for; a task that catches it
    (``except Exception``) cancels its own request."""

    def __init__(self, delay: float = 0.0, when: float | None = None) -> None:
        super().__init__(
            f"retry requested at {when}" if when is not None else f"retry requested in {delay}s"
        )
        #: seconds from the end of the attempt
        self.delay = delay
        #: or an absolute time (epoch seconds)
        self.when = when

    def __reduce__(self) -> tuple[type[ForcedRetry], tuple[float, float | None]]:
        return (type(self), (self.delay, self.when))
