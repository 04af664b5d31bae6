"""End-to-end tests of the Worker runtime, on every contract backend (conftest's
``docket`` fixture): run modes, concurrency, results, retries, perpetual tasks,
timeouts."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import anyio
import pytest
import sniffio
from helpers import make_worker, running

from docket_core import (
    CurrentDocket,
    CurrentExecution,
    Depends,
    Docket,
    Execution,
    ExecutionState,
    ExponentialRetry,
    Perpetual,
    Retry,
    TaskKey,
    Timeout,
    Worker,
)

pytestmark = pytest.mark.anyio


async def state_of(docket: Docket, key: str) -> ExecutionState:
    execution = await docket.get_execution(key)
    assert execution is not None
    return execution.state


async def wait_for_state(docket: Docket, key: str, state: ExecutionState) -> None:
    with anyio.fail_after(2):
        while (await docket.get_execution(key)) is None or await state_of(docket, key) != state:
            await anyio.sleep(0.005)


# -- run modes -------------------------------------------------------------------------


async def test_run_until_finished_returns_when_nothing_is_left(docket: Docket) -> None:
    ran: list[int] = []

    async def record(n: int) -> None:
        ran.append(n)

    executions = [await docket.add(record)(n) for n in range(5)]
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert sorted(ran) == [0, 1, 2, 3, 4]
    for execution in executions:
        assert await state_of(docket, execution.key) is ExecutionState.COMPLETED
    assert await docket.adapter.pending() == 0


async def test_run_until_finished_on_an_empty_docket_returns_promptly(docket: Docket) -> None:
    started = time.monotonic()
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert time.monotonic() - started < 0.5


async def test_run_until_finished_waits_for_future_tasks(docket: Docket) -> None:
    ran_at: list[float] = []

    async def later() -> None:
        ran_at.append(time.time())

    when = datetime.now(UTC) + timedelta(milliseconds=200)
    execution = await docket.add(later, when=when)()
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert len(ran_at) == 1
    assert ran_at[0] >= when.timestamp()
    assert await state_of(docket, execution.key) is ExecutionState.COMPLETED


async def test_run_forever_drains_in_flight_tasks_when_cancelled(docket: Docket) -> None:
    started = anyio.Event()
    finished: list[bool] = []

    async def slow() -> None:
        started.set()
        await anyio.sleep(0.1)
        finished.append(True)

    execution = await docket.add(slow)()
    worker = make_worker(docket)
    with anyio.fail_after(2):
        async with anyio.create_task_group() as group:
            scope = anyio.CancelScope()

            async def run() -> None:
                with scope:
                    await worker.run_forever()

            group.start_soon(run)
            await started.wait()
            scope.cancel()
    assert finished == [True]
    assert await state_of(docket, execution.key) is ExecutionState.COMPLETED
    assert worker.counters["succeeded"] == 1


async def test_run_forever_cancelled_before_it_starts_returns_and_holds_nothing(
    docket: Docket,
) -> None:
    ran: list[int] = []

    async def waiting() -> None:
        ran.append(1)

    execution = await docket.add(waiting)()
    worker = make_worker(docket)
    with anyio.fail_after(2):
        with anyio.CancelScope() as scope:
            scope.cancel()
            await worker.run_forever()
    # a store's read need not checkpoint (memory's does not when work is
    # waiting), so the worker may take the task before it sees the cancellation;
    # whatever it took, it drains: the task is never left held by a stopped worker
    state = await state_of(docket, execution.key)
    if state is ExecutionState.QUEUED:
        assert ran == []
        assert worker.counters["started"] == 0
        assert await docket.adapter.pending() == 1
    else:
        assert state is ExecutionState.COMPLETED
        assert ran == [1]
        assert await docket.adapter.pending() == 0
    assert await docket.workers() == []


async def test_run_at_most_limits_a_self_perpetuating_task(docket: Docket) -> None:
    runs: list[int] = []

    async def again(perpetual: Perpetual = Perpetual(every=timedelta(milliseconds=5))) -> None:
        runs.append(1)

    await docket.add(again, key="again")()
    with anyio.fail_after(2):
        await make_worker(docket).run_at_most({"again": 3})
    assert len(runs) == 3
    assert await docket.adapter.pending() == 0


# -- concurrency and task kinds ------------------------------------------------------


async def test_worker_concurrency_bounds_running_tasks(docket: Docket) -> None:
    running = 0
    peak = 0

    async def busy() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.03)
        running -= 1

    for _ in range(10):
        await docket.add(busy)()
    worker = make_worker(docket, concurrency=3)
    with anyio.fail_after(2):
        await worker.run_until_finished()
    assert peak == 3
    assert worker.counters["succeeded"] == 10


async def test_async_and_sync_tasks_both_run_and_store_results(docket: Docket) -> None:
    threads: dict[str, int] = {}

    async def async_double(x: int) -> int:
        threads["async"] = threading.get_ident()
        return x * 2

    def sync_triple(x: int) -> dict[str, int]:
        threads["sync"] = threading.get_ident()
        time.sleep(0.01)
        return {"value": x * 3}

    first = await docket.add(async_double)(21)
    second = await docket.add(sync_triple)(5)
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert threads["async"] == threading.get_ident()
    assert threads["sync"] != threading.get_ident()
    assert await first.get_result(timeout=timedelta(seconds=1)) == 42
    assert await second.get_result(timeout=timedelta(seconds=1)) == {"value": 15}
    loaded = await docket.get_execution(second.key)
    assert loaded is not None
    assert await loaded.get_result(timeout=timedelta(seconds=1)) == {"value": 15}


async def test_a_failing_task_stores_its_exception(docket: Docket) -> None:
    async def boom() -> None:
        raise ValueError("kaboom")

    execution = await docket.add(boom)()
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    loaded = await docket.get_execution(execution.key)
    assert loaded is not None
    assert loaded.state is ExecutionState.FAILED
    assert loaded.error == "ValueError: kaboom"
    with pytest.raises(ValueError, match="kaboom"):
        await execution.get_result(timeout=timedelta(seconds=1))


# -- retries -----------------------------------------------------------------------------


async def test_a_picked_up_run_reaches_the_store_only_after_its_claim(docket: Docket) -> None:
    """An idle worker's pickup lets the run begin before its claim is written
    (``held_calls``): a run whose first call replaces its own key still
    replaces a running key (its run goes on to its end, the replacement
    waits), never the message it was handed (which would stop the run)."""
    finished = anyio.Event()
    later = datetime.now(UTC) + timedelta(hours=1)

    async def itself(key: str = TaskKey()) -> None:
        await docket.replace(itself, when=later, key=key)()
        await anyio.sleep(0.05)  # (a run stopped as superseded stops here)
        finished.set()

    docket.register(itself)
    worker = make_worker(docket)
    async with running(worker):
        await anyio.sleep(0.05)  # (the worker idles in its blocked read)
        await docket.add(itself, key="itself")()
        with anyio.fail_after(2):
            await finished.wait()
    assert await state_of(docket, "itself") is ExecutionState.SCHEDULED
    assert worker.counters["superseded"] == worker.counters["abandoned"] == 0


async def test_retry_runs_every_attempt_then_fails_without_failing_in_between(
    docket: Docket,
) -> None:
    attempts: list[int] = []
    states_seen: list[ExecutionState] = []
    events: list[str] = []

    async def flaky(
        key: str = TaskKey(),
        docket: Docket = CurrentDocket(),
        retry: Retry = Retry(attempts=3, delay=timedelta(milliseconds=20)),
    ) -> None:
        attempts.append(retry.attempt)
        states_seen.append(await state_of(docket, key))
        raise RuntimeError(f"attempt {retry.attempt}")

    execution = await docket.add(flaky, key="flaky")()
    subscribed = anyio.Event()

    async def listen() -> None:
        async for event in execution.subscribe():
            if event["type"] != "state":
                continue
            events.append(event["state"])
            subscribed.set()
            if ExecutionState(event["state"]).terminal:
                return

    with anyio.fail_after(2):
        async with anyio.create_task_group() as group:
            group.start_soon(listen)
            await subscribed.wait()
            await make_worker(docket).run_until_finished()
    assert attempts == [1, 2, 3]
    assert states_seen == [ExecutionState.RUNNING] * 3
    assert events[-1] == "failed"
    assert "failed" not in events[:-1]
    assert events.count("running") == 3
    loaded = await docket.get_execution("flaky")
    assert loaded is not None
    assert loaded.state is ExecutionState.FAILED
    assert loaded.attempt == 3
    assert loaded.error == "RuntimeError: attempt 3"


async def test_retry_that_succeeds_completes(docket: Docket) -> None:
    async def second_time(retry: Retry = Retry(attempts=3)) -> str:
        if retry.attempt < 2:
            raise RuntimeError("not yet")
        return f"ok on {retry.attempt}"

    execution = await docket.add(second_time)()
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert await execution.get_result(timeout=timedelta(seconds=1)) == "ok on 2"


async def test_exponential_retry_delays_grow(docket: Docket) -> None:
    starts: list[float] = []
    scheduled: list[float] = []
    delays: list[timedelta] = []

    async def backoff(
        retry: ExponentialRetry = ExponentialRetry(
            attempts=4,
            minimum_delay=timedelta(milliseconds=40),
            maximum_delay=timedelta(milliseconds=500),
        ),
        execution: Execution = CurrentExecution(),
    ) -> None:
        starts.append(time.time())
        scheduled.append(execution.when.timestamp())
        delays.append(retry.delay)
        raise RuntimeError("again")

    execution = await docket.add(backoff)()
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert len(starts) == 4
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    expected = [0.04, 0.08, 0.16]
    for gap, minimum in zip(gaps, expected, strict=True):
        assert gap >= minimum * 0.95, (gaps, expected)
    # the delays grow: compared as the worker scheduled them, since a start
    # may come ~100 ms late on a server (hz 10), more on a loaded machine
    planned = [when - start for start, when in zip(starts, scheduled[1:], strict=False)]
    assert planned[2] > planned[0], planned
    assert delays == [timedelta(milliseconds=ms) for ms in (40, 80, 160, 320)]
    assert await state_of(docket, execution.key) is ExecutionState.FAILED


async def test_retry_in_forces_a_retry_after_a_delay(docket: Docket) -> None:
    starts: list[float] = []

    async def forced(retry: Retry = Retry(attempts=2)) -> str:
        starts.append(time.monotonic())
        if retry.attempt == 1:
            retry.in_(timedelta(milliseconds=60))
        return "second"

    execution = await docket.add(forced)()
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert len(starts) == 2
    assert starts[1] - starts[0] >= 0.057
    assert await execution.get_result(timeout=timedelta(seconds=1)) == "second"


async def test_retry_at_forces_a_retry_at_a_time(docket: Docket) -> None:
    starts: list[float] = []
    target: list[float] = []

    async def forced_at(retry: Retry = Retry(attempts=2)) -> None:
        starts.append(time.time())
        if retry.attempt == 1:
            when = datetime.now(UTC) + timedelta(milliseconds=60)
            target.append(when.timestamp())
            retry.at(when)

    execution = await docket.add(forced_at)()
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert len(starts) == 2
    assert starts[1] >= target[0]
    assert await state_of(docket, execution.key) is ExecutionState.COMPLETED


async def test_forced_retries_are_bounded_by_attempts(docket: Docket) -> None:
    runs: list[int] = []

    async def always(retry: Retry = Retry(attempts=2)) -> None:
        runs.append(retry.attempt)
        retry.in_(timedelta(milliseconds=1))

    execution = await docket.add(always)()
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert runs == [1, 2]
    assert await state_of(docket, execution.key) is ExecutionState.FAILED


# -- perpetual tasks --------------------------------------------------------------------


async def test_perpetual_runs_start_to_start(docket: Docket, backend: str) -> None:
    starts: list[float] = []
    scheduled: list[float] = []

    async def ticker(
        perpetual: Perpetual = Perpetual(every=timedelta(milliseconds=300)),
        execution: Execution = CurrentExecution(),
    ) -> None:
        starts.append(time.time())
        scheduled.append(execution.when.timestamp())
        await anyio.sleep(0.1)

    await docket.add(ticker, key="ticker")()
    with anyio.fail_after(5):
        await make_worker(docket).run_at_most({"ticker": 3})
    assert len(starts) == 3
    # each next run is scheduled 300 ms after this one started (the worker's
    # start, a little before the body's), never the 400 ms of end to start;
    # the margins are for a loaded machine, where the body may begin tens of
    # milliseconds after the worker started the run
    for start, when in zip(starts, scheduled[1:], strict=False):
        assert 0.2 <= when - start < 0.35, (starts, scheduled)
    # and it starts then: a Redis or Valkey server ends a short blocking read on
    # its 10 Hz timer (hz 10), so a due run may start up to ~100 ms late there
    late = 0.0 if backend.startswith("memory") else 0.1
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    for gap in gaps:
        assert 0.2 <= gap < 0.5 + late, gaps


async def test_perpetual_cancel_ends_the_chain(docket: Docket) -> None:
    runs: list[int] = []

    async def countdown(perpetual: Perpetual = Perpetual(every=timedelta(milliseconds=5))) -> None:
        runs.append(1)
        if len(runs) == 3:
            perpetual.cancel()

    execution = await docket.add(countdown)()
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert len(runs) == 3
    assert await state_of(docket, execution.key) is ExecutionState.COMPLETED


async def test_perpetuate_changes_the_next_calls_arguments(docket: Docket) -> None:
    seen: list[tuple[int, str]] = []

    async def step(
        n: int, label: str = "x", perpetual: Perpetual = Perpetual(every=timedelta(0))
    ) -> None:
        seen.append((n, label))
        if n >= 3:
            perpetual.cancel()
        else:
            perpetual.perpetuate(n + 1, label=f"step{n + 1}")

    await docket.add(step)(0)
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert seen == [(0, "x"), (1, "step1"), (2, "step2"), (3, "step3")]


async def test_a_failing_perpetual_task_keeps_going(docket: Docket) -> None:
    runs: list[int] = []

    async def shaky(perpetual: Perpetual = Perpetual(every=timedelta(milliseconds=5))) -> None:
        runs.append(1)
        raise RuntimeError("shaky")

    await docket.add(shaky, key="shaky")()
    with anyio.fail_after(2):
        await make_worker(docket).run_at_most({"shaky": 3})
    assert len(runs) == 3


async def test_automatic_perpetual_is_seeded_once(docket: Docket) -> None:
    runs: list[float] = []
    first_run = anyio.Event()

    async def housekeeping(
        perpetual: Perpetual = Perpetual(every=timedelta(hours=1), automatic=True),
    ) -> None:
        runs.append(time.time())
        first_run.set()

    docket.register(housekeeping)
    first = make_worker(docket, name="first")
    second = make_worker(docket, name="second")
    with anyio.fail_after(2):
        async with anyio.create_task_group() as group:
            group.start_soon(first.run_forever)
            await first_run.wait()
            group.start_soon(second.run_forever)
            with anyio.fail_after(1):
                while not await docket.workers() or len(await docket.workers()) < 2:
                    await anyio.sleep(0.005)
            await anyio.sleep(0.05)
            group.cancel_scope.cancel()
    assert len(runs) == 1
    snapshot = await docket.snapshot()
    assert [e.key for e in snapshot.future] == ["housekeeping"]
    assert snapshot.future[0].when.timestamp() >= runs[0] + 3599


async def test_a_cancelled_automatic_perpetual_is_seeded_again(
    docket: Docket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling an automatic perpetual task pauses it until the next
    re-seed (every 60 s; shortened here), as in pydocket."""
    import docket_core.worker

    monkeypatch.setattr(docket_core.worker, "RESEED_SECONDS", 0.2)
    runs: list[float] = []
    ran = anyio.Event()

    async def beat(
        perpetual: Perpetual = Perpetual(every=timedelta(hours=1), automatic=True),
    ) -> None:
        runs.append(time.time())
        ran.set()

    docket.register(beat)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(make_worker(docket).run_forever)
            await ran.wait()
            ran = anyio.Event()
            await docket.cancel("beat")  # the next run (in an hour) is cancelled
            cancelled_at = time.time()
            await ran.wait()  # ... and the re-seed starts the chain again
            group.cancel_scope.cancel()
    assert len(runs) == 2
    assert runs[1] - cancelled_at < 1.0


async def test_automatic_perpetual_is_not_seeded_when_disabled(docket: Docket) -> None:
    async def auto(perpetual: Perpetual = Perpetual(automatic=True)) -> None:
        pass

    docket.register(auto)
    with anyio.fail_after(2):
        await make_worker(docket, schedule_automatic_tasks=False).run_until_finished()
    assert await docket.get_execution("auto") is None


# -- timeouts ----------------------------------------------------------------------------


async def test_timeout_fails_a_slow_task(docket: Docket) -> None:
    async def slow(timeout: Timeout = Timeout(timedelta(milliseconds=50))) -> None:
        await anyio.sleep(5)

    execution = await docket.add(slow)()
    started = time.monotonic()
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert time.monotonic() - started < 1
    loaded = await docket.get_execution(execution.key)
    assert loaded is not None
    assert loaded.state is ExecutionState.FAILED
    assert loaded.error is not None and "TimeoutError" in loaded.error
    with pytest.raises(TimeoutError, match="timed out"):
        await execution.get_result(timeout=timedelta(seconds=1))


async def test_timeout_extend_lets_a_task_finish(docket: Docket) -> None:
    # The extension comes 450 ms before the first deadline (a loaded suite has
    # woken a 60 ms sleep after more than 100 ms), and the run outlasts that
    # deadline by 250 ms, so only the extension lets it finish.
    async def extended(timeout: Timeout = Timeout(timedelta(milliseconds=500))) -> str:
        await anyio.sleep(0.05)
        timeout.extend(timedelta(seconds=1))
        await anyio.sleep(0.7)
        return "made it"

    execution = await docket.add(extended)()
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert await execution.get_result(timeout=timedelta(seconds=1)) == "made it"


async def test_retry_after_timeout(docket: Docket) -> None:
    attempts: list[int] = []

    async def first_hangs(
        retry: Retry = Retry(attempts=2),
        timeout: Timeout = Timeout(timedelta(milliseconds=50)),
    ) -> str:
        attempts.append(retry.attempt)
        if retry.attempt == 1:
            await anyio.sleep(5)
        return "second"

    execution = await docket.add(first_hangs)()
    with anyio.fail_after(2):
        await make_worker(docket).run_until_finished()
    assert attempts == [1, 2]
    assert await execution.get_result(timeout=timedelta(seconds=1)) == "second"


async def _wait_too_long() -> None:
    """A wait of the task's own that times out: ``asyncio.wait_for`` where
    asyncio runs, ``anyio.fail_after`` on trio; both raise ``TimeoutError``."""
    if sniffio.current_async_library() == "asyncio":
        await asyncio.wait_for(asyncio.sleep(1), timeout=0.01)
    with anyio.fail_after(0.01):
        await anyio.sleep(1)


async def test_a_timeout_error_of_the_tasks_own_fails_it_like_any_error(docket: Docket) -> None:
    attempts: list[int] = []

    async def waits(
        retry: Retry = Retry(attempts=2),
        timeout: Timeout = Timeout(timedelta(seconds=5)),
    ) -> None:
        attempts.append(retry.attempt)
        await _wait_too_long()

    async def plain() -> None:
        await _wait_too_long()

    guarded = await docket.add(waits)()
    unguarded = await docket.add(plain)()
    worker = make_worker(docket)
    with anyio.fail_after(3):
        await worker.run_until_finished()
    assert attempts == [1, 2]  # retried as any other error, not as docket's timeout
    assert worker.counters["timed_out"] == 0
    for execution in (guarded, unguarded):
        loaded = await docket.get_execution(execution.key)
        assert loaded is not None
        assert loaded.state is ExecutionState.FAILED
        assert loaded.error is not None and loaded.error.startswith("TimeoutError")
        assert "exceeded its timeout" not in loaded.error
        with pytest.raises(TimeoutError) as raised:
            await execution.get_result(timeout=timedelta(seconds=1))
        assert "timed out" not in str(raised.value)  # the task's own, not docket's


# -- cancellation ------------------------------------------------------------------------


async def swallow_a_cancel(docket: Docket) -> tuple[Worker, Execution, list[bool]]:
    """Run a task that catches the cancellation docket sends it and returns
    anyway; returns the worker, the execution and whether it was cancelled."""
    started = anyio.Event()
    cancelled: list[bool] = []

    @asynccontextmanager
    async def resource() -> AsyncIterator[str]:
        yield "resource"
        await anyio.sleep(0)  # a cleanup that awaits: the cancel may land here again

    async def stubborn(held: str = Depends(resource)) -> str:
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append(True)
        return "swallowed"

    k = f"stubborn-{time.monotonic_ns()}"
    worker = make_worker(docket)
    async with running(worker):
        execution = await docket.add(stubborn, key=k)()
        with anyio.fail_after(2):
            await started.wait()
        await docket.cancel(k)
        with anyio.fail_after(2):
            while worker.counters["succeeded"] + worker.counters["cancelled"] == 0:
                await anyio.sleep(0.01)
    return worker, execution, cancelled


async def test_a_task_that_swallows_its_cancellation_ends_as_it_returned(docket: Docket) -> None:
    worker, _, cancelled = await swallow_a_cancel(docket)
    assert cancelled == [True]
    assert worker.counters["succeeded"] == 1 and worker.counters["cancelled"] == 0


async def test_a_task_that_swallows_its_cancellation_is_recorded_completed(
    docket: Docket,
) -> None:
    """As in pydocket: the cancel is sent, the task returns anyway, and its
    run is recorded ``completed`` with its result."""
    _, execution, _ = await swallow_a_cancel(docket)
    assert await execution.get_result(timeout=timedelta(seconds=2)) == "swallowed"
    assert await state_of(docket, execution.key) is ExecutionState.COMPLETED
