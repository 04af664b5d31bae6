"""The custom-dependency extension points of pydocket 0.27: ``Runtime``,
``FailureHandler``, ``CompletionHandler``, ``TaskOutcome`` and
``AdmissionBlocked``, driven through the core.

A task (or its worker, through ``Worker(dependencies=...)``) declares at most
one of each handler; its injected value is consulted around the run:

- a ``Runtime``'s ``run(execution, function, args, kwargs)`` is awaited
  instead of the task function;
- after a failure, a ``FailureHandler``'s ``handle_failure`` may take it on
  (``True``): the core then neither retries nor perpetuates the run, and
  records it failed unless the handler superseded the key meanwhile;
- after a success, or a failure the core will not retry, a
  ``CompletionHandler``'s ``on_complete`` runs (``True``: it did its own
  logging).  ``Perpetual`` is one: its ``on_complete`` lets the core
  schedule the next run; a subclass that overrides it without calling it
  ends the chain;
- ``AdmissionBlocked``, raised by a dependency as it resolves (or by the
  task), stops the run before its work: rescheduled (the same attempt),
  dropped (cancelled), or left to the gate that handled it.

The built-in ``Retry``, ``Perpetual`` and ``Timeout`` are such handlers too
(so the same ``single`` rules apply), but the core carries them out: their
own methods are never called by the worker.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from ._resolution import Dependency
from .outcomes import ADMISSION_BLOCKED_RETRY_DELAY, AdmissionBlocked, TaskOutcome


class Runtime(Dependency):
    """Controls how the task function is called: its ``run`` is awaited
    instead (one per task)."""

    single: ClassVar[bool] = True
    _role: ClassVar[str | None] = "runtime"

    @abc.abstractmethod
    async def run(
        self,
        execution: Any,
        function: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Call ``function(*args, **kwargs)`` your way and return its result."""


class FailureHandler(Dependency):
    """Decides what a failure leads to: ``handle_failure`` returns ``True``
    when it took the failure on (one per task)."""

    single: ClassVar[bool] = True
    _role: ClassVar[str | None] = "failure"

    @abc.abstractmethod
    async def handle_failure(self, execution: Any, outcome: TaskOutcome) -> bool:
        """Handle a failed run; ``True``: no retry, no next run, from the core."""


class CompletionHandler(Dependency):
    """Runs once a run is truly over (succeeded, or failed with no retry
    left): ``on_complete`` returns ``True`` when it did its own logging (one
    per task)."""

    single: ClassVar[bool] = True
    _role: ClassVar[str | None] = "completion"

    @abc.abstractmethod
    async def on_complete(self, execution: Any, outcome: TaskOutcome) -> bool:
        """Handle the end of a run."""


__all__ = [
    "ADMISSION_BLOCKED_RETRY_DELAY",
    "AdmissionBlocked",
    "CompletionHandler",
    "FailureHandler",
    "Runtime",
    "TaskOutcome",
]
