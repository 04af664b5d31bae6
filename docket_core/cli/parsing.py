"""Reading the ``docket`` command line: argument types, environment defaults
and the argument parser.

Options that configure a worker or pick a docket can also come from the
environment (``DOCKET_URL``, ``DOCKET_NAME``, ``DOCKET_TASKS``,
``DOCKET_WORKER_*``, ``DOCKET_LOGGING_LEVEL``); a command-line option wins
over its variable.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..sansio.strikes import Operator

__all__ = ["LOGGING_LEVELS", "build_parser", "parse_duration", "parse_value", "wildcard"]

LOGGING_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


# -- parsing helpers ---------------------------------------------------------------------------

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_WITH_UNIT = re.compile(r"(?P<number>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>ms|s|m|h)?")
_CLOCK = re.compile(r"(?:(?P<hours>\d+):)?(?P<minutes>\d+):(?P<seconds>\d+(?:\.\d+)?)")


def parse_duration(text: str) -> timedelta:
    """Read a duration: ``123`` or ``123s`` (seconds), ``123ms``, ``5m``, ``2h``,
    ``mm:ss`` or ``hh:mm:ss``.  Raises ``ValueError`` on anything else."""
    cleaned = text.strip().lower()
    match = _WITH_UNIT.fullmatch(cleaned)
    if match:
        seconds = float(match["number"]) * _UNIT_SECONDS[match["unit"] or "s"]
        return timedelta(seconds=seconds)
    match = _CLOCK.fullmatch(cleaned)
    if match:
        minutes = int(match["minutes"])
        seconds = float(match["seconds"])
        if seconds >= 60 or (match["hours"] is not None and minutes >= 60):
            raise ValueError(f"invalid duration {text!r}: minutes and seconds must be below 60")
        hours = int(match["hours"] or 0)
        return timedelta(hours=hours, minutes=minutes, seconds=seconds)
    raise ValueError(
        f"invalid duration {text!r}; use e.g. 30, 30s, 250ms, 5m, 2h, 01:30 or 01:00:00"
    )


_TRUE = {"true", "t", "yes", "y", "on", "1"}
_FALSE = {"false", "f", "no", "n", "off", "0"}


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"invalid bool {text!r}; use true or false")


_VALUE_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "bool": _parse_bool,
    "str": str,
}


def parse_value(text: str) -> Any:
    """Read a strike value: ``int:5``, ``float:1.5``, ``bool:true``, ``str:x``;
    without a known type prefix the whole text is a string.  Raises
    ``ValueError`` when the text does not fit the type it names."""
    prefix, colon, rest = text.partition(":")
    if not colon or prefix not in _VALUE_TYPES:
        return text
    try:
        return _VALUE_TYPES[prefix](rest)
    except ValueError:
        raise ValueError(f"invalid {prefix} value {rest!r} in {text!r}") from None


def wildcard(text: str | None) -> str | None:
    """``*`` or an empty string means "any"."""
    if text is None or text.strip() in ("", "*"):
        return None
    return text


def _argument_type(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = name
    return convert


def _positive_int(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"invalid number {text!r}") from None
    if number < 1:
        raise ValueError(f"must be at least 1, not {number}")
    return number


_duration = _argument_type(parse_duration, "duration")


# -- the parser --------------------------------------------------------------------------------


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    return value.strip().lower() in _TRUE


def _add_docket_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=_env("DOCKET_URL", "memory://"),
        help="the store holding the docket (env DOCKET_URL; default %(default)s)",
    )
    parser.add_argument(
        "--docket",
        default=_env("DOCKET_NAME", "docket"),
        help="the docket's name (env DOCKET_NAME; default %(default)s)",
    )


def _add_strike_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "function", nargs="?", default=None, help="task name; '*' or '' for any task"
    )
    parser.add_argument(
        "parameter", nargs="?", default=None, help="parameter name; '*' or '' for any"
    )
    parser.add_argument(
        "operator",
        nargs="?",
        default="==",
        choices=[operator.value for operator in Operator],
        help="comparison (default ==)",
    )
    parser.add_argument(
        "value",
        nargs="?",
        default=None,
        help=(
            "value to compare with: int:5, float:1.5, bool:true, str:x (untyped: str); "
            "for 'between', LOW,HIGH such as int:1,int:10"
        ),
    )
    _add_docket_options(parser)


def build_parser() -> argparse.ArgumentParser:
    """The ``docket`` argument parser (environment defaults read now)."""
    parser = argparse.ArgumentParser(
        prog="docket", description="Distributed background tasks for Python."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser("version", help="print docket's version")

    worker = commands.add_parser("worker", help="run a worker")
    worker.add_argument(
        "--tasks",
        action="append",
        default=None,
        metavar="MODULE:COLLECTION",
        help=(
            "a collection of task functions to register, e.g. myapp.tasks:all_tasks; "
            "repeatable (env DOCKET_TASKS, comma separated)"
        ),
    )
    _add_docket_options(worker)
    worker.add_argument(
        "--name",
        default=os.environ.get("DOCKET_WORKER_NAME"),
        help="the worker's name (env DOCKET_WORKER_NAME; default: chosen by the worker)",
    )
    worker.add_argument(
        "--concurrency",
        type=_argument_type(_positive_int, "concurrency"),
        default=_env("DOCKET_WORKER_CONCURRENCY", "10"),
        help="how many tasks may run at once (default %(default)s)",
    )
    durations = [
        ("--redelivery-timeout", "REDELIVERY_TIMEOUT", "5m",
         "how long a task may go unrenewed before another worker takes it over"),
        ("--reconnection-delay", "RECONNECTION_DELAY", "5s",
         "how long to wait before reconnecting to the store after an error"),
        ("--minimum-check-interval", "MINIMUM_CHECK_INTERVAL", "100ms",
         "the shortest wait between two checks for new work"),
        ("--scheduling-resolution", "SCHEDULING_RESOLUTION", "250ms",
         "how often future tasks are checked for being due"),
    ]  # fmt: skip
    for option, env_suffix, default, text in durations:
        worker.add_argument(
            option,
            type=_duration,
            default=_env(f"DOCKET_WORKER_{env_suffix}", default),
            metavar="DURATION",
            help=f"{text} (env DOCKET_WORKER_{env_suffix}; default %(default)s)",
        )
    worker.add_argument(
        "--schedule-automatic-tasks",
        action=argparse.BooleanOptionalAction,
        default=_env_bool("DOCKET_WORKER_SCHEDULE_AUTOMATIC_TASKS", True),
        help="start automatic perpetual tasks (env DOCKET_WORKER_SCHEDULE_AUTOMATIC_TASKS)",
    )
    worker.add_argument(
        "--fallback-task",
        default=os.environ.get("DOCKET_WORKER_FALLBACK_TASK"),
        help=(
            "module:function run for messages naming an unknown task "
            "(env DOCKET_WORKER_FALLBACK_TASK; default: record them as failed)"
        ),
    )
    ports = [
        ("--metrics-port", "METRICS_PORT",
         "serve the worker's metrics to Prometheus on this port, at /metrics "
         "(needs docket[metrics])"),
        ("--healthcheck-port", "HEALTHCHECK_PORT",
         "answer HTTP GET on this port with 200 while the worker runs"),
    ]  # fmt: skip
    for option, env_suffix, text in ports:
        worker.add_argument(
            option,
            type=_argument_type(_positive_int, "port"),
            default=os.environ.get(f"DOCKET_WORKER_{env_suffix}"),
            metavar="PORT",
            help=f"{text} (env DOCKET_WORKER_{env_suffix})",
        )
    worker.add_argument(
        "--until-finished",
        action="store_true",
        help="exit once no task is due, scheduled or running instead of running forever",
    )
    worker.add_argument(
        "--logging-level",
        type=str.upper,
        choices=LOGGING_LEVELS,
        default=_env("DOCKET_LOGGING_LEVEL", "INFO").upper(),
        help="log level (env DOCKET_LOGGING_LEVEL; default %(default)s)",
    )

    strike = commands.add_parser(
        "strike",
        help="pause a task, or calls matching an argument condition",
        description=(
            "Strike a task by name, calls whose PARAMETER matches OPERATOR VALUE, or both. "
            "Struck tasks are not run until restored."
        ),
    )
    _add_strike_arguments(strike)

    restore = commands.add_parser(
        "restore",
        help="lift a strike",
        description="Lift a strike given with the same arguments to 'docket strike'.",
    )
    _add_strike_arguments(restore)

    clear = commands.add_parser("clear", help="cancel every task that waits to run")
    _add_docket_options(clear)

    snapshot = commands.add_parser("snapshot", help="show running and future tasks")
    snapshot.add_argument(
        "--limit",
        type=_positive_int,
        default=1000,
        help="list at most this many running and future tasks each (default %(default)s)",
    )
    _add_docket_options(snapshot)

    dead = commands.add_parser(
        "dead-letters",
        help="list, replay or drop malformed messages set aside",
        description="Messages that could not be read (a field missing or not a number) "
        "are moved to the docket's dead letters with the reason.",
    )
    dead_commands = dead.add_subparsers(dest="dead_command", required=True, metavar="COMMAND")
    dead_ls = dead_commands.add_parser("ls", help="list the newest dead letters")
    dead_ls.add_argument("--limit", type=_positive_int, default=100, help="default %(default)s")
    _add_docket_options(dead_ls)
    for verb, text in (("replay", "put dead letters back in the queue"), ("drop", "remove them")):
        action = dead_commands.add_parser(verb, help=text)
        action.add_argument("ids", nargs="*", metavar="ID", help="dead letter ids (from 'ls')")
        action.add_argument("--all", action="store_true", help="every dead letter")
        _add_docket_options(action)

    workers = commands.add_parser("workers", help="inspect the docket's workers")
    workers_commands = workers.add_subparsers(
        dest="workers_command", required=True, metavar="COMMAND"
    )
    workers_ls = workers_commands.add_parser("ls", help="list live workers")
    _add_docket_options(workers_ls)
    for_task = workers_commands.add_parser("for-task", help="list live workers that run TASK")
    for_task.add_argument("task", help="a task name")
    _add_docket_options(for_task)

    watch = commands.add_parser("watch", help="follow a task's state and progress until it ends")
    watch.add_argument("key", help="the task's key")
    watch.add_argument(
        "--poll-interval",
        type=_duration,
        default="1s",
        metavar="DURATION",
        help="how often to look, besides the live events (default %(default)s)",
    )
    _add_docket_options(watch)

    tasks = commands.add_parser("tasks", help="add one of the built-in tasks")
    builtins = tasks.add_subparsers(dest="task", required=True, metavar="TASK")
    for name, text in (("trace", "log MESSAGE"), ("fail", "fail with MESSAGE (tried twice)")):
        builtin = builtins.add_parser(name, help=text)
        builtin.add_argument("message", help="the message")
    sleep = builtins.add_parser("sleep", help="sleep SECONDS")
    sleep.add_argument("seconds", type=float, help="how long to sleep")
    for builtin in builtins.choices.values():
        builtin.add_argument(
            "--delay",
            type=_duration,
            default="0s",
            metavar="DURATION",
            help="run it this much later (default now)",
        )
        _add_docket_options(builtin)

    return parser
