"""What ``worker_logs`` keeps from run to run gives the texts it would
compute afresh: the ``[   12ms]`` of a duration, ``docket.when``, the
``call`` text; and a run's end record shares nothing with its start record."""

from __future__ import annotations

import logging
import math
import random
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Annotated

import pytest

from docket_core import Docket, Logged
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
