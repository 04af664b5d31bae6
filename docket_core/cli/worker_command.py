"""``docket worker``: run one worker with pydocket's options, environment
variables and defaults, through ``Worker.run``.

Options that pydocket's worker has and this docket's ``Worker`` does not
take (yet) are accepted; left at their defaults they change nothing, and a
value asked for that the worker cannot honour is a usage error rather than
silently ignored.
"""

from __future__ import annotations

import importlib
import inspect
from datetime import timedelta
from typing import Annotated, Any

import typer

from .common import (
    DEFAULT_URL,
    MEMORY_WORKER_NOTE,
    DocketOption,
    UrlOption,
    duration_option,
    fail,
    note_memory,
    run_guarded,
)
from .logs import LogFormat, LogLevel, default_log_format, logging_configured
from .parsing import split_task_paths

__all__ = ["DEFAULT_TASKS", "worker"]

#: the collection a worker registers when not told otherwise (pydocket's standard tasks)
DEFAULT_TASKS = ["docket_core.tasks:standard_tasks"]
#: pydocket's default for ``--message-batch``
DEFAULT_MESSAGE_BATCH = 1000


def _accepted_options() -> set[str]:
    """The keyword arguments ``Worker.run`` passes on (its own and the
    worker's), so an option the worker lacks is known before it starts."""
    from ..worker import Worker

    names = set(inspect.signature(Worker.run).parameters)
    names |= set(inspect.signature(Worker).parameters)
    return names


def _optional(
    options: dict[str, Any], accepted: set[str], name: str, value: Any, default: Any
) -> None:
    """Pass ``name`` on if the worker takes it; a value other than the
    default that it cannot take ends the command."""
    if name in accepted:
        options[name] = value
    elif value != default:
        flag = "--" + name.replace("_", "-")
        fail(f"{flag} is not supported by this docket's worker", 2)


def _check_path(option: str, path: str) -> None:
    """A ``module:attribute`` path must name something importable (usage error otherwise)."""
    module_name, _, attribute = path.partition(":")
    try:
        found = bool(attribute) and hasattr(importlib.import_module(module_name), attribute)
    except ImportError as error:
        fail(f"{option} {path!r}: {error}", 2)
    if not found:
        fail(f"{option} {path!r}: expected module:attribute naming something in the module", 2)


def worker(
    tasks: Annotated[
        list[str],
        typer.Option(
            "--tasks",
            help=(
                "A task collection to register, as module:attribute (any iterable of "
                "task functions). Repeat it, or separate paths with commas or spaces."
            ),
            envvar="DOCKET_TASKS",
        ),
    ] = DEFAULT_TASKS,
    docket_: DocketOption = "docket",
    url: UrlOption = DEFAULT_URL,
    name: Annotated[
        str | None,
        typer.Option(
            help="The worker's name", envvar="DOCKET_WORKER_NAME", show_default="HOSTNAME#PID"
        ),
    ] = None,
    logging_level: Annotated[
        LogLevel,
        typer.Option(help="The lowest level logged", envvar="DOCKET_LOGGING_LEVEL"),
    ] = LogLevel.INFO,
    logging_format: Annotated[
        LogFormat,
        typer.Option(
            help="How logs are written",
            envvar="DOCKET_LOGGING_FORMAT",
            show_default="rich on a terminal, plain otherwise",
        ),
    ] = default_log_format(),
    concurrency: Annotated[
        int,
        typer.Option(
            help="How many tasks may run at once", envvar="DOCKET_WORKER_CONCURRENCY", min=1
        ),
    ] = 10,
    message_batch: Annotated[
        int,
        typer.Option(
            help="The most messages one read may claim",
            envvar="DOCKET_WORKER_MESSAGE_BATCH",
            min=1,
        ),
    ] = DEFAULT_MESSAGE_BATCH,
    redelivery_timeout: Annotated[
        timedelta,
        typer.Option(
            parser=duration_option,
            help="How long a running task may go unrenewed before another worker takes it",
            envvar="DOCKET_WORKER_REDELIVERY_TIMEOUT",
            show_default="5m",
        ),
    ] = timedelta(minutes=5),
    reconnection_delay: Annotated[
        timedelta,
        typer.Option(
            parser=duration_option,
            help="How long to wait before reconnecting after the store fails",
            envvar="DOCKET_WORKER_RECONNECTION_DELAY",
            show_default="5s",
        ),
    ] = timedelta(seconds=5),
    minimum_check_interval: Annotated[
        timedelta,
        typer.Option(
            parser=duration_option,
            help="The shortest wait between two looks for work",
            envvar="DOCKET_WORKER_MINIMUM_CHECK_INTERVAL",
            show_default="100ms",
        ),
    ] = timedelta(milliseconds=100),
    scheduling_resolution: Annotated[
        timedelta,
        typer.Option(
            parser=duration_option,
            help="How often future tasks are checked for being due",
            envvar="DOCKET_WORKER_SCHEDULING_RESOLUTION",
            show_default="250ms",
        ),
    ] = timedelta(milliseconds=250),
    schedule_automatic_tasks: Annotated[
        bool,
        typer.Option(
            "--schedule-automatic-tasks/--no-schedule-automatic-tasks",
            help="Start the automatic perpetual tasks",
            envvar="DOCKET_WORKER_SCHEDULE_AUTOMATIC_TASKS",
        ),
    ] = True,
    enable_internal_instrumentation: Annotated[
        bool,
        typer.Option(
            "--enable-internal-instrumentation/--no-enable-internal-instrumentation",
            help="Trace the worker's own polling of the store",
            envvar="DOCKET_WORKER_ENABLE_INTERNAL_INSTRUMENTATION",
        ),
    ] = False,
    until_finished: Annotated[
        bool,
        typer.Option(
            "--until-finished",
            help="Exit once nothing is scheduled, queued or running",
        ),
    ] = False,
    healthcheck_port: Annotated[
        int | None,
        typer.Option(
            "--healthcheck-port",
            help=(
                "Answer HTTP GET on this port: 200 once the worker is ready, 503 while it "
                "starts, drains or has lost its store"
            ),
            envvar="DOCKET_WORKER_HEALTHCHECK_PORT",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="Serve Prometheus metrics on this port at /metrics (needs the metrics extra)",
            envvar="DOCKET_WORKER_METRICS_PORT",
        ),
    ] = None,
    fallback_task: Annotated[
        str | None,
        typer.Option(
            "--fallback-task",
            help=(
                "A task (module:function) run, with the original arguments, for messages "
                "naming a task this worker does not know"
            ),
            envvar=["DOCKET_FALLBACK_TASK", "DOCKET_WORKER_FALLBACK_TASK"],
        ),
    ] = None,
    drain_timeout: Annotated[
        timedelta | None,
        typer.Option(
            "--drain-timeout",
            parser=duration_option,
            metavar="DURATION",
            help=(
                "How long a stopping worker waits for its running tasks before it "
                "cancels them (they are redelivered); default: as long as they take"
            ),
            envvar="DOCKET_WORKER_DRAIN_TIMEOUT",
        ),
    ] = None,
    loop: Annotated[
        str,
        typer.Option(
            "--loop",
            help="The event loop: asyncio, uvloop (the uvloop extra) or trio",
            envvar="DOCKET_WORKER_LOOP",
        ),
    ] = "asyncio",
    dependencies: Annotated[
        str | None,
        typer.Option(
            "--dependencies",
            help="Dependencies (module:attribute) that run around every task",
            envvar="DOCKET_WORKER_DEPENDENCIES",
        ),
    ] = None,
    freeze_gc: Annotated[
        bool,
        typer.Option(
            "--freeze-gc/--no-freeze-gc",
            help=(
                "Keep the objects there when the worker starts out of the garbage "
                "collector's passes while it runs (less CPU a task, no long pauses)"
            ),
            envvar="DOCKET_WORKER_FREEZE_GC",
        ),
    ] = True,
) -> None:
    """Run a worker until stopped (SIGTERM or SIGINT drain it) or, with
    ``--until-finished``, until the docket is empty."""
    from ..worker import Worker

    with logging_configured(logging_level, logging_format):
        note_memory(url, MEMORY_WORKER_NOTE)
        accepted = _accepted_options()
        options: dict[str, Any] = {
            "docket_name": docket_,
            "url": url,
            "name": name,
            "concurrency": concurrency,
            "redelivery_timeout": redelivery_timeout,
            "reconnection_delay": reconnection_delay,
            "minimum_check_interval": minimum_check_interval,
            "scheduling_resolution": scheduling_resolution,
            "schedule_automatic_tasks": schedule_automatic_tasks,
            "until_finished": until_finished,
            "healthcheck_port": healthcheck_port,
            "metrics_port": metrics_port,
            "tasks": split_task_paths(tasks),
            "fallback_task": fallback_task,
            "drain_timeout": drain_timeout,
            "freeze_gc": freeze_gc,
        }
        _optional(options, accepted, "message_batch", message_batch, DEFAULT_MESSAGE_BATCH)
        _optional(
            options,
            accepted,
            "enable_internal_instrumentation",
            enable_internal_instrumentation,
            False,
        )
        _optional(options, accepted, "dependencies", dependencies, None)

        for path in options["tasks"]:
            _check_path("--tasks", path)
        if fallback_task:
            _check_path("--fallback-task", fallback_task)

        run_guarded(lambda: Worker.run_sync(loop=loop, **options))
