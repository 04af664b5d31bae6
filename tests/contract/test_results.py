"""``Execution.get_result`` on every contract backend: values, re-raised
exceptions, timeouts, finished and struck executions, exceptions that cannot
be kept; and ``execution_ttl=0``, which keeps nothing (memory only: it makes
its own Docket).
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import anyio
import pytest
from helpers import Now, finish, running

from docket_core import Disposition, Docket, ExecutionCancelled, ExecutionState, Worker

pytestmark = pytest.mark.anyio


# -- get_result -----------------------------------------------------------------------


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

    execution = await docket.add(job, when=now() + timedelta(seconds=30), key="slow")()
    started = time.monotonic()
    # pydocket's type (the builtin TimeoutError) and wording
    with pytest.raises(TimeoutError, match=r"^Timeout waiting for execution slow to complete$"):
        await execution.get_result(timeout=timedelta(milliseconds=50))
    assert time.monotonic() - started < 1.0
    with pytest.raises(TimeoutError, match=r"^Timeout waiting for execution slow to complete$"):
        await execution.get_result(deadline=now() + timedelta(milliseconds=20))
    with pytest.raises(TimeoutError, match="execution slow"):
        await execution.get_result(deadline=now() - timedelta(seconds=1))


async def test_get_result_refuses_both_timeout_and_deadline(docket: Docket, now: Now) -> None:
    async def job() -> None:
        pass

    execution = await docket.add(job, when=now() + timedelta(seconds=30))()
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"^Cannot specify both timeout and deadline$"):
        await execution.get_result(timeout=timedelta(seconds=5), deadline=now())
    assert time.monotonic() - started < 1.0


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


async def test_get_result_of_a_struck_execution(docket: Docket) -> None:
    async def job() -> None:
        pass

    await docket.strike(job)
    execution = await docket.add(job)()
    assert execution.disposition is Disposition.STRUCK
    assert execution.state is ExecutionState.CANCELLED
    with (
        anyio.fail_after(1),
        pytest.raises(ExecutionCancelled, match=r"^Execution .* was cancelled$"),
    ):
        await execution.get_result()


async def test_get_result_of_a_cancelled_execution_says_so(docket: Docket, now: Now) -> None:
    async def job() -> None:
        pass

    execution = await docket.add(job, when=now() + timedelta(seconds=30), key="gone")()
    await docket.cancel("gone")
    with (
        anyio.fail_after(2),
        pytest.raises(ExecutionCancelled, match=r"^Execution gone was cancelled$"),
    ):
        await execution.get_result()


class Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


async def test_get_result_of_an_exception_that_cannot_be_kept(
    docket: Docket, worker: Worker
) -> None:
    async def explode() -> None:
        raise Unpicklable("locked up")

    execution = await docket.add(explode)()
    await finish(worker)
    with anyio.fail_after(1), pytest.raises(Exception, match="Unpicklable: locked up"):
        await execution.get_result()


# -- execution_ttl --------------------------------------------------------------------


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
