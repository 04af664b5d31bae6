"""``Docket.cancel`` on every contract backend: a scheduled, queued or running
execution, a waiting ``get_result``, an unknown key, and a cancelled key added
again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from helpers import Now, finish, key, running

from docket_core import Disposition, Docket, ExecutionCancelled, ExecutionState, Worker

pytestmark = pytest.mark.anyio


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


async def test_a_cancelled_key_can_be_added_again(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[int] = []

    async def job(n: int) -> None:
        calls.append(n)

    k = key()
    await docket.add(job, when=now() + timedelta(seconds=30), key=k)(1)
    await docket.cancel(k)
    again = await docket.add(job, key=k)(2)
    assert again.disposition is Disposition.SCHEDULED
    await finish(worker)
    assert calls == [2]
