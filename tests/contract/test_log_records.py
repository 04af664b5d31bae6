"""The records of the per-run lines (``worker_logs._emit``): made from a
template rather than by ``Logger.info``, they must be ``LogRecord``s a
handler or formatter cannot tell apart from ordinary ones, and an
application's own record factory still makes them."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import finish, make_worker

from docket_core import Docket

pytestmark = pytest.mark.anyio

#: what every record has, and what the lines' ``extra`` adds
EXTRA = {
    "docket.name",
    "docket.worker",
    "docket.task",
    "docket.key",
    "docket.when",
    "docket.attempt",
    "punctuality",
}


@pytest.fixture
def info(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="docket.worker")
    return caplog


def run_records(caplog: pytest.LogCaptureFixture, key: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "docket.worker" and r.__dict__.get("docket.key") == key
    ]


async def test_run_lines_are_records_like_any_other(
    docket: Docket, info: pytest.LogCaptureFixture
) -> None:
    async def quiet() -> None:
        pass

    execution = await docket.add(quiet)()
    before = time.time()
    await finish(make_worker(docket))
    after = time.time()
    start, end = run_records(info, execution.key)

    reference = logging.getLogger("docket.worker").makeRecord(
        "docket.worker", logging.INFO, __file__, 1, "m", (), None, "f"
    )
    for record, site in ((start, "log_start"), (end, "log_end")):
        assert type(record) is logging.LogRecord
        assert set(record.__dict__) >= set(reference.__dict__) | EXTRA
        assert (record.levelno, record.levelname) == (logging.INFO, "INFO")
        assert record.funcName == site
        assert record.pathname.endswith("worker_logs.py")
        assert record.module == "worker_logs"
        assert (record.thread, record.process) == (threading.get_ident(), os.getpid())
        assert before <= record.created <= after
        assert record.msecs == int((record.created - int(record.created)) * 1000)
        # relativeCreated counts from logging's start, as the reference's does
        elapsed = (reference.created - record.created) * 1000
        assert abs(reference.relativeCreated - record.relativeCreated - elapsed) < 1
        assert record.exc_info is None and record.stack_info is None
        formatted = logging.Formatter(
            "%(asctime)s.%(msecs)03d %(relativeCreated)d %(levelname)s %(name)s "
            "%(module)s:%(lineno)d %(threadName)s %(processName)s %(message)s"
        ).format(record)
        assert formatted.endswith(record.getMessage())
    assert start.getMessage().startswith("↪ [")
    assert end.getMessage().startswith("↩ [")
    assert "duration" in end.__dict__ and "duration" not in start.__dict__


@pytest.fixture
def tagging_factory() -> Iterator[list[str]]:
    made: list[str] = []
    original = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = original(*args, **kwargs)
        record.tagged = True
        made.append(record.name)
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield made
    finally:
        logging.setLogRecordFactory(original)


async def test_an_applications_record_factory_makes_the_run_lines(
    docket: Docket, info: pytest.LogCaptureFixture, tagging_factory: list[str]
) -> None:
    async def quiet() -> None:
        pass

    execution = await docket.add(quiet)()
    await finish(make_worker(docket))
    start, end = run_records(info, execution.key)
    assert start.__dict__.get("tagged") and end.__dict__.get("tagged")
    assert (start.funcName, end.funcName) == ("log_start", "log_end")
    assert start.__dict__["docket.key"] == execution.key
