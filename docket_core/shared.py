"""``Shared`` values and a worker's own dependencies.

``Shared(factory)`` is one value per worker: built on first use (the first
task that needs it waits for it; others that ask meanwhile wait for the same
build), then handed to every task of the worker, and closed when the worker
stops.  Its identity is the factory: every ``Shared(open_pool)`` anywhere
means the same value.  A factory may be a function or coroutine function, a
(sync or async) generator function, or return a (sync or async) context
manager; its own parameters may be other ``Shared`` values (they are built
first, and closed after it), or ``CurrentDocket()``/``CurrentWorker()``.

``SharedScope`` holds the values of one worker: entered when the worker
starts, it closes them in reverse order of their building when it exits.
``SharedScope.start`` builds the worker's own ``Shared`` dependencies
(``Worker(dependencies=...)``) at once, so a failure is an error at startup
(``WorkerDependencyError``) rather than in some task; the other worker
dependencies (``Depends(...)``) run around every task
(``worker_dependencies``).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    AsyncExitStack,
    asynccontextmanager,
)
from types import TracebackType
from typing import Any, TypeVar, overload

import anyio

from ._resolution import Dependency, TaskContext, factory_plan
from ._run_resolution import Run
from .sansio.errors import UsageError

_R = TypeVar("_R")


class WorkerDependencyError(UsageError):
    """A worker dependency could not be built when the worker started."""


def _name(factory: Callable[..., Any]) -> str:
    return getattr(factory, "__qualname__", None) or repr(factory)


#: the factories whose ``Shared`` declarations are being checked (a cycle
#: would check one again before its check ends)
_CHECKING: list[Callable[..., Any]] = []
#: the scope of the worker whose tasks run in this context
current_scope: contextvars.ContextVar[SharedScope] = contextvars.ContextVar("shared_scope")


class _Shared(Dependency):
    """The worker's one value of ``factory`` (see the module docstring)."""

    def __init__(self, factory: Callable[..., Any]) -> None:
        self.factory = factory

    def _check(self, function: Callable[..., Any], parameter: str, top_level: bool) -> None:
        if self.factory in _CHECKING:
            cycle = [*_CHECKING[_CHECKING.index(self.factory) :], self.factory]
            raise UsageError(
                "Shared dependencies form a cycle: " + " -> ".join(_name(f) for f in cycle)
            )
        _CHECKING.append(self.factory)
        try:
            factory_plan(self.factory)
        finally:
            _CHECKING.pop()

    def _cache_key(self) -> object | None:
        return (_Shared, self.factory)

    async def _inject(self, run: Run, parameter: str) -> Any:
        scope = run.scope if isinstance(run, _ScopeRun) else current_scope.get(None)
        if scope is None:
            scope = getattr(run.context.worker, "shared_scope", None)
        if not isinstance(scope, SharedScope):
            raise UsageError(
                f"{self!r} needs a running worker: shared values live as long as their worker"
            )
        return await scope.value(self.factory)

    def __repr__(self) -> str:
        return f"Shared({_name(self.factory)})"


@overload
def Shared(factory: Callable[..., AbstractAsyncContextManager[_R]]) -> _R: ...
@overload
def Shared(factory: Callable[..., AbstractContextManager[_R]]) -> _R: ...
@overload
def Shared(factory: Callable[..., AsyncIterator[_R]]) -> _R: ...
@overload
def Shared(factory: Callable[..., Iterator[_R]]) -> _R: ...
@overload
def Shared(factory: Callable[..., Awaitable[_R]]) -> _R: ...
@overload
def Shared(factory: Callable[..., _R]) -> _R: ...
def Shared(factory: Callable[..., Any]) -> Any:
    """Inject the worker's one value of ``factory`` (see the module docstring)."""
    return _Shared(factory)


class _ScopeRun(Run):
    """The resolution of one shared factory: its scope, and no task."""

    __slots__ = ("scope",)

    def __init__(self, factory: Callable[..., Any], context: TaskContext, scope: SharedScope):
        super().__init__(factory, context)
        self.scope = scope


async def _no_progress(**changes: Any) -> None:
    raise UsageError("a shared value is built outside any task: it has no progress to report")


class _NoExecution:
    """The execution a shared factory sees: there is none."""

    def __getattr__(self, name: str) -> Any:
        raise UsageError(
            f"a shared value is built once per worker, outside any task: there is no "
            f"execution {name} to inject"
        )


class SharedScope:
    """The ``Shared`` values of one worker (see the module docstring)."""

    def __init__(self, *, docket: Any = None, worker: Any = None) -> None:
        self.docket = docket
        self.worker = worker
        self._stack = AsyncExitStack()
        self._values: dict[Callable[..., Any], Any] = {}
        self._locks: dict[Callable[..., Any], anyio.Lock] = {}
        self._token: contextvars.Token[SharedScope] | None = None
        self._closed = False

    @property
    def built(self) -> tuple[Callable[..., Any], ...]:
        """The factories built so far, in the order they were built."""
        return tuple(self._values)

    async def __aenter__(self) -> SharedScope:
        self._token = current_scope.set(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        try:
            await self._stack.__aexit__(exc_type, exc, tb)
        finally:
            self._values.clear()
            if self._token is not None:
                try:
                    current_scope.reset(self._token)
                except ValueError:  # exited in another context than entered
                    pass
                self._token = None

    async def value(self, factory: Callable[..., Any]) -> Any:
        """The value of ``factory``, built on first use."""
        try:
            return self._values[factory]
        except KeyError:
            pass
        if self._closed:
            raise UsageError(f"Shared({_name(factory)}): the worker has stopped")
        lock = self._locks.setdefault(factory, anyio.Lock())
        async with lock:
            if factory in self._values:
                return self._values[factory]
            value = self._values[factory] = await self._build(factory)
            return value

    async def _build(self, factory: Callable[..., Any]) -> Any:
        _Shared(factory)._check(_worker, "", False)  # (a cycle would never end)
        context = TaskContext(
            docket=self.docket,
            worker=self.worker,
            execution=_NoExecution(),
            function_name=f"Shared({_name(factory)})",
            args=(),
            kwargs={},
            now=time.time,
            deadline=None,
            on_deadline_change=lambda deadline: None,
            report_progress=_no_progress,
        )
        run = _ScopeRun(factory, context, self)
        try:
            value = await run.call_factory(factory)
        except BaseException:
            # what it entered before failing is closed now; the next use tries again
            await run.stack.aclose()
            raise
        # closed before whatever it was built from (built, hence pushed, first)
        self._stack.push_async_callback(run.stack.aclose)
        return value

    async def start(self, dependencies: Mapping[str, Dependency]) -> None:
        """Check the worker's dependencies and build its ``Shared`` ones now:
        a failure is a ``WorkerDependencyError`` naming the dependency (what
        was built is closed when the scope exits)."""
        for name, dependency in dependencies.items():
            try:
                dependency._check(_worker, name, True)
                if isinstance(dependency, _Shared):
                    await self.value(dependency.factory)
            except Exception as error:
                raise WorkerDependencyError(
                    f"worker dependency {name!r} ({dependency!r}) could not be built: "
                    f"{type(error).__name__}: {error}"
                ) from error


async def open_scope(
    docket: Any, worker: Any, dependencies: Mapping[str, Dependency]
) -> SharedScope:
    """Enter a worker's ``SharedScope`` and build its ``Shared`` dependencies
    (``start``); a failure closes what was built, in reverse, and raises."""
    scope = SharedScope(docket=docket, worker=worker)
    await scope.__aenter__()
    try:
        await scope.start(dependencies)
    except BaseException as error:
        await scope.__aexit__(type(error), error, error.__traceback__)
        raise
    return scope


def _worker() -> None:
    """Stands for the worker where a check names the declaring function."""


def validate_worker_dependencies(
    dependencies: Mapping[str, Any] | Sequence[Any] | None,
) -> dict[str, Dependency]:
    """``Worker(dependencies=...)`` by name: a mapping keeps its names, a
    sequence gets ``__worker_dep_<index>__``; names starting with ``__`` are
    reserved, and every value must be a dependency (``Depends(...)``,
    ``Shared(...)``...)."""
    if not dependencies:
        return {}
    if isinstance(dependencies, Mapping):
        items: list[tuple[str | None, Any]] = list(dependencies.items())
    else:
        items = [(None, dependency) for dependency in dependencies]
    validated: dict[str, Dependency] = {}
    for index, (given, dependency) in enumerate(items):
        if given is not None and given.startswith("__"):
            raise UsageError(
                f"Worker dependency name {given!r} is reserved; "
                "names starting with '__' are not allowed."
            )
        if not isinstance(dependency, Dependency):
            label = given if given is not None else f"index {index}"
            raise TypeError(
                f"Worker dependency {label!r} must be a Dependency instance "
                f"(e.g. Depends(fn) or Shared(fn)), got {type(dependency).__name__}."
            )
        validated[given if given is not None else f"__worker_dep_{index}__"] = dependency
    return validated


@asynccontextmanager
async def worker_dependencies(
    context: TaskContext, dependencies: Mapping[str, Dependency]
) -> AsyncIterator[dict[str, Any]]:
    """Resolve a worker's dependencies around one task run (in order; their
    context managers exit in reverse order after the task, even if it
    failed): yields their values by name."""
    run = Run(_worker, context)
    async with run.stack:
        yield {
            name: await run.inject(dependency, name) for name, dependency in dependencies.items()
        }
