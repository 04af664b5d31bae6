"""The ``docket`` commands, on typer: pydocket's (``worker``, ``strike``,
``restore``, ``clear``, ``snapshot``, ``watch``, ``workers ls|for-task``,
``tasks trace|fail|sleep``, ``version``) with its options, environment
variables and defaults, and this docket's own (``dead-letters`` and
``dashboard``).

Exit statuses: 0 done; 1 the store or docket failed (unreachable, refused);
2 a usage error (a bad option or argument).  ``watch`` exits 0 whatever the
run's outcome, as pydocket's does, and says the outcome.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from ..sansio.strikes import Operator
from . import render
from .common import (
    DEFAULT_URL,
    DocketOption,
    UrlOption,
    duration_option,
    fail,
    note_memory,
    run_guarded,
    run_on_docket,
)
from .parsing import describe_strike, parse_strike_value, split_task_paths, wildcard
from .worker_command import DEFAULT_TASKS, worker

if TYPE_CHECKING:
    from ..docket import Docket
    from ..execution import Execution

__all__ = ["app"]

app = typer.Typer(
    help="docket: distributed background tasks for Python functions",
    add_completion=True,
    no_args_is_help=True,
    # a traceback must not print local variables: URLs can hold passwords
    pretty_exceptions_show_locals=False,
)
app.command(help="Start a worker to process tasks")(worker)


def output_console() -> Console:
    """A console on standard output; a pipe or file (no width of its own)
    gets wide lines, so keys are never cut."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 200
    return console


@app.command(help="Print the version of docket")
def version() -> None:
    from .. import __version__

    print(__version__)


# -- strikes and clear ---------------------------------------------------------------------


FunctionArgument = Annotated[
    str, typer.Argument(help="The task to strike or restore ('*' or '' for any task)")
]
ParameterArgument = Annotated[
    str, typer.Argument(help="The parameter to compare ('*' or '' for none: the whole task)")
]
OperatorArgument = Annotated[Operator, typer.Argument(help="How to compare the argument")]
ValueArgument = Annotated[
    str | None,
    typer.Argument(
        help=(
            "The value to compare with, typed as TYPE:TEXT (int:42, float:1.5, bool:true, "
            "str:x, datetime.timedelta:30; untyped: a string); for 'between', LOW,HIGH"
        ),
    ),
]


def _strike_or_restore(
    *,
    restore: bool,
    function: str,
    parameter: str,
    operator: Operator,
    value: str | None,
    docket_name: str,
    url: str,
) -> None:
    task, argument = wildcard(function), wildcard(parameter)
    if task is None and argument is None:
        raise typer.BadParameter("Must provide either a function and/or a parameter")
    try:
        compared = parse_strike_value(operator, value) if argument is not None else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="VALUE") from None
    verb = "Restoring" if restore else "Striking"
    print(f"{verb} {describe_strike(task, argument, operator, compared)}")

    async def body(docket: Docket) -> None:
        act = docket.restore if restore else docket.strike
        await act(task, argument, operator, compared)

    run_on_docket(url, docket_name, body)


@app.command(help="Strike a task, or its calls whose argument matches, from the docket")
def strike(
    function: FunctionArgument = "*",
    parameter: ParameterArgument = "*",
    operator: OperatorArgument = Operator.EQUAL,
    value: ValueArgument = None,
    docket_: DocketOption = "docket",
    url: UrlOption = DEFAULT_URL,
) -> None:
    _strike_or_restore(
        restore=False,
        function=function,
        parameter=parameter,
        operator=operator,
        value=value,
        docket_name=docket_,
        url=url,
    )


@app.command(help="Restore a task, or calls, struck with the same arguments")
def restore(
    function: FunctionArgument = "*",
    parameter: ParameterArgument = "*",
    operator: OperatorArgument = Operator.EQUAL,
    value: ValueArgument = None,
    docket_: DocketOption = "docket",
    url: UrlOption = DEFAULT_URL,
) -> None:
    _strike_or_restore(
        restore=True,
        function=function,
        parameter=parameter,
        operator=operator,
        value=value,
        docket_name=docket_,
        url=url,
    )


@app.command(help="Clear every scheduled and queued task from the docket")
def clear(docket_: DocketOption = "docket", url: UrlOption = DEFAULT_URL) -> None:
    count = run_on_docket(url, docket_, lambda docket: docket.clear())
    print(f"Cleared {count} tasks from docket '{docket_}'")


# -- snapshot, watch --------------------------------------------------------------------------


@app.command(help="Show what is on the docket right now: running and future tasks, with totals")
def snapshot(
    tasks: Annotated[
        list[str],
        typer.Option(
            "--tasks",
            help="A task collection to register (module:attribute); repeatable",
            envvar="DOCKET_TASKS",
        ),
    ] = DEFAULT_TASKS,
    docket_: DocketOption = "docket",
    url: UrlOption = DEFAULT_URL,
    stats: Annotated[
        bool, typer.Option("--stats", help="Also count the tasks by function")
    ] = False,
    limit: Annotated[
        int,
        typer.Option(help="List at most this many running and future tasks each", min=1),
    ] = 1000,
) -> None:
    async def body(docket: Docket) -> Any:
        for path in split_task_paths(tasks):
            docket.register_collection(path)
        return await docket.snapshot(limit=limit)

    taken = run_on_docket(url, docket_, body)
    console = output_console()
    console.print(render.snapshot_table(taken, docket_))
    for line in render.snapshot_notes(taken, limit):
        console.print(line, markup=False, highlight=False)
    if stats:
        console.print()
        console.print(render.task_stats_table(taken))


@app.command(help="Follow a task's state and progress, live, until it ends")
def watch(
    key: Annotated[str, typer.Argument(help="The key of the task to follow")],
    url: Annotated[
        str,
        typer.Option(
            "--url",
            "-u",
            help="The store holding the docket",
            envvar=["DOCKET_REDIS_URL", "DOCKET_URL"],
        ),
    ] = DEFAULT_URL,
    docket_name: Annotated[
        str, typer.Option("--docket", "-d", help="The name of the docket", envvar="DOCKET_NAME")
    ] = "docket",
    poll_interval: Annotated[
        timedelta,
        typer.Option(
            parser=duration_option,
            help="How often to read the task again, besides its live events",
            show_default="1s",
        ),
    ] = timedelta(seconds=1),
) -> None:
    from .watch import watch_execution

    console = output_console()
    run_on_docket(
        url, docket_name, lambda docket: watch_execution(docket, key, console, poll_interval)
    )


# -- the built-in tasks ----------------------------------------------------------------------

tasks_app = typer.Typer(help="Add one of docket's built-in tasks", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")

DelayOption = Annotated[
    timedelta,
    typer.Option(
        parser=duration_option, help="How long from now the task is due", show_default="0s"
    ),
]


def _add_builtin(
    url: str, docket_name: str, function: Callable[..., Awaitable[None]], delay: timedelta
) -> Callable[..., None]:
    def add(*args: Any) -> None:
        async def body(docket: Docket) -> Execution:
            return await docket.add(function, when=datetime.now(UTC) + delay)(*args)

        execution = run_on_docket(url, docket_name, body)
        name = function.__name__
        print(f"Added {name} task {execution.key!r} to the docket {docket_name!r}")

    return add


@tasks_app.command(help="Add a task that logs MESSAGE")
def trace(
    docket_: DocketOption = "docket",
    url: UrlOption = DEFAULT_URL,
    message: Annotated[str, typer.Argument(help="The message to log")] = "Howdy!",
    delay: DelayOption = timedelta(0),
) -> None:
    from .. import tasks

    _add_builtin(url, docket_, tasks.trace, delay)(message)


def fail_(
    docket_: DocketOption = "docket",
    url: UrlOption = DEFAULT_URL,
    message: Annotated[str, typer.Argument(help="The error's message")] = "Howdy!",
    delay: DelayOption = timedelta(0),
) -> None:
    from .. import tasks

    _add_builtin(url, docket_, tasks.fail, delay)(message)


tasks_app.command(name="fail", help="Add a task that fails with MESSAGE (tried twice)")(fail_)


@tasks_app.command(help="Add a task that sleeps SECONDS")
def sleep(
    docket_: DocketOption = "docket",
    url: UrlOption = DEFAULT_URL,
    seconds: Annotated[float, typer.Argument(help="How long to sleep")] = 1,
    delay: DelayOption = timedelta(0),
) -> None:
    from .. import tasks

    _add_builtin(url, docket_, tasks.sleep, delay)(seconds)


# -- workers -------------------------------------------------------------------------------

workers_app = typer.Typer(help="Look at the docket's live workers", no_args_is_help=True)
app.add_typer(workers_app, name="workers")


@workers_app.command(name="ls", help="List the live workers")
def workers_ls(docket_: DocketOption = "docket", url: UrlOption = DEFAULT_URL) -> None:
    workers = run_on_docket(url, docket_, lambda docket: docket.workers())
    output_console().print(render.workers_table(docket_, workers))


@workers_app.command(name="for-task", help="List the live workers that can run TASK")
def workers_for_task(
    task: Annotated[str, typer.Argument(help="The task's name")],
    docket_: DocketOption = "docket",
    url: UrlOption = DEFAULT_URL,
) -> None:
    workers = run_on_docket(url, docket_, lambda docket: docket.task_workers(task))
    output_console().print(render.workers_table(docket_, workers, highlight_task=task))


# -- dead letters ----------------------------------------------------------------------------

dead_letters_app = typer.Typer(
    help="List, replay or drop the malformed messages set aside", no_args_is_help=True
)
app.add_typer(dead_letters_app, name="dead-letters")

IdsArgument = Annotated[
    list[str] | None, typer.Argument(help="Dead letter ids (from 'dead-letters ls')")
]
AllOption = Annotated[bool, typer.Option("--all", help="Every dead letter")]


@dead_letters_app.command(name="ls", help="List the newest dead letters, with their reasons")
def dead_letters_ls(
    docket_: DocketOption = "docket",
    url: UrlOption = DEFAULT_URL,
    limit: Annotated[int, typer.Option(help="List at most this many", min=1)] = 100,
) -> None:
    total, letters = run_on_docket(url, docket_, lambda docket: docket.dead_letters(limit))
    output_console().print(render.dead_letters_table(total, letters))


def _dead_letters_act(
    ids: list[str] | None, every: bool, url: str, docket_name: str, drop: bool
) -> None:
    if not ids and not every:
        raise typer.BadParameter("name dead letter ids, or --all")
    if ids and every:
        raise typer.BadParameter("name dead letter ids or --all, not both")
    chosen = None if every else list(ids or ())

    async def body(docket: Docket) -> int:
        if drop:
            return await docket.drop_dead_letters(chosen)
        return await docket.replay_dead_letters(chosen)

    count = run_on_docket(url, docket_name, body)
    print(f"{'Dropped' if drop else 'Replayed'} {count} dead letter(s)")


@dead_letters_app.command(name="replay", help="Put dead letters back in the queue, as they were")
def dead_letters_replay(
    ids: IdsArgument = None,
    every: AllOption = False,
    docket_: DocketOption = "docket",
    url: UrlOption = DEFAULT_URL,
) -> None:
    _dead_letters_act(ids, every, url, docket_, drop=False)


@dead_letters_app.command(name="drop", help="Remove dead letters for good")
def dead_letters_drop(
    ids: IdsArgument = None,
    every: AllOption = False,
    docket_: DocketOption = "docket",
    url: UrlOption = DEFAULT_URL,
) -> None:
    _dead_letters_act(ids, every, url, docket_, drop=True)


# -- dashboard -------------------------------------------------------------------------------


@app.command(help="Serve a read-only web page showing the docket, updated live")
def dashboard(
    docket_: DocketOption = "docket",
    url: UrlOption = DEFAULT_URL,
    host: Annotated[
        str, typer.Option(help="The address to listen on", envvar="DOCKET_DASHBOARD_HOST")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="The port to listen on", envvar="DOCKET_DASHBOARD_PORT")
    ] = 8080,
) -> None:
    try:
        from ..dashboard import serve_dashboard
    except ImportError as error:
        fail(f"the dashboard is not available ({error})", 1)
    note_memory(url)
    try:
        run_guarded(lambda: serve_dashboard(url=url, name=docket_, host=host, port=port))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
