"""Behaviours a user porting from pydocket meets, on every contract backend,
checked against pydocket 0.27's documentation and source: how a perpetual
run's failure is recorded, a retry that gives way to a ``replace``, a
``Retry`` the caller passes, ``TaskArgument()`` without a name, and when (and
as what type) a misdeclared task is refused.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from helpers import finish, key, loaded, running

from docket_core import (
    ConcurrencyLimit,
    CurrentExecution,
    Depends,
    Docket,
    Execution,
    ExecutionState,
    ExponentialRetry,
    Perpetual,
    Progress,
    Retry,
    TaskArgument,
    Worker,
)

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def watching(execution: Execution) -> AsyncIterator[list[dict[str, Any]]]:
    """Collect ``execution``'s state events for the duration of the block
    (subscribed when the block starts)."""
    events: list[dict[str, Any]] = []
    subscribed = anyio.Event()

    async def listen() -> None:
        async for event in execution.subscribe():
            if event["type"] == "state":
                events.append(event)
                subscribed.set()

    async with anyio.create_task_group() as group:
        group.start_soon(listen)
        with anyio.fail_after(2):
            await subscribed.wait()  # the first event is the current state
        yield events
        group.cancel_scope.cancel()


async def until(condition: Any, limit: float = 3.0) -> None:
    with anyio.fail_after(limit):
        while not condition():
            await anyio.sleep(0.005)


# -- Perpetual ------------------------------------------------------------------------


async def test_a_failed_perpetual_run_is_recorded_failed_and_the_next_run_still_comes(
    docket: Docket, worker: Worker
) -> None:
    runs: list[int] = []

    async def shaky(perpetual: Perpetual = Perpetual(every=timedelta(hours=1))) -> None:
        runs.append(1)
        raise RuntimeError("shaky")

    k = key()
    execution = await docket.add(shaky, key=k)()
    async with watching(execution) as events, running(worker):
        await until(lambda: [e["state"] for e in events][-2:] == ["failed", "scheduled"])
    assert runs == [1]
    states = [e["state"] for e in events]
    assert states[-4:] == ["queued", "running", "failed", "scheduled"], states
    failed = events[-2]
    assert failed["error"] == "RuntimeError: shaky"
    assert "completed_at" in failed
    # the next run is scheduled an hour on: the record is now that run's
    assert events[-1]["when"] >= failed["completed_at"] + 3590
    assert (await loaded(docket, k)).state is ExecutionState.SCHEDULED
    assert [e.key for e in (await docket.snapshot()).future] == [k]


async def test_a_successful_perpetual_run_is_recorded_completed_before_the_next(
    docket: Docket, worker: Worker
) -> None:

    async def steady(perpetual: Perpetual = Perpetual(every=timedelta(hours=1))) -> None:
        pass

    execution = await docket.add(steady, key=key())()
    async with watching(execution) as events, running(worker):
        await until(lambda: [e["state"] for e in events][-2:] == ["completed", "scheduled"])
    assert "error" not in events[-2]


# -- Retry ----------------------------------------------------------------------------


async def test_a_retry_gives_way_to_a_replace_made_while_it_waited(
    docket: Docket, worker: Worker
) -> None:
    calls: list[tuple[str, int]] = []

    async def flaky(
        label: str,
        retry: Retry = Retry(attempts=3, delay=timedelta(milliseconds=300)),
    ) -> str:
        calls.append((label, retry.attempt))
        if label == "first":
            raise RuntimeError("first fails")
        return label

    k = key()
    await docket.add(flaky, key=k)("first")
    async with running(worker):
        await until(lambda: calls == [("first", 1)])
        with anyio.fail_after(2):
            while (record := await loaded(docket, k)).attempt != 2:
                await anyio.sleep(0.005)
        assert record.state is ExecutionState.SCHEDULED  # the retry waits
        replacement = await docket.replace(flaky, datetime.now(UTC), k)("second")
        assert await replacement.get_result(timeout=timedelta(seconds=2)) == "second"
        await anyio.sleep(0.5)  # well past the time the retry was due
    assert calls == [("first", 1), ("second", 1)]
    done = await loaded(docket, k)
    assert (done.state, done.attempt) == (ExecutionState.COMPLETED, 1)


async def test_a_retry_passed_by_the_caller_is_used_instead_of_the_default(
    docket: Docket, worker: Worker
) -> None:
    seen: list[tuple[int, int | None]] = []

    async def flaky(
        retry: Retry = Retry(attempts=1), execution: Execution = CurrentExecution()
    ) -> None:
        seen.append((execution.attempt, retry.attempts))
        raise RuntimeError(f"attempt {execution.attempt}")

    k = key()
    await docket.add(flaky, key=k)(retry=Retry(attempts=3, delay=timedelta(milliseconds=10)))
    await finish(worker)
    assert seen == [(1, 3), (2, 3), (3, 3)]  # the task sees the caller's Retry
    record = await loaded(docket, k)
    assert (record.state, record.attempt) == (ExecutionState.FAILED, 3)
    assert record.error == "RuntimeError: attempt 3"

    # without one, the declared default (a single attempt) applies
    seen.clear()
    await docket.add(flaky, key=key())()
    await finish(worker)
    assert seen == [(1, 1)]


async def test_an_exponential_retry_passed_by_the_caller_keeps_its_delays(
    docket: Docket, worker: Worker
) -> None:
    attempts: list[int] = []
    starts: list[float] = []

    async def flaky(
        retry: Retry = Retry(attempts=1), execution: Execution = CurrentExecution()
    ) -> None:
        attempts.append(execution.attempt)
        starts.append(time.time())
        raise RuntimeError("again")

    given = ExponentialRetry(attempts=2, minimum_delay=timedelta(milliseconds=150))
    k = key()
    await docket.add(flaky, key=k)(retry=given)
    async with running(worker):
        await until(lambda: attempts == [1, 2])
    # the second attempt waited out the caller's 150 ms (a lower bound: it
    # holds however late a loaded machine starts it)
    assert starts[1] - starts[0] >= 0.14, starts


# -- TaskArgument ---------------------------------------------------------------------


async def test_task_argument_without_a_name_takes_its_parameter_name(
    docket: Docket, worker: Worker
) -> None:
    async def customer_name(customer_id: int = TaskArgument()) -> str:
        return f"customer {customer_id}"

    async def greet(customer_id: int, name: str = Depends(customer_name)) -> str:
        return f"hello {name}"

    async def own(customer_id: int = TaskArgument()) -> int:
        return customer_id

    docket.register(own)  # accepted, as in pydocket
    greeted = await docket.add(greet)(7)
    passed = await docket.add(own)(customer_id=8)
    missing = await docket.add(own)()
    await finish(worker)
    assert await greeted.get_result(timeout=timedelta(seconds=1)) == "hello customer 7"
    assert await passed.get_result(timeout=timedelta(seconds=1)) == 8
    failed = await loaded(docket, missing.key)
    assert failed.state is ExecutionState.FAILED
    assert "customer_id" in (failed.error or "")


# -- validation: when, and as what -----------------------------------------------------


async def test_two_single_dependencies_are_refused_at_registration(docket: Docket) -> None:
    async def twice(a: Retry = Retry(), b: Retry = Retry(attempts=2)) -> None:
        pass

    async def two_limits(
        x: int,
        a: ConcurrencyLimit = ConcurrencyLimit("x"),
        b: ConcurrencyLimit = ConcurrencyLimit(3),
    ) -> None:
        pass

    for function in (twice, two_limits):
        with pytest.raises(ValueError):
            docket.register(function)
        with pytest.raises(ValueError):
            await docket.add(function)()
        assert function.__name__ not in docket.tasks
    assert (await docket.snapshot()).total_tasks == 0


async def test_two_single_dependencies_are_refused_in_pydockets_words(docket: Docket) -> None:
    async def twice(a: Retry = Retry(), b: Retry = Retry(attempts=2)) -> None:
        pass

    async def two_perpetuals(a: Perpetual = Perpetual(), b: Perpetual = Perpetual()) -> None:
        pass

    with pytest.raises(ValueError, match=r"^Only one Retry dependency is allowed per task$"):
        docket.register(twice)
    with pytest.raises(ValueError, match=r"^Only one Perpetual dependency is allowed per task$"):
        docket.register(two_perpetuals)


async def test_what_pydocket_refuses_only_when_the_task_runs_registers(
    docket: Docket, worker: Worker
) -> None:
    """A limit on a parameter the task lacks, and a factory parameter nothing
    fills, register as in pydocket; each run of such a task fails."""

    def needs_a_value(value: int) -> int:
        return value

    async def limited(x: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer")) -> None:
        raise AssertionError("must not run")

    async def unfillable(v: int = Depends(needs_a_value)) -> None:
        raise AssertionError("must not run")

    docket.register(limited)
    docket.register(unfillable)
    first = await docket.add(limited)(1)
    second = await docket.add(unfillable)()
    await finish(worker)
    record = await loaded(docket, first.key)
    assert record.state is ExecutionState.FAILED
    assert "ConcurrencyLimit argument 'customer' not found in task arguments. Available: ['x']" in (
        record.error or ""
    )
    record = await loaded(docket, second.key)
    assert record.state is ExecutionState.FAILED
    assert "'value'" in (record.error or "")


async def test_retry_with_no_attempts_is_accepted_and_runs_once(
    docket: Docket, worker: Worker
) -> None:
    runs: list[int] = []

    async def once(retry: Retry = Retry(attempts=0)) -> None:
        runs.append(1)
        raise RuntimeError("no retry")

    execution = await docket.add(once)()
    await finish(worker)
    assert runs == [1]
    assert (await loaded(docket, execution.key)).state is ExecutionState.FAILED


async def test_progress_refuses_nonpositive_totals_and_increments_as_value_errors(
    docket: Docket, worker: Worker
) -> None:
    async def reports(progress: Progress = Progress()) -> list[str]:
        messages = []
        for attempt in (progress.set_total(0), progress.increment(0)):
            try:
                await attempt
            except ValueError as error:
                messages.append(str(error))
        return messages

    execution = await docket.add(reports)()
    await finish(worker)
    assert await execution.get_result(timeout=timedelta(seconds=1)) == [
        "Total must be at least 1",
        "Amount must be at least 1",
    ]
