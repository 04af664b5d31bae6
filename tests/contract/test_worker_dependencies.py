"""Dependency injection end to end: a real Worker, on every contract backend
(conftest's ``docket`` fixture), fills in CurrentDocket, CurrentWorker,
CurrentExecution, TaskKey, TaskArgument, TaskLogger, Depends and Progress."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

import anyio
import pytest

from docket_core import (
    CurrentDocket,
    CurrentExecution,
    CurrentWorker,
    Depends,
    Docket,
    Execution,
    ExecutionState,
    Progress,
    TaskArgument,
    TaskKey,
    TaskLogger,
    Worker,
)
from docket_core.dependencies import current_docket, current_execution, current_worker

pytestmark = pytest.mark.anyio

FAST = timedelta(milliseconds=5)


@pytest.fixture
def worker(docket: Docket) -> Worker:
    return Worker(docket, minimum_check_interval=FAST, scheduling_resolution=FAST)


async def run(worker: Worker, execution: Execution) -> Any:
    with anyio.fail_after(2):
        await worker.run_until_finished()
    return await execution.get_result(timeout=timedelta(seconds=1))


async def test_ambient_objects_are_injected(docket: Docket, worker: Worker) -> None:
    seen: dict[str, Any] = {}

    async def ambient(
        x: int,
        the_docket: Docket = CurrentDocket(),
        the_worker: Worker = CurrentWorker(),
        execution: Execution = CurrentExecution(),
        key: str = TaskKey(),
    ) -> None:
        seen.update(
            docket=the_docket,
            worker=the_worker,
            execution=execution,
            key=key,
            vars=(current_docket.get(), current_worker.get(), current_execution.get()),
        )

    execution = await docket.add(ambient, key="the-key")(7)
    await run(worker, execution)
    assert seen["docket"] is docket
    assert seen["worker"] is worker
    assert seen["key"] == "the-key"
    running: Execution = seen["execution"]
    assert running.key == "the-key"
    assert running.function_name == "ambient"
    assert running.args == (7,)
    assert running.attempt == 1
    assert running.state is ExecutionState.RUNNING
    assert running.worker == worker.name
    assert seen["vars"] == (docket, worker, running)


async def test_a_task_without_dependencies_sees_its_docket_worker_and_execution(
    docket: Docket, worker: Worker
) -> None:
    """A run that declares no dependency skips the resolution's work, not
    its context: async and sync tasks read their own docket, worker and
    execution, run after run in the same runner task."""
    seen: list[tuple[Any, Any, Any]] = []

    async def plain(n: int) -> None:
        seen.append((current_docket.get(), current_worker.get(), current_execution.get()))

    def plain_sync(n: int) -> None:
        seen.append((current_docket.get(), current_worker.get(), current_execution.get()))

    executions = [await docket.add(plain)(i) for i in range(3)]
    executions.append(await docket.add(plain_sync)(3))
    with anyio.fail_after(2):
        await worker.run_until_finished()
    assert len(seen) == 4
    assert all(found[0] is docket and found[1] is worker for found in seen)
    keys = sorted(execution.key for _, _, execution in seen)
    assert keys == sorted(execution.key for execution in executions)
    assert sorted(execution.args[0] for _, _, execution in seen) == [0, 1, 2, 3]


async def test_task_arguments_are_injected(docket: Docket, worker: Worker) -> None:
    async def customer_label(customer_id: int = TaskArgument()) -> str:
        return f"customer-{customer_id}"

    async def region_of(region: str | None = TaskArgument(optional=True)) -> str | None:
        return region

    async def describe(
        customer_id: int,
        amount: float,
        same_id: int = TaskArgument("customer_id"),
        label: str = Depends(customer_label),
        region: str | None = Depends(region_of),
    ) -> tuple[Any, ...]:
        return same_id, label, region, amount

    execution = await docket.add(describe)(42, amount=9.5)
    assert await run(worker, execution) == (42, "customer-42", None, 9.5)


async def test_a_missing_task_argument_fails_the_task(docket: Docket, worker: Worker) -> None:
    async def needs(missing: str = TaskArgument()) -> str:
        return missing

    async def uses(x: int, value: str = Depends(needs)) -> None:
        raise AssertionError("never runs")

    execution = await docket.add(uses)(1)
    with pytest.raises(ExceptionGroup, match=r"parameter\(s\): value") as caught:
        await run(worker, execution)
    assert any("missing" in str(inner) for inner in caught.value.exceptions)
    failed = await docket.get_execution(execution.key)
    assert failed is not None and failed.state is ExecutionState.FAILED


async def test_task_logger_labels_its_records(docket: Docket, worker: Worker) -> None:
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    async def chatty(logger: logging.LoggerAdapter[logging.Logger] = TaskLogger()) -> None:
        logger.info("hello from the task")

    target = logging.getLogger("docket.task.chatty")
    handler = Collect()
    target.addHandler(handler)
    target.setLevel(logging.INFO)
    try:
        execution = await docket.add(chatty, key="chatty-key")()
        await run(worker, execution)
    finally:
        target.removeHandler(handler)
    (record,) = [r for r in records if r.getMessage() == "hello from the task"]
    assert record.name == "docket.task.chatty"
    labels = vars(record)
    assert labels["key"] == "chatty-key"
    assert labels["docket"] == docket.name
    assert labels["worker"] == worker.name


async def test_depends_sync_async_and_nested(docket: Docket, worker: Worker) -> None:
    calls: list[str] = []

    def base() -> int:
        calls.append("base")
        return 10

    async def doubled(value: int = Depends(base)) -> int:
        calls.append("doubled")
        return value * 2

    async def combine(
        a: int = Depends(base), b: int = Depends(doubled), c: int = Depends(base)
    ) -> int:
        return a + b + c

    execution = await docket.add(combine)()
    assert await run(worker, execution) == 40
    assert calls.count("base") == 1  # resolved once per execution
    assert calls.count("doubled") == 1


async def test_depends_context_managers_exit_after_the_task(docket: Docket, worker: Worker) -> None:
    log: list[str] = []

    def sync_generator() -> Iterator[str]:
        log.append("enter sync generator")
        yield "sg"
        log.append("exit sync generator")

    async def async_generator() -> AsyncIterator[str]:
        log.append("enter async generator")
        yield "ag"
        log.append("exit async generator")

    @contextmanager
    def sync_manager() -> Iterator[str]:
        log.append("enter sync manager")
        try:
            yield "sm"
        finally:
            log.append("exit sync manager")

    @asynccontextmanager
    async def async_manager() -> AsyncIterator[str]:
        log.append("enter async manager")
        try:
            yield "am"
        finally:
            log.append("exit async manager")

    async def managed(
        a: str = Depends(sync_generator),
        b: str = Depends(async_generator),
        c: str = Depends(sync_manager),
        d: str = Depends(async_manager),
    ) -> str:
        log.append("task")
        return a + b + c + d

    execution = await docket.add(managed)()
    assert await run(worker, execution) == "sgagsmam"
    task_at = log.index("task")
    assert {e for e in log[:task_at]} == {
        "enter sync generator",
        "enter async generator",
        "enter sync manager",
        "enter async manager",
    }
    assert log[task_at + 1 :] == [
        "exit async manager",
        "exit sync manager",
        "exit async generator",
        "exit sync generator",
    ]


async def test_depends_managers_exit_when_the_task_fails(docket: Docket, worker: Worker) -> None:
    log: list[str] = []

    @asynccontextmanager
    async def resource() -> AsyncIterator[str]:
        log.append("open")
        try:
            yield "r"
        finally:
            log.append("closed")

    async def failing(value: str = Depends(resource)) -> None:
        log.append("task")
        raise RuntimeError("task broke")

    execution = await docket.add(failing)()
    with pytest.raises(RuntimeError, match="task broke"):
        await run(worker, execution)
    assert log == ["open", "task", "closed"]


async def test_a_failing_dependency_fails_the_task(docket: Docket, worker: Worker) -> None:
    ran: list[bool] = []

    async def broken_factory() -> int:
        raise LookupError("no such thing")

    async def dependent(value: int = Depends(broken_factory)) -> None:
        ran.append(True)

    execution = await docket.add(dependent)()
    with anyio.fail_after(2):
        await worker.run_until_finished()
    assert ran == []
    failed = await docket.get_execution(execution.key)
    assert failed is not None
    assert failed.state is ExecutionState.FAILED
    assert failed.error is not None and "no such thing" in failed.error


async def test_depends_in_a_sync_task(docket: Docket, worker: Worker) -> None:
    async def prefix() -> str:
        return "sync:"

    def sync_task(x: int, p: str = Depends(prefix), key: str = TaskKey()) -> str:
        return f"{p}{x}:{key}"

    execution = await docket.add(sync_task, key="k")(3)
    assert await run(worker, execution) == "sync:3:k"


async def test_progress_is_reported_while_the_task_runs(docket: Docket, worker: Worker) -> None:
    seen: list[tuple[int, int, str | None]] = []
    events: list[dict[str, Any]] = []

    async def crunch(
        progress: Progress = Progress(),
        key: str = TaskKey(),
        the_docket: Docket = CurrentDocket(),
    ) -> None:
        await progress.set_total(4)
        for _ in range(3):
            await progress.increment()
        await progress.set_message("almost")
        assert (progress.current, progress.total, progress.message) == (3, 4, "almost")
        current = await the_docket.get_execution(key)
        assert current is not None
        seen.append((current.progress.current, current.progress.total, current.progress.message))

    execution = await docket.add(crunch, key="crunch")()
    subscribed = anyio.Event()

    async def listen() -> None:
        async for event in execution.subscribe():
            subscribed.set()
            events.append(event)
            if event["type"] == "state" and ExecutionState(event["state"]).terminal:
                return

    with anyio.fail_after(2):
        async with anyio.create_task_group() as group:
            group.start_soon(listen)
            await subscribed.wait()
            await worker.run_until_finished()
    assert seen == [(3, 4, "almost")]
    progress = [e for e in events if e["type"] == "progress" and e.get("updated_at")]
    assert [(e["current"], e["total"]) for e in progress][-1] == (3, 4)
    assert progress[-1]["message"] == "almost"
    assert any(e["current"] == 1 for e in progress)
