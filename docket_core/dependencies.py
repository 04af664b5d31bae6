"""Dependencies: parameter defaults that docket fills in when a task runs.

A task declares what it needs as parameter defaults (``retry: Retry =
Retry(attempts=3)``) or as ``Annotated`` metadata (``customer_id:
Annotated[int, ConcurrencyLimit(2)]``).  The declared objects say how the task
is driven (its ``TaskPolicy``); at run time each is replaced by a per-execution
value, often a copy of itself that knows the current attempt, deadline, etc.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
)
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, ClassVar, NoReturn, TypeVar, cast, overload

from ._resolution import (
    Dependency,
    Logged,
    TaskContext,
    bind_arguments,
    call_repr,
    current_docket,
    current_execution,
    current_worker,
    task_policy,
    validate,
)
from ._run_resolution import ResolvedCall, Run, resolve
from .controls import Cooldown, Debounce, RateLimit
from .extensions import CompletionHandler, FailureHandler, Runtime
from .outcomes import (
    ADMISSION_BLOCKED_RETRY_DELAY,
    AdmissionBlocked,
    TaskOutcome,
    carried_out_by_the_core,
    forced_retry_at,
)
from .perpetual import Cron, Perpetual
from .sansio.decisions import retry_delay
from .sansio.errors import ForcedRetry, UsageError
from .sansio.values import (
    DEFAULT_PROGRESS_TOTAL,
    ConcurrencyPolicy,
    RetryPolicy,
)
from .shared import Shared, SharedScope, WorkerDependencyError

__all__ = [
    "ADMISSION_BLOCKED_RETRY_DELAY",
    "AdmissionBlocked",
    "CallArgument",
    "CompletionHandler",
    "ConcurrencyLimit",
    "Cooldown",
    "Cron",
    "CurrentDocket",
    "CurrentExecution",
    "CurrentWorker",
    "CycleError",
    "Debounce",
    "Dependency",
    "Depends",
    "ExponentialRetry",
    "FailureHandler",
    "ForcedRetry",
    "Logged",
    "Perpetual",
    "Progress",
    "RateLimit",
    "ResolvedCall",
    "Retry",
    "Runtime",
    "Shared",
    "SharedScope",
    "TaskArgument",
    "TaskContext",
    "TaskKey",
    "TaskLogger",
    "TaskOutcome",
    "Timeout",
    "WorkerDependencyError",
    "bind_arguments",
    "call_repr",
    "current_docket",
    "current_execution",
    "current_worker",
    "forced_retry_at",
    "resolve",
    "task_policy",
    "validate",
]

_D = TypeVar("_D", bound=Dependency)
_R = TypeVar("_R")


def _copy(dependency: _D) -> _D:
    return copy.copy(dependency)


# -- ambient objects ---------------------------------------------------------------


class _CurrentDocket(Dependency):
    """The ``Docket`` the task came from."""

    async def _inject(self, run: Run, parameter: str) -> Any:
        return run.context.docket


class _CurrentWorker(Dependency):
    """The ``Worker`` running the task."""

    async def _inject(self, run: Run, parameter: str) -> Any:
        return run.context.worker


class _CurrentExecution(Dependency):
    """The ``Execution`` being run."""

    async def _inject(self, run: Run, parameter: str) -> Any:
        return run.context.execution


class _TaskKey(Dependency):
    """The execution's key."""

    async def _inject(self, run: Run, parameter: str) -> Any:
        return run.context.execution.key


class _TaskArgument(Dependency):
    """One of the task's arguments, by name.

    Without a name it takes the name of the parameter it is the default of
    (in a ``Depends`` factory, the factory's parameter; on the task itself,
    the caller's value for that parameter).  A missing argument fails the run
    with a ``UsageError`` unless ``optional`` (then ``None``); as in pydocket,
    nothing about it is refused at registration.
    """

    def __init__(self, parameter: str | None = None, optional: bool = False) -> None:
        self.parameter = parameter
        self.optional = optional

    async def _inject(self, run: Run, parameter: str) -> Any:
        name = self.parameter or parameter
        arguments = run.arguments
        if name in arguments:
            return arguments[name]
        if self.optional:
            return None
        raise UsageError(
            f"TaskArgument {name!r} but the call of {run.context.function_name} "
            "has no such argument"
        )

    def __repr__(self) -> str:
        return f"TaskArgument({self.parameter!r}, optional={self.optional})"


class CycleError(UsageError):
    """``CallArgument``s that refer to each other in a circle."""


class _CallArgument(Dependency):
    """An argument of the call by name, as the task sees it: what the caller
    passed, else the parameter's plain default, else the value of the task's
    own dependency for that parameter (resolved once, shared with the task).

    Without a name it takes the name of the parameter it is the default of.
    A missing one fails the run with a ``UsageError`` unless ``optional``
    (then ``None``); parameters that resolve through each other in a circle
    fail with a ``CycleError``.
    """

    def __init__(self, parameter: str | None = None, optional: bool = False) -> None:
        self.parameter = parameter
        self.optional = optional

    async def _inject(self, run: Run, parameter: str) -> Any:
        name = self.parameter or parameter
        arguments = run.arguments
        if name in arguments:
            return arguments[name]
        sibling = run.sibling(name)
        refers_to_itself = isinstance(sibling, _CallArgument) and sibling.parameter in (None, name)
        if sibling is None or refers_to_itself:
            if self.optional:
                return None
            raise UsageError(
                f"CallArgument {name!r} but the call of {run.context.function_name} "
                "has no such argument"
            )
        if name in run.resolving:
            raise CycleError(
                f"CallArgument {name!r} of {run.context.function_name} depends on itself"
            )
        run.resolving.add(name)
        try:
            return await run.inject(sibling, name)
        finally:
            run.resolving.discard(name)

    def __repr__(self) -> str:
        return f"CallArgument({self.parameter!r}, optional={self.optional})"


class _TaskLogger(Dependency):
    """A ``LoggerAdapter`` over ``docket.task.<function name>`` labelled with
    the docket, worker and key."""

    async def _inject(self, run: Run, parameter: str) -> Any:
        context = run.context
        logger = logging.getLogger(f"docket.task.{context.function_name}")
        extra = {
            "docket": getattr(context.docket, "name", None),
            "worker": getattr(context.worker, "name", None),
            "key": getattr(context.execution, "key", None),
        }
        return logging.LoggerAdapter(logger, extra)


class _Depends(Dependency):
    """The value of ``factory``, resolved once per execution.

    ``factory`` may be a function or coroutine function, a (sync or async)
    generator function, or return a (sync or async) context manager; managers
    are exited when the task is done, in reverse order, even if it failed.
    Its own parameters may have dependency defaults.
    """

    def __init__(self, factory: Callable[..., Any]) -> None:
        self.factory = factory

    def _cache_key(self) -> object | None:
        return self.factory

    async def _inject(self, run: Run, parameter: str) -> Any:
        return await run.call_factory(self.factory)

    def __repr__(self) -> str:
        return f"Depends({getattr(self.factory, '__qualname__', self.factory)})"


def CurrentDocket() -> Any:
    """Inject the ``Docket`` the task came from."""
    return _CurrentDocket()


def CurrentWorker() -> Any:
    """Inject the ``Worker`` running the task."""
    return _CurrentWorker()


def CurrentExecution() -> Any:
    """Inject the ``Execution`` being run."""
    return _CurrentExecution()


def TaskKey() -> str:
    """Inject the execution's key."""
    return cast(str, _TaskKey())


def TaskArgument(parameter: str | None = None, optional: bool = False) -> Any:
    """Inject one of the task's arguments (see ``_TaskArgument``)."""
    return _TaskArgument(parameter, optional)


def CallArgument(parameter: str | None = None, optional: bool = False) -> Any:
    """Inject an argument of the call, or the value of the task's dependency
    for that parameter (see ``_CallArgument``)."""
    return _CallArgument(parameter, optional)


def TaskLogger() -> logging.LoggerAdapter[logging.Logger]:
    """Inject a ``LoggerAdapter`` labelled with the docket, worker and key."""
    return cast("logging.LoggerAdapter[logging.Logger]", _TaskLogger())


@overload
def Depends(factory: Callable[..., AbstractAsyncContextManager[_R]]) -> _R: ...
@overload
def Depends(factory: Callable[..., AbstractContextManager[_R]]) -> _R: ...
@overload
def Depends(factory: Callable[..., AsyncIterator[_R]]) -> _R: ...
@overload
def Depends(factory: Callable[..., Iterator[_R]]) -> _R: ...
@overload
def Depends(factory: Callable[..., Awaitable[_R]]) -> _R: ...
@overload
def Depends(factory: Callable[..., _R]) -> _R: ...
def Depends(factory: Callable[..., Any]) -> Any:
    """Inject the value of ``factory``, resolved once per execution (see ``_Depends``)."""
    return _Depends(factory)


# -- retries -----------------------------------------------------------------------


class Retry(FailureHandler):
    """Retry a failed task: ``attempts`` in total (``None``: forever), ``delay`` apart.

    The injected copy knows the current ``attempt`` (1-based) and the
    ``delay`` a failure of it waits (``decisions.retry_delay``, as the worker
    computes it), and can ask for a retry with ``after(delay)``/``in_(delay)``/
    ``at(when)``, which raise ``ForcedRetry`` (still bounded by ``attempts``).

    As in pydocket, a ``Retry`` the caller passes for the parameter
    (``add(task)(retry=Retry(3))``) drives the retries instead of the declared
    one; the task gets it as passed.
    """

    single: ClassVar[bool] = True
    _per_call: ClassVar[bool] = True

    def __init__(self, attempts: int | None = 1, delay: timedelta = timedelta(0)) -> None:
        # (as in pydocket, ``attempts`` below 1 is taken as 1: no retry)
        self.attempts = attempts
        self.delay = delay
        self.attempt = 1
        #: whether this class's own ``handle_failure`` let the core retry
        self._core_retry = False
        #: the parameters of tasks this retry is the default of (``_check``)
        self._parameters: tuple[str, ...] = ()

    @classmethod
    def forever(cls, delay: timedelta = timedelta(0)) -> Retry:
        return cls(attempts=None, delay=delay)

    def _retry_policy(self) -> RetryPolicy:
        return RetryPolicy(attempts=self.attempts, delay=self.delay.total_seconds())

    def _policy(self) -> dict[str, Any]:
        return {"retry": self._retry_policy()}

    def _check(self, function: Callable[..., Any], parameter: str, top_level: bool) -> None:
        if top_level and parameter not in self._parameters:
            self._parameters += (parameter,)

    def _call_policy(
        self, function_name: str, docket_name: str, arguments: Mapping[str, Any]
    ) -> dict[str, Any]:
        for name in self._parameters:
            given = arguments.get(name)
            if isinstance(given, Retry):
                return {"retry": given._retry_policy()}
        return {}

    def _cache_key(self) -> object | None:
        return self

    async def _inject(self, run: Run, parameter: str) -> Any:
        injected = _copy(self)
        injected.attempt = attempt = getattr(run.context.execution, "attempt", 1)
        injected.delay = timedelta(seconds=retry_delay(self._retry_policy(), attempt))
        return injected

    def after(self, delay: timedelta) -> NoReturn:
        """Stop this attempt; retry ``delay`` from now."""
        raise ForcedRetry(delay=delay.total_seconds())

    def in_(self, delay: timedelta) -> NoReturn:
        """Same as ``after``."""
        self.after(delay)

    def at(self, when: datetime) -> NoReturn:
        """Stop this attempt; retry at ``when``."""
        raise ForcedRetry(when=when.timestamp())

    @carried_out_by_the_core
    async def handle_failure(self, execution: Any, outcome: TaskOutcome) -> bool:
        """Whether a failure of ``execution`` is retried: the core schedules
        the retry itself when the run's end is recorded (a subclass that
        overrides this and calls it lets the core retry)."""
        retries = self.attempts is None or getattr(execution, "attempt", 1) < self.attempts
        self._core_retry = retries
        return retries

    def __repr__(self) -> str:
        return f"{type(self).__name__}(attempts={self.attempts}, delay={self.delay!r})"


class ExponentialRetry(Retry):
    """``Retry`` whose delay doubles on each attempt, from ``minimum_delay`` up
    to ``maximum_delay``.  The injected copy's ``delay`` is the current one."""

    def __init__(
        self,
        attempts: int | None = 1,
        minimum_delay: timedelta = timedelta(seconds=1),
        maximum_delay: timedelta = timedelta(seconds=64),
        *,
        delay: timedelta | None = None,
    ) -> None:
        """``delay`` (0.27's word) is the first delay, as ``minimum_delay``."""
        if delay is not None:
            minimum_delay = delay
        super().__init__(attempts=attempts, delay=minimum_delay)
        self.minimum_delay = minimum_delay
        self.maximum_delay = maximum_delay

    @classmethod
    def forever(
        cls,
        delay: timedelta = timedelta(seconds=1),
        maximum_delay: timedelta = timedelta(seconds=64),
        *,
        minimum_delay: timedelta | None = None,
    ) -> ExponentialRetry:
        """Retry forever, from ``delay`` (``minimum_delay``, the older word)
        doubling up to ``maximum_delay``."""
        first = minimum_delay if minimum_delay is not None else delay
        return cls(attempts=None, minimum_delay=first, maximum_delay=maximum_delay)

    def _retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            attempts=self.attempts,
            delay=self.minimum_delay.total_seconds(),
            exponential=True,
            maximum_delay=self.maximum_delay.total_seconds(),
        )

    def __repr__(self) -> str:
        return (
            f"ExponentialRetry(attempts={self.attempts}, minimum_delay={self.minimum_delay!r}, "
            f"maximum_delay={self.maximum_delay!r})"
        )


# -- timeouts ----------------------------------------------------------------------


class Timeout(Runtime):
    """Cancel the task once it has run for ``base``; the injected copy can
    ``extend`` the deadline and tell how much time ``remaining()``.  The core
    keeps the deadline: ``run`` just calls the function."""

    single: ClassVar[bool] = True

    def __init__(self, base: timedelta) -> None:
        self.base = base
        self._deadline: float | None = None
        self._now: Callable[[], float] = time.time
        self._on_change: Callable[[float], None] | None = None

    def _policy(self) -> dict[str, Any]:
        return {"timeout": self.base.total_seconds()}

    def _cache_key(self) -> object | None:
        return Timeout

    async def _inject(self, run: Run, parameter: str) -> Any:
        context = run.context
        injected = _copy(self)
        injected._now = context.now
        injected._deadline = (
            context.deadline
            if context.deadline is not None
            else context.now() + self.base.total_seconds()
        )
        injected._on_change = context.on_deadline_change
        return injected

    def _current_deadline(self) -> float:
        if self._deadline is None:
            self._deadline = self._now() + self.base.total_seconds()
        return self._deadline

    def extend(self, by: timedelta | None = None) -> None:
        """Push the deadline back by ``by`` (default: ``base``)."""
        extension = (by if by is not None else self.base).total_seconds()
        self._deadline = self._current_deadline() + extension
        if self._on_change is not None:
            self._on_change(self._deadline)

    def remaining(self) -> timedelta:
        """Time left before the deadline (never negative)."""
        return timedelta(seconds=max(self._current_deadline() - self._now(), 0.0))

    def expired(self) -> bool:
        return self._current_deadline() <= self._now()

    @carried_out_by_the_core
    async def run(
        self,
        execution: Any,
        function: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Call the function (its deadline is the worker core's)."""
        return await function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Timeout({self.base!r})"


# -- concurrency -------------------------------------------------------------------


#: the argument types whose limits' policies a ``ConcurrencyLimit`` keeps
#: (equal values write alike: not ``bool``, whose values equal 0 and 1)
_KEPT_VALUES = frozenset({int, str, type(None)})
#: how many it keeps before it starts over
_POLICIES_KEPT = 4096


class ConcurrencyLimit(Dependency):
    """At most ``max_concurrent`` runs at once, across all workers.

    Per argument value (``ConcurrencyLimit("customer_id", 2)``, or
    ``Annotated[int, ConcurrencyLimit(2)]`` on the parameter itself), or for
    the whole task (``ConcurrencyLimit(3)``, ``ConcurrencyLimit(max_concurrent=3)``).
    Keys are prefixed with ``scope`` (default: the docket's name): dockets
    on one store that name the same scope share its slots and its waiters.
    """

    single: ClassVar[bool] = True
    _per_call: ClassVar[bool] = True

    def __init__(
        self,
        argument_name: str | int | None = None,
        max_concurrent: int = 1,
        scope: str | None = None,
    ) -> None:
        if isinstance(argument_name, int) and not isinstance(argument_name, bool):
            max_concurrent, argument_name = argument_name, None
        if max_concurrent < 1:
            raise UsageError("ConcurrencyLimit max_concurrent must be at least 1")
        self.argument_name = argument_name if isinstance(argument_name, str) else None
        self.max_concurrent = max_concurrent
        self.scope = scope
        self._policies: dict[tuple[str, str, object], ConcurrencyPolicy] = {}

    def _bind_to_parameter(self, parameter: str) -> Dependency:
        bound = _copy(self)
        bound._describes_argument = True
        bound._policies = {}
        if bound.argument_name is None:
            bound.argument_name = parameter
        return bound

    def _call_policy(
        self, function_name: str, docket_name: str, arguments: Mapping[str, Any]
    ) -> dict[str, Any]:
        name = self.argument_name
        value: object = None
        if name is not None:
            try:
                value = arguments[name]
            except KeyError:
                raise UsageError(
                    f"ConcurrencyLimit argument {name!r} not found in task arguments. "
                    f"Available: {list(arguments)}"
                ) from None
        # the policies of plain values are kept (a worker sees the same
        # customers again and again): a few thousand at most
        kept = type(value) in _KEPT_VALUES
        if kept:
            policy = self._policies.get((docket_name, function_name, value))
            if policy is not None:
                return {"concurrency": policy}
        key = f"{self.scope or docket_name}:concurrency:{function_name}"
        if name is not None:
            key = f"{key}:{name}:{value!r}"
        policy = ConcurrencyPolicy(
            limit_key=key, max_concurrent=self.max_concurrent, scope=self.scope
        )
        if kept:
            if len(self._policies) >= _POLICIES_KEPT:
                self._policies.clear()
            self._policies[docket_name, function_name, value] = policy
        return {"concurrency": policy}

    def __repr__(self) -> str:
        return (
            f"ConcurrencyLimit({self.argument_name!r}, max_concurrent={self.max_concurrent}, "
            f"scope={self.scope!r})"
        )


# -- progress ----------------------------------------------------------------------


class Progress(Dependency):
    """Report the task's progress: ``current`` of ``total`` plus a ``message``."""

    def __init__(self) -> None:
        self.current = 0
        self.total = DEFAULT_PROGRESS_TOTAL
        self.message: str | None = None
        self._report: Callable[..., Any] | None = None

    def _cache_key(self) -> object | None:
        return Progress

    async def _inject(self, run: Run, parameter: str) -> Any:
        injected = _copy(self)
        injected._report = run.context.report_progress
        return injected

    async def set_total(self, total: int) -> None:
        if total < 1:
            raise UsageError("Total must be at least 1")
        self.total = total
        if self._report is not None:
            await self._report(total=total)

    async def set_current(self, current: int) -> None:
        self.current = current
        if self._report is not None:
            await self._report(current=current)

    async def increment(self, amount: int = 1) -> None:
        if amount < 1:
            raise UsageError("Amount must be at least 1")
        self.current += amount
        if self._report is not None:
            await self._report(increment=amount)

    async def set_message(self, message: str | None) -> None:
        self.message = message
        if self._report is not None:
            await self._report(message=message, clear_message=message is None)

    def __repr__(self) -> str:
        return f"Progress(current={self.current}, total={self.total}, message={self.message!r})"
