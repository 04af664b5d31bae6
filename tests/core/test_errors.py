"""Every error docket raises is a ``DocketError``, including the two outcomes
that are not faults: ``ExecutionCancelled`` and ``ForcedRetry``."""

from __future__ import annotations

import pickle
from datetime import timedelta

import pytest
from helpers import make_worker

import docket_core
from docket_core import (
    Docket,
    DocketError,
    ExecutionCancelled,
    ExecutionState,
    ForcedRetry,
    Retry,
    _resolution,
    dependencies,
    execution,
)
from docket_core.sansio import errors

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("error", [ExecutionCancelled, ForcedRetry])
def test_outcomes_are_docket_errors_and_plain_exceptions(error: type[Exception]) -> None:
    assert issubclass(error, DocketError)
    assert issubclass(error, Exception)
    assert not issubclass(error, errors.UsageError | errors.StoreError)


def test_each_error_has_one_class_wherever_it_is_imported_from() -> None:
    assert (
        docket_core.ExecutionCancelled is execution.ExecutionCancelled is errors.ExecutionCancelled
    )
    assert (
        docket_core.ForcedRetry
        is dependencies.ForcedRetry
        is _resolution.ForcedRetry
        is errors.ForcedRetry
    )


def test_a_forced_retry_survives_pickling() -> None:
    copy = pickle.loads(pickle.dumps(ForcedRetry(delay=3.0)))
    assert (type(copy), copy.delay, copy.when) == (ForcedRetry, 3.0, None)
    copy = pickle.loads(pickle.dumps(ForcedRetry(when=1234.5)))
    assert (copy.delay, copy.when) == (0.0, 1234.5)


@pytest.mark.backends("memory-asyncio", "memory-trio")
async def test_a_forced_retry_is_still_a_retry_to_the_worker(docket: Docket) -> None:
    attempts: list[int] = []

    async def again(retry: Retry = Retry(attempts=3)) -> str:
        attempts.append(retry.attempt)
        if retry.attempt < 3:
            retry.in_(timedelta(milliseconds=1))
        return "done"

    added = await docket.add(again)()
    async with make_worker(docket) as worker:
        await worker.run_until_finished()
    assert attempts == [1, 2, 3]
    assert await added.get_result(timeout=timedelta(seconds=2)) == "done"


@pytest.mark.backends("memory-asyncio", "memory-trio")
async def test_a_task_that_catches_its_forced_retry_is_not_retried(docket: Docket) -> None:
    attempts: list[int] = []

    async def swallowed(retry: Retry = Retry(attempts=3)) -> None:
        attempts.append(retry.attempt)
        try:
            retry.in_(timedelta(milliseconds=1))
        except Exception:
            pass

    added = await docket.add(swallowed)()
    async with make_worker(docket) as worker:
        await worker.run_until_finished()
    assert attempts == [1]
    assert (await docket.get_execution(added.key)).state is ExecutionState.COMPLETED  # type: ignore[union-attr]


@pytest.mark.backends("memory-asyncio")
async def test_waiting_on_a_cancelled_execution_raises_a_docket_error(docket: Docket) -> None:
    async def later() -> None: ...

    added = await docket.add(later, key="cancel-me")()
    await docket.cancel("cancel-me")
    with pytest.raises(DocketError, match="cancelled"):
        await added.get_result(timeout=timedelta(seconds=2))
