"""How ``docket worker`` logs: ``--logging-level`` and ``--logging-format``
(``rich``, ``plain`` or ``json``), as pydocket's CLI offers them.

Every format writes to standard output through one handler on the root
logger.  ``plain`` writes ``[time] LEVEL - logger - message`` lines
(``PlainFormatter``: ``logging.Formatter``'s text, made cheaply, since a
worker logs two lines a run).  ``json`` writes one JSON object per line: the
logger's name, the time, the level and the message, then the record's
``extra`` fields (the docket, worker, task and key of a run), and the
traceback when there is one.  Both go through ``LineHandler``, which
flushes a WARNING or worse at once and other lines within a tenth of a
second, in blocks.  With ``plain``, the worker's run lines reach it as
text, without a record (``LineHandler.write_message``; ``worker_logs``
says when).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = [
    "JsonFormatter",
    "LineHandler",
    "LogFormat",
    "LogLevel",
    "PlainFormatter",
    "configure_logging",
    "default_log_format",
    "logging_configured",
]


class LogLevel(enum.StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


class LogFormat(enum.StrEnum):
    RICH = "rich"
    PLAIN = "plain"
    JSON = "json"


def default_log_format() -> LogFormat:
    """``rich`` on a terminal, ``plain`` when the output goes elsewhere."""
    return LogFormat.RICH if sys.stdout.isatty() else LogFormat.PLAIN


_LogRecord = logging.LogRecord
#: the attributes every ``LogRecord`` has; anything else came as ``extra``
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "name": record.name,
            "asctime": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "levelname": record.levelname,
            "message": record.getMessage(),
        }
        for attribute, value in vars(record).items():
            if attribute not in _RECORD_ATTRIBUTES and attribute not in entry:
                entry[attribute] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """``[2025-01-31 12:00:00] INFO - docket.worker - message``: the text of
    ``logging.Formatter("[%(asctime)s] %(levelname)s - %(name)s - %(message)s",
    datefmt="%Y-%m-%d %H:%M:%S")``, and the same side effects on the record
    (``message``, ``asctime``, ``exc_text``), at a fraction of its cost: the
    line up to the message (the time, shown to the second, the level and the
    logger) is put together once a second, level and logger, and without the
    format's ``%`` mapping."""

    FORMAT = "[%(asctime)s] %(levelname)s - %(name)s - %(message)s"
    DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

    def __init__(self) -> None:
        super().__init__(self.FORMAT, datefmt=self.DATE_FORMAT)
        #: (second, level name, logger name, the time's text, the line up to
        #: the message) of the last record: one tuple, so that threads sharing
        #: the formatter never mix one record's parts with another's
        self._head: tuple[float, object, object, str, str] = (-1.0, None, None, "", "")

    def format(self, record: logging.LogRecord) -> str:
        if type(record) is _LogRecord:  # (``getMessage``, without the call)
            message = str(record.msg)
            if record.args:
                message = message % record.args
        else:
            message = record.getMessage()
        record.message = message
        head = self._heading(record.created, record.levelname, record.name)
        record.asctime = head[3]
        line = head[4] + message
        # the traceback and the stack, as ``logging.Formatter`` adds them
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            if line[-1:] != "\n":
                line += "\n"
            line += record.exc_text
        if record.stack_info:
            if line[-1:] != "\n":
                line += "\n"
            line += self.formatStack(record.stack_info)
        return line

    def _heading(
        self, created: float, level: object, name: object
    ) -> tuple[float, object, object, str, str]:
        """The time's text and the line up to the message of a record made
        at ``created``, of that level and logger, remade only when one of
        the three changed (the time to the second)."""
        second = created // 1  # (what ``time.localtime`` shows of it)
        head = self._head
        if head[0] != second or head[1] is not level or head[2] is not name:
            if head[0] == second:
                shown = head[3]
            else:
                shown = time.strftime(self.DATE_FORMAT, self.converter(created))
            head = self._head = (second, level, name, shown, f"[{shown}] {level!s} - {name!s} - ")
        return head


class LineHandler(logging.StreamHandler[TextIO]):
    """The CLI's handler: a ``StreamHandler`` that writes each record as
    ``StreamHandler`` does (the formatter's text, then a newline), with one
    difference in timing: a line below WARNING is flushed within
    ``FLUSH_DELAY`` seconds (by a helper thread, started at the first such
    line), not at once, so a busy worker writes its lines in blocks rather
    than with a system call each.  A WARNING or worse flushes at once, with
    whatever came before it; ``flush``, ``close`` and ``logging.shutdown``
    (at exit) flush too."""

    FLUSH_DELAY = 0.1

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        #: lines were written and not flushed (changed under ``self.lock``)
        self._pending = False
        self._closed = False
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        #: this class handles and emits records as ``LineHandler`` does, so
        #: ``write_message`` may write a line without its record
        self._writes_lines = _writes_as_line_handler(type(self))
        _LINE_HANDLERS.add(self)

    def handle(self, record: logging.LogRecord) -> Any:
        """``Handler.handle``: the filters, then ``emit`` under the lock (a
        handler without filters goes straight to ``emit``)."""
        lock = self.lock
        if self.filters or lock is None:
            return super().handle(record)
        with lock:
            self.emit(record)
        return record if _FILTERS_RETURN_RECORDS else True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            formatter = self.formatter or _DEFAULT_FORMATTER
            self._write(formatter.format(record) + self.terminator, record.levelno)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def write_message(self, created: float, levelno: int, name: str, message: str) -> bool:
        """Write the line of a record of logger ``name`` made at ``created``
        with this message and no ``exc_info`` or ``stack_info``, without the
        record, when that writes what ``handle`` writes: the formatter is
        a ``PlainFormatter`` (whose line shows none of the record's other
        fields), the handler has no filter and its level lets the record
        through, and a subclass has not changed how a record is handled
        or emitted.  Returns whether it wrote the line (else nothing was
        done: the caller logs a record).  The worker's run lines come this
        way (``worker_logs``), when this is the one handler they reach."""
        formatter = self.formatter
        lock = self.lock
        if type(formatter) is not PlainFormatter or self.filters or levelno < self.level:
            return False
        if lock is None or not self._writes_lines or self._closed:
            return False
        # (``getLevelName``'s own first look, without the call)
        level = _LEVEL_TO_NAME.get(levelno) or logging.getLevelName(levelno)
        with lock:
            try:
                # (``PlainFormatter._heading``, its usual case inline)
                head = formatter._head
                if head[0] != created // 1 or head[1] is not level or head[2] is not name:
                    head = formatter._heading(created, level, name)
                self.stream.write(f"{head[4]}{message}{self.terminator}")
                if levelno >= _WARNING or self._closed:
                    self._pending = False
                    self.flush()
                elif not self._pending:
                    self._pending = True
                    self._flush_soon()
            except RecursionError:
                raise
            except Exception:
                record = logging.LogRecord(name, levelno, "", 0, message, None, None)
                record.created = created
                self.handleError(record)
        return True

    def _write(self, text: str, levelno: int) -> None:
        """Write ``text`` (under the lock); flush it now or soon, by ``levelno``."""
        self.stream.write(text)
        if levelno >= logging.WARNING or self._closed:
            self._pending = False
            self.flush()
        elif not self._pending:
            self._pending = True
            self._flush_soon()

    def _flush_soon(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush_in_time, name="docket-log-flusher", daemon=True
            )
            self._flusher.start()
        self._wake.set()

    def _flush_in_time(self) -> None:
        """The helper thread: flush the lines written, ``FLUSH_DELAY`` after the first."""
        while True:
            self._wake.wait()
            time.sleep(self.FLUSH_DELAY)
            self.acquire()  # (``handle`` holds it around every ``emit``)
            try:
                if self._closed:
                    return
                self._wake.clear()
                self._flush_pending()
            finally:
                self.release()

    def _flush_pending(self) -> None:
        """Flush what ``emit`` left unflushed; a stream closed or broken in
        the meantime is ignored, as ``logging.shutdown`` ignores it."""
        if self._pending:
            self._pending = False
            try:
                self.flush()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        self.acquire()
        try:
            self._closed = True
            self._flush_pending()
        finally:
            self.release()
        self._wake.set()
        super().close()

    def _before_fork(self) -> None:
        """Flush, so that a forked child does not write these lines again."""
        self.acquire()
        try:
            self._flush_pending()
        finally:
            self.release()

    def _forked(self) -> None:
        """In a forked child: the helper thread did not come along."""
        self._flusher = None
        self._wake = threading.Event()
        self._pending = False


def _writes_as_line_handler(kind: type[LineHandler]) -> bool:
    """Whether a handler of this class handles and emits records as
    ``LineHandler`` does (a subclass may override neither)."""
    return kind is LineHandler or (
        kind.handle is LineHandler.handle and kind.emit is LineHandler.emit
    )


_DEFAULT_FORMATTER = logging.Formatter()
_WARNING = logging.WARNING
#: level -> name, the table ``logging.getLevelName`` reads first (and
#: ``addLevelName`` writes)
_LEVEL_TO_NAME: dict[int, str] = getattr(logging, "_levelToName", {})
#: whether ``Handler.handle`` returns the record that passed (Python 3.12 on)
_FILTERS_RETURN_RECORDS = sys.version_info >= (3, 12)
#: every ``LineHandler``, to reset in a forked child
_LINE_HANDLERS: weakref.WeakSet[LineHandler] = weakref.WeakSet()


def _before_fork() -> None:
    for handler in list(_LINE_HANDLERS):
        handler._before_fork()


def _after_fork() -> None:
    for handler in list(_LINE_HANDLERS):
        handler._forked()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork)


def _handler(log_format: LogFormat) -> logging.Handler:
    if log_format is LogFormat.JSON:
        handler: logging.Handler = LineHandler(sys.stdout)
        handler.setFormatter(JsonFormatter())
    elif log_format is LogFormat.PLAIN:
        handler = LineHandler(sys.stdout)
        handler.setFormatter(PlainFormatter())
    else:
        from rich.logging import RichHandler

        handler = RichHandler()
        handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
    return handler


def configure_logging(level: LogLevel, log_format: LogFormat) -> logging.Handler:
    """Send the root logger's records at ``level`` and above to standard
    output in ``log_format``; returns the handler installed."""
    root = logging.getLogger()
    handler = _handler(log_format)
    root.addHandler(handler)
    root.setLevel(level.value)
    return handler


@contextmanager
def logging_configured(level: LogLevel, log_format: LogFormat) -> Iterator[logging.Handler]:
    """``configure_logging`` for the length of a command: on the way out the
    root logger gets its level back and loses the handler, so a command run
    inside a longer process (a test, a notebook) leaves no handler behind
    writing to a stream that may since have closed."""
    root = logging.getLogger()
    level_before = root.level
    handler = configure_logging(level, log_format)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level_before)
