"""End-to-end tests of the Docket client API on memory://, under asyncio and trio.

Strikes, snapshot, clear, workers and task_workers.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import anyio
import pytest
from helpers import Now, finish, key, running

from docket_core import (
    Disposition,
    Docket,
    ExecutionState,
    Operator,
    UsageError,
    Worker,
)

pytestmark = pytest.mark.anyio


# -- strikes ----------------------------------------------------------------------------------


async def test_strike_by_function(docket: Docket, worker: Worker) -> None:
    calls: list[str] = []

    async def struck(x: int) -> None:
        calls.append("struck")

    async def spared(x: int) -> None:
        calls.append("spared")

    await docket.strike(struck)
    k = key()
    execution = await docket.add(struck, key=k)(1)
    assert execution.disposition is Disposition.STRUCK
    assert await docket.get_execution(k) is None
    assert (await docket.snapshot()).future == []

    other = await docket.add(spared)(1)
    assert other.disposition is Disposition.SCHEDULED

    await finish(worker)
    assert calls == ["spared"]


async def test_strike_by_function_name(docket: Docket) -> None:
    async def by_name() -> None:
        pass

    docket.register(by_name)
    await docket.strike("by_name")
    assert (await docket.add("by_name")()).disposition is Disposition.STRUCK
    assert (await docket.add(by_name)()).disposition is Disposition.STRUCK


@pytest.mark.parametrize(
    ("operator", "value", "struck", "spared"),
    [
        ("==", 5, [5], [4, 6]),
        ("!=", 5, [4, 6], [5]),
        (">", 5, [6, 9], [5, 4]),
        (">=", 5, [5, 6], [4]),
        ("<", 5, [4, 0], [5, 6]),
        ("<=", 5, [5, 4], [6]),
        ("between", (3, 5), [3, 4, 5], [2, 6]),
        (Operator.GREATER_THAN, 5, [6], [5]),
    ],
)
async def test_strike_by_parameter(
    docket: Docket,
    worker: Worker,
    operator: str | Operator,
    value: Any,
    struck: list[int],
    spared: list[int],
) -> None:
    calls: list[tuple[str, int]] = []

    async def first(customer: int) -> None:
        calls.append(("first", customer))

    async def second(region: str, customer: int) -> None:
        calls.append(("second", customer))

    async def unrelated(other: int) -> None:
        calls.append(("unrelated", other))

    await docket.strike(None, "customer", operator, value)

    for n in struck:
        assert (await docket.add(first)(n)).disposition is Disposition.STRUCK
        assert (await docket.add(second)("eu", customer=n)).disposition is Disposition.STRUCK
        # a parameter of another name is not affected
        assert (await docket.add(unrelated)(n)).disposition is Disposition.SCHEDULED
    for n in spared:
        assert (await docket.add(first)(customer=n)).disposition is Disposition.SCHEDULED
        assert (await docket.add(second)("eu", n)).disposition is Disposition.SCHEDULED

    await finish(worker)
    expected = sorted(
        [("first", n) for n in spared]
        + [("second", n) for n in spared]
        + [("unrelated", n) for n in struck]
    )
    assert sorted(calls) == expected


async def test_incomparable_values_are_not_struck(docket: Docket) -> None:
    async def job(customer: Any) -> None:
        pass

    await docket.strike(None, "customer", ">", 5)
    assert (await docket.add(job)("text")).disposition is Disposition.SCHEDULED
    assert (await docket.add(job)(None)).disposition is Disposition.SCHEDULED
    assert (await docket.add(job)(6)).disposition is Disposition.STRUCK


async def test_strike_by_function_and_parameter(docket: Docket, worker: Worker) -> None:
    calls: list[tuple[str, int]] = []

    async def target(customer: int) -> None:
        calls.append(("target", customer))

    async def bystander(customer: int) -> None:
        calls.append(("bystander", customer))

    await docket.strike(target, "customer", "==", 1)
    assert (await docket.add(target)(1)).disposition is Disposition.STRUCK
    assert (await docket.add(target)(2)).disposition is Disposition.SCHEDULED
    assert (await docket.add(bystander)(1)).disposition is Disposition.SCHEDULED

    await finish(worker)
    assert sorted(calls) == [("bystander", 1), ("target", 2)]


async def test_strike_needs_a_function_or_parameter(docket: Docket) -> None:
    with pytest.raises(UsageError):
        await docket.strike()


async def test_struck_at_execution_when_due(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[int] = []

    async def victim(customer: int) -> None:
        calls.append(customer)

    soon = now() + timedelta(milliseconds=30)
    by_function = await docket.add(victim, when=soon)(1)
    by_value = await docket.add(victim, when=soon)(3)
    kept = await docket.add(victim, when=soon)(4)
    assert by_function.disposition is Disposition.SCHEDULED

    await docket.strike(victim, "customer", "<", 3)
    await docket.strike(None, "customer", "==", 3)

    await finish(worker)
    assert calls == [4]
    for execution in (by_function, by_value):
        stored = await docket.get_execution(execution.key)
        assert stored is not None
        assert stored.state is ExecutionState.CANCELLED, execution
    done = await docket.get_execution(kept.key)
    assert done is not None
    assert done.state is ExecutionState.COMPLETED


async def test_struck_at_execution_already_queued_when_worker_starts(
    docket: Docket, worker: Worker
) -> None:
    calls: list[int] = []

    async def victim(customer: int) -> None:
        calls.append(customer)

    queued = await docket.add(victim)(1)
    assert queued.disposition is Disposition.SCHEDULED
    await docket.strike(victim)

    await finish(worker)
    assert calls == []
    stored = await docket.get_execution(queued.key)
    assert stored is not None
    assert stored.state is ExecutionState.CANCELLED


async def test_struck_at_execution_while_the_worker_runs(
    docket: Docket, worker: Worker, now: Now
) -> None:
    calls: list[str] = []
    ran = anyio.Event()

    async def victim() -> None:
        calls.append("victim")

    async def marker() -> None:
        calls.append("marker")
        ran.set()

    async with running(worker):
        execution = await docket.add(victim, when=now() + timedelta(milliseconds=40))()
        await docket.strike(victim)
        await docket.add(marker, when=now() + timedelta(milliseconds=80))()
        await ran.wait()
        stored = await docket.get_execution(execution.key)
    assert calls == ["marker"]
    assert stored is not None
    assert stored.state is ExecutionState.CANCELLED


async def test_restore_undoes_a_strike(docket: Docket, worker: Worker) -> None:
    calls: list[int] = []

    async def job(customer: int) -> None:
        calls.append(customer)

    await docket.strike(job)
    await docket.strike(None, "customer", "between", (10, 20))
    assert (await docket.add(job)(1)).disposition is Disposition.STRUCK

    await docket.restore(job)
    assert (await docket.add(job)(1)).disposition is Disposition.SCHEDULED
    assert (await docket.add(job)(15)).disposition is Disposition.STRUCK

    await docket.restore(None, "customer", "between", (10, 20))
    assert (await docket.add(job)(15)).disposition is Disposition.SCHEDULED

    await finish(worker)
    assert sorted(calls) == [1, 15]


async def test_restore_lets_a_held_back_execution_run(docket: Docket, worker: Worker) -> None:
    calls: list[int] = []

    async def job() -> None:
        calls.append(1)

    execution = await docket.add(job)()
    await docket.strike(job)
    await docket.restore(job)
    await finish(worker)
    assert calls == [1]
    stored = await docket.get_execution(execution.key)
    assert stored is not None
    assert stored.state is ExecutionState.COMPLETED


# -- snapshot, clear, workers ---------------------------------------------------------------


async def test_snapshot_future_running_and_workers(
    docket: Docket, worker: Worker, now: Now
) -> None:
    started = anyio.Event()
    release = anyio.Event()

    async def blocking(tag: str) -> None:
        started.set()
        await release.wait()

    async def later(n: int) -> None:
        pass

    empty = await docket.snapshot()
    assert (empty.future, empty.running, empty.workers, empty.total_tasks) == ([], [], [], 0)

    when = now() + timedelta(seconds=30)
    future = await docket.add(later, when=when, key="later-key")(7)
    snapshot = await docket.snapshot()
    assert [(e.key, e.function_name, e.args, e.when) for e in snapshot.future] == [
        ("later-key", "later", (7,), when)
    ]
    assert snapshot.total_tasks == 1

    async with running(worker):
        held = await docket.add(blocking, key="blocking-key")("t")
        await started.wait()
        snapshot = await docket.snapshot()
        assert [e.key for e in snapshot.future] == [future.key]
        assert len(snapshot.running) == 1
        run = snapshot.running[0]
        assert run.key == held.key
        assert run.function_name == "blocking"
        assert run.worker == worker.name
        assert run.execution.args == ("t",)
        assert run.started <= now()
        assert snapshot.total_tasks == 2
        assert [w.name for w in snapshot.workers] == [worker.name]
        assert {"blocking", "later"} <= snapshot.workers[0].tasks
        release.set()
        await held.get_result(timeout=timedelta(seconds=2))

    snapshot = await docket.snapshot()
    assert snapshot.running == []
    assert snapshot.workers == []
    assert [e.key for e in snapshot.future] == [future.key]


async def test_clear_removes_scheduled_and_queued(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[int] = []

    async def job(n: int) -> None:
        calls.append(n)

    executions = [
        await docket.add(job)(1),
        await docket.add(job)(2),
        await docket.add(job, when=now() + timedelta(milliseconds=20))(3),
    ]
    assert await docket.clear() == 3
    assert (await docket.snapshot()).future == []
    await finish(worker)
    assert calls == []
    for execution in executions:
        stored = await docket.get_execution(execution.key)
        assert stored is not None
        assert stored.state is ExecutionState.CANCELLED
    assert await docket.clear() == 0


async def test_clear_leaves_running_tasks(docket: Docket) -> None:
    # one slot: the queued job stays queued while the blocking task runs
    worker = Worker(docket, concurrency=1, minimum_check_interval=timedelta(milliseconds=5))
    started = anyio.Event()
    release = anyio.Event()

    async def blocking() -> str:
        started.set()
        await release.wait()
        return "finished"

    async def queued_job() -> None:
        raise AssertionError("cleared; must not run")

    async with running(worker):
        held = await docket.add(blocking)()
        await started.wait()
        await docket.add(queued_job)()
        assert await docket.clear() == 1
        release.set()
        assert await held.get_result(timeout=timedelta(seconds=2)) == "finished"


async def test_workers_and_task_workers(docket: Docket, worker: Worker) -> None:
    async def some_task() -> None:
        pass

    docket.register(some_task)
    assert await docket.workers() == []
    started = anyio.Event()

    async def ping() -> None:
        started.set()

    async with running(worker):
        await docket.add(ping)()
        await started.wait()
        workers = await docket.workers()
        assert [w.name for w in workers] == [worker.name]
        assert {"some_task", "ping", "trace", "fail", "sleep"} <= workers[0].tasks
        assert workers[0].last_seen <= datetime.now(workers[0].last_seen.tzinfo)
        assert [w.name for w in await docket.task_workers("some_task")] == [worker.name]
        assert await docket.task_workers("not_a_task") == []
    assert await docket.workers() == []
