"""A retry delay never overflows, however many attempts (#12): what
``decisions.retry_delay`` answers is a wait a ``timedelta`` can hold, and
``now`` plus it is a time a ``datetime`` can show, for every attempt number
and every delay a ``Retry``/``ExponentialRetry`` can be given."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from docket_core.dependencies import ExponentialRetry, Retry, TaskContext, resolve, task_policy
from docket_core.sansio.decisions import plan_end, retry_delay
from docket_core.sansio.effects import Schedule
from docket_core.sansio.inputs import TaskEnded, TaskOutcome
from docket_core.sansio.values import RetryPolicy, TaskMessage, TaskPolicy

NOW = 1_750_000_000.0
ATTEMPTS = [2, 64, 65, 1_000, 1_025, 1_100, 10_000, 10**9, 10**18]
POLICIES = [
    RetryPolicy(attempts=None, delay=1.0, exponential=True),  # uncapped
    RetryPolicy(attempts=None, delay=1e300, exponential=True),
    RetryPolicy(attempts=None, delay=0.001, exponential=True, maximum_delay=math.inf),
    RetryPolicy(
        attempts=None, delay=1.0, exponential=True, maximum_delay=timedelta.max.total_seconds()
    ),
    RetryPolicy(attempts=None, delay=timedelta.max.total_seconds()),
]


def representable(delay: float) -> None:
    """``delay`` fits a ``timedelta``, and ``NOW + delay`` a ``datetime``."""
    assert math.isfinite(delay) and delay >= 0
    timedelta(seconds=delay)
    datetime.fromtimestamp(NOW + delay, UTC)


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
@pytest.mark.parametrize("attempt", ATTEMPTS)
def test_the_core_delay_fits_a_timedelta_and_a_datetime(policy: RetryPolicy, attempt: int) -> None:
    representable(retry_delay(policy, attempt))


def test_delays_still_grow_then_stay_at_their_cap() -> None:
    policy = RetryPolicy(attempts=None, delay=1.0, exponential=True, maximum_delay=64.0)
    assert [retry_delay(policy, n) for n in (1, 2, 3, 7, 8, 10**9)] == [1, 2, 4, 64, 64, 64]
    uncapped = RetryPolicy(attempts=None, delay=1.0, exponential=True)
    delays = [retry_delay(uncapped, n) for n in (10, 30, 60, 10**6)]
    assert delays == sorted(delays) and delays[0] == 512.0


def test_the_next_attempt_of_a_long_retried_task_is_a_time_a_datetime_shows() -> None:
    message = TaskMessage(key="k", function="f", payload=b"", when=NOW, attempt=10**6)
    ended = TaskEnded(delivery_id="d", now=NOW, outcome=TaskOutcome.FAILED, error="E: boom")
    effect = plan_end(
        delivery_id="d",
        message=message,
        policy=TaskPolicy(retry=POLICIES[0]),
        ended=ended,
        outcome=TaskOutcome.FAILED,
        error="E: boom",
        started_at=NOW,
        execution_ttl=60.0,
    )
    assert isinstance(effect, Schedule) and effect.message.attempt == 10**6 + 1
    datetime.fromtimestamp(effect.message.when, UTC)


def _context(attempt: int) -> TaskContext:
    async def report(**fields: Any) -> None:
        pass

    return TaskContext(
        docket=SimpleNamespace(name="d"),
        worker=SimpleNamespace(name="w"),
        execution=SimpleNamespace(key="k", attempt=attempt, function_name="task"),
        function_name="task",
        args=(),
        kwargs={},
        now=lambda: NOW,
        deadline=None,
        on_deadline_change=lambda deadline: None,
        report_progress=report,
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    "retry",
    [
        ExponentialRetry(attempts=None, maximum_delay=timedelta.max),
        Retry(attempts=None, delay=timedelta.max),
    ],
    ids=repr,
)
async def test_a_task_told_its_delay_after_many_attempts_does_not_overflow(retry: Retry) -> None:
    async def task(retry: Retry = retry) -> None: ...

    policy = task_policy(task, "task", "d", {}).retry
    assert policy is not None
    for attempt in (2, 1_025, 10**6):
        async with resolve(task, _context(attempt)) as call:
            delay: timedelta = call.kwargs["retry"].delay
        assert delay == timedelta(seconds=retry_delay(policy, attempt))
        datetime.fromtimestamp(NOW + delay.total_seconds(), UTC)
