"""pydocket 0.27's custom-dependency extension points, driven through the
core, on every contract backend: ``Runtime``, ``FailureHandler``,
``CompletionHandler`` (and ``Perpetual.on_complete``), ``AdmissionBlocked``,
custom dependencies written as async context managers (``Dependency["T"]``),
``CallArgument``, ``ExponentialRetry(..., delay=...)`` and
``ExponentialRetry.forever(...)``; and 0.27's names at 0.27's paths."""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from helpers import loaded, make_worker

from docket_core import (
    CallArgument,
    CycleError,
    Depends,
    Docket,
    ExecutionState,
    ExponentialRetry,
    Perpetual,
    Retry,
    Timeout,
    Worker,
)
from docket_core.dependencies import (
    AdmissionBlocked,
    CompletionHandler,
    Dependency,
    FailureHandler,
    Runtime,
    TaskOutcome,
    current_execution,
)

pytestmark = pytest.mark.anyio


async def finish(worker: Worker, limit: float = 10.0) -> None:
    with anyio.fail_after(limit):
        await worker.run_until_finished()


# -- Runtime ------------------------------------------------------------------------


class Doubling(Runtime["Doubling"]):
    """Calls the task twice and returns the sum: a runtime of its own."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def run(
        self,
        execution: Any,
        function: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        self.calls.append(execution.key)
        return await function(*args, **kwargs) + await function(*args, **kwargs)


async def test_a_custom_runtime_calls_the_task(docket: Docket) -> None:
    runtime = Doubling()

    async def add_one(n: int, how: Doubling = runtime) -> int:
        return n + 1

    execution = await docket.add(add_one)(20)
    await finish(make_worker(docket))
    assert await execution.get_result() == 42
    assert runtime.calls == [execution.key]


async def test_a_runtime_and_a_timeout_are_one_runtime_too_many(docket: Docket) -> None:
    async def both(a: Doubling = Doubling(), b: Timeout = Timeout(timedelta(seconds=1))) -> None:
        pass

    with pytest.raises(ValueError, match=r"^Only one Runtime dependency is allowed per task$"):
        docket.register(both)


# -- FailureHandler, CompletionHandler ----------------------------------------------


class Recorder(FailureHandler["Recorder"]):
    """Takes every failure on itself, recording it."""

    def __init__(self, take: bool) -> None:
        self.take = take
        self.outcomes: list[TaskOutcome] = []

    async def handle_failure(self, execution: Any, outcome: TaskOutcome) -> bool:
        self.outcomes.append(outcome)
        return self.take


async def test_a_failure_handler_takes_a_failure(docket: Docket) -> None:
    taking = Recorder(take=True)

    async def broken(handler: Recorder = taking) -> None:
        raise KeyError("missing")

    execution = await docket.add(broken)()
    await finish(make_worker(docket))
    (outcome,) = taking.outcomes
    assert isinstance(outcome.exception, KeyError)
    assert outcome.duration >= timedelta(0)
    assert (await loaded(docket, execution.key)).state is ExecutionState.FAILED


async def test_a_failure_handler_may_reschedule_the_key_itself(docket: Docket) -> None:
    runs: list[int] = []

    class Again(FailureHandler["Again"]):
        async def handle_failure(self, execution: Any, outcome: TaskOutcome) -> bool:
            now = datetime.now(UTC)
            await execution.docket.replace(execution.function, now, execution.key)(n=2)
            return True

    async def once_more(n: int, handler: Again = Again()) -> None:
        runs.append(n)
        if n == 1:
            raise ValueError("first try")

    execution = await docket.add(once_more)(n=1)
    await finish(make_worker(docket))
    assert runs == [1, 2]
    assert (await loaded(docket, execution.key)).state is ExecutionState.COMPLETED


async def test_a_retry_subclass_may_extend_or_decline_its_handling(docket: Docket) -> None:
    seen: list[str] = []

    class Noting(Retry):
        async def handle_failure(self, execution: Any, outcome: TaskOutcome) -> bool:
            seen.append(f"noted {execution.attempt}")
            return await super().handle_failure(execution, outcome)

    class Declining(Retry):
        async def handle_failure(self, execution: Any, outcome: TaskOutcome) -> bool:
            seen.append(f"declined {execution.attempt}")
            return False

    async def noted(retry: Noting = Noting(attempts=3)) -> None:
        raise ValueError("no")

    async def declined(retry: Declining = Declining(attempts=3)) -> None:
        raise ValueError("no")

    noted_run = await docket.add(noted)()
    declined_run = await docket.add(declined)()
    await finish(make_worker(docket))
    assert sorted(seen) == ["declined 1", "noted 1", "noted 2", "noted 3"]
    for execution in (noted_run, declined_run):
        assert (await loaded(docket, execution.key)).state is ExecutionState.FAILED


class Completion(CompletionHandler["Completion"]):
    def __init__(self) -> None:
        self.outcomes: list[TaskOutcome] = []

    async def on_complete(self, execution: Any, outcome: TaskOutcome) -> bool:
        self.outcomes.append(outcome)
        return False


async def test_a_completion_handler_sees_the_end_of_a_run(docket: Docket) -> None:
    handler = Completion()

    async def answer(done: Completion = handler, retry: Any = None) -> int:
        return 42

    await docket.add(answer)()
    await finish(make_worker(docket))
    (outcome,) = handler.outcomes
    assert outcome.result == 42 and outcome.exception is None


async def test_a_completion_handler_waits_for_the_last_retry(docket: Docket) -> None:
    handler = Completion()

    async def flaky(done: Completion = handler) -> None:
        raise ValueError("no")

    worker = make_worker(docket, dependencies=[Retry(attempts=3)])
    await docket.add(flaky)()
    await finish(worker)
    (outcome,) = handler.outcomes  # once: after the third and last attempt
    assert isinstance(outcome.exception, ValueError)


async def test_perpetual_on_complete_may_be_extended(docket: Docket) -> None:
    seen: list[Any] = []

    class Counted(Perpetual):
        async def on_complete(self, execution: Any, outcome: TaskOutcome) -> bool:
            seen.append(outcome.result)
            return await super().on_complete(execution, outcome)

    class Stopping(Perpetual):
        async def on_complete(self, execution: Any, outcome: TaskOutcome) -> bool:
            seen.append("stopping")
            return True  # never asks the base: the chain ends

    runs: list[str] = []

    async def counted(p: Counted = Counted(every=timedelta(milliseconds=10))) -> str:
        runs.append("counted")
        return "tick"

    async def stopping(p: Stopping = Stopping(every=timedelta(milliseconds=10))) -> None:
        runs.append("stopping")

    await docket.add(counted, key="counted")()
    await docket.add(stopping, key="stopping")()
    worker = make_worker(docket)
    await worker.run_at_most({"counted": 3})
    assert runs.count("counted") == 3 and runs.count("stopping") == 1
    assert seen.count("tick") == 3 and seen.count("stopping") == 1
    assert (await loaded(docket, "stopping")).state is ExecutionState.COMPLETED


# -- AdmissionBlocked and custom dependencies -----------------------------------------


class Gate(Dependency["Gate"]):
    """Lets a run through only from its second attempt at the gate."""

    def __init__(self, reschedule: bool = True) -> None:
        self.reschedule = reschedule
        self.knocks = 0
        self.exits = 0

    async def __aenter__(self) -> Gate:
        self.knocks += 1
        if self.knocks == 1:
            raise AdmissionBlocked(
                current_execution.get(),
                "the gate",
                reschedule=self.reschedule,
                retry_delay=timedelta(milliseconds=50),
            )
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self.exits += 1


async def test_a_blocked_run_is_rescheduled(docket: Docket) -> None:
    gate = Gate()
    runs: list[int] = []

    async def guarded(n: int, g: Gate = gate) -> None:
        runs.append(n)

    execution = await docket.add(guarded)(7)
    worker = make_worker(docket)
    await finish(worker)
    assert runs == [7]
    assert gate.knocks == 2 and gate.exits == 1
    record = await loaded(docket, execution.key)
    assert record.state is ExecutionState.COMPLETED and record.attempt == 1
    assert worker.counters["rescheduled"] == 1


async def test_a_blocked_run_that_may_not_wait_is_dropped(docket: Docket) -> None:
    gate = Gate(reschedule=False)
    runs: list[int] = []

    async def guarded(n: int, g: Gate = gate) -> None:
        runs.append(n)

    execution = await docket.add(guarded)(7)
    await finish(make_worker(docket))
    assert runs == []
    assert (await loaded(docket, execution.key)).state is ExecutionState.CANCELLED


# -- CallArgument -----------------------------------------------------------------


async def test_call_argument_reads_arguments_defaults_and_sibling_values(
    docket: Docket,
) -> None:
    def greeting(name: str = CallArgument(), style: str = CallArgument("style")) -> str:
        return f"{style} {name}"

    def account(name: str = CallArgument()) -> str:
        return f"account of {name}"

    def summary(owner: str = CallArgument("owner"), text: str = CallArgument("text")) -> str:
        return f"{text} / {owner}"

    async def welcome(
        name: str,
        style: str = "Hello",
        owner: str = Depends(account),
        text: str = Depends(greeting),
        both: str = Depends(summary),
    ) -> str:
        return both

    execution = await docket.add(welcome)("Ada")
    await finish(make_worker(docket))
    assert await execution.get_result() == "Hello Ada / account of Ada"


async def test_call_arguments_in_a_circle_fail_the_run(docket: Docket) -> None:
    def first(other: str = CallArgument("b")) -> str:
        return other

    def second(other: str = CallArgument("a")) -> str:
        return other

    async def circular(a: str = Depends(first), b: str = Depends(second)) -> None:
        pass

    execution = await docket.add(circular)()
    await finish(make_worker(docket))
    record = await loaded(docket, execution.key)
    assert record.state is ExecutionState.FAILED
    assert record.error is not None and "CycleError" in record.error
    assert issubclass(CycleError, ValueError)


# -- ExponentialRetry -----------------------------------------------------------------


async def test_exponential_retry_takes_027s_delay(docket: Docket) -> None:
    delays: list[timedelta] = []

    async def flaky(
        retry: ExponentialRetry = ExponentialRetry(
            attempts=3, delay=timedelta(milliseconds=10), maximum_delay=timedelta(seconds=1)
        ),
    ) -> None:
        delays.append(retry.delay)
        raise ValueError("no")

    await docket.add(flaky)()
    await finish(make_worker(docket))
    assert delays == [timedelta(milliseconds=ms) for ms in (10, 20, 40)]
    forever = ExponentialRetry.forever(
        delay=timedelta(seconds=2), maximum_delay=timedelta(minutes=1)
    )
    assert forever.attempts is None
    assert (forever.delay, forever.maximum_delay) == (timedelta(seconds=2), timedelta(minutes=1))


# -- names --------------------------------------------------------------------------

NAMES_027 = {
    "docket_core": [
        "CallArgument",
        "Cooldown",
        "Cron",
        "CycleError",
        "Debounce",
        "RateLimit",
        "Shared",
        "__version__",
    ],
    "docket_core.dependencies": [
        "AdmissionBlocked",
        "CallArgument",
        "CompletionHandler",
        "Cooldown",
        "Cron",
        "CycleError",
        "Debounce",
        "Dependency",
        "FailureHandler",
        "RateLimit",
        "Runtime",
        "Shared",
        "TaskOutcome",
    ],
}


@pytest.mark.parametrize("module", sorted(NAMES_027))
def test_027s_names_are_at_027s_paths(module: str) -> None:
    imported = importlib.import_module(module)
    assert [name for name in NAMES_027[module] if not hasattr(imported, name)] == []


def test_the_version_is_the_installed_distributions() -> None:
    from importlib.metadata import version

    import docket_core

    assert docket_core.__version__ == version("docket")
