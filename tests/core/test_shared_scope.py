"""``Shared`` values and worker dependencies (``docket_core.shared``): built
once per worker on first use, closed in reverse order when the worker
stops, cycles and failures reported clearly."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from docket_core.dependencies import (
    CurrentWorker,
    Depends,
    TaskContext,
    TaskKey,
    resolve,
    validate,
)
from docket_core.sansio.errors import UsageError
from docket_core.shared import (
    Shared,
    SharedScope,
    WorkerDependencyError,
    validate_worker_dependencies,
    worker_dependencies,
)

pytestmark = pytest.mark.anyio

WORKER = SimpleNamespace(name="w")


def context(key: str = "k") -> TaskContext:
    async def report(**fields: Any) -> None:
        pass

    return TaskContext(
        docket=SimpleNamespace(name="d"),
        worker=WORKER,
        execution=SimpleNamespace(key=key, attempt=1, function_name="task"),
        function_name="task",
        args=(),
        kwargs={},
        now=lambda: 0.0,
        deadline=None,
        on_deadline_change=lambda deadline: None,
        report_progress=report,
    )


async def run_task(task: Any) -> Any:
    async with resolve(task, context()) as call:
        return await task(*call.args, **call.kwargs)


@contextmanager
def fails_with(kind: type[BaseException], match: str = "") -> Iterator[None]:
    """The error, alone or in the group a failed resolution raises."""
    try:
        yield
    except BaseException as error:
        found: BaseException | None = error if isinstance(error, kind) else None
        if found is None and isinstance(error, BaseExceptionGroup):
            group = error.subgroup(kind)
            found = group.exceptions[0] if group is not None else None
        if found is None or match not in str(found):
            raise
    else:
        raise AssertionError(f"no {kind.__name__} was raised")


async def test_a_shared_value_is_built_once_and_closed_with_its_worker() -> None:
    log: list[str] = []

    @asynccontextmanager
    async def pool() -> AsyncIterator[object]:
        log.append("open")
        await anyio.sleep(0.01)  # slow: concurrent first uses wait for this build
        yield object()
        log.append("close")

    async def task(value: object = Shared(pool)) -> object:
        return value

    async with SharedScope(worker=WORKER):
        values: list[object] = []

        async def one() -> None:
            values.append(await run_task(task))

        async with anyio.create_task_group() as group:
            for _ in range(5):
                group.start_soon(one)
        assert len({id(v) for v in values}) == 1
        assert log == ["open"]
    assert log == ["open", "close"]


async def test_shared_values_close_in_reverse_order_of_their_building() -> None:
    log: list[str] = []

    @contextmanager
    def config() -> Iterator[dict[str, str]]:
        log.append("config")
        yield {"url": "db://"}
        log.append("~config")

    @asynccontextmanager
    async def database(settings: dict[str, str] = Shared(config)) -> AsyncIterator[str]:
        log.append("database")
        yield settings["url"]
        log.append("~database")

    async def client(url: str = Shared(database), worker: Any = CurrentWorker()) -> str:
        log.append("client")
        return f"{worker.name}:{url}"

    async def task(c: str = Shared(client), d: str = Shared(database)) -> tuple[str, str]:
        return c, d

    async with SharedScope(worker=WORKER) as scope:
        assert await run_task(task) == ("w:db://", "db://")
        assert scope.built == (config, database, client)
    assert log == ["config", "database", "client", "~database", "~config"]


async def test_a_failed_build_is_not_kept_and_what_it_opened_is_closed() -> None:
    log: list[str] = []
    attempts = iter([True, False])

    @asynccontextmanager
    async def resource() -> AsyncIterator[str]:
        log.append("open")
        yield "r"
        log.append("close")

    async def flaky(r: str = Depends(resource)) -> str:
        if next(attempts):
            raise ConnectionError("refused")
        return r + "!"

    async def task(value: str = Shared(flaky)) -> str:
        return value

    async with SharedScope(worker=WORKER):
        with fails_with(ConnectionError):
            await run_task(task)
        assert log == ["open", "close"]
        assert await run_task(task) == "r!"
    assert log == ["open", "close", "open", "close"]


def test_shared_dependencies_that_form_a_cycle_are_refused() -> None:
    def first(value: object = Shared(lambda: None)) -> object:
        return value

    def second(value: object = Shared(first)) -> object:
        return value

    first.__defaults__ = (Shared(second),)

    async def task(value: object = Shared(first)) -> None: ...

    with pytest.raises(UsageError, match="cycle"):
        validate(task)


async def test_shared_needs_a_worker_and_no_task() -> None:
    async def task(value: object = Shared(object)) -> object:
        return value

    with fails_with(UsageError, "running worker"):
        await run_task(task)

    def keyed(key: str = TaskKey()) -> str:
        return key

    async def keyed_task(value: str = Shared(keyed)) -> str:
        return value

    async with SharedScope(worker=WORKER):
        with fails_with(UsageError, "outside any task: there is no execution key"):
            await run_task(keyed_task)


async def test_the_worker_dependencies_are_built_at_startup_and_a_failure_names_one() -> None:
    log: list[str] = []

    @asynccontextmanager
    async def cache() -> AsyncIterator[str]:
        log.append("cache")
        yield "c"
        log.append("~cache")

    async def broken() -> str:
        raise OSError("no route to host")

    dependencies = validate_worker_dependencies({"cache": Shared(cache), "db": Shared(broken)})
    with pytest.raises(WorkerDependencyError, match=r"'db' \(Shared\(.*broken\)\).*no route"):
        async with SharedScope(worker=WORKER) as scope:
            await scope.start(dependencies)
    assert log == ["cache", "~cache"]


def test_worker_dependencies_are_named_and_checked() -> None:
    shared = Shared(object)
    assert validate_worker_dependencies(None) == {}
    assert validate_worker_dependencies([shared]) == {"__worker_dep_0__": shared}
    assert validate_worker_dependencies({"pool": shared}) == {"pool": shared}
    with pytest.raises(UsageError, match="reserved"):
        validate_worker_dependencies({"__pool": shared})
    with pytest.raises(TypeError, match="must be a Dependency"):
        validate_worker_dependencies({"pool": object()})


async def test_worker_dependencies_run_around_each_task_in_reverse_order() -> None:
    log: list[str] = []

    def tracked(name: str) -> Any:
        @asynccontextmanager
        async def manager() -> AsyncIterator[str]:
            log.append(name)
            try:
                yield name
            finally:
                log.append(f"~{name}")

        manager.__qualname__ = name
        return manager

    dependencies = validate_worker_dependencies(
        {"a": Depends(tracked("a")), "b": Depends(tracked("b"))}
    )
    with pytest.raises(RuntimeError):
        async with worker_dependencies(context(), dependencies) as values:
            assert values == {"a": "a", "b": "b"}
            log.append("task")
            raise RuntimeError("the task failed")
    assert log == ["a", "b", "task", "~b", "~a"]
