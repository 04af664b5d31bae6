"""What ``worker_logs`` keeps from run to run gives the texts it would
compute afresh: the ``[   12ms]`` of a duration, ``docket.when``, the
``call`` text; and a run's end record shares nothing with its start record."""

from __future__ import annotations

import io
import logging
import math
import random
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from typing import Annotated

import pytest

from docket_core import Docket, Logged
from docket_core.cli.logs import LineHandler, PlainFormatter
from docket_core.execution import Execution
from docket_core.worker_logs import (
    _call_text,
    _shown,
    _when_text,
    log_end,
    log_start,
    ms,
    worker_extra,
)

pytestmark = pytest.mark.anyio


def test_kept_durations_read_as_ms_has_them() -> None:
    rng = random.Random(7)
    values = [rng.random() * 10 for _ in range(20_000)]
    values += [rng.random() / 100 for _ in range(20_000)]
    for whole in range(0, 10_000, 3):  # exact halves round to even, and their neighbours
        half = (whole + 0.5) / 1000
        values += [half, math.nextafter(half, 0), math.nextafter(half, 1)]
    values += [-0.0, 0.0, 5e-324, -0.0004, -1.0, 9.9995, 10.0, 99.9, 120.0, math.inf, math.nan]
    for seconds in values:
        assert _shown(seconds) == ms(seconds), seconds


def test_kept_seconds_read_as_isoformat_has_them() -> None:
    rng = random.Random(7)
    start = datetime(2025, 3, 1, 23, 59, 58, tzinfo=UTC)
    times = [start + timedelta(microseconds=37 * step) for step in range(100_000)]
    times += [datetime.fromtimestamp(rng.uniform(0, 4.2e9), UTC) for _ in range(20_000)]
    times += [
        datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(2096, 10, 2, 7, 6, 39, 999_999, tzinfo=UTC),
        datetime(2300, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        datetime(2025, 1, 1, tzinfo=timezone(timedelta(hours=2))),
        datetime(2025, 1, 1, 12, 0, 0, 5),
    ]
    for when in times:
        assert _when_text(when) == when.isoformat(), repr(when)


@pytest.fixture
async def docket() -> AsyncIterator[Docket]:
    name = f"log-shortcuts-{uuid.uuid4().hex}"
    async with Docket(name=name, url=f"memory://{name}") as docket:
        yield docket


async def test_kept_call_texts_read_as_call_repr_has_them(docket: Docket) -> None:
    async def plain(a: int, b: int = 0, *rest: int, **named: int) -> None: ...

    async def shown(a: Annotated[int, Logged], b: int = 0) -> None: ...

    calls = [
        (plain, (1,), {}),
        (plain, (2,), {}),
        (plain, (1, 2), {}),
        (plain, (1, 2, 3), {}),
        (plain, (1,), {"b": 2}),
        (plain, (1,), {"x": 2}),
        (plain, (1,), {"b": 2, "x": 3}),
        (plain, (1,), {"x": 3, "b": 2}),
        (plain, (3,), {}),
        (shown, (1,), {}),
        (shown, (2,), {}),
        (shown, (2,), {"b": 5}),
    ]
    for function, args, kwargs in calls * 2:
        execution = await docket.add(function)(*args, **kwargs)
        expected = execution.call_repr()
        assert _call_text(execution, execution.function_name, execution.key) == expected


async def test_the_end_record_shares_nothing_with_the_start_record(
    docket: Docket, caplog: pytest.LogCaptureFixture
) -> None:
    class Scribbling(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            record.scribbled = record.getMessage()

    async def task() -> None: ...

    caplog.set_level(logging.INFO, logger="docket.worker")
    scribbling = Scribbling()
    logging.getLogger("docket.worker").addHandler(scribbling)
    try:
        execution = await docket.add(task)()
        base = worker_extra(docket.name, "w")
        line = log_start(execution, base, 0.25)
        log_end(line, execution, base, 0.25, 0.5, rescheduled=False)
    finally:
        logging.getLogger("docket.worker").removeHandler(scribbling)
    start, end = (r for r in caplog.records if r.__dict__.get("docket.key") == execution.key)
    assert start.__dict__ is not end.__dict__
    assert start.getMessage().startswith("↪ [   250ms]") and "duration" not in start.__dict__
    assert end.getMessage().startswith("↩ [   500ms]") and end.__dict__["duration"] == 0.5
    assert end.__dict__["scribbled"] == end.getMessage()  # (its own, not the start's)
    assert (start.funcName, end.funcName) == ("log_start", "log_end")
    assert start.lineno != end.lineno


class _Counting(LineHandler):
    """The CLI's handler, counting the records its formatter is handed
    (it changes neither ``handle`` nor ``emit``: lines may go straight)."""

    def __init__(self, stream: io.StringIO) -> None:
        super().__init__(stream)
        formatter = PlainFormatter()
        plain = formatter.format
        self.records = 0

        def counted(record: logging.LogRecord) -> str:
            self.records += 1
            return plain(record)

        formatter.format = counted  # type: ignore[method-assign]
        self.setFormatter(formatter)


class _Emitting(LineHandler):
    """A handler of the CLI's class that emits its own way: it takes records."""

    def __init__(self, stream: io.StringIO) -> None:
        super().__init__(stream)
        self.setFormatter(PlainFormatter())
        self.emitted: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.emitted.append(record.getMessage())
        super().emit(record)


@contextmanager
def _alone_on_the_worker_logger(*handlers: logging.Handler) -> Iterator[logging.Logger]:
    """``docket.worker`` at INFO with these handlers and no propagation
    (put back as it was, the handlers closed, at the end)."""
    log = logging.getLogger("docket.worker")
    saved = (log.level, log.propagate)
    log.setLevel(logging.INFO)
    log.propagate = False
    for handler in handlers:
        log.addHandler(handler)
    try:
        yield log
    finally:
        for handler in handlers:
            log.removeHandler(handler)
            handler.close()
        log.setLevel(saved[0])
        log.propagate = saved[1]


def _lines(docket: Docket, execution: Execution, extra: logging.Handler | None) -> tuple[str, int]:
    """Two runs' start and end lines, through ``docket.worker``
    with the CLI's handler alone on it (and ``extra`` beside it); what the
    handler wrote (its times blanked) and how many records it was handed."""
    stream = io.StringIO()
    handler = _Counting(stream)
    with _alone_on_the_worker_logger(handler, *([extra] if extra is not None else [])):
        base = worker_extra(docket.name, "w")
        for punctuality, duration, rescheduled in [(0.25, 0.5, False), (0.003, 12.0, True)]:
            line = log_start(execution, base, punctuality)
            log_end(line, execution, base, punctuality, duration, rescheduled=rescheduled)
        written = stream.getvalue()
    return re.sub(r"^\[[^]]*\]", "[time]", written, flags=re.M), handler.records


async def test_run_lines_go_straight_to_the_one_line_handler_as_records_would(
    docket: Docket,
) -> None:
    """The CLI's handler alone on the way takes a run's lines as text (no
    record is made), and writes what it writes of their records when
    another handler beside it makes them go as records."""

    async def task(a: int) -> None: ...

    execution = await docket.add(task, key="the-key")(1)
    straight, handed = _lines(docket, execution, None)
    as_records, handed_records = _lines(docket, execution, logging.NullHandler())
    assert (handed, handed_records) == (0, 4)
    assert straight == as_records
    assert straight.splitlines() == [
        "[time] INFO - docket.worker - ↪ [   250ms] task(...){the-key}",
        "[time] INFO - docket.worker - ↩ [   500ms] task(...){the-key}",
        "[time] INFO - docket.worker - ↪ [     3ms] task(...){the-key}",
        "[time] INFO - docket.worker - ↫ [ 12000ms] task(...){the-key}",
    ]


async def test_an_end_line_after_a_straight_start_carries_the_run_fields(
    docket: Docket, caplog: pytest.LogCaptureFixture
) -> None:
    """A start line went straight (no record); a handler came before the
    end: the end record still carries every field of the run."""

    async def task() -> None: ...

    execution = await docket.add(task, key="k")()
    handler = _Counting(io.StringIO())
    with _alone_on_the_worker_logger(handler) as log:
        base = worker_extra(docket.name, "w")
        line = log_start(execution, base, 0.25)
        assert handler.records == 0
        log.propagate = True
        caplog.set_level(logging.INFO, logger="docket.worker")
        log_end(line, execution, base, 0.25, 0.5, rescheduled=False)
    (end,) = (r for r in caplog.records if r.__dict__.get("docket.key") == "k")
    fields = {name: end.__dict__[name] for name in ("docket.task", "docket.when", "punctuality")}
    assert fields == {
        "docket.task": "task",
        "docket.when": execution.when.isoformat(),
        "punctuality": 0.25,
    }
    assert (end.__dict__["docket.attempt"], end.__dict__["duration"]) == (1, 0.5)
    assert end.getMessage() == "↩ [   500ms] task(){k}" and handler.records == 1


async def test_a_line_handler_subclass_that_emits_its_own_way_gets_records(
    docket: Docket,
) -> None:
    async def task() -> None: ...

    execution = await docket.add(task, key="k")()
    handler = _Emitting(io.StringIO())
    with _alone_on_the_worker_logger(handler):
        base = worker_extra(docket.name, "w")
        line = log_start(execution, base, 0.25)
        log_end(line, execution, base, 0.25, 0.5, rescheduled=False)
    assert handler.emitted == ["↪ [   250ms] task(){k}", "↩ [   500ms] task(){k}"]
