"""``Shared`` values and ``Worker(dependencies=...)`` end to end, on every
contract backend: one value per worker, built on first use (or at startup
for the worker's own), handed to every task, closed when the worker stops,
in reverse order of building; a worker dependency resolves around every
run (not passed to the task, shared with the task's own ``Depends`` of the
same factory); a failure to build one at startup is a clear error."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

import anyio
import pytest
from helpers import loaded, make_worker

from docket_core import (
    CurrentWorker,
    Depends,
    Docket,
    ExecutionState,
    Retry,
    Shared,
    Timeout,
    Worker,
)
from docket_core.shared import WorkerDependencyError

pytestmark = pytest.mark.anyio


async def finish(worker: Worker) -> None:
    with anyio.fail_after(10):
        await worker.run_until_finished()


async def test_a_shared_value_is_built_once_per_worker_and_closed_with_it(
    docket: Docket,
) -> None:
    events: list[str] = []

    @asynccontextmanager
    async def pool() -> AsyncIterator[dict[str, int]]:
        events.append("open")
        yield {"uses": 0}
        events.append("close")

    seen: list[int] = []

    async def query(n: int, connections: dict[str, int] = Shared(pool)) -> None:
        connections["uses"] += 1
        seen.append(id(connections))

    for n in range(4):
        await docket.add(query)(n)
    async with make_worker(docket, concurrency=2) as worker:
        await finish(worker)
        assert events == ["open"]
        await docket.add(query)(9)
        await finish(worker)  # the same worker, run again: the same value
        assert events == ["open"]
    assert events == ["open", "close"]
    assert len(seen) == 5 and len(set(seen)) == 1


async def test_shared_values_depend_on_each_other_and_close_in_reverse(docket: Docket) -> None:
    events: list[str] = []

    @asynccontextmanager
    async def config() -> AsyncIterator[str]:
        events.append("open config")
        yield "dsn://x"
        events.append("close config")

    @asynccontextmanager
    async def engine(dsn: str = Shared(config)) -> AsyncIterator[str]:
        events.append(f"open engine on {dsn}")
        yield f"engine({dsn})"
        events.append("close engine")

    got: list[str] = []

    async def task(db: str = Shared(engine)) -> None:
        got.append(db)

    await docket.add(task)()
    await finish(make_worker(docket))  # not entered: the run owns the scope
    assert got == ["engine(dsn://x)"]
    assert events == [
        "open config",
        "open engine on dsn://x",
        "close engine",
        "close config",
    ]


async def test_worker_dependencies_run_around_every_task(docket: Docket) -> None:
    events: list[str] = []

    @contextmanager
    def audit(worker: Worker = CurrentWorker()) -> Iterator[str]:
        events.append("enter")
        yield worker.name
        events.append("exit")

    seen: list[Any] = []

    async def task(n: int, who: str = Depends(audit)) -> None:
        events.append(f"run {n}")
        seen.append(who)

    for n in range(2):
        await docket.add(task)(n)
    worker = make_worker(docket, concurrency=1, dependencies=[Depends(audit)])
    await finish(worker)
    # one enter and exit per run: the task's Depends(audit) is the worker's value
    assert events == ["enter", "run 0", "exit", "enter", "run 1", "exit"]
    assert seen == [worker.name, worker.name]


async def test_worker_shared_dependencies_are_built_at_startup(docket: Docket) -> None:
    events: list[str] = []

    @asynccontextmanager
    async def client() -> AsyncIterator[str]:
        events.append("open")
        yield "client"
        events.append("close")

    async with make_worker(docket, dependencies={"client": Shared(client)}):
        assert events == ["open"]
    assert events == ["open", "close"]


async def test_a_failed_worker_dependency_is_an_error_at_startup(docket: Docket) -> None:
    events: list[str] = []

    @asynccontextmanager
    async def first() -> AsyncIterator[str]:
        events.append("open first")
        yield "first"
        events.append("close first")

    async def broken() -> str:
        raise ConnectionError("no database")

    ran: list[str] = []

    async def task() -> None:
        ran.append("ran")

    await docket.add(task)()
    worker = make_worker(docket, dependencies={"first": Shared(first), "database": Shared(broken)})
    with pytest.raises(WorkerDependencyError, match=r"'database'.*ConnectionError: no database"):
        async with worker:
            pass
    with pytest.raises(WorkerDependencyError, match="'database'"):
        await worker.run_until_finished()
    assert ran == []
    assert events == ["open first", "close first"] * 2


async def test_worker_dependencies_are_checked_when_the_worker_is_made(docket: Docket) -> None:
    with pytest.raises(ValueError, match="reserved"):
        Worker(docket, dependencies={"__mine": Depends(lambda: 1)})
    with pytest.raises(TypeError, match="must be a Dependency instance"):
        Worker(docket, dependencies=[lambda: 1])


async def test_a_worker_level_retry_and_timeout_drive_every_task(docket: Docket) -> None:
    """As in pydocket, a worker's ``Retry`` and ``Timeout`` apply to every
    task that declares none; a task that declares its own clashes (it fails
    with pydocket's words, without running)."""
    attempts: list[str] = []

    async def plain() -> None:
        attempts.append("plain")
        raise ValueError("again")

    async def slow() -> None:
        attempts.append("slow")
        await anyio.sleep(5)

    async def own_retry(retry: Retry = Retry(attempts=5)) -> None:
        attempts.append("own_retry")

    keys = [(await docket.add(task)()).key for task in (plain, slow, own_retry)]
    worker = make_worker(
        docket, dependencies=[Retry(attempts=2), Timeout(timedelta(milliseconds=200))]
    )
    await finish(worker)
    assert sorted(attempts) == ["plain", "plain", "slow", "slow"]
    plain_run, slow_run, clash = [await loaded(docket, key) for key in keys]
    assert plain_run.state is ExecutionState.FAILED
    assert slow_run.state is ExecutionState.FAILED
    assert clash.state is ExecutionState.FAILED
    assert clash.error is not None and "Only one Retry dependency" in clash.error
