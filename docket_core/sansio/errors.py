"""Errors, split by blame.

``UsageError``: the caller did something docket cannot do (an unknown task
name, an argument that cannot be pickled, a limit on a missing argument).
``StoreError``: the store failed or answered nonsense (an unexpected reply,
a refused script); its subclass ``StoreUnavailable``: the store cannot be
reached right now (connection lost), worth retrying.  ``InvalidTransition``:
an input arrived that the state machine's table has no row for, which is a bug
in docket itself.
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
