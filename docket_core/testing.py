"""Assertions for tests of code that schedules docket tasks.

Each helper looks at ``(await docket.snapshot()).future``: the executions that
are scheduled for later or queued and waiting for a worker (not those running).
On failure the ``AssertionError`` names the task and lists what is
scheduled, in pydocket's words (``Task send not found with ...``, ``Task send
found but should not be scheduled``, ``Expected 2 tasks for send, found 1``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .docket import Docket
    from .execution import Execution

__all__ = [
    "assert_no_tasks",
    "assert_task_count",
    "assert_task_not_scheduled",
    "assert_task_scheduled",
]

TaskRef = Callable[..., Any] | str


def _name(function: TaskRef) -> str:
    if isinstance(function, str):
        return function
    return str(getattr(function, "__name__", function))


def _matches(
    execution: Execution,
    name: str,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    key: str | None,
) -> bool:
    if execution.function_name != name:
        return False
    if key is not None and execution.key != key:
        return False
    if args is not None and tuple(execution.args) != tuple(args):
        return False
    if kwargs is not None:
        for parameter, value in kwargs.items():
            if parameter not in execution.kwargs or execution.kwargs[parameter] != value:
                return False
    return True


def _criteria(name: str, args: Any, kwargs: Any, key: str | None) -> str:
    parts = [f"function={name}"]
    if key is not None:
        parts.append(f"key={key!r}")
    if args is not None:
        parts.append(f"args={tuple(args)!r}")
    if kwargs is not None:
        parts.append(f"kwargs={dict(kwargs)!r}")
    return ", ".join(parts)


def _call(execution: Execution) -> str:
    return (
        f"{execution.function_name}(args={execution.args!r}, "
        f"kwargs={execution.kwargs!r}, key={execution.key!r})"
    )


def _listing(future: Sequence[Execution]) -> str:
    return "\n".join(f"  - {_call(execution)}" for execution in future)


async def _future(docket: Docket) -> list[Execution]:
    return list((await docket.snapshot()).future)


async def assert_task_scheduled(
    docket: Docket,
    function: TaskRef,
    *,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    key: str | None = None,
) -> None:
    """Assert that a matching call is scheduled or queued.

    ``args`` must equal the call's positional arguments; ``kwargs`` must be a
    subset of its keyword arguments."""
    name = _name(function)
    future = await _future(docket)
    if any(_matches(e, name, args, kwargs, key) for e in future):
        return
    if not future:
        raise AssertionError(f"Task {name} not found: no tasks scheduled on docket")
    raise AssertionError(
        f"Task {name} not found with {_criteria(name, args, kwargs, key)}\n\n"
        f"Scheduled tasks:\n{_listing(future)}"
    )


async def assert_task_not_scheduled(
    docket: Docket,
    function: TaskRef,
    *,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    key: str | None = None,
) -> None:
    """Assert that no matching call is scheduled or queued."""
    name = _name(function)
    future = await _future(docket)
    for execution in future:
        if _matches(execution, name, args, kwargs, key):
            raise AssertionError(
                f"Task {name} found but should not be scheduled\nFound: {_call(execution)}"
                f"\n\nScheduled tasks:\n{_listing(future)}"
            )


async def assert_task_count(docket: Docket, function: TaskRef | None = None, *, count: int) -> None:
    """Assert how many calls (of ``function``, or of any task) are scheduled or queued."""
    future = await _future(docket)
    if function is None:
        actual = len(future)
        what = "all tasks"
    else:
        name = _name(function)
        actual = sum(1 for e in future if e.function_name == name)
        what = f"tasks for {name}"
    if actual != count:
        scheduled = f"\n\nScheduled tasks:\n{_listing(future)}" if future else ""
        raise AssertionError(f"Expected {count} {what}, found {actual}{scheduled}")


async def assert_no_tasks(docket: Docket) -> None:
    """Assert that nothing is scheduled or queued."""
    future = await _future(docket)
    if future:
        raise AssertionError(
            f"Expected no tasks, found {len(future)} task(s) scheduled:\n{_listing(future)}"
        )
