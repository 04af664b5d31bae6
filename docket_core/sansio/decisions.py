"""Pure decisions about one execution: how to schedule it, what its end leads to.

The producer side (``plan_add``) and the worker side (``plan_end``) both live
here so that the rules about ``when``, attempts, retries and perpetual runs are
written once.
"""

from __future__ import annotations

import attrs

from .effects import BuryMalformed, Finish, Request, Schedule, StoreEffect
from .inputs import FollowUp, TaskEnded, TaskOutcome
from .values import (
    ExecutionState,
    MalformedEntry,
    RetryPolicy,
    ScheduleMode,
    TaskMessage,
    TaskPolicy,
)

_NO_FOLLOW_UP = FollowUp()


def plan_add(
    *,
    key: str,
    function: str,
    payload: bytes,
    when: float,
    mode: ScheduleMode,
    now: float,
) -> Schedule:
    """The effect that stores a new execution (``add`` or ``replace``)."""
    message = TaskMessage(key=key, function=function, payload=payload, when=when)
    return Schedule(message=message, mode=mode, now=now)


def retry_delay(policy: RetryPolicy, attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
    if not policy.exponential:
        return policy.delay
    delay = policy.delay * 2.0 ** max(attempt - 1, 0)
    if policy.maximum_delay > 0:
        delay = min(delay, policy.maximum_delay)
    return delay


def may_retry(policy: RetryPolicy, attempt: int) -> bool:
    """Whether a failure of attempt ``attempt`` leaves another attempt."""
    return policy.attempts is None or attempt < policy.attempts


def plan_end(
    *,
    delivery_id: str,
    message: TaskMessage,
    policy: TaskPolicy,
    ended: TaskEnded,
    outcome: TaskOutcome,
    error: str | None,
    started_at: float,
    execution_ttl: float,
    request: Request | None = None,
) -> StoreEffect:
    """What the end of a run leads to: a retry, the next perpetual run, or a
    recorded outcome.  The returned effect acknowledges the delivery.

    - A failure with attempts left is scheduled again (attempt + 1) after the
      retry delay, or at the time the task asked for; it never shows FAILED.
    - A perpetual task that succeeded, or failed with no retry left, schedules
      its next run ``every`` seconds after this one started (start to start),
      unless it called ``cancel()``; cancelled runs do not perpetuate.
    - Anything else is recorded as completed, failed or cancelled.
    """
    now = ended.now
    follow_up = ended.follow_up or _NO_FOLLOW_UP
    if outcome is TaskOutcome.FAILED and policy.retry is not None:
        if may_retry(policy.retry, message.attempt):
            when = follow_up.retry_at
            if when is None:
                when = now + retry_delay(policy.retry, message.attempt)
            return Schedule(
                message=attrs.evolve(message, when=when, attempt=message.attempt + 1),
                mode=ScheduleMode.REPLACE,
                now=now,
                acknowledge=delivery_id,
                expect_generation=message.generation,
                request=request,
            )
    perpetual = policy.perpetual
    if (
        perpetual is not None
        and outcome is not TaskOutcome.CANCELLED
        and not follow_up.perpetual_cancelled
    ):
        when = follow_up.perpetual_at
        if when is None:
            when = max(now, started_at + perpetual.every)
        payload = follow_up.perpetual_payload or message.payload
        return Schedule(
            message=attrs.evolve(message, when=when, attempt=1, payload=payload),
            mode=ScheduleMode.REPLACE,
            now=now,
            acknowledge=delivery_id,
            expect_generation=message.generation,
            request=request,
        )
    if outcome is TaskOutcome.SUCCEEDED:
        state = ExecutionState.COMPLETED
    elif outcome is TaskOutcome.FAILED:
        state = ExecutionState.FAILED
    else:
        state = ExecutionState.CANCELLED
    return Finish(
        delivery_id=delivery_id,
        key=message.key,
        generation=message.generation,
        state=state,
        now=now,
        ttl=execution_ttl,
        error=error,
        result=ended.result if execution_ttl > 0 else None,
        request=request,
    )


def plan_reject(
    *,
    delivery_id: str,
    message: TaskMessage,
    now: float,
    execution_ttl: float,
    problem: str | None,
    request: Request | None = None,
) -> Finish:
    """End a delivery that must not run: a problem (unknown task, arguments
    that cannot be read) is a recorded failure with the reason; a strike is a
    cancellation."""
    state = ExecutionState.FAILED if problem is not None else ExecutionState.CANCELLED
    failed = problem is not None
    return Finish(
        delivery_id=delivery_id,
        key=message.key,
        generation=message.generation,
        state=state,
        now=now,
        # a failure nobody could run is kept even on fire-and-forget dockets,
        # so that it is visible; a struck task follows the docket's ttl
        ttl=failure_ttl(execution_ttl) if failed else execution_ttl,
        error=problem,
        request=request,
    )


def failure_ttl(execution_ttl: float) -> float:
    """How long the record of a task nobody could run is kept: at least an
    hour, even on fire-and-forget dockets, so that it is visible."""
    return max(execution_ttl, 3600.0)


def plan_bury(
    *, worker: str, entry: MalformedEntry, now: float, execution_ttl: float, request: Request
) -> BuryMalformed:
    """Set a malformed entry aside in the dead-letter stream (failing its key
    when it is the key's current message)."""
    ttl = failure_ttl(execution_ttl)
    return BuryMalformed(worker=worker, entry=entry, now=now, ttl=ttl, request=request)
