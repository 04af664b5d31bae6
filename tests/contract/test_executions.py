"""Looking at one execution, on every contract backend: ``get_execution``
(scheduled, running with its worker and progress, finished), ``subscribe``'s
state and progress events, and progress a superseded run cannot write; an
``Execution`` built as pydocket builds one, ``sync``, ``is_superseded``, and
``execution.progress`` as pydocket's ``ExecutionProgress``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from helpers import Now, finish, key, running

from docket_core import Disposition, Docket, Execution, ExecutionState, Progress, Worker
from docket_core.execution import ExecutionProgress
from docket_core.sansio.effects import Claim, ClaimItem
from docket_core.sansio.inputs import Claimed, ClaimVerdict

pytestmark = pytest.mark.anyio


# -- get_execution --------------------------------------------------------------------


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


async def test_get_execution_while_running_shows_worker_and_progress(
    docket: Docket, worker: Worker
) -> None:
    reported = anyio.Event()
    release = anyio.Event()

    async def slow(progress: Progress = Progress()) -> None:
        await progress.set_total(4)
        await progress.increment(2)
        await progress.set_message("halfway")
        reported.set()
        await release.wait()

    async with running(worker):
        execution = await docket.add(slow)()
        await reported.wait()
        loaded = await docket.get_execution(execution.key)
        assert loaded is not None
        assert loaded.state is ExecutionState.RUNNING
        assert loaded.worker == worker.name
        assert loaded.started_at is not None
        assert (loaded.progress.current, loaded.progress.total) == (2, 4)
        assert loaded.progress.message == "halfway"
        release.set()
        await execution.get_result(timeout=timedelta(seconds=2))
    await execution.sync()
    assert execution.state is ExecutionState.COMPLETED


async def test_a_superseded_run_cannot_write_its_successors_progress(
    docket: Docket, now: Now
) -> None:
    async def job() -> None:
        pass

    old = await docket.add(job, key="k", when=now() + timedelta(hours=1))()
    new = await docket.replace(job, key="k", when=now() + timedelta(hours=1))()
    assert new.generation != old.generation
    adapter = docket.adapter
    stale = await adapter.report_progress("k", now=1.0, generation=old.generation, current=5)
    assert stale.current != 5
    fresh = await adapter.report_progress("k", now=2.0, generation=new.generation, current=7)
    assert fresh.current == 7
    progress = await adapter.get_progress("k")
    assert progress is not None and progress.current == 7


# -- pydocket's Execution: constructor, sync, progress ------------------------------


async def test_an_execution_built_as_pydocket_builds_one(docket: Docket, worker: Worker) -> None:
    async def job(x: int, *, label: str = "") -> str:
        return f"{label}{x}"

    docket.register(job)
    when = datetime.now(UTC) + timedelta(hours=1)
    # pydocket's positional order: docket, function, args, kwargs, key, when, attempt
    execution = Execution(docket, job, (1,), {"label": "n"}, "built", when, 1)
    assert (execution.docket, execution.function, execution.function_name) == (docket, job, "job")
    assert (execution.args, execution.kwargs, execution.key) == ((1,), {"label": "n"}, "built")
    assert (execution.when, execution.attempt) == (when, 1)
    assert execution.disposition is Disposition.LOADED
    by_name = Execution(
        docket=docket, function=job, args=(), kwargs={}, key="k", when=when, attempt=3
    )
    assert by_name.attempt == 3 and by_name.function_name == "job"

    await execution.sync()  # nothing stored yet: stays as built
    assert execution.state is ExecutionState.SCHEDULED
    await docket.schedule(execution)
    assert execution.disposition is Disposition.SCHEDULED
    assert not await execution.is_superseded()
    stored = await docket.get_execution("built")
    assert stored is not None and stored.kwargs == {"label": "n"} and stored.when == when

    await docket.replace(job, when=datetime.now(UTC), key="built")(2, label="r")
    assert await execution.is_superseded()
    await finish(worker)
    await execution.sync()
    assert execution.state is ExecutionState.COMPLETED
    assert execution.worker == worker.name and execution.completed_at is not None
    assert await execution.get_result() == "r2"


async def test_execution_progress_is_pydockets(docket: Docket, worker: Worker) -> None:
    reported = anyio.Event()
    release = anyio.Event()

    async def slow(progress: Progress = Progress()) -> None:
        await progress.set_total(8)
        await progress.increment(3)
        await progress.set_message("three")
        reported.set()
        await release.wait()

    execution = await docket.add(slow)()
    assert isinstance(execution.progress, ExecutionProgress)
    assert execution.progress.current is None and execution.progress.updated_at is None
    async with running(worker):
        await reported.wait()
        progress = execution.progress
        await progress.sync()
        assert (progress.current, progress.total, progress.message) == (3, 8, "three")
        assert isinstance(progress.updated_at, datetime)
        assert progress.updated_at.tzinfo is not None
        assert abs((datetime.now(UTC) - progress.updated_at).total_seconds()) < 30

        # reported from outside the task, as pydocket's ExecutionProgress can
        outside = await ExecutionProgress.create(docket, execution.key)
        assert (outside.current, outside.total) == (3, 8)
        await outside.increment(2)
        await outside.set_message(None)
        assert (outside.current, outside.message) == (5, None)
        with pytest.raises(ValueError, match=r"^Total must be at least 1$"):
            await outside.set_total(0)
        with pytest.raises(ValueError, match=r"^Amount must be at least 1$"):
            await outside.increment(0)
        await execution.sync()  # Execution.sync reloads the progress too
        assert (execution.progress.current, execution.progress.message) == (5, None)
        release.set()
        await execution.get_result(timeout=timedelta(seconds=2))


# -- subscribe ------------------------------------------------------------------------


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
    # the running and completed events carry the worker and the times the
    # record keeps (an event writes a time to 14 significant digits)
    by_state = {e["state"]: e for e in events if e["type"] == "state"}
    stored = await docket.get_execution(execution.key)
    assert stored is not None and stored.started_at and stored.completed_at
    assert by_state["running"]["worker"] == worker.name
    assert abs(by_state["running"]["started_at"] - stored.started_at.timestamp()) < 1e-3
    assert abs(by_state["completed"]["completed_at"] - stored.completed_at.timestamp()) < 1e-3
    assert "error" not in by_state["completed"]

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
    subscribed = anyio.Event()
    done = anyio.Event()

    async def watch() -> None:
        async for event in execution.subscribe():
            if event["type"] == "state":
                states.append(event["state"])
                subscribed.set()
                if event["state"] == "completed":
                    done.set()
                    return

    # subscribed before the worker starts: under load, subscribing could take
    # longer than the 50 ms until the worker queues it
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            await subscribed.wait()
            async with running(worker):
                await done.wait()

    assert states[0] == "scheduled"
    assert states[-3:] == ["queued", "running", "completed"]


async def test_a_claim_keeps_the_progress_a_run_that_started_with_it_reported(
    docket: Docket,
) -> None:
    # a fresh delivery's run starts with its claim, and may report progress
    # before the claim reaches the store: the claim must not reset it; a
    # delivery handed out again starts from the default
    async def job() -> None:
        pass

    docket.register(job)
    await docket.add(job, key="k")()
    adapter = docket.adapter
    now = datetime.now(UTC).timestamp()

    async def claim(worker: str, recover: bool) -> None:
        read = await adapter.read(
            worker=worker, count=1, now=now, redelivery_timeout=60.0, block=0.0, recover=recover
        )
        (delivery,) = read.deliveries
        generation = delivery.message.generation
        await adapter.report_progress("k", now=now, generation=generation, total=10, current=3)
        item = ClaimItem(delivery_id=delivery.delivery_id, key="k", generation=generation)
        (claimed,) = await adapter.execute([Claim(worker=worker, items=(item,), now=now)])
        assert claimed == Claimed(verdicts=((delivery.delivery_id, ClaimVerdict.CLAIMED),))

    await claim("w1", recover=False)
    progress = await adapter.get_progress("k")
    assert progress is not None and (progress.current, progress.total) == (3, 10)
    await claim("w1", recover=True)  # (handed to it again, after a lost read)
    progress = await adapter.get_progress("k")
    assert progress is not None and (progress.current, progress.total) == (0, 100)
