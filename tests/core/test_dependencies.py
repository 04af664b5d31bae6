"""Tests for docket_core.dependencies: declarations, policies and resolution."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Annotated, Any

import cloudpickle
import pytest

from docket_core import dependencies as deps
from docket_core.dependencies import (
    ConcurrencyLimit,
    CurrentDocket,
    CurrentExecution,
    CurrentWorker,
    Depends,
    ExponentialRetry,
    ForcedRetry,
    Logged,
    Perpetual,
    Progress,
    Retry,
    TaskArgument,
    TaskContext,
    TaskKey,
    TaskLogger,
    Timeout,
    bind_arguments,
    call_repr,
    forced_retry_at,
    resolve,
    task_policy,
    validate,
)
from docket_core.sansio.errors import UsageError
from docket_core.sansio.values import (
    NO_POLICY,
    ConcurrencyPolicy,
    PerpetualPolicy,
    RetryPolicy,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


NOW = 1_000_000.0


def make_context(
    name: str = "task",
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    attempt: int = 1,
    deadline: float | None = None,
) -> tuple[TaskContext, list[Any]]:
    """A context with stand-ins; the list collects deadline changes and reports."""
    events: list[Any] = []

    async def report(**fields: Any) -> None:
        events.append(("progress", fields))

    context = TaskContext(
        docket=SimpleNamespace(name="the-docket"),
        worker=SimpleNamespace(name="the-worker"),
        execution=SimpleNamespace(key="the-key", attempt=attempt, function_name=name),
        function_name=name,
        args=args,
        kwargs=dict(kwargs or {}),
        now=lambda: NOW,
        deadline=deadline,
        on_deadline_change=lambda d: events.append(("deadline", d)),
        report_progress=report,
    )
    return context, events


async def run(function: Any, context: TaskContext) -> Any:
    async with resolve(function, context) as call:
        return await function(*call.args, **call.kwargs)


async def run_unwrapped(function: Any, context: TaskContext) -> Any:
    """``run``, raising the first error a failed resolution holds when it
    comes wrapped in an exception group."""
    try:
        return await run(function, context)
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None


# -- ambient objects -----------------------------------------------------------


async def test_ambient_objects_and_contextvars() -> None:
    seen: dict[str, Any] = {}

    async def task(
        docket: Any = CurrentDocket(),
        worker: Any = CurrentWorker(),
        execution: Any = CurrentExecution(),
        key: str = TaskKey(),
    ) -> None:
        seen.update(docket=docket, worker=worker, execution=execution, key=key)
        seen["vars"] = (
            deps.current_docket.get(),
            deps.current_worker.get(),
            deps.current_execution.get(),
        )

    context, _ = make_context()
    await run(task, context)
    assert seen["docket"] is context.docket
    assert seen["worker"] is context.worker
    assert seen["execution"] is context.execution
    assert seen["key"] == "the-key"
    assert seen["vars"] == (context.docket, context.worker, context.execution)
    assert deps.current_docket.get(None) is None


async def test_task_logger() -> None:
    async def task(logger: logging.LoggerAdapter[Any] = TaskLogger()) -> Any:
        return logger

    context, _ = make_context("my_task")
    logger = await run(task, context)
    assert isinstance(logger, logging.LoggerAdapter)
    assert logger.logger.name == "docket.task.my_task"
    assert logger.extra == {"docket": "the-docket", "worker": "the-worker", "key": "the-key"}


async def test_no_dependencies_passes_call_through() -> None:
    async def task(a: int, b: int = 2) -> int:
        return a + b

    context, _ = make_context(args=(1,), kwargs={"b": 5})
    async with resolve(task, context) as call:
        assert call.args == (1,)
        assert call.kwargs == {"b": 5}
        assert call.follow_up(NOW) is None
    assert task_policy(task, "task", "d", {}) is NO_POLICY


# -- Depends -------------------------------------------------------------------


async def test_depends_kinds_nested_and_cached() -> None:
    calls: list[str] = []

    def sync_value() -> int:
        calls.append("sync")
        return 1

    async def async_value(base: int = Depends(sync_value)) -> int:
        calls.append("async")
        return base + 10

    def generator(base: int = Depends(async_value)) -> Iterator[int]:
        calls.append("gen-enter")
        yield base + 100
        calls.append("gen-exit")

    async def async_generator(
        base: int = Depends(generator),
        again: int = Depends(sync_value),
    ) -> AsyncIterator[int]:
        calls.append("agen-enter")
        yield base + again
        calls.append("agen-exit")

    @contextmanager
    def managed() -> Iterator[str]:
        calls.append("cm-enter")
        yield "cm"
        calls.append("cm-exit")

    @asynccontextmanager
    async def async_managed() -> AsyncIterator[str]:
        calls.append("acm-enter")
        yield "acm"
        calls.append("acm-exit")

    async def task(
        a: int = Depends(async_generator),
        b: int = Depends(sync_value),
        c: str = Depends(managed),
        d: str = Depends(async_managed),
    ) -> tuple[int, int, str, str]:
        calls.append("task")
        return a, b, c, d

    validate(task)
    context, _ = make_context()
    assert await run(task, context) == (112, 1, "cm", "acm")
    assert calls == [
        "sync",
        "async",
        "gen-enter",
        "agen-enter",
        "cm-enter",
        "acm-enter",
        "task",
        "acm-exit",
        "cm-exit",
        "agen-exit",
        "gen-exit",
    ]
    # a new execution resolves again
    calls.clear()
    await run(task, make_context()[0])
    assert calls.count("sync") == 1


async def test_context_managers_exit_when_task_fails() -> None:
    seen: list[Any] = []

    def first() -> Iterator[str]:
        try:
            yield "first"
        except ValueError as error:
            seen.append(("first saw", str(error)))
            raise
        finally:
            seen.append("first exit")

    async def second() -> AsyncIterator[str]:
        try:
            yield "second"
        finally:
            seen.append("second exit")

    async def task(
        a: str = Depends(first),
        b: str = Depends(second),
    ) -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await run(task, make_context()[0])
    assert seen == ["second exit", ("first saw", "boom"), "first exit"]


async def test_context_manager_cannot_swallow_task_error() -> None:
    def swallower() -> Iterator[None]:
        try:
            yield
        except ValueError:
            pass

    async def task(x: None = Depends(swallower)) -> None:
        raise ValueError("kept")

    with pytest.raises(ValueError, match="kept"):
        await run(task, make_context()[0])


async def test_factory_error_propagates_and_cleans_up() -> None:
    seen: list[str] = []

    def opened() -> Iterator[str]:
        try:
            yield "ok"
        finally:
            seen.append("closed")

    def broken() -> str:
        raise RuntimeError("factory failed")

    async def task(
        a: str = Depends(opened),
        b: str = Depends(broken),
    ) -> None:
        seen.append("ran")

    context, _ = make_context()
    with pytest.raises(ExceptionGroup, match=r"parameter\(s\): b") as caught:
        async with resolve(task, context):
            pass
    assert [str(e) for e in caught.value.exceptions] == ["factory failed"]
    assert seen == ["closed"]
    assert deps.current_docket.get(None) is None


async def test_explicit_kwarg_and_positional_win() -> None:
    def factory() -> str:
        raise AssertionError("must not be called")

    async def task(a: int, value: str = Depends(factory)) -> str:
        return f"{a}:{value}"

    assert await run(task, make_context(args=(1,), kwargs={"value": "given"})[0]) == "1:given"
    assert await run(task, make_context(args=(1, "positional"))[0]) == "1:positional"


async def test_factory_parameter_without_dependency_fails_when_the_task_runs() -> None:
    """As in pydocket: the task registers, and its run fails."""

    def factory(x: int) -> int:
        return x

    async def task(v: int = Depends(factory)) -> None:
        pass

    validate(task)
    with pytest.raises(UsageError, match="'x'"):
        await run_unwrapped(task, make_context()[0])


# -- TaskArgument --------------------------------------------------------------


async def test_task_argument_inferred_explicit_optional() -> None:
    def by_name(customer_id: int = TaskArgument()) -> str:
        return f"customer {customer_id}"

    def optional(nothing: Any = TaskArgument(optional=True)) -> Any:
        return nothing

    async def task(
        customer_id: int,
        described: str = Depends(by_name),
        explicit: int = TaskArgument("customer_id"),
        missing: Any = Depends(optional),
    ) -> tuple[str, int, Any]:
        return described, explicit, missing

    validate(task)
    assert await run(task, make_context(args=(7,))[0]) == ("customer 7", 7, None)
    assert await run(task, make_context(kwargs={"customer_id": 8})[0]) == ("customer 8", 8, None)


async def test_task_argument_missing_is_usage_error() -> None:
    def needs(absent: int = TaskArgument()) -> int:
        return absent

    async def task(x: int = Depends(needs)) -> None:
        pass

    with pytest.raises(UsageError, match="absent"):
        await run_unwrapped(task, make_context()[0])


async def test_bare_task_argument_on_the_task_takes_its_parameter_name() -> None:
    """Registering works (as in pydocket); the call's own ``x`` is used, and a
    call without one fails when it runs (``None`` if optional)."""

    async def task(x: int = TaskArgument()) -> int:
        return x

    async def lenient(x: Any = TaskArgument(optional=True)) -> Any:
        return x

    validate(task)
    validate(lenient)
    assert await run(task, make_context(kwargs={"x": 5})[0]) == 5
    assert await run(task, make_context(args=(6,))[0]) == 6
    with pytest.raises(UsageError, match="'x'"):
        await run_unwrapped(task, make_context()[0])
    assert await run(lenient, make_context()[0]) is None


# -- Retry ---------------------------------------------------------------------


async def test_retry_policy_and_injection() -> None:
    async def task(retry: Retry = Retry(attempts=3, delay=timedelta(seconds=2))) -> Retry:
        return retry

    assert task_policy(task, "task", "d", {}).retry == RetryPolicy(attempts=3, delay=2.0)
    injected = await run(task, make_context(attempt=2)[0])
    assert injected.attempt == 2 and injected.attempts == 3

    async def forever(retry: Retry = Retry.forever(timedelta(seconds=1))) -> None:
        pass

    assert task_policy(forever, "f", "d", {}).retry == RetryPolicy(attempts=None, delay=1.0)


async def test_exponential_retry() -> None:
    declared = ExponentialRetry(
        attempts=5, minimum_delay=timedelta(seconds=2), maximum_delay=timedelta(seconds=10)
    )

    async def task(retry: ExponentialRetry = declared) -> ExponentialRetry:
        return retry

    assert task_policy(task, "task", "d", {}).retry == RetryPolicy(
        attempts=5, delay=2.0, exponential=True, maximum_delay=10.0
    )
    assert (await run(task, make_context(attempt=1)[0])).delay == timedelta(seconds=2)
    assert (await run(task, make_context(attempt=3)[0])).delay == timedelta(seconds=8)
    assert (await run(task, make_context(attempt=4)[0])).delay == timedelta(seconds=10)
    assert ExponentialRetry.forever().attempts is None


async def test_forced_retry() -> None:
    async def task(retry: Retry = Retry(attempts=3)) -> None:
        retry.after(timedelta(seconds=30))

    context, _ = make_context()
    with pytest.raises(ForcedRetry) as caught:
        async with resolve(task, context) as call:
            try:
                await task(*call.args, **call.kwargs)
            except ForcedRetry as error:
                follow_up = call.follow_up(NOW, error)
                assert follow_up is not None and follow_up.retry_at == NOW + 30
                raise
    assert forced_retry_at(caught.value, NOW) == NOW + 30
    when = datetime(2030, 1, 1, tzinfo=UTC)
    with pytest.raises(ForcedRetry) as caught:
        Retry().at(when)
    assert forced_retry_at(caught.value, NOW) == when.timestamp()
    with pytest.raises(ForcedRetry) as caught:
        Retry().in_(timedelta(seconds=1))
    assert forced_retry_at(caught.value, NOW) == NOW + 1
    assert forced_retry_at(ValueError(), NOW) is None


def test_a_retry_passed_by_the_caller_replaces_the_declared_one() -> None:
    declared = Retry(attempts=1)

    async def task(x: int, retry: Retry = declared) -> None:
        pass

    async def other(r: Retry = declared) -> None:
        pass

    validate(task)
    validate(other)  # one default shared by two tasks, under two names
    given = ExponentialRetry(attempts=4, minimum_delay=timedelta(seconds=2))
    arguments = bind_arguments(task, (1,), {"retry": given})
    assert task_policy(task, "task", "d", arguments).retry == RetryPolicy(
        attempts=4, delay=2.0, exponential=True, maximum_delay=64.0
    )
    assert task_policy(other, "other", "d", {"r": Retry(attempts=2)}).retry == RetryPolicy(
        attempts=2, delay=0.0
    )
    # anything else under that name, or nothing, leaves the declared policy
    declared_policy = RetryPolicy(attempts=1, delay=0.0)
    assert task_policy(task, "task", "d", bind_arguments(task, (1,), {})).retry == declared_policy
    assert task_policy(task, "task", "d", {"x": 1, "retry": 3}).retry == declared_policy


def test_retry_attempts_below_one_are_accepted_as_no_retry() -> None:
    """pydocket takes ``Retry(attempts=0)`` without complaint: no retry."""
    from docket_core.sansio.decisions import may_retry

    for attempts in (0, -1):
        retry = Retry(attempts=attempts)
        assert not may_retry(retry._retry_policy(), 1)


def test_two_retries_are_rejected() -> None:
    async def task(
        a: Retry = Retry(),
        b: ExponentialRetry = ExponentialRetry(),
    ) -> None:
        pass

    with pytest.raises(UsageError, match="Retry"):
        validate(task)


# -- Perpetual -----------------------------------------------------------------


async def test_perpetual_policy_and_follow_ups() -> None:
    async def task(
        n: int = 0,
        perpetual: Perpetual = Perpetual(every=timedelta(seconds=5), automatic=True),
    ) -> Perpetual:
        return perpetual

    policy = task_policy(task, "task", "d", {})
    assert policy.perpetual == PerpetualPolicy(every=5.0, automatic=True)

    async with resolve(task, make_context()[0]) as call:
        await task(*call.args, **call.kwargs)
    assert call.follow_up(NOW) is None

    async with resolve(task, make_context()[0]) as call:
        perpetual = await task(*call.args, **call.kwargs)
        perpetual.cancel()
    follow_up = call.follow_up(NOW)
    assert follow_up is not None and follow_up.perpetual_cancelled

    async with resolve(task, make_context()[0]) as call:
        perpetual = await task(*call.args, **call.kwargs)
        perpetual.perpetuate(3, extra="x")
        perpetual.after(timedelta(seconds=7))
    follow_up = call.follow_up(NOW)
    assert follow_up is not None
    assert follow_up.perpetual_at == NOW + 7
    assert follow_up.perpetual_payload is not None
    assert cloudpickle.loads(follow_up.perpetual_payload) == ((3,), {"extra": "x"})

    when = datetime(2031, 5, 1, tzinfo=UTC)
    async with resolve(task, make_context()[0]) as call:
        (await task(*call.args, **call.kwargs)).at(when)
    follow_up = call.follow_up(NOW)
    assert follow_up is not None and follow_up.perpetual_at == when.timestamp()


# -- Timeout -------------------------------------------------------------------


async def test_timeout() -> None:
    async def task(timeout: Timeout = Timeout(timedelta(seconds=10))) -> Timeout:
        return timeout

    assert task_policy(task, "task", "d", {}).timeout == 10.0
    context, events = make_context(deadline=NOW + 4)
    timeout = await run(task, context)
    assert timeout.remaining() == timedelta(seconds=4)
    assert not timeout.expired()
    timeout.extend()
    timeout.extend(timedelta(seconds=1))
    assert events == [("deadline", NOW + 14), ("deadline", NOW + 15)]
    assert timeout.remaining() == timedelta(seconds=15)

    context, _ = make_context(deadline=NOW - 1)
    timeout = await run(task, context)
    assert timeout.expired() and timeout.remaining() == timedelta(0)


# -- ConcurrencyLimit ----------------------------------------------------------


def test_concurrency_limit_forms() -> None:
    async def per_argument(
        customer_id: int,
        limit: ConcurrencyLimit = ConcurrencyLimit("customer_id", 2),
    ) -> None:
        pass

    async def annotated(customer_id: Annotated[int, ConcurrencyLimit(3)]) -> None:
        pass

    async def task_wide(limit: ConcurrencyLimit = ConcurrencyLimit(max_concurrent=4)) -> None:
        pass

    async def positional_max(limit: ConcurrencyLimit = ConcurrencyLimit(5, scope="s")) -> None:
        pass

    args = bind_arguments(per_argument, (42,), {})
    assert task_policy(per_argument, "pa", "dk", args).concurrency == ConcurrencyPolicy(
        limit_key="dk:concurrency:pa:customer_id:42", max_concurrent=2
    )
    args = bind_arguments(annotated, (), {"customer_id": "c"})
    assert task_policy(annotated, "an", "dk", args).concurrency == ConcurrencyPolicy(
        limit_key="dk:concurrency:an:customer_id:'c'", max_concurrent=3
    )
    assert task_policy(task_wide, "tw", "dk", {}).concurrency == ConcurrencyPolicy(
        limit_key="dk:concurrency:tw", max_concurrent=4
    )
    assert task_policy(positional_max, "pm", "dk", {}).concurrency == ConcurrencyPolicy(
        limit_key="s:concurrency:pm", max_concurrent=5, scope="s"
    )
    with pytest.raises(
        UsageError,
        match=r"^ConcurrencyLimit argument 'customer_id' not found in task arguments\. "
        r"Available: \[\]$",
    ):
        task_policy(per_argument, "pa", "dk", {})


#: one limit on two tasks' parameters (annotations resolve in this module)
SHARED_LIMIT = ConcurrencyLimit(2)


def test_a_limit_keeps_the_policies_of_plain_values_apart() -> None:
    """A limit keeps the policy of each plain argument value it has seen
    (a worker meets the same customers again and again): the same value
    gives the same policy, and what only compares equal does not mix."""

    async def one(customer: Annotated[Any, SHARED_LIMIT]) -> None:
        pass

    async def two(account: Annotated[Any, SHARED_LIMIT]) -> None:
        pass

    def key(function: Any, name: str, docket: str, value: Any) -> str:
        policy = task_policy(function, name, docket, {function.__code__.co_varnames[0]: value})
        assert policy.concurrency is not None
        return policy.concurrency.limit_key

    assert key(one, "one", "dk", 1) == "dk:concurrency:one:customer:1"
    first = task_policy(one, "one", "dk", {"customer": 1}).concurrency
    assert task_policy(one, "one", "dk", {"customer": 1}).concurrency is first
    assert key(one, "one", "dk", True) == "dk:concurrency:one:customer:True"
    assert key(one, "one", "dk", 1.0) == "dk:concurrency:one:customer:1.0"
    assert key(one, "one", "dk", "1") == "dk:concurrency:one:customer:'1'"
    assert key(one, "one", "other", 1) == "other:concurrency:one:customer:1"
    assert key(two, "two", "dk", 1) == "dk:concurrency:two:account:1"
    assert key(one, "one", "dk", None) == "dk:concurrency:one:customer:None"


async def test_annotated_concurrency_parameter_is_not_injected() -> None:
    async def task(customer_id: Annotated[int, ConcurrencyLimit(3)]) -> int:
        return customer_id

    assert await run(task, make_context(args=(9,))[0]) == 9


async def test_self_injecting_dependencies_are_handed_to_the_task_as_declared() -> None:
    """A task whose dependencies are only their own values (limits and
    admission controls) gets each declared object, unless the caller passed
    the parameter; the caller's arguments are left as they were given."""
    declared = ConcurrencyLimit("customer", 2)

    async def task(
        customer: int,
        limit: ConcurrencyLimit = declared,
        cooldown: deps.Cooldown = deps.Cooldown(timedelta(seconds=1)),
    ) -> tuple[Any, Any]:
        return limit, cooldown

    context = make_context(kwargs={"customer": 4})[0]
    limit, cooldown = await run(task, context)
    assert isinstance(limit, ConcurrencyLimit) and limit.argument_name == "customer"
    assert limit.max_concurrent == 2
    assert isinstance(cooldown, deps.Cooldown)
    assert context.kwargs == {"customer": 4}
    assert await run(task, make_context(args=(4, "mine"))[0]) == ("mine", cooldown)
    assert await run(task, make_context(kwargs={"customer": 4, "cooldown": 0})[0]) == (limit, 0)


def test_concurrency_limit_on_unknown_parameter_fails_each_call() -> None:
    """As in pydocket 0.27: the task registers; each call's policy fails."""

    async def task(x: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer_id")) -> None:
        pass

    validate(task)
    with pytest.raises(UsageError, match=r"Available: \['x'\]"):
        task_policy(task, "task", "dk", bind_arguments(task, (1,), {}))
    with pytest.raises(UsageError):
        ConcurrencyLimit(max_concurrent=0)


def test_policy_is_cached_per_function(monkeypatch: pytest.MonkeyPatch) -> None:
    async def task(
        customer_id: int,
        retry: Retry = Retry(attempts=2),
        limit: ConcurrencyLimit = ConcurrencyLimit("customer_id"),
    ) -> None:
        pass

    first = task_policy(task, "t", "d", {"customer_id": 1})
    import inspect

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("signature inspected again")

    monkeypatch.setattr(inspect, "signature", fail)
    second = task_policy(task, "t", "d", {"customer_id": 2})
    assert first.retry is second.retry
    assert second.concurrency is not None
    assert second.concurrency.limit_key == "d:concurrency:t:customer_id:2"
    assert bind_arguments(task, (3,), {}) == {"customer_id": 3}


# -- Progress ------------------------------------------------------------------


async def test_progress() -> None:
    async def task(progress: Progress = Progress()) -> Progress:
        await progress.set_total(10)
        await progress.increment()
        await progress.increment(2)
        await progress.set_message("halfway")
        await progress.set_message(None)
        return progress

    context, events = make_context()
    progress = await run(task, context)
    assert (progress.current, progress.total, progress.message) == (3, 10, None)
    assert events == [
        ("progress", {"total": 10}),
        ("progress", {"increment": 1}),
        ("progress", {"increment": 2}),
        ("progress", {"message": "halfway", "clear_message": False}),
        ("progress", {"message": None, "clear_message": True}),
    ]
    with pytest.raises(ValueError, match=r"^Total must be at least 1$"):
        await progress.set_total(0)
    with pytest.raises(ValueError, match=r"^Amount must be at least 1$"):
        await progress.increment(0)


async def test_progress_shared_between_task_and_factory() -> None:
    def factory(progress: Progress = Progress()) -> Progress:
        return progress

    async def task(
        a: Progress = Progress(),
        b: Progress = Depends(factory),
    ) -> bool:
        return a is b

    assert await run(task, make_context()[0])


# -- binding and logging -------------------------------------------------------


def test_bind_arguments() -> None:
    async def task(a: int, b: int = 2, *rest: int, retry: Retry = Retry(), **extra: Any) -> None:
        pass

    assert bind_arguments(task, (1,), {}) == {"a": 1, "b": 2}
    assert bind_arguments(task, (1, 3, 4, 5), {"z": 9}) == {
        "a": 1,
        "b": 3,
        "rest": (4, 5),
        "z": 9,
    }
    assert bind_arguments(task, (), {"retry": "x"}) == {"retry": "x", "b": 2}


def test_call_repr_with_logged() -> None:
    async def task(
        a: Annotated[int, Logged],
        b: str,
        items: Annotated[list[int], Logged(length_only=True)],
        secret: str = "",
    ) -> None:
        pass

    assert call_repr(task, "task", (1, "hidden", [1, 2, 3]), {"secret": "s"}) == (
        "task(1, ..., [len 3], secret=...)"
    )
    assert call_repr(task, "task", (), {"a": 5, "items": "ab"}) == "task(a=5, items=[len 2])"


async def test_resolve_sets_the_context_s_docket_and_worker_even_when_one_is_none() -> None:
    """``resolve`` sets all three context variables from the context it is
    given (a runner task, through ``resolve_in_runner``, sets the docket and
    the worker once itself), a ``None`` docket too."""
    context, _ = make_context()
    context.docket = None
    seen: list[Any] = []

    async def task() -> None:
        seen.extend(
            (deps.current_docket.get(), deps.current_worker.get(), deps.current_execution.get())
        )

    outer = deps.current_docket.set("an outer docket")
    try:
        await run(task, context)
        assert deps.current_docket.get() == "an outer docket"
    finally:
        deps.current_docket.reset(outer)
    assert seen == [None, context.worker, context.execution]
