"""One retry delay: what ``Retry``/``ExponentialRetry`` tell a task is what
the core waits (``decisions.retry_delay``), for every attempt."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from docket_core.dependencies import ExponentialRetry, Retry, TaskContext, resolve, task_policy
from docket_core.sansio.decisions import retry_delay

pytestmark = pytest.mark.anyio

ATTEMPTS = range(1, 12)


def context(attempt: int) -> TaskContext:
    async def report(**fields: Any) -> None:
        pass

    return TaskContext(
        docket=SimpleNamespace(name="d"),
        worker=SimpleNamespace(name="w"),
        execution=SimpleNamespace(key="k", attempt=attempt, function_name="task"),
        function_name="task",
        args=(),
        kwargs={},
        now=lambda: 0.0,
        deadline=None,
        on_deadline_change=lambda deadline: None,
        report_progress=report,
    )


async def injected_delay(task: Any, attempt: int) -> timedelta:
    async with resolve(task, context(attempt)) as call:
        delay: timedelta = call.kwargs["retry"].delay
        return delay


RETRIES = [
    Retry(attempts=None, delay=timedelta(milliseconds=1500)),
    ExponentialRetry(attempts=None),
    ExponentialRetry(
        attempts=None, minimum_delay=timedelta(seconds=2), maximum_delay=timedelta(seconds=10)
    ),
    # the case the two copies of the formula once disagreed on
    ExponentialRetry(attempts=None, maximum_delay=timedelta(0)),
    ExponentialRetry(
        attempts=None, minimum_delay=timedelta(seconds=5), maximum_delay=timedelta(seconds=1)
    ),
]


@pytest.mark.parametrize("retry", RETRIES, ids=repr)
async def test_the_injected_delay_is_the_one_the_core_waits(retry: Retry) -> None:
    async def task(retry: Retry = retry) -> None: ...

    policy = task_policy(task, "task", "d", {}).retry
    assert policy is not None
    for attempt in ATTEMPTS:
        expected = timedelta(seconds=retry_delay(policy, attempt))
        assert await injected_delay(task, attempt) == expected, attempt


async def test_exponential_retry_follows_pydockets_maximum_delay() -> None:
    async def task(
        retry: ExponentialRetry = ExponentialRetry(
            attempts=None, minimum_delay=timedelta(seconds=1), maximum_delay=timedelta(0)
        ),
    ) -> None: ...

    delays = [await injected_delay(task, attempt) for attempt in (1, 2, 3)]
    assert delays == [timedelta(seconds=1), timedelta(0), timedelta(0)]
