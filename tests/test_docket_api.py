"""End-to-end tests of the Docket client API on memory://, under asyncio and trio.

Scheduling, keys, replace, cancel, get_execution, get_result, subscribe and
execution_ttl.  Strikes, snapshot, clear and workers are in
``test_docket_api_more.py``; Agenda, the testing helpers, pickling errors and
edge cases in ``test_docket_api_extras.py``.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from typing import Any

import anyio
import pytest
from helpers import Now, finish, key, running

from docket_core import (
    Disposition,
    Docket,
    Execution,
    ExecutionCancelled,
    ExecutionState,
    Progress,
    Worker,
)

pytestmark = pytest.mark.anyio


# -- add ---------------------------------------------------------------------------------


async def test_add_now_runs_the_call(docket: Docket, worker: Worker) -> None:
    calls: list[tuple[int, str]] = []

    async def record(a: int, b: str = "x") -> None:
        calls.append((a, b))

    execution = await docket.add(record)(1, b="two")
    assert execution.disposition is Disposition.SCHEDULED
    assert execution.state is ExecutionState.QUEUED
    assert execution.function_name == "record"
    assert execution.args == (1,)
    assert execution.kwargs == {"b": "two"}
    assert calls == []

    await finish(worker)

    assert calls == [(1, "two")]
    done = await docket.get_execution(execution.key)
    assert done is not None
    assert done.state is ExecutionState.COMPLETED


async def test_add_with_when_runs_no_earlier_and_soon_after(
    docket: Docket, worker: Worker, now: Now
) -> None:
    ran_at: list[float] = []
    ran = anyio.Event()

    async def later() -> None:
        ran_at.append(time.time())
        ran.set()

    when = now() + timedelta(milliseconds=200)
    execution = await docket.add(later, when=when)()
    assert execution.state is ExecutionState.SCHEDULED
    assert execution.when == when

    async with running(worker):
        await ran.wait()

    assert len(ran_at) == 1
    assert ran_at[0] >= when.timestamp()
    assert ran_at[0] - when.timestamp() < 0.3


async def test_add_by_registered_name(docket: Docket, worker: Worker) -> None:
    calls: list[int] = []

    async def named(n: int) -> None:
        calls.append(n)

    docket.register(named, names=["named", "alias"])
    first = await docket.add("named")(1)
    second = await docket.add("alias")(2)
    assert first.function_name == "named"
    assert second.function_name == "alias"

    await finish(worker)
    assert sorted(calls) == [1, 2]


async def test_add_unknown_name_raises_key_error(docket: Docket) -> None:
    with pytest.raises(KeyError, match="nope"):
        docket.add("nope")
    assert (await docket.snapshot()).future == []


async def test_add_is_typed_with_paramspec(docket: Docket, worker: Worker) -> None:
    seen: list[str] = []

    async def typed(count: int, label: str, *, loud: bool = False) -> str:
        text = label * count
        seen.append(text.upper() if loud else text)
        return text

    execution: Execution = await docket.add(typed)(2, "ab", loud=True)
    await finish(worker)
    assert seen == ["ABAB"]
    assert await execution.get_result() == "abab"


# -- idempotent keys ----------------------------------------------------------------------


async def test_key_while_scheduled_first_when_and_args_win(
    docket: Docket, worker: Worker, now: Now
) -> None:
    calls: list[int] = []

    async def once(n: int) -> None:
        calls.append(n)

    k = key()
    first_when = now() + timedelta(milliseconds=50)
    first = await docket.add(once, when=first_when, key=k)(1)
    second = await docket.add(once, when=now() + timedelta(seconds=30), key=k)(2)
    assert first.disposition is Disposition.SCHEDULED
    assert second.disposition is Disposition.ALREADY_SCHEDULED
    assert second.state is ExecutionState.SCHEDULED

    stored = await docket.get_execution(k)
    assert stored is not None
    assert stored.when == first_when
    assert stored.args == (1,)

    await finish(worker)
    assert calls == [1]


async def test_key_while_queued(docket: Docket, worker: Worker) -> None:
    calls: list[int] = []

    async def once(n: int) -> None:
        calls.append(n)

    k = key()
    first = await docket.add(once, key=k)(1)
    second = await docket.add(once, key=k)(2)
    assert first.disposition is Disposition.SCHEDULED
    assert second.disposition is Disposition.ALREADY_SCHEDULED
    assert second.state is ExecutionState.QUEUED

    await finish(worker)
    assert calls == [1]


async def test_key_while_running_then_again_after_completion(
    docket: Docket, worker: Worker
) -> None:
    calls: list[int] = []
    started = anyio.Event()
    release = anyio.Event()

    async def blocking(n: int) -> None:
        calls.append(n)
        started.set()
        await release.wait()

    k = key()
    async with running(worker):
        first = await docket.add(blocking, key=k)(1)
        await started.wait()
        again = await docket.add(blocking, key=k)(2)
        assert again.disposition is Disposition.ALREADY_SCHEDULED
        assert again.state is ExecutionState.RUNNING
        release.set()
        await first.get_result(timeout=timedelta(seconds=2))
        assert calls == [1]

        third = await docket.add(blocking, key=k)(3)
        assert third.disposition is Disposition.SCHEDULED
        await third.get_result(timeout=timedelta(seconds=2))
    assert calls == [1, 3]


# -- replace -------------------------------------------------------------------------------


async def test_replace_a_future_execution(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[str] = []

    async def job(value: str) -> None:
        calls.append(value)

    k = key()
    await docket.add(job, when=now() + timedelta(seconds=30), key=k)("old")
    replacement = await docket.replace(job, now(), k)("new")
    assert replacement.disposition is Disposition.SCHEDULED
    assert replacement.state is ExecutionState.QUEUED
    assert len((await docket.snapshot()).future) == 1

    await finish(worker)
    assert calls == ["new"]


async def test_replace_a_queued_execution(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[str] = []

    async def job(value: str) -> None:
        calls.append(value)

    k = key()
    await docket.add(job, key=k)("old")
    await docket.replace(job, now() + timedelta(milliseconds=30), k)("new")
    snapshot = await docket.snapshot()
    assert [e.args for e in snapshot.future] == [("new",)]

    await finish(worker)
    assert calls == ["new"]


# -- cancel ----------------------------------------------------------------------------------


async def test_cancel_a_scheduled_execution(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[int] = []

    async def job() -> None:
        calls.append(1)

    k = key()
    execution = await docket.add(job, when=now() + timedelta(milliseconds=30), key=k)()
    await docket.cancel(k)
    stored = await docket.get_execution(k)
    assert stored is not None
    assert stored.state is ExecutionState.CANCELLED
    assert (await docket.snapshot()).future == []

    await finish(worker)
    assert calls == []
    with pytest.raises(ExecutionCancelled):
        await execution.get_result(timeout=timedelta(seconds=1))


async def test_cancel_a_queued_execution(docket: Docket, worker: Worker) -> None:
    calls: list[int] = []

    async def job() -> None:
        calls.append(1)

    k = key()
    await docket.add(job, key=k)()
    await docket.cancel(k)
    assert (await docket.snapshot()).future == []

    await finish(worker)
    assert calls == []
    stored = await docket.get_execution(k)
    assert stored is not None
    assert stored.state is ExecutionState.CANCELLED


async def test_cancel_wakes_a_waiting_get_result(docket: Docket, now: Now) -> None:
    async def job() -> None:
        raise AssertionError("never runs")

    k = key()
    execution = await docket.add(job, when=now() + timedelta(seconds=30), key=k)()
    with anyio.fail_after(2):
        async with anyio.create_task_group() as group:

            async def cancel_soon() -> None:
                await anyio.sleep(0.02)
                await docket.cancel(k)

            group.start_soon(cancel_soon)
            with pytest.raises(ExecutionCancelled):
                await execution.get_result()


async def test_cancel_a_running_execution(docket: Docket, worker: Worker) -> None:
    starts: list[int] = []
    interrupted: list[bool] = []
    started = anyio.Event()

    async def endless() -> None:
        starts.append(1)
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            interrupted.append(True)
            raise

    k = key()
    events: list[dict[str, Any]] = []
    cancelled_seen = anyio.Event()

    async with running(worker):
        execution = await docket.add(endless, key=k)()
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                async for event in execution.subscribe():
                    events.append(event)
                    if event.get("state") == "cancelled":
                        cancelled_seen.set()
                        return

            group.start_soon(watch)
            await started.wait()
            await docket.cancel(k)
            with pytest.raises(ExecutionCancelled):
                await execution.get_result(timeout=timedelta(seconds=2))
            await cancelled_seen.wait()

        stored = await docket.get_execution(k)
        assert stored is not None
        assert stored.state is ExecutionState.CANCELLED
        # give the worker a few polls to (wrongly) run it again
        await anyio.sleep(0.1)

    assert starts == [1]
    assert interrupted == [True]
    stored = await docket.get_execution(k)
    assert stored is not None
    assert stored.state is ExecutionState.CANCELLED
    assert any(e.get("state") == "cancelled" for e in events)


async def test_cancel_unknown_key_is_harmless(docket: Docket) -> None:
    await docket.cancel("no-such-key")
    assert await docket.get_execution("no-such-key") is None


# -- get_execution ----------------------------------------------------------------------------


async def test_get_execution(docket: Docket, worker: Worker, now: Now) -> None:
    assert await docket.get_execution("unknown") is None

    async def job(x: int) -> int:
        return x * 2

    k = key()
    when = now() + timedelta(milliseconds=20)
    await docket.add(job, when=when, key=k)(21)
    scheduled = await docket.get_execution(k)
    assert scheduled is not None
    assert scheduled.state is ExecutionState.SCHEDULED
    assert scheduled.attempt == 1
    assert scheduled.when == when
    assert scheduled.function_name == "job"
    assert scheduled.function is job
    assert scheduled.args == (21,)
    assert scheduled.key == k

    await finish(worker)
    done = await docket.get_execution(k)
    assert done is not None
    assert done.state is ExecutionState.COMPLETED
    assert done.worker == worker.name
    assert done.completed_at is not None
    assert await done.get_result() == 42


# -- get_result -------------------------------------------------------------------------------


class Boom(ValueError):
    pass


async def test_get_result_returns_the_value(docket: Docket, worker: Worker) -> None:
    async def compute(a: int, b: int) -> dict[str, int]:
        return {"sum": a + b}

    execution = await docket.add(compute)(2, 3)
    async with running(worker):
        assert await execution.get_result(timeout=timedelta(seconds=2)) == {"sum": 5}


async def test_get_result_reraises_the_task_exception(docket: Docket, worker: Worker) -> None:
    async def explode() -> None:
        raise Boom("kaboom")

    execution = await docket.add(explode)()
    async with running(worker):
        with pytest.raises(Boom, match="kaboom"):
            await execution.get_result(timeout=timedelta(seconds=2))
    stored = await docket.get_execution(execution.key)
    assert stored is not None
    assert stored.state is ExecutionState.FAILED
    assert stored.error is not None and "Boom" in stored.error


async def test_get_result_times_out(docket: Docket, now: Now) -> None:
    async def job() -> None:
        pass

    execution = await docket.add(job, when=now() + timedelta(seconds=30))()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await execution.get_result(timeout=timedelta(milliseconds=50))
    assert time.monotonic() - started < 1.0
    with pytest.raises(TimeoutError):
        await execution.get_result(deadline=now() + timedelta(milliseconds=20))


async def test_get_result_of_an_already_finished_execution(docket: Docket, worker: Worker) -> None:
    async def value() -> str:
        return "done"

    async def broken() -> None:
        raise Boom("late")

    ok = await docket.add(value)()
    bad = await docket.add(broken)()
    await finish(worker)
    with anyio.fail_after(1):
        assert await ok.get_result() == "done"
        with pytest.raises(Boom):
            await bad.get_result()
        loaded = await docket.get_execution(ok.key)
        assert loaded is not None
        assert await loaded.get_result() == "done"


async def test_get_result_of_none(docket: Docket, worker: Worker) -> None:
    async def nothing() -> None:
        return None

    execution = await docket.add(nothing)()
    await finish(worker)
    with anyio.fail_after(1):
        assert await execution.get_result() is None


# -- execution_ttl ----------------------------------------------------------------------------


async def test_zero_execution_ttl_keeps_nothing(now: Now) -> None:
    name = f"ttl0-{uuid.uuid4().hex}"
    ran = []

    async def job() -> int:
        ran.append(1)
        return 7

    async def explode() -> None:
        raise Boom("x")

    async with Docket(name=name, url=f"memory://{name}", execution_ttl=timedelta(0)) as d:
        ok = await d.add(job)()
        bad = await d.add(explode)()
        future = await d.add(job, when=now() + timedelta(seconds=30))()
        assert await d.get_execution(ok.key) is not None
        await d.cancel(future.key)
        async with Worker(
            d,
            minimum_check_interval=timedelta(milliseconds=5),
            scheduling_resolution=timedelta(milliseconds=5),
        ) as w:
            await finish(w)
        assert ran == [1]
        assert await d.get_execution(ok.key) is None
        assert await d.get_execution(bad.key) is None
        assert await d.get_execution(future.key) is None


# -- subscribe --------------------------------------------------------------------------------


async def test_subscribe_yields_state_and_progress_events(docket: Docket, worker: Worker) -> None:
    proceed = anyio.Event()

    async def reporting(progress: Progress = Progress()) -> str:
        await proceed.wait()
        await progress.set_total(10)
        await progress.increment()
        await progress.increment(3)
        await progress.set_message("almost")
        return "ok"

    execution = await docket.add(reporting)()
    events: list[dict[str, Any]] = []
    subscribed = anyio.Event()

    async def watch() -> None:
        async for event in execution.subscribe():
            events.append(event)
            subscribed.set()
            if event["type"] == "state" and event["state"] in {"completed", "failed"}:
                return

    async with running(worker):
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            await subscribed.wait()
            proceed.set()

    states = [e["state"] for e in events if e["type"] == "state"]
    assert states[0] in {"queued", "running"}
    assert states[-2:] == ["running", "completed"]
    assert all(e["key"] == execution.key for e in events)

    progress = [e for e in events if e["type"] == "progress"]
    # the first progress event is the snapshot taken on subscribing
    live = progress[1:]
    assert [(p["current"], p["total"], p["message"]) for p in live] == [
        (0, 10, None),
        (1, 10, None),
        (4, 10, None),
        (4, 10, "almost"),
    ]
    assert all(p["updated_at"] is not None for p in live)
    assert execution.state is ExecutionState.COMPLETED


async def test_subscribe_sees_scheduled_then_queued(
    docket: Docket, worker: Worker, now: Now
) -> None:
    async def job() -> None:
        pass

    execution = await docket.add(job, when=now() + timedelta(milliseconds=50))()
    states: list[str] = []

    async def watch() -> None:
        async for event in execution.subscribe():
            if event["type"] == "state":
                states.append(event["state"])
                if event["state"] == "completed":
                    return

    async with running(worker):
        await watch()

    assert states[0] == "scheduled"
    assert states[-3:] == ["queued", "running", "completed"]
