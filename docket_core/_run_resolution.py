"""One execution's resolution: ``resolve(function, context)`` enters the
dependencies a task declares (and the worker's own), in a ``Run`` that
keeps their cache, cleanups and roles, and gives the ``ResolvedCall``; the
per-function plans it follows are ``_resolution``'s."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from datetime import timedelta
from types import TracebackType
from typing import Any

import attrs

from ._resolution import (
    _NO_DEPENDENCIES,
    _PLANS,
    Dependency,
    TaskContext,
    _plan,
    bind_arguments,
    current_docket,
    current_execution,
    current_worker,
    factory_plan,
)
from .outcomes import (
    AdmissionBlocked,
    TaskOutcome,
    blocked_follow_up,
    dependency_failures,
    forced_retry_at,
    overridden,
)
from .sansio.inputs import FollowUp


class Run:
    """The state of one execution's resolution: caches, cleanups, the
    per-execution copies that have something to say afterwards, and the
    extension points found (``roles``: "runtime", "failure", "completion")."""

    __slots__ = (
        "_arguments",
        "cache",
        "context",
        "follow_ups",
        "function",
        "resolving",
        "roles",
        "stack",
    )

    def __init__(self, function: Callable[..., Any], context: TaskContext) -> None:
        self.function = function
        self.context = context
        self.stack = AsyncExitStack()
        self.cache: dict[object, Any] = {}
        self.follow_ups: list[Dependency] = []
        self.roles: dict[str, Any] = {}
        #: the parameters a ``CallArgument`` is resolving (a cycle would never end)
        self.resolving: set[str] = set()
        self._arguments: dict[str, Any] | None = None

    def sibling(self, name: str) -> Dependency | None:
        """The task's own dependency for parameter ``name``, if it has one."""
        plan = _PLANS.get(self.function) or _plan(self.function)
        return next((i.dependency for i in plan.injected if i.name == name), None)

    @property
    def arguments(self) -> dict[str, Any]:
        """The call's arguments by name (bound once, on demand)."""
        if self._arguments is None:
            context = self.context
            self._arguments = bind_arguments(self.function, context.args, context.kwargs)
        return self._arguments

    async def inject(self, dependency: Dependency, parameter: str) -> Any:
        key = dependency._cache_key()
        if key is None:
            return await dependency._inject(self, parameter)
        try:
            return self.cache[key]
        except KeyError:
            pass
        value = self.cache[key] = await dependency._inject(self, parameter)
        return value

    async def call_factory(self, factory: Callable[..., Any]) -> Any:
        """Resolve a ``Depends`` factory's own dependencies, then call or enter it."""
        plan = factory_plan(factory)
        kwargs = {name: await self.inject(d, name) for name, d in plan.injected}
        if plan.kind == "asyncgen":
            manager = contextlib.asynccontextmanager(factory)(**kwargs)
            return await self.stack.enter_async_context(manager)
        if plan.kind == "gen":
            return self.stack.enter_context(contextlib.contextmanager(factory)(**kwargs))
        value = factory(**kwargs)
        if inspect.isawaitable(value):
            value = await value
        if hasattr(value, "__aenter__") and hasattr(value, "__aexit__"):
            return await self.stack.enter_async_context(value)
        if hasattr(value, "__enter__") and hasattr(value, "__exit__"):
            return self.stack.enter_context(value)
        return value


class ResolvedCall:
    """A task call with its dependency parameters filled in."""

    __slots__ = ("_run", "args", "kwargs", "runtime")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], run: Run | None) -> None:
        self.args = args
        self.kwargs = kwargs
        self._run = run
        runtime = run.roles.get("runtime") if run is not None else None
        #: a custom ``Runtime`` to call the function through (``extensions``)
        self.runtime: Any = runtime if runtime is not None and overridden(runtime, "run") else None

    async def settle(
        self,
        execution: Any,
        *,
        started: float,
        result: Any = None,
        error: BaseException | None = None,
        retrying: bool = False,
    ) -> FollowUp | None:
        """What the run that began at ``started`` asks of its future
        (``follow_up``), once the custom handlers had their say: a failure
        goes to a ``FailureHandler`` (``True``: no retry, no next run); the
        end of a run that will not be retried to a ``CompletionHandler``.  A
        run an ``AdmissionBlocked`` stopped follows it; no handler is asked."""
        now = time.time()
        if error is not None and isinstance(error, AdmissionBlocked):
            return blocked_follow_up(error, now)
        run = self._run
        if run is None or not run.roles:
            return self.follow_up(now, error)
        outcome = TaskOutcome(duration=timedelta(seconds=now - started), result=result)
        outcome.exception = error
        handler = run.roles.get("failure")
        declined = False
        if error is not None and handler is not None and overridden(handler, "handle_failure"):
            # (a ``Retry`` subclass that asks its base retries through the core)
            by_core = hasattr(handler, "_core_retry")
            if by_core:
                handler._core_retry = False
            handled = await handler.handle_failure(execution, outcome)
            if not (by_core and handler._core_retry):
                if handled:
                    return attrs.evolve(self.follow_up(now) or FollowUp(), failure_handled=True)
                declined = retrying
                retrying = False
        handler = run.roles.get("completion")
        if (error is None or not retrying) and handler is not None:
            if overridden(handler, "on_complete"):
                if hasattr(handler, "_chain"):
                    handler._chain = False  # (a perpetual's goes on only if its own ran)
                await handler.on_complete(execution, outcome)
        follow_up = self.follow_up(time.time(), error)
        if declined:
            return attrs.evolve(follow_up or FollowUp(), retry_declined=True)
        return follow_up

    def follow_up(self, now: float, error: BaseException | None = None) -> FollowUp | None:
        """What the task asked for about its future (``retry_at`` only when
        ``error`` is given and is a ``ForcedRetry``)."""
        result: FollowUp | None = None
        if self._run is not None:
            for source in self._run.follow_ups:
                result = source._follow_up() or result
        retry_at = forced_retry_at(error, now) if error is not None else None
        if retry_at is not None:
            result = attrs.evolve(result or FollowUp(), retry_at=retry_at)
        return result


class _Resolution(AbstractAsyncContextManager[ResolvedCall]):
    """``async with resolve(function, context) as call``: see ``resolve``.

    The ``TaskContext`` is made (``make_context``) only when a dependency
    needs it: a function that declares none (and a worker that adds none) is
    called with its arguments as given.  ``outer`` is the docket and the
    worker to set ``current_docket`` and ``current_worker`` to, ``None``
    when the caller set them already (a runner task sets them once for all
    its runs)."""

    __slots__ = (
        "_args",
        "_execution",
        "_function",
        "_kwargs",
        "_make_context",
        "_outer",
        "_run",
        "_tokens",
        "_worker_dependencies",
    )

    def __init__(
        self,
        function: Callable[..., Any],
        execution: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        make_context: Callable[[], TaskContext],
        worker_dependencies: Mapping[str, Dependency],
        outer: tuple[Any, Any] | None = None,
    ) -> None:
        self._function = function
        self._execution = execution
        self._args = args
        self._kwargs = kwargs
        self._make_context = make_context
        self._worker_dependencies = worker_dependencies
        self._outer = outer
        self._run: Run | None = None
        self._tokens: tuple[contextvars.Token[Any], ...] = ()

    async def __aenter__(self) -> ResolvedCall:
        plan = _PLANS.get(self._function) or _plan(self._function)
        outer = self._outer
        if outer is None:
            self._tokens = (current_execution.set(self._execution),)
        else:
            self._tokens = (
                current_docket.set(outer[0]),
                current_worker.set(outer[1]),
                current_execution.set(self._execution),
            )
        workers = self._worker_dependencies
        if not plan.injected and not workers:
            return ResolvedCall(self._args, self._kwargs, None)
        if plan.self_injected and not workers:
            kwargs = self._kwargs
            given = len(self._args)
            for item in plan.injected:
                if item.position >= given and item.name not in kwargs:
                    if kwargs is self._kwargs:
                        kwargs = dict(kwargs)
                    kwargs[item.name] = item.dependency
            return ResolvedCall(self._args, kwargs, None)
        context = self._make_context()
        run = self._run = Run(self._function, context)
        kwargs = dict(context.kwargs)
        given = len(context.args)
        failures: dict[str, Exception] = {}
        try:
            # the worker's own first (their values are not passed to the
            # task); the task's ``Depends`` of the same factories share them
            for name, dependency in workers.items():
                try:
                    value = await run.inject(dependency, name)
                except Exception as error:
                    failures[name] = error
                else:
                    if dependency._role is not None:
                        run.roles[dependency._role] = value
            for item in plan.injected:
                if item.position < given or item.name in kwargs:
                    continue
                try:
                    value = kwargs[item.name] = await run.inject(item.dependency, item.name)
                except Exception as error:
                    failures[item.name] = error
                else:
                    if item.dependency._role is not None:
                        run.roles[item.dependency._role] = value
            if failures:
                blocked = [e for e in failures.values() if isinstance(e, AdmissionBlocked)]
                if blocked:
                    raise blocked[0]  # a block is no failure: the runtime settles it
                raise dependency_failures(failures)
        except BaseException:
            await self._close(*sys.exc_info())
            raise
        return ResolvedCall(context.args, kwargs, run)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._close(exc_type, exc, tb)

    async def _close(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._run is not None:
                # the dependencies' context managers see the task's error, but
                # cannot swallow it: the runtime must learn how the task ended
                await self._run.stack.__aexit__(exc_type, exc, tb)
        finally:
            for token in reversed(self._tokens):
                try:
                    token.var.reset(token)
                except ValueError:  # exited in another context than entered
                    pass
            self._tokens = ()


def resolve(
    function: Callable[..., Any],
    context: TaskContext,
    worker_dependencies: Mapping[str, Dependency] = _NO_DEPENDENCIES,
) -> AbstractAsyncContextManager[ResolvedCall]:
    """Resolve ``function``'s dependencies for one execution.

    Entering yields the ready call; leaving exits the dependencies' context
    managers in reverse order (also when the task failed).  Errors raised while
    resolving propagate out of ``async with`` after cleaning up what was
    already entered; a dependency that raises an ``Exception`` does not stop
    the others from resolving, and the failures are raised together
    (``dependency_failures``), unless one is an ``AdmissionBlocked``: that is
    raised as it is.  ``worker_dependencies`` (``Worker(dependencies=...)``)
    resolve first, in the same run (they share its cache), and are not
    passed to the function.  The contextvars ``current_docket``,
    ``current_worker`` and ``current_execution`` are set for the duration.
    """
    return _Resolution(
        function,
        context.execution,
        context.args,
        context.kwargs,
        lambda: context,
        worker_dependencies,
        (context.docket, context.worker),
    )


def resolve_in_runner(
    function: Callable[..., Any],
    execution: Any,
    make_context: Callable[[], TaskContext],
    worker_dependencies: Mapping[str, Dependency],
) -> AbstractAsyncContextManager[ResolvedCall]:
    """``resolve`` in a runner task, which set ``current_docket`` and
    ``current_worker`` for all its runs: the call takes ``execution``'s
    arguments, and ``make_context`` makes the ``TaskContext`` only if a
    dependency needs one (a function that declares none never pays for it)."""
    return _Resolution(
        function,
        execution,
        execution.args,
        execution.kwargs,
        make_context,
        worker_dependencies,
    )
