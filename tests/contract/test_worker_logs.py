"""The worker's log lines, in pydocket's format, on every contract backend.

``docket.worker`` logs a banner listing the tasks, then ``↪``/``↬`` when a run
starts and ``↩``/``↫`` when it ends (a failure at ERROR, with its traceback),
``🗙`` at WARNING for a struck delivery; every record carries pydocket's
``extra`` fields.  Checked with ``caplog``."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated

import anyio
import pytest
from helpers import finish, key, make_worker, running

import docket_core
from docket_core import (
    Depends,
    Docket,
    Execution,
    ExecutionState,
    Perpetual,
    Retry,
    Timeout,
    Worker,
)
from docket_core.annotations import Logged
from docket_core.worker_logs import compact_signature, ms

pytestmark = pytest.mark.anyio

#: a duration as the lines show it: ``[     3ms]`` or ``[   120s ]``
DURATION = r"\[ *\d+(ms|s )\]"


def worker_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "docket.worker"]


def run_lines(caplog: pytest.LogCaptureFixture, k: str) -> list[logging.LogRecord]:
    """The records of the runs of key ``k``, in order."""
    return [r for r in worker_lines(caplog) if r.__dict__.get("docket.key") == k]


def shape(record: logging.LogRecord) -> tuple[str, str]:
    """(level, message with the duration blanked)."""
    return record.levelname, re.sub(DURATION, "[]", record.getMessage())


@pytest.fixture
def info(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="docket.worker")
    return caplog


# -- the banner ------------------------------------------------------------------------


async def test_the_banner_lists_the_tasks(docket: Docket, info: pytest.LogCaptureFixture) -> None:
    async def greet(
        name: Annotated[str, Logged],
        times: int = 2,
        retry: Retry = Retry(attempts=3),
    ) -> None:
        pass

    docket.register(greet)
    worker = make_worker(docket, name="banner-worker")
    await finish(worker)
    messages = [r.getMessage() for r in worker_lines(info)]
    start = messages.index("Starting worker 'banner-worker' with the following tasks:")
    listed = messages[start + 1 : start + 1 + len(docket.tasks)]
    assert "* greet(name: str, times: int = 2, ...)" in listed
    assert all(line.startswith("* ") for line in listed)
    assert {line[2:].split("(")[0] for line in listed} == set(docket.tasks)


def test_compact_signatures() -> None:
    async def plain(a, b=None, *rest, **extra):  # type: ignore[no-untyped-def]
        pass

    async def typed(
        when: float, items: list[int], maybe: int | None = None, key: str = docket_core.TaskKey()
    ) -> None:
        pass

    assert compact_signature(plain) == "a, b = None, *rest, **extra"
    expected = "when: float, items: list[int], maybe: int | None = None, ..."
    assert compact_signature(typed) == expected


def test_durations_are_formatted_as_pydocket_does() -> None:
    assert ms(0.0123) == "    12ms"
    assert ms(99.9) == " 99900ms"
    assert ms(120) == "   120s "


# -- one run ---------------------------------------------------------------------------


async def test_a_success_logs_a_start_and_an_end_line_with_extras(
    docket: Docket, info: pytest.LogCaptureFixture
) -> None:
    async def quick(a: int) -> int:
        return a

    k = key()
    execution = await docket.add(quick, key=k)(1)
    worker = make_worker(docket, name="extras-worker")
    await finish(worker)
    start, end = run_lines(info, k)
    assert shape(start) == ("INFO", f"↪ [] quick(...){{{k}}}")
    assert shape(end) == ("INFO", f"↩ [] quick(...){{{k}}}")
    assert re.fullmatch(rf"↪ {DURATION} quick\(\.\.\.\)\{{{k}\}}", start.getMessage())
    for record in (start, end):
        assert record.__dict__["docket.name"] == docket.name
        assert record.__dict__["docket.worker"] == "extras-worker"
        assert record.__dict__["docket.task"] == "quick"
        assert record.__dict__["docket.key"] == k
        assert record.__dict__["docket.attempt"] == 1
        assert record.__dict__["docket.when"] == execution.when.isoformat()
        assert isinstance(record.__dict__["punctuality"], float)
        assert record.exc_info is None
    assert not hasattr(start, "duration")
    assert 0 <= end.__dict__["duration"] < 2


async def test_a_failure_logs_its_end_line_with_the_traceback(
    docket: Docket, info: pytest.LogCaptureFixture
) -> None:
    async def breaks(n: int) -> None:
        raise ValueError(f"broken {n}")

    k = key()
    await docket.add(breaks, key=k)(3)
    await finish(make_worker(docket))
    start, end = run_lines(info, k)
    assert shape(start) == ("INFO", f"↪ [] breaks(...){{{k}}}")
    assert shape(end) == ("ERROR", f"↩ [] breaks(...){{{k}}}")
    assert end.exc_info is not None and end.exc_info[0] is ValueError
    assert "Traceback (most recent call last)" in info.text
    assert "ValueError: broken 3" in info.text
    assert end.__dict__["docket.key"] == k


async def test_a_retry_logs_the_retry_arrows(
    docket: Docket, info: pytest.LogCaptureFixture
) -> None:
    attempts: list[int] = []

    async def flaky(retry: Retry = Retry(attempts=2)) -> None:
        attempts.append(retry.attempt)
        if retry.attempt == 1:
            raise RuntimeError("first try fails")

    k = key()
    await docket.add(flaky, key=k)()
    await finish(make_worker(docket))
    assert attempts == [1, 2]
    call = f"flaky(){{{k}}}"
    assert [shape(r) for r in run_lines(info, k)] == [
        ("INFO", f"↪ [] {call}"),
        ("ERROR", f"↫ [] {call}"),
        ("INFO", f"↬ [] {call}"),
        ("INFO", f"↩ [] {call}"),
    ]
    assert [r.__dict__["docket.attempt"] for r in run_lines(info, k)] == [1, 1, 2, 2]


async def test_a_last_failed_attempt_ends_with_the_plain_arrow(
    docket: Docket, info: pytest.LogCaptureFixture
) -> None:
    async def hopeless(retry: Retry = Retry(attempts=2)) -> None:
        raise RuntimeError("never works")

    k = key()
    await docket.add(hopeless, key=k)()
    await finish(make_worker(docket))
    levels_and_arrows = [(r.levelname, r.getMessage()[0]) for r in run_lines(info, k)]
    assert levels_and_arrows == [("INFO", "↪"), ("ERROR", "↫"), ("INFO", "↬"), ("ERROR", "↩")]


async def test_a_perpetual_follow_up_ends_with_the_rescheduled_arrow_and_a_strike_warns(
    docket: Docket, info: pytest.LogCaptureFixture
) -> None:
    async def tick(perpetual: Perpetual = Perpetual(every=timedelta(milliseconds=10))) -> None:
        pass

    k = key()
    await docket.add(tick, key=k)()
    with anyio.fail_after(5):
        await make_worker(docket).run_at_most({k: 2})
    call = f"tick(){{{k}}}"
    assert [shape(r) for r in run_lines(info, k)] == [
        ("INFO", f"↪ [] {call}"),
        ("INFO", f"↫ [] {call}"),
        ("INFO", f"↪ [] {call}"),
        ("INFO", f"↫ [] {call}"),
        ("WARNING", f"🗙 {call}"),
    ]


async def test_a_struck_task_logs_a_warning(docket: Docket, info: pytest.LogCaptureFixture) -> None:
    async def victim(customer: Annotated[int, Logged]) -> None:
        raise AssertionError("never runs")

    k = key()
    await docket.add(victim, key=k)(7)
    await docket.strike(victim)
    await finish(make_worker(docket, name="striking-worker"))
    (struck,) = run_lines(info, k)
    assert (struck.levelname, struck.getMessage()) == ("WARNING", f"🗙 victim(7){{{k}}}")
    assert struck.__dict__["docket.worker"] == "striking-worker"
    assert struck.__dict__["docket.task"] == "victim"


async def test_a_cancelled_run_ends_with_a_cross(
    docket: Docket, worker: Worker, info: pytest.LogCaptureFixture
) -> None:
    started = anyio.Event()

    async def endless() -> None:
        started.set()
        await anyio.sleep_forever()

    k = key()
    async with running(worker):
        execution = await docket.add(endless, key=k)()
        await started.wait()
        await docket.cancel(k)
        with pytest.raises(docket_core.ExecutionCancelled):
            await execution.get_result(timeout=timedelta(seconds=2))
        with anyio.fail_after(2):
            while len(run_lines(info, k)) < 2:
                await anyio.sleep(0.01)
    assert [shape(r) for r in run_lines(info, k)] == [
        ("INFO", f"↪ [] endless(){{{k}}}"),
        ("INFO", f"✗ [] endless(){{{k}}} (cancelled)"),
    ]


async def test_a_timed_out_run_ends_at_error_with_a_timeout_error(
    docket: Docket, info: pytest.LogCaptureFixture
) -> None:
    async def slow(timeout: Timeout = Timeout(timedelta(milliseconds=50))) -> None:
        await anyio.sleep(5)

    k = key()
    await docket.add(slow, key=k)()
    await finish(make_worker(docket), limit=5)
    _, end = run_lines(info, k)
    assert shape(end) == ("ERROR", f"↩ [] slow(){{{k}}}")
    assert end.exc_info is not None and end.exc_info[0] is TimeoutError


# -- Logged ----------------------------------------------------------------------------


async def test_logged_arguments_show_and_others_do_not(
    docket: Docket, info: pytest.LogCaptureFixture
) -> None:
    async def shown(
        customer: Annotated[int, Logged],
        items: Annotated[list[int], Logged(length_only=True)],
        mapping: Annotated[dict[str, int], Logged(length_only=True)],
        pair: Annotated[tuple[int, ...], Logged(length_only=True)],
        members: Annotated[set[int], Logged(length_only=True)],
        label: Annotated[str, Logged()],
        password: str,
        note: str = "",
    ) -> None:
        pass

    k = key()
    arguments = (42, [1, 2], {"a": 1, "b": 2}, (1, 2), {1, 2, 3}, "x", "hunter2")
    await docket.add(shown, key=k)(*arguments, note="secret")
    await finish(make_worker(docket))
    expected = f"shown(42, [len 2], {{len 2}}, (len 2), {{len 3}}, 'x', ..., note=...){{{k}}}"
    assert [r.getMessage().split("] ", 1)[1] for r in run_lines(info, k)] == [expected] * 2
    assert "hunter2" not in info.text and "secret" not in info.text


def test_logged_lives_in_annotations_and_at_the_top() -> None:
    assert docket_core.Logged is Logged
    assert Logged(length_only=True).format("abc") == "[len 3]"
    assert Logged(length_only=True).format(7) == "7"
    assert Logged().format({"a": 1}) == "{'a': 1}"


async def test_call_repr_is_built_once_a_run_and_not_at_all_when_info_is_off(
    docket: Docket, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    original: Callable[[Execution], str] = Execution.call_repr

    def counting(self: Execution) -> str:
        calls.append(self.key)
        return original(self)

    monkeypatch.setattr(Execution, "call_repr", counting)

    async def quiet() -> None:
        pass

    caplog.set_level(logging.WARNING, logger="docket.worker")
    await docket.add(quiet)()
    await finish(make_worker(docket))
    assert calls == []
    caplog.set_level(logging.INFO, logger="docket.worker")
    k = key()
    await docket.add(quiet, key=k)()
    await finish(make_worker(docket))
    assert calls == [k]
    assert len(run_lines(caplog, k)) == 2


# -- dependencies that fail ------------------------------------------------------------


async def test_a_dependency_failure_fails_the_task_and_names_the_parameters(
    docket: Docket, info: pytest.LogCaptureFixture
) -> None:
    ran: list[bool] = []

    async def no_database() -> str:
        raise ConnectionError("database is down")

    def no_cache() -> str:
        raise LookupError("cache is gone")

    def fine() -> str:
        return "ok"

    async def needs(
        a: str = Depends(no_database), ok: str = Depends(fine), b: str = Depends(no_cache)
    ) -> None:
        ran.append(True)

    k = key()
    execution = await docket.add(needs, key=k)()
    await finish(make_worker(docket))
    assert ran == []
    stored = await docket.get_execution(k)
    assert stored is not None and stored.state is ExecutionState.FAILED
    assert stored.error is not None
    assert stored.error.startswith(
        "ExceptionGroup: Failed to resolve dependencies for parameter(s): a, b"
    )
    assert "database is down" in stored.error and "cache is gone" in stored.error
    with pytest.raises(ExceptionGroup) as raised:
        await execution.get_result(timeout=timedelta(seconds=1))
    assert raised.value.message == "Failed to resolve dependencies for parameter(s): a, b"
    assert [type(e) for e in raised.value.exceptions] == [ConnectionError, LookupError]

    _, end = run_lines(info, k)
    assert shape(end) == ("ERROR", f"↩ [] needs(){{{k}}}")
    assert end.exc_info is not None and end.exc_info[0] is ExceptionGroup
    assert "Failed to resolve dependencies for parameter(s): a, b" in info.text
    assert "ConnectionError: database is down" in info.text
    assert "LookupError: cache is gone" in info.text


async def test_a_dependency_failure_still_retries(
    docket: Docket, info: pytest.LogCaptureFixture
) -> None:
    attempts: list[int] = []

    def flaky_resource(execution: Execution = docket_core.CurrentExecution()) -> str:
        attempts.append(execution.attempt)
        if execution.attempt == 1:
            raise ConnectionError("not yet")
        return "ready"

    async def uses(
        resource: str = Depends(flaky_resource), retry: Retry = Retry(attempts=2)
    ) -> str:
        return resource

    k = key()
    execution = await docket.add(uses, key=k)()
    await finish(make_worker(docket))
    assert await execution.get_result(timeout=timedelta(seconds=1)) == "ready"
    assert attempts == [1, 2]
    assert [r.getMessage()[0] for r in run_lines(info, k)] == ["↪", "↫", "↬", "↩"]
