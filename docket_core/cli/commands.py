"""The ``docket`` commands that inspect or steer a docket in a shared store:
``strike``, ``restore``, ``clear``, ``snapshot``, ``dead-letters``, ``workers``,
``watch`` and ``tasks``.  ``docket_core.cli`` parses the command line and
dispatches here."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from ..adapter import ProgressEvent, StateEvent, StoreEvent
from ..sansio.errors import UsageError
from ..sansio.strikes import Operator
from ..sansio.values import ExecutionState
from .parsing import parse_value, wildcard

if TYPE_CHECKING:
    from ..docket import Docket, WorkerInfo

T = TypeVar("T")


def with_docket(args: argparse.Namespace, body: Callable[[Docket], Awaitable[T]]) -> T:
    """Open the docket named by ``args``, run ``body`` on it, return its result."""
    import anyio

    from ..docket import Docket

    async def run() -> T:
        async with Docket(name=args.docket, url=args.url) as docket:
            return await body(docket)

    return anyio.run(run)


def _strike_arguments(args: argparse.Namespace) -> tuple[str | None, str | None, str, Any]:
    function = wildcard(args.function)
    parameter = wildcard(args.parameter)
    if function is None and parameter is None:
        raise UsageError("name a task, a parameter, or both ('*' stands for any)")
    if parameter is None:
        return function, None, args.operator, None
    if args.value is None:
        raise UsageError(f"a condition on {parameter!r} needs a value to compare with")
    try:
        if args.operator == Operator.BETWEEN.value:
            bounds = args.value.split(",")
            if len(bounds) != 2:
                raise ValueError(f"'between' needs two values, LOW,HIGH (got {args.value!r})")
            value: Any = (parse_value(bounds[0]), parse_value(bounds[1]))
        else:
            value = parse_value(args.value)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return function, parameter, args.operator, value


def _describe_strike(function: str | None, parameter: str | None, operator: str, value: Any) -> str:
    if parameter is None:
        return f"task {function}"
    condition = f"{parameter} {operator} {value!r}"
    return f"{function} calls with {condition}" if function else f"any task with {condition}"


def command_strike(args: argparse.Namespace, out: TextIO, *, restore: bool) -> int:
    function, parameter, operator, value = _strike_arguments(args)

    async def body(docket: Docket) -> None:
        if restore:
            await docket.restore(function, parameter, operator, value)
        else:
            await docket.strike(function, parameter, operator, value)

    with_docket(args, body)
    verb = "Restored" if restore else "Struck"
    print(f"{verb} {_describe_strike(function, parameter, operator, value)}", file=out)
    return 0


def command_clear(args: argparse.Namespace, out: TextIO) -> int:
    count = with_docket(args, lambda docket: docket.clear())
    print(f"Cleared {count} task{'s' if count != 1 else ''}", file=out)
    return 0


def _relative(moment: datetime, reference: datetime) -> str:
    seconds = (moment - reference).total_seconds()
    if abs(seconds) < 0.0005:
        return "now"
    text = _format_seconds(abs(seconds))
    return f"in {text}" if seconds > 0 else f"{text} ago"


def _format_seconds(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(header) for header in headers]
    for row in rows:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in [list(headers), ["-" * width for width in widths], *rows]
    ]
    return "\n".join(lines)


def _rows(executions: Sequence[Any], more: Callable[[Any], list[str]]) -> list[list[str]]:
    """Table rows of executions: key, function, attempt, then ``more(execution)``."""
    return [[str(e.key), str(e.function_name), str(e.attempt), *more(e)] for e in executions]


def command_snapshot(args: argparse.Namespace, out: TextIO) -> int:
    snapshot = with_docket(args, lambda docket: docket.snapshot(limit=args.limit))
    taken: datetime = snapshot.taken
    print(f"Docket {args.docket!r} at {args.url}, taken {taken.isoformat()}", file=out)
    print(
        f"{snapshot.total_tasks} task(s): {snapshot.running_total} running, "
        f"{snapshot.future_total} future; {len(snapshot.workers)} worker(s)",
        file=out,
    )
    if not snapshot.complete:
        shown = len(snapshot.running) + len(snapshot.future)
        print(f"showing {shown} of {snapshot.total_tasks} (--limit {args.limit})", file=out)
    if snapshot.malformed or snapshot.dead_letters:
        print(
            f"{len(snapshot.malformed)} malformed message(s) in the queue, "
            f"{snapshot.dead_letters} dead letter(s) ('docket dead-letters ls')",
            file=out,
        )
    print(file=out)
    running = sorted(snapshot.running, key=lambda e: e.started)
    print("Running", file=out)
    rows = _rows(running, lambda e: [str(e.worker), _relative(e.started, taken)])
    print(_table(["KEY", "FUNCTION", "ATTEMPT", "WORKER", "STARTED"], rows), file=out)
    print(file=out)
    print("Future", file=out)
    rows = _rows(
        sorted(snapshot.future, key=lambda e: e.when), lambda e: [_relative(e.when, taken)]
    )
    print(_table(["KEY", "FUNCTION", "ATTEMPT", "WHEN"], rows), file=out)
    return 0


def command_dead_letters(args: argparse.Namespace, out: TextIO) -> int:
    if args.dead_command == "ls":
        total, letters = with_docket(args, lambda docket: docket.dead_letters(args.limit))
        print(f"{total} dead letter(s)", file=out)
        rows = [
            [
                letter.entry_id,
                letter.key or "-",
                datetime.fromtimestamp(letter.dead_at, UTC).isoformat(),
                letter.reason,
            ]
            for letter in letters
        ]
        print(_table(["ID", "KEY", "DEAD SINCE", "REASON"], rows), file=out)
        return 0
    if not args.ids and not args.all:
        raise UsageError("name dead letter ids, or --all")
    if args.ids and args.all:
        raise UsageError("name dead letter ids or --all, not both")

    async def act(docket: Docket) -> int:
        ids: list[str] | None = None if args.all else list(args.ids)
        if args.dead_command == "drop":
            return await docket.drop_dead_letters(ids)
        return await docket.replay_dead_letters(ids)

    count = with_docket(args, act)
    verb = "Dropped" if args.dead_command == "drop" else "Replayed"
    print(f"{verb} {count} dead letter(s)", file=out)
    return 0


def _workers_table(workers: Sequence[WorkerInfo], out: TextIO) -> int:
    now = datetime.now().astimezone()
    rows = [
        [
            str(worker.name),
            _relative(worker.last_seen, now),
            ", ".join(sorted(worker.tasks)),
        ]
        for worker in sorted(workers, key=lambda w: w.name)
    ]
    print(_table(["NAME", "LAST SEEN", "TASKS"], rows), file=out)
    return 0


def command_workers_ls(args: argparse.Namespace, out: TextIO) -> int:
    return _workers_table(with_docket(args, lambda docket: docket.workers()), out)


def command_workers_for_task(args: argparse.Namespace, out: TextIO) -> int:
    workers = with_docket(args, lambda docket: docket.task_workers(args.task))
    return _workers_table(workers, out)


# -- watch and the built-in tasks ------------------------------------------------------------


def _describe_event(event: StoreEvent) -> str | None:
    if isinstance(event, ProgressEvent):
        if not event.current and not event.message:
            return None
        text = f"progress {event.current}/{event.total}"
        return f"{text} {event.message}" if event.message else text
    text = f"state {event.state.value}"
    if event.worker:
        text += f" on {event.worker}"
    if event.error:
        text += f": {event.error}"
    return text


def command_watch(args: argparse.Namespace, out: TextIO) -> int:
    """Follow one execution's state and progress until it ends."""
    import anyio

    poll = args.poll_interval.total_seconds()

    async def body(docket: Docket) -> ExecutionState:
        execution = await docket.get_execution(args.key)
        if execution is None:
            raise UsageError(f"docket {docket.name!r} has no execution {args.key!r}")
        shown: list[str] = []

        def show(event: StoreEvent) -> None:
            line = _describe_event(event)
            if line is not None and (not shown or shown[-1] != line):
                shown.append(line)
                stamp = datetime.now().astimezone().strftime("%H:%M:%S")
                print(f"{stamp} {args.key} {line}", file=out, flush=True)

        async with anyio.create_task_group() as group:

            async def follow() -> None:
                async for event in execution.events():
                    show(event)
                    if execution.state.terminal:
                        group.cancel_scope.cancel()

            async def check() -> None:
                # published events can be missed (a reconnection): look, too
                while True:
                    await anyio.sleep(poll)
                    await execution.sync()
                    if execution.state.terminal:
                        show(StateEvent(key=execution.key, state=execution.state))
                        group.cancel_scope.cancel()

            group.start_soon(follow)
            group.start_soon(check)
        return execution.state

    state = with_docket(args, body)
    return 1 if state is ExecutionState.FAILED else 0


def command_tasks(args: argparse.Namespace, out: TextIO) -> int:
    """Add one of the built-in tasks (``trace``, ``fail``, ``sleep``)."""
    when = datetime.now(UTC) + args.delay
    argument: Any = args.seconds if args.task == "sleep" else args.message

    async def body(docket: Docket) -> str:
        execution = await docket.add(args.task, when=when)(argument)
        return execution.key

    key = with_docket(args, body)
    print(f"Added {args.task} task {key!r}", file=out)
    return 0
