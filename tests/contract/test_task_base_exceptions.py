"""A task body cannot take its worker down: whatever it raises is a recorded
failure, and the worker goes on (or, for ``SystemExit`` and
``KeyboardInterrupt``, stops after draining its other runs)."""

from __future__ import annotations

import asyncio
import pickle
import threading
from datetime import timedelta
from typing import Any

import anyio
import pytest

from docket_core import Docket, ExecutionState, Worker

pytestmark = [pytest.mark.anyio, pytest.mark.backends("memory-asyncio", "redis-asyncio")]


def make_worker(docket: Docket) -> Worker:
    return Worker(
        docket,
        minimum_check_interval=timedelta(milliseconds=5),
        scheduling_resolution=timedelta(milliseconds=5),
    )


async def state(docket: Docket, key: str) -> ExecutionState:
    execution = await docket.get_execution(key)
    assert execution is not None
    return execution.state


async def test_a_task_raising_cancelled_error_itself_fails_and_the_worker_goes_on(
    docket: Docket,
) -> None:
    async def rogue() -> None:
        raise asyncio.CancelledError("not docket's")

    async def fine() -> str:
        return "ok"

    bad = await docket.add(rogue, key="rogue")()
    good = await docket.add(fine, key="fine")()
    with anyio.fail_after(10):
        async with make_worker(docket) as worker:
            await worker.run_until_finished()
    assert await state(docket, "rogue") is ExecutionState.FAILED
    assert await state(docket, "fine") is ExecutionState.COMPLETED
    assert worker.counters["failed"] == 1
    with pytest.raises(Exception, match="CancelledError"):
        await bad.get_result()
    assert await good.get_result() == "ok"


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this one")


async def test_an_exception_whose_str_raises_fails_the_task_and_the_worker_goes_on(
    docket: Docket,
) -> None:
    async def rude() -> None:
        raise Unprintable()

    async def fine() -> str:
        return "ok"

    await docket.add(rude, key="rude")()
    await docket.add(fine, key="fine")()
    with anyio.fail_after(10):
        async with make_worker(docket) as worker:
            await worker.run_until_finished()
    failed = await docket.get_execution("rude")
    assert failed is not None and failed.state is ExecutionState.FAILED
    assert failed.error == "Unprintable: <unprintable>"
    assert await state(docket, "fine") is ExecutionState.COMPLETED


@pytest.mark.parametrize("raised", [SystemExit(3), KeyboardInterrupt()])
async def test_a_task_raising_system_exit_fails_then_the_worker_stops_after_draining(
    docket: Docket, raised: BaseException
) -> None:
    others_done = anyio.Event()

    async def quitter() -> None:
        await anyio.sleep(0.05)
        raise raised

    async def slow() -> str:
        await anyio.sleep(0.3)
        others_done.set()
        return "drained"

    await docket.add(slow, key="slow")()
    await docket.add(quitter, key="quitter")()
    with anyio.fail_after(10):
        async with make_worker(docket) as worker:
            await worker.run_forever()  # returns: the worker stopped itself
    assert others_done.is_set()
    assert await state(docket, "quitter") is ExecutionState.FAILED
    assert await state(docket, "slow") is ExecutionState.COMPLETED
    execution = await docket.get_execution("quitter")
    assert execution is not None and type(raised).__name__ in (execution.error or "")
    with pytest.raises(Exception, match=type(raised).__name__):
        await execution.get_result()  # an Exception, not the SystemExit itself


async def test_a_sync_task_raising_system_exit_in_its_thread_fails(docket: Docket) -> None:
    def quitter() -> None:
        assert threading.current_thread() is not threading.main_thread()
        raise SystemExit(1)

    await docket.add(quitter, key="quitter")()
    with anyio.fail_after(10):
        async with make_worker(docket) as worker:
            await worker.run_forever()
    assert await state(docket, "quitter") is ExecutionState.FAILED


class Unpicklable:
    def __reduce__(self) -> Any:
        raise pickle.PicklingError("not today")


async def test_a_result_that_cannot_be_pickled_is_a_failure_that_says_so(docket: Docket) -> None:
    async def returns_a_lock() -> Unpicklable:
        return Unpicklable()

    execution = await docket.add(returns_a_lock, key="lock")()
    with anyio.fail_after(10):
        async with make_worker(docket) as worker:
            await worker.run_until_finished()
    assert await state(docket, "lock") is ExecutionState.FAILED
    with pytest.raises(TypeError, match="cannot be pickled"):
        await execution.get_result()


class BreaksOnLoad(Exception):
    def __reduce__(self) -> Any:
        return (_explode, ())


def _explode() -> None:
    raise RuntimeError("cannot be rebuilt")


async def test_an_exception_that_cannot_be_unpickled_is_reported_as_such(docket: Docket) -> None:
    async def raises_oddly() -> None:
        raise BreaksOnLoad("odd")

    execution = await docket.add(raises_oddly, key="odd")()
    with anyio.fail_after(10):
        async with make_worker(docket) as worker:
            await worker.run_until_finished()
    with pytest.raises(Exception, match="could not be unpickled here"):
        await execution.get_result()
