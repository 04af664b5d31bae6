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

Logging stays cheap (a worker logs two lines a run): nothing is built
unless the logger is enabled for INFO (or, for a failure, for ERROR), and a
run builds its ``call`` and its fields once.  What runs share is kept: the
``call`` text before ``{key}`` of a function with no ``Logged`` parameter,
the text of ``docket.when`` up to the second, the ``[   12ms]`` of whole
milliseconds.  The start and end lines skip ``Logger.info``'s own work (the
caller's frame walk, the ``LogRecord`` constructor, the ``extra`` checks):
the start line's record is a copy of a record made once per call site,
thread and process, with the run's fields and the line's time and message
written in; the end line's record takes the run's fields as they are (the
start line had a copy).  Both go to the logger's handlers as
``Logger.handle`` sends them (filters, handlers and propagation as usual).
An application that installs its own record factory
(``logging.setLogRecordFactory``) gets its records made the usual way.
When the one handler the lines reach is the CLI's (``docket worker
--logging-format plain``: a ``LineHandler`` whose ``write_message`` takes
a line's text) and no filter or record factory could see a record, no
record is made: the handler writes the line's text as it would have
written the record's.
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
from datetime import UTC, datetime
from typing import Annotated, Any

from ._resolution import Dependency, _annotations, _plan, _signature
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
        return "%6.0fms" % (seconds * 1000)  # (``%`` is quicker than an f-string's spec)
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


class _Template:
    """A record made once at a call site, in one thread, with the run's
    ``extra`` fields as placeholders: a line's record is a copy with its
    values written over (no field added, so the copy never grows)."""

    __slots__ = ("bases", "fields", "size", "started")

    def __init__(self, fields: dict[str, Any], bases: int, started: float) -> None:
        self.fields = fields
        #: how many fields the worker's ``extra`` brings, and how many a record has
        self.bases = bases
        self.size = len(fields)
        #: when ``logging`` started (what ``relativeCreated`` counts from), in seconds
        self.started = started


#: the ``extra`` fields of a run's lines after the worker's own, in order
_RUN_FIELDS = ("docket.task", "docket.key", "docket.when", "docket.attempt", "punctuality")


class _Site:
    """A function of this module that logs a run's line at INFO, and its
    templates, one a thread (a record names its thread and process)."""

    __slots__ = ("name", "templates")

    def __init__(self, name: str) -> None:
        self.name = name
        self.templates: dict[int, _Template] = {}

    def template(self, base: Mapping[str, Any]) -> _Template:
        """This thread's template, for a worker whose ``extra`` is ``base``: a
        real record, made by the logger with the caller's file, line and name."""
        caller = sys._getframe(1)
        record = logger.makeRecord(
            logger.name, logging.INFO, caller.f_code.co_filename, caller.f_lineno, "", (), None,
            self.name,
        )  # fmt: skip
        fields = dict(record.__dict__)
        fields.update(dict.fromkeys(base))
        fields.update(dict.fromkeys(_RUN_FIELDS))
        started = record.created - record.relativeCreated / 1000
        template = self.templates[threading.get_ident()] = _Template(fields, len(base), started)
        return template


_START = _Site("log_start")
_END = _Site("log_end")


def _forked() -> None:
    """A forked child has another process id and name: its records make new templates."""
    _START.templates.clear()
    _END.templates.clear()


os.register_at_fork(after_in_child=_forked)

#: whether records name their asyncio task (Python 3.12 on)
_TASK_NAMES = sys.version_info >= (3, 12)
_LogRecord = logging.LogRecord
_get_ident = threading.get_ident
_time = time.time


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


def _hand_over(fields: dict[str, Any], started: float, msg: str, args: tuple[Any, ...]) -> None:
    """Make a record of ``fields`` (a template's, the line's values written
    in), stamp it with the time, message and arguments, and hand it to the
    logger's handlers, as ``Logger.handle`` does."""
    now = _time()
    fields["created"] = now
    fields["msecs"] = now % 1.0 * 1000.0 // 1.0  # (``LogRecord``'s ``int(...) + 0.0``)
    fields["relativeCreated"] = (now - started) * 1000
    fields["msg"] = msg
    fields["args"] = args
    if _TASK_NAMES:
        fields["taskName"] = _task_name()
    record = _LogRecord.__new__(_LogRecord)
    record.__dict__ = fields
    if logger.filters or logger.disabled:
        logger.handle(record)
    else:  # (what ``Logger.handle`` comes to without filters)
        logger.callHandlers(record)


#: whole milliseconds under ten seconds -> ``ms`` of them (``[     3ms]``)
_MS_SHOWN: dict[int, str] = {}


def _shown(seconds: float) -> str:
    """``ms(seconds)``, kept for the whole milliseconds a run usually takes."""
    if 0 < seconds < 10:  # (not 0: ``ms(-0.0)`` shows ``-0``)
        milliseconds = seconds * 1000
        # (``%6.0f`` and ``round`` both round half to even)
        whole = round(milliseconds)
        shown = _MS_SHOWN.get(whole)
        if shown is None:
            shown = _MS_SHOWN[whole] = ms(seconds)
        return shown
    return ms(seconds)


#: whole seconds since the epoch -> ``isoformat()`` of that second (UTC),
#: without its offset: the runs of a second share it
_SECONDS_SHOWN: dict[float, str] = {}
_SECONDS_KEPT = 1024


def _when_text(when: datetime) -> str:
    """``when.isoformat()``, with the part up to the second kept for the
    next runs due in the same second (UTC, the times a store gives back)."""
    if type(when) is datetime and when.tzinfo is UTC:
        stamp = when.timestamp()
        # (below 4e9 s a float tells microseconds apart: the second is exact)
        if 0 <= stamp < 4e9:
            second = stamp // 1
            head = _SECONDS_SHOWN.get(second)
            if head is None:
                if len(_SECONDS_SHOWN) >= _SECONDS_KEPT:
                    _SECONDS_SHOWN.clear()
                head = _SECONDS_SHOWN[second] = when.replace(microsecond=0).isoformat()[:-6]
            micro = when.microsecond
            if micro:
                return f"{head}.{str(1_000_000 + micro)[1:]}+00:00"
            return f"{head}+00:00"
    return when.isoformat()


# -- one run ---------------------------------------------------------------------------


#: function -> (task name, positional arguments, keyword names, the text of such
#: a call before its ``{key}``), for the functions with no ``Logged`` parameter:
#: their calls show no value, so the text is the same for each call of a shape
_CALLS: dict[Any, tuple[str, int, tuple[str, ...], str]] = {}
_CALLS_KEPT = 4096
#: ``Execution.call_repr`` as docket defines it (not as a test may replace it)
_CALL_REPR = Execution.call_repr


def _shows_values(function: Callable[..., Any] | None) -> bool:
    """Whether the calls of ``function`` show some argument's value (``Logged``)."""
    if function is None:
        return False
    try:
        return bool(_plan(function).logged)
    except Exception:
        return True


def call_of(execution: Execution) -> str:
    """``execution.call_repr()``; a call that cannot be shown (a signature
    that cannot be read) still names its task and key."""
    return _call_text(execution, execution.function_name, execution.key)


def _call_text(execution: Execution, name: str, key: str) -> str:
    """``call_of(execution)``, given its task's ``name`` and ``key``.  The
    text before ``{key}`` is kept for a function with no ``Logged``
    parameter, so its next call of the same shape costs a lookup."""
    if type(execution).call_repr is not _CALL_REPR:
        return _called(execution, name, key)
    function = execution.function
    kwargs = execution.kwargs
    names = tuple(kwargs) if kwargs else ()
    try:
        known = _CALLS.get(function)
    except TypeError:  # (a callable that cannot be hashed)
        return _called(execution, name, key)
    positional = len(execution.args)
    if known is not None and known[0] == name and known[1] == positional and known[2] == names:
        return f"{known[3]}{{{key}}}"
    text = _called(execution, name, key)
    ending = f"{{{key}}}"
    if text.endswith(ending) and not _shows_values(function):
        if len(_CALLS) >= _CALLS_KEPT:
            _CALLS.clear()
        _CALLS[function] = (name, positional, names, text[: -len(ending)])
    return text


def _called(execution: Execution, name: str, key: str) -> str:
    try:
        return execution.call_repr()
    except Exception:
        return f"{name}(?){{{key}}}"


class RunLine:
    """What a run's lines share, made once: the ``call`` text and the
    ``extra`` fields (made when first asked for, from ``execution``); while
    the start line's record factory is logging's own, also ``fields``, the
    record fields the end line's record is made of."""

    __slots__ = ("_extra", "base", "call", "execution", "fields", "punctuality", "thread")

    def __init__(self, execution: Execution, base: Mapping[str, Any], punctuality: float) -> None:
        self.call = _call_text(execution, execution.function_name, execution.key)
        self.base = base
        self.execution = execution
        self.punctuality = punctuality
        self.fields: dict[str, Any] | None = None
        self.thread = 0
        self._extra: dict[str, Any] | None = None

    @property
    def extra(self) -> dict[str, Any]:
        """The ``extra`` of the run's lines (without ``duration``, until the end)."""
        if self._extra is None:
            execution = self.execution
            self._extra = {
                **self.base,
                "docket.task": execution.function_name,
                "docket.key": execution.key,
                "docket.when": _when_text(execution.when),
                "docket.attempt": execution.attempt,
                "punctuality": self.punctuality,
            }
        return self._extra


def _straight_handler() -> Any:
    """The one handler a run line at INFO reaches, when it may take the
    line's text without a record (it has ``write_message``, as the CLI's
    ``LineHandler`` has) because nothing else would see the record: no filter
    on the logger, no other handler on the way up, logging's own record
    factory.  ``None`` otherwise: the line goes as a record."""
    if logger.filters or logger.disabled or logging.getLogRecordFactory() is not _LogRecord:
        return None
    found = None
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if found is not None:
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    if found is None or getattr(found, "write_message", None) is None:
        return None
    return found


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
    arrow = RETRY_START if execution.attempt > 1 else START
    line = RunLine(execution, base, punctuality)
    call = line.call
    straight = _straight_handler()
    if straight is not None and straight.write_message(
        _time(), logging.INFO, logger.name, f"{arrow} [{_shown(punctuality)}] {call}"
    ):
        return line
    if logging.getLogRecordFactory() is not _LogRecord:  # (an application's: the usual way)
        logger.info("%s [%s] %s", arrow, ms(punctuality), call, extra=line.extra)
        return line
    name = execution.function_name
    key = execution.key
    line.thread = thread = _get_ident()
    template = _START.templates.get(thread)
    if template is None or template.bases != len(base):
        template = _START.template(base)
    fields = template.fields.copy()
    fields.update(base)
    if len(fields) != template.size:  # (other worker fields than the template's)
        template = _START.template(base)
        fields = template.fields.copy()
        fields.update(base)
    fields["docket.task"] = name
    fields["docket.key"] = key
    fields["docket.when"] = _when_text(execution.when)
    fields["docket.attempt"] = execution.attempt
    fields["punctuality"] = punctuality
    line.fields = fields
    _hand_over(fields.copy(), template.started, "%s [%s] %s", (arrow, _shown(punctuality), call))
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
    if line is not None and failure is None and interrupted is None:  # (the usual end)
        arrow = RESCHEDULED_END if rescheduled else END
        straight = _straight_handler()
        if straight is not None:
            message = f"{arrow} [{_shown(duration)}] {line.call}"
            if straight.write_message(_time(), logging.INFO, logger.name, message):
                return
        fields = line.fields
        if (
            fields is not None
            and line.thread == _get_ident()
            and logging.getLogRecordFactory() is _LogRecord
        ):
            template = _END.templates.get(line.thread)
            if template is None:
                template = _END.template(line.base)
            # the run's fields are this record's: the start line had a copy
            line.fields = None
            fields["funcName"] = template.fields["funcName"]
            fields["lineno"] = template.fields["lineno"]
            fields["duration"] = duration
            _hand_over(fields, template.started, "%s [%s] %s", (arrow, _shown(duration), line.call))
            return
        extra = line.extra
        extra["duration"] = duration
        logger.info("%s [%s] %s", arrow, ms(duration), line.call, extra=extra)
        return
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
    logger.log(
        level, "%s [%s] %s", arrow, ms(duration), line.call, extra=line.extra, exc_info=failure
    )
