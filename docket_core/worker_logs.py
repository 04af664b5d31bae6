"""The worker's log lines, in pydocket's format, on the ``docket.worker`` logger.

At start, a banner names the worker and lists the tasks it serves, one
``* name(compact signature)`` line each.  Every run then logs two lines:

- ``↪ [punctuality] call`` at INFO when it starts (``↬`` for a retry attempt);
- ``↩ [duration] call`` at INFO when it ends (``↫`` when a retry or the next
  run of a perpetual task was scheduled).  A failure logs its end line at
  ERROR with the exception, so its traceback is printed; a run cancelled by
  ``Docket.cancel`` ends with ``✗ [duration] call (cancelled)``.

A struck delivery logs ``🗙 call`` at WARNING instead.  ``call`` is
``Execution.call_repr()``: the task's name, its arguments (``...`` unless the
parameter is annotated ``Logged``) and ``{key}``.  Records carry pydocket's
``extra`` fields: ``docket.name``, ``docket.worker``, ``docket.task``,
``docket.key``, ``docket.when``, ``docket.attempt``, and ``punctuality`` and
``duration`` (seconds) once known.

Logging stays cheap: a run builds its ``call`` and its ``extra`` once, and
only when the logger is enabled for INFO (or, for a failure, for ERROR).  The
start and end lines skip ``Logger.info``'s own work (the caller's frame walk,
the ``LogRecord`` constructor, the ``extra`` checks): each is a copy of a
record made once per level, call site, thread and process, given its time,
message and fields, then handed to ``Logger.handle`` (filters, handlers and
propagation as usual).  An application that installs its own record factory
(``logging.setLogRecordFactory``) gets its records made the usual way.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
import time
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any

from ._resolution import Dependency, _annotations, _signature

if TYPE_CHECKING:
    from .execution import Execution

logger = logging.getLogger("docket.worker")

START, RETRY_START = "↪", "↬"
END, RESCHEDULED_END = "↩", "↫"
CANCELLED, STRUCK = "✗", "🗙"

__all__ = [
    "RunLine",
    "call_of",
    "compact_signature",
    "log_end",
    "log_start",
    "log_startup",
    "log_struck",
    "ms",
    "worker_extra",
]


def ms(seconds: float) -> str:
    """A duration as the log lines show it: ``[   12ms]``, or whole seconds
    from 100 s on (``[   120s ]``), always six characters and a unit."""
    if seconds < 100:
        return f"{seconds * 1000:6.0f}ms"
    return f"{seconds:6.0f}s "


# -- the banner ------------------------------------------------------------------------


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is Annotated:
        annotation = annotation.__origin__
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type) and typing.get_origin(annotation) is None:
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def compact_signature(function: Callable[..., Any]) -> str:
    """A task's parameters for the banner: names, types and defaults, with
    the parameters docket fills in (dependency defaults) folded into ``...``."""
    try:
        signature = _signature(function)
        annotations = _annotations(function, signature)
    except Exception:
        return "..."
    shown: list[str] = []
    injected = 0
    for name, parameter in signature.parameters.items():
        if isinstance(parameter.default, Dependency):
            injected += 1
            continue
        text = name
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            text = f"*{name}"
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            text = f"**{name}"
        if name in annotations:
            text = f"{text}: {_type_name(annotations[name])}"
        if parameter.default is not parameter.empty:
            try:
                text = f"{text} = {parameter.default!r}"
            except Exception:
                text = f"{text} = ..."
        shown.append(text)
    if injected:
        shown.append("...")
    return ", ".join(shown)


def worker_extra(docket_name: str, worker_name: str) -> dict[str, Any]:
    """The ``extra`` fields every line of a worker carries."""
    return {"docket.name": docket_name, "docket.worker": worker_name}


def log_startup(worker_name: str, tasks: Mapping[str, Callable[..., Any]], extra: Any) -> None:
    """``Starting worker 'NAME' with the following tasks:`` and one
    ``* name(signature)`` line per task."""
    if not logger.isEnabledFor(logging.INFO):
        return
    logger.info("Starting worker %r with the following tasks:", worker_name, extra=extra)
    for name, function in list(tasks.items()):
        logger.info("* %s(%s)", name, compact_signature(function), extra=extra)


# -- records made cheaply ---------------------------------------------------------------

#: (level, call site, thread) -> the fields every record made there shares, and
#: when ``logging`` started (what ``relativeCreated`` counts from), in seconds
_TEMPLATES: dict[tuple[int, str, int], tuple[dict[str, Any], float]] = {}
#: what a record made by ``_emit`` sets itself, line by line
_PER_LINE = ("created", "msecs", "relativeCreated", "msg", "args", "taskName")
#: whether records name their asyncio task (Python 3.12 on)
_TASK_NAMES = sys.version_info >= (3, 12)

# a forked child has another process id and name: its records make new templates
os.register_at_fork(after_in_child=_TEMPLATES.clear)


def _template(level: int, site: str, key: tuple[int, str, int]) -> tuple[dict[str, Any], float]:
    """The shared fields of the records ``site`` (the function calling
    ``_emit``) logs at ``level`` in this thread: those of a real record, made
    once by the logger with the caller's file, line and name."""
    caller = sys._getframe(2)
    record = logger.makeRecord(
        logger.name, level, caller.f_code.co_filename, caller.f_lineno, "", (), None, site
    )
    fields = {name: value for name, value in record.__dict__.items() if name not in _PER_LINE}
    template = _TEMPLATES[key] = (fields, record.created - record.relativeCreated / 1000)
    return template


def _task_name() -> str | None:
    """The asyncio task's name, as Python 3.12's ``LogRecord.taskName`` has it."""
    if not getattr(logging, "logAsyncioTasks", False):
        return None
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return None
    try:
        task = asyncio.current_task()
    except Exception:
        return None
    return None if task is None else task.get_name()


def _emit(level: int, site: str, msg: str, args: tuple[Any, ...], extra: Mapping[str, Any]) -> None:
    """``logger.log(level, msg, *args, extra=extra)`` from ``site``, the
    caller (already known to be enabled for ``level``), with the record made
    from its template.  The record is a ``LogRecord`` like any other: only
    the way it is filled differs."""
    if logging.getLogRecordFactory() is not logging.LogRecord:
        logger.log(level, msg, *args, extra=extra, stacklevel=2)
        return
    key = (level, site, threading.get_ident())
    template = _TEMPLATES.get(key)
    if template is None:
        template = _template(level, site, key)
    shared, started = template
    fields = shared.copy()
    fields.update(extra)
    now = time.time()
    fields["created"] = now
    fields["msecs"] = int((now - int(now)) * 1000) + 0.0
    fields["relativeCreated"] = (now - started) * 1000
    fields["msg"] = msg
    fields["args"] = args
    if _TASK_NAMES:
        fields["taskName"] = _task_name()
    record = logging.LogRecord.__new__(logging.LogRecord)
    record.__dict__ = fields
    logger.handle(record)


# -- one run ---------------------------------------------------------------------------


def call_of(execution: Execution) -> str:
    """``execution.call_repr()``; a call that cannot be shown (a signature
    that cannot be read) still names its task and key."""
    try:
        return execution.call_repr()
    except Exception:
        return f"{execution.function_name}(?){{{execution.key}}}"


class RunLine:
    """The ``call`` and ``extra`` of one run's log lines, built once."""

    __slots__ = ("call", "extra")

    def __init__(self, execution: Execution, base: Mapping[str, Any], punctuality: float) -> None:
        self.call = call_of(execution)
        self.extra: dict[str, Any] = {
            **base,
            "docket.task": execution.function_name,
            "docket.key": execution.key,
            "docket.when": execution.when.isoformat(),
            "docket.attempt": execution.attempt,
            "punctuality": punctuality,
        }


def log_struck(execution: Execution, base: Mapping[str, Any]) -> None:
    """``🗙 call`` at WARNING: a strike matched the delivery; it does not run."""
    if logger.isEnabledFor(logging.WARNING):
        line = RunLine(execution, base, 0.0)
        del line.extra["punctuality"]
        logger.warning("%s %s", STRUCK, line.call, extra=line.extra)


def log_start(execution: Execution, base: Mapping[str, Any], punctuality: float) -> RunLine | None:
    """``↪ [punctuality] call`` (``↬`` for a retry); ``None`` when INFO is off."""
    if not logger.isEnabledFor(logging.INFO):
        return None
    line = RunLine(execution, base, punctuality)
    arrow = RETRY_START if execution.attempt > 1 else START
    _emit(logging.INFO, "log_start", "%s [%s] %s", (arrow, ms(punctuality), line.call), line.extra)
    return line


def log_end(
    line: RunLine | None,
    execution: Execution,
    base: Mapping[str, Any],
    punctuality: float,
    duration: float,
    *,
    rescheduled: bool,
    failure: BaseException | None = None,
    interrupted: str | None = None,
) -> None:
    """The end line of a run that started with ``line``: ``↩``/``↫`` at
    INFO, or at ERROR with ``failure``'s traceback; a run stopped by docket
    (``interrupted``: why) ends with ``✗``."""
    level = logging.INFO
    if failure is not None:
        level = logging.ERROR
    elif interrupted is not None and interrupted != "cancelled":
        level = logging.WARNING
    if line is None:
        if level == logging.INFO or not logger.isEnabledFor(level):
            return
        line = RunLine(execution, base, punctuality)
    line.extra["duration"] = duration
    if interrupted is not None and failure is None:
        logger.log(
            level,
            "%s [%s] %s (%s)",
            CANCELLED,
            ms(duration),
            line.call,
            interrupted,
            extra=line.extra,
        )
        return
    arrow = RESCHEDULED_END if rescheduled else END
    if failure is None:
        _emit(level, "log_end", "%s [%s] %s", (arrow, ms(duration), line.call), line.extra)
        return
    logger.log(
        level, "%s [%s] %s", arrow, ms(duration), line.call, extra=line.extra, exc_info=failure
    )
