"""The CLI's ``plain`` logging made cheap: ``PlainFormatter`` writes what
``logging.Formatter`` with the same format writes, and ``LineHandler``
writes every line but flushes lines below WARNING a moment later."""

from __future__ import annotations

import copy
import io
import logging
import sys
import time

import pytest

from docket_core.cli.logs import (
    LineHandler,
    LogFormat,
    LogLevel,
    PlainFormatter,
    configure_logging,
)


def _records() -> list[logging.LogRecord]:
    make = logging.getLogger("docket.worker").makeRecord
    try:
        raise ValueError("broken")
    except ValueError:
        stack = "Stack (most recent call last):\n  here"
        args = ("  1ms", "job(...)")
        failed = make(
            "docket.worker", logging.ERROR, "f.py", 3, "↩ [%s] %s", args, sys.exc_info(),
            "log_end", None, stack,
        )  # fmt: skip
    records = [
        make("docket.worker", logging.INFO, "f.py", 1, "%s [%s] %s", ("↪", "  1ms", "j()"), None),
        make("docket", logging.WARNING, "f.py", 1, "plain text", (), None),
        make("other", logging.DEBUG, "f.py", 1, "multi\nline %d", (5,), None),
        make("other", logging.INFO, "f.py", 1, "%(k)s", ({"k": 1},), None),
        make("other", logging.INFO, "f.py", 1, 42, (), None),
        failed,
    ]
    timed = []
    for created in (0.25, 0.75, 1.0, 59.999, 1_700_000_000.5, 1_700_000_001.0):
        for record in records:
            record = copy.copy(record)
            record.created = created
            timed.append(record)
    return timed


def test_the_plain_formatter_writes_what_logging_formatter_writes() -> None:
    standard = logging.Formatter(PlainFormatter.FORMAT, datefmt=PlainFormatter.DATE_FORMAT)
    fast = PlainFormatter()
    for record in _records():
        expected, mine = copy.copy(record), copy.copy(record)
        assert fast.format(mine) == standard.format(expected)
        assert mine.__dict__ == expected.__dict__  # (message, asctime, exc_text)


class _Raw(io.RawIOBase):  # (a file's raw stream)
    """What reached the file: the bytes flushed so far."""

    def __init__(self) -> None:
        self.flushed = b""

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.flushed += bytes(data)
        return len(data)


def _handler() -> tuple[LineHandler, _Raw]:
    raw = _Raw()
    buffered = io.BufferedWriter(raw)  # type: ignore[type-var]
    handler = LineHandler(io.TextIOWrapper(buffered, encoding="utf-8"))
    handler.FLUSH_DELAY = 0.05
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    return handler, raw


def _log(handler: logging.Handler, level: int, message: str) -> None:
    record = logging.getLogger("t").makeRecord("t", level, "f.py", 1, message, (), None)
    handler.handle(record)


def test_info_lines_are_flushed_a_moment_later_and_warnings_at_once() -> None:
    handler, raw = _handler()
    try:
        _log(handler, logging.INFO, "↪ one")
        _log(handler, logging.INFO, "two")
        assert raw.flushed == b""  # written, not flushed yet
        deadline = time.monotonic() + 5
        while not raw.flushed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert raw.flushed.decode() == "INFO ↪ one\nINFO two\n"
        _log(handler, logging.INFO, "three")
        _log(handler, logging.WARNING, "four")
        assert raw.flushed.decode().endswith("INFO three\nWARNING four\n")
        _log(handler, logging.INFO, "five")
    finally:
        handler.close()
    assert raw.flushed.decode().endswith("WARNING four\nINFO five\n")  # closing flushes


def test_the_line_handler_applies_its_filters_and_flushes_on_demand() -> None:
    handler, raw = _handler()
    handler.addFilter(lambda record: "secret" not in record.getMessage())
    try:
        _log(handler, logging.INFO, "a secret")
        _log(handler, logging.INFO, "public")
        handler.flush()
        assert raw.flushed.decode() == "INFO public\n"
    finally:
        handler.close()


@pytest.mark.parametrize("log_format", [LogFormat.PLAIN, LogFormat.JSON])
def test_the_cli_installs_the_line_handler(log_format: LogFormat) -> None:
    root = logging.getLogger()
    level = root.level
    handler = configure_logging(LogLevel.INFO, log_format)
    try:
        assert isinstance(handler, LineHandler)
        assert isinstance(handler.formatter, PlainFormatter) == (log_format is LogFormat.PLAIN)
    finally:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(level)


def _plain() -> tuple[LineHandler, _Raw]:
    handler, raw = _handler()
    handler.setFormatter(PlainFormatter())
    return handler, raw


def test_a_message_written_straight_reads_as_its_record_reads() -> None:
    """``write_message`` writes the line ``handle`` writes for a record of
    that time, level, logger and message (no traceback, no stack)."""
    straight, straight_raw = _plain()
    handled, handled_raw = _plain()
    try:
        written = 0
        for record in _records():
            if record.exc_info or record.stack_info:
                continue
            assert straight.write_message(
                record.created, record.levelno, record.name, record.getMessage()
            )
            handled.handle(record)
            written += 1
        straight.flush()
        handled.flush()
    finally:
        straight.close()
        handled.close()
    assert written >= 20
    assert straight_raw.flushed == handled_raw.flushed
    assert len(straight_raw.flushed.decode().splitlines()) > written  # (a multi-line message)


def test_a_handler_that_would_show_more_than_the_text_takes_a_record() -> None:
    """``write_message`` declines, writing nothing, when the record could
    show more than its text: another formatter, a filter, a level above."""
    other = _handler()  # (``%(levelname)s %(message)s``: not a ``PlainFormatter``)
    filtered = _plain()
    filtered[0].addFilter(lambda record: True)
    above = _plain()
    above[0].setLevel(logging.WARNING)
    try:
        for handler, _ in (other, filtered, above):
            assert not handler.write_message(1.0, logging.INFO, "docket.worker", "↪ x")
        assert above[0].write_message(1.0, logging.ERROR, "docket.worker", "↩ y")
        for handler, _ in (other, filtered, above):
            handler.flush()
    finally:
        for handler, _ in (other, filtered, above):
            handler.close()
    assert other[1].flushed == filtered[1].flushed == b""
    assert above[1].flushed.decode().endswith("ERROR - docket.worker - ↩ y\n")


def test_a_line_that_cannot_be_written_is_reported_as_a_record_would_be(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A time the formatter cannot show (or a broken stream) goes to
    ``handleError``, as ``emit`` sends it: nothing reaches the caller."""
    handler, raw = _plain()
    try:
        assert handler.write_message(1e300, logging.INFO, "docket.worker", "↪ late")
        handler.flush()
    finally:
        handler.close()
    assert raw.flushed == b""
    assert "↪ late" in capsys.readouterr().err


def test_a_closed_handler_declines_and_a_renamed_level_shows_its_new_name() -> None:
    """``write_message`` of a closed handler writes nothing (the caller
    logs a record, as it would to any handler); a level renamed with
    ``logging.addLevelName`` shows its new name, as a record's line does."""
    closed, closed_raw = _plain()
    closed.close()
    assert not closed.write_message(1.0, logging.INFO, "docket.worker", "↪ x")
    assert closed_raw.flushed == b""
    renamed, raw = _plain()
    logging.addLevelName(logging.INFO, "NOTE")
    try:
        assert renamed.write_message(1.0, logging.INFO, "docket.worker", "↪ y")
        renamed.flush()
    finally:
        logging.addLevelName(logging.INFO, "INFO")
        logging._nameToLevel.pop("NOTE", None)  # (what addLevelName left behind)
        renamed.close()
    assert raw.flushed.decode().endswith("NOTE - docket.worker - ↪ y\n")
