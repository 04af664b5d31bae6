"""The producer's shell around ``decisions.plan_add``, shared by ``Docket``
and ``Batch``.

An ``add``/``replace`` call becomes an ``Execution`` (the caller's handle) and
a ``PendingCall`` (the core's value: its arguments pickled, and bound by
parameter name only if a strike asks for them).  ``plan_add`` decides whether
it is stored or struck; ``struck`` and ``settle`` tell the execution which.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import instrumentation
from ._resolution import bind_arguments
from .execution import Execution, to_datetime, to_timestamp
from .instrumentation import TASKS_ADDED, TASKS_REPLACED, TASKS_SCHEDULED
from .sansio.decisions import PendingCall
from .sansio.errors import StoreError
from .sansio.inputs import Outcome, Scheduled
from .sansio.values import Disposition, ExecutionState, ScheduleMode
from .serialization import dumps_call

if TYPE_CHECKING:
    from .docket import Docket

TaskFunction = Callable[..., Any]


def resolve_task(docket: Docket, function: TaskFunction | str) -> tuple[TaskFunction, str]:
    """The task function and its name; a function not registered yet is
    registered (under its ``__name__``), an unknown name is a ``KeyError``
    (as in pydocket)."""
    if isinstance(function, str):
        try:
            return docket.tasks[function], function
        except KeyError:
            raise unregistered(function) from None
    name = function.__name__
    if docket.tasks.get(name) is not function:
        docket.register(function)
    return function, name


def unregistered(name: str) -> KeyError:
    """pydocket's error for a task name the docket does not know."""
    return KeyError(f"Task '{name}' is not registered")


class LazyArguments(Mapping[str, Any]):
    """A call's arguments by parameter name (``bind_arguments``), bound on
    first read: the core reads them only when a strike names a parameter, a
    worker when a per-call dependency (a keyed limit, say) or a strike does."""

    __slots__ = ("_args", "_bound", "_function", "_kwargs")

    def __init__(
        self, function: TaskFunction, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        self._function = function
        self._args = args
        self._kwargs = kwargs
        self._bound: dict[str, Any] | None = None

    def _arguments(self) -> dict[str, Any]:
        if self._bound is None:
            self._bound = bind_arguments(self._function, self._args, self._kwargs)
        return self._bound

    def __getitem__(self, name: str) -> Any:
        return self._arguments()[name]

    def __contains__(self, name: object) -> bool:
        return name in self._arguments()

    def __iter__(self) -> Iterator[str]:
        return iter(self._arguments())

    def __len__(self) -> int:
        return len(self._arguments())


def pending_call(
    docket: Docket,
    task: TaskFunction,
    name: str,
    *,
    when: datetime | None,
    key: str | None,
    mode: ScheduleMode,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    headers: dict[str, str] | None,
    now: float,
) -> tuple[Execution, PendingCall]:
    """The execution of a call and the value ``plan_add`` decides on.  The
    arguments are pickled here, so an unpicklable one fails at once."""
    at = now if when is None else to_timestamp(when)
    key = key or uuid7()
    execution = Execution(docket, task, args, kwargs, key, to_datetime(at), function_name=name)
    if instrumentation.metering():
        counter = TASKS_ADDED if mode is ScheduleMode.ADD else TASKS_REPLACED
        counter.add(1, {"docket.name": docket.name, "docket.task": name})
    call = PendingCall(
        function=name,
        key=key,
        when=at,
        mode=mode,
        payload=dumps_call(name, args, kwargs, headers, docket.signing),
        arguments=LazyArguments(task, args, kwargs),
    )
    return execution, call


def struck(execution: Execution) -> Execution:
    """Tell ``execution`` a strike matched it: nothing was stored."""
    execution.disposition = Disposition.STRUCK
    execution.state = ExecutionState.CANCELLED
    return execution


def settle(execution: Execution, outcome: Outcome) -> None:
    """Tell ``execution`` what the store did with it."""
    if not isinstance(outcome, Scheduled):
        raise StoreError(f"the store answered {outcome!r} to a schedule")
    if outcome.accepted:
        execution.disposition = Disposition.SCHEDULED
        execution._generation = outcome.generation
        if instrumentation.metering():
            labels = {"docket.name": execution.docket.name, "docket.task": execution.function_name}
            TASKS_SCHEDULED.add(1, labels)
    else:
        execution.disposition = Disposition.ALREADY_SCHEDULED
    if outcome.state is not None:
        execution.state = outcome.state


def uuid7() -> str:
    """A time-ordered UUID (version 7, RFC 9562): keys sort by creation time."""
    milliseconds = time.time_ns() // 1_000_000
    value = (milliseconds & (2**48 - 1)) << 80 | int.from_bytes(os.urandom(10)) & (2**80 - 1)
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    digits = f"{value:032x}"  # (str(uuid.UUID(int=value)), without the object)
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
