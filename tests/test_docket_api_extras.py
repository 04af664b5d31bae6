"""End-to-end tests of the Docket client API on memory://, under asyncio and trio.

Agenda.scatter, the testing helpers, arguments that cannot be pickled, and edges
of add/cancel/get_result/get_execution.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import anyio
import pytest
from helpers import Now, finish, key, running

from docket_core import (
    Agenda,
    Disposition,
    Docket,
    ExecutionCancelled,
    ExecutionState,
    Progress,
    UsageError,
    Worker,
)
from docket_core.testing import (
    assert_no_tasks,
    assert_task_count,
    assert_task_not_scheduled,
    assert_task_scheduled,
)

pytestmark = pytest.mark.anyio


# -- Agenda ------------------------------------------------------------------------------------


async def test_agenda_scatter_spreads_over_the_window(docket: Docket, now: Now) -> None:
    async def job(n: int) -> None:
        pass

    agenda = Agenda()
    for n in range(5):
        agenda.add(job)(n)
    agenda.add(job, key="fixed")(99)
    assert len(agenda) == 6

    start = now() + timedelta(seconds=10)
    executions = await agenda.scatter(docket, over=timedelta(seconds=50), start=start)
    assert [e.disposition for e in executions] == [Disposition.SCHEDULED] * 6
    offsets = [round((e.when - start).total_seconds(), 6) for e in executions]
    assert offsets == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    assert executions[-1].key == "fixed"
    assert [e.args for e in executions] == [(n,) for n in [0, 1, 2, 3, 4, 99]]
    snapshot = await docket.snapshot()
    assert len(snapshot.future) == 6

    again = await agenda.scatter(docket, over=timedelta(seconds=50), start=start)
    assert again[-1].disposition is Disposition.ALREADY_SCHEDULED
    assert len((await docket.snapshot()).future) == 11


async def test_agenda_scatter_single_goes_in_the_middle(docket: Docket, now: Now) -> None:
    async def job() -> None:
        pass

    agenda = Agenda()
    agenda.add(job)()
    start = now() + timedelta(seconds=1)
    (execution,) = await agenda.scatter(docket, over=timedelta(seconds=10), start=start)
    assert execution.when - start == timedelta(seconds=5)


async def test_agenda_scatter_with_jitter_is_deterministic(docket: Docket, now: Now) -> None:
    async def job(n: int) -> None:
        pass

    agenda = Agenda()
    for n in range(3):
        agenda.add(job)(n)
    draws: Iterator[float] = iter([0.0, 0.75, 0.5])
    start = now() + timedelta(seconds=5)
    executions = await agenda.scatter(
        docket,
        over=timedelta(seconds=20),
        start=start,
        jitter=timedelta(seconds=4),
        random=lambda: next(draws),
    )
    offsets = [(e.when - start).total_seconds() for e in executions]
    # evenly 0, 10, 20; jitter (2*r - 1) * 4: -4 (clamped to start), +2, 0
    assert offsets == pytest.approx([0.0, 12.0, 20.0], abs=1e-6)


async def test_agenda_scatter_rejects_unknown_names_first(docket: Docket) -> None:
    async def job() -> None:
        pass

    agenda = Agenda()
    agenda.add(job)()
    agenda.add("no_such_task")()
    with pytest.raises(KeyError, match="no_such_task"):
        await agenda.scatter(docket, over=timedelta(seconds=10))
    assert (await docket.snapshot()).future == []


async def test_agenda_scatter_rejects_an_empty_window(docket: Docket) -> None:
    async def job() -> None:
        pass

    agenda = Agenda()
    agenda.add(job)()
    with pytest.raises(ValueError):
        await agenda.scatter(docket, over=timedelta(0))
    assert (await docket.snapshot()).future == []


async def test_agenda_scatter_then_run(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[int] = []

    async def job(n: int) -> None:
        calls.append(n)

    agenda = Agenda()
    for n in range(3):
        agenda.add(job)(n)
    await agenda.scatter(docket, over=timedelta(milliseconds=60))
    await finish(worker)
    assert sorted(calls) == [0, 1, 2]


# -- testing helpers ----------------------------------------------------------------------------


async def test_testing_helpers(docket: Docket, worker: Worker, now: Now) -> None:
    async def send(to: str, subject: str = "", *, urgent: bool = False) -> None:
        pass

    async def other() -> None:
        pass

    await assert_no_tasks(docket)
    await assert_task_count(docket, count=0)
    await assert_task_not_scheduled(docket, send)

    await docket.add(send, key="k1")("ann", subject="hi", urgent=True)
    await docket.add(send, when=now() + timedelta(seconds=30))("bob")
    await docket.add(other)()

    await assert_task_scheduled(docket, send)
    await assert_task_scheduled(docket, "send", args=("ann",))
    await assert_task_scheduled(docket, send, kwargs={"urgent": True})
    await assert_task_scheduled(docket, send, kwargs={"subject": "hi", "urgent": True})
    await assert_task_scheduled(docket, send, key="k1")
    await assert_task_scheduled(docket, send, args=("bob",))
    await assert_task_scheduled(docket, other)
    await assert_task_not_scheduled(docket, send, args=("carol",))
    await assert_task_not_scheduled(docket, send, kwargs={"urgent": False})
    await assert_task_not_scheduled(docket, send, key="k2")
    await assert_task_not_scheduled(docket, "trace")
    await assert_task_count(docket, count=3)
    await assert_task_count(docket, send, count=2)
    await assert_task_count(docket, "other", count=1)

    with pytest.raises(AssertionError, match="carol") as caught:
        await assert_task_scheduled(docket, send, args=("carol",))
    message = str(caught.value)
    assert "3 scheduled" in message
    assert "'ann'" in message and "'bob'" in message and "other" in message

    with pytest.raises(AssertionError, match="not to be scheduled"):
        await assert_task_not_scheduled(docket, send, key="k1")
    with pytest.raises(AssertionError, match="expected 5 send tasks scheduled, found 2"):
        await assert_task_count(docket, send, count=5)
    with pytest.raises(AssertionError, match="expected no tasks"):
        await assert_no_tasks(docket)

    await docket.clear()
    await assert_no_tasks(docket)
    with pytest.raises(AssertionError, match="nothing is scheduled"):
        await assert_task_scheduled(docket, send)


async def test_testing_helpers_ignore_running_tasks(docket: Docket, worker: Worker) -> None:
    started = anyio.Event()
    release = anyio.Event()

    async def blocking() -> None:
        started.set()
        await release.wait()

    async with running(worker):
        execution = await docket.add(blocking)()
        await started.wait()
        await assert_no_tasks(docket)
        await assert_task_not_scheduled(docket, blocking)
        release.set()
        await execution.get_result(timeout=timedelta(seconds=2))


# -- arguments that cannot be pickled --------------------------------------------------------


def _generator() -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(
    "argument",
    [
        pytest.param(lambda: [threading.Lock()], id="lock"),
        pytest.param(lambda: _generator(), id="generator"),
        pytest.param(lambda: {"nested": (lambda x: x, threading.Lock())}, id="lambda-with-lock"),
    ],
)
async def test_unpicklable_argument_raises_usage_error(
    docket: Docket, argument: Callable[[], Any]
) -> None:
    async def job(value: Any) -> None:
        pass

    k = key()
    with pytest.raises(UsageError, match="pickled"):
        await docket.add(job, key=k)(argument())
    with pytest.raises(UsageError):
        await docket.add(job, key=k)(value=argument())
    with pytest.raises(UsageError):
        await docket.replace(job, datetime.now().astimezone(), k)(argument())
    assert (await docket.snapshot()).future == []
    assert await docket.get_execution(k) is None
    # the key is still free
    assert (await docket.add(job, key=k)(1)).disposition is Disposition.SCHEDULED


# -- edges ------------------------------------------------------------------------------------


async def test_add_with_when_in_the_past_is_queued(
    docket: Docket, worker: Worker, now: Now
) -> None:
    calls: list[int] = []

    async def job() -> None:
        calls.append(1)

    execution = await docket.add(job, when=now() - timedelta(hours=1))()
    assert execution.state is ExecutionState.QUEUED
    await finish(worker)
    assert calls == [1]


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


async def test_get_result_of_a_struck_execution(docket: Docket) -> None:
    async def job() -> None:
        pass

    await docket.strike(job)
    execution = await docket.add(job)()
    assert execution.disposition is Disposition.STRUCK
    assert execution.state is ExecutionState.CANCELLED
    with anyio.fail_after(1), pytest.raises(ExecutionCancelled):
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


async def test_default_keys_are_time_ordered_uuid7(docket: Docket) -> None:
    import uuid as uuid_module

    async def job() -> None:
        pass

    first = await docket.add(job)()
    await anyio.sleep(0.002)
    second = await docket.add(job)()
    assert uuid_module.UUID(first.key).version == 7
    assert first.key < second.key


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
