"""Pure decisions: how a call is scheduled, what a run's end leads to, how
long a worker counts as live.

The producer side (``plan_add``), the worker side (``plan_end``) and the
retry and liveness arithmetic every part of docket shares live here, so that
the rules about strikes, ``when``, attempts, retries, perpetual runs and
heartbeats are written once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, overload

import attrs

from .effects import BuryMalformed, Finish, Request, Schedule, StoreEffect
from .inputs import FollowUp, TaskEnded, TaskOutcome
from .strikes import StrikeList
from .values import (
    ExecutionState,
    MalformedEntry,
    RetryPolicy,
    ScheduleMode,
    TaskMessage,
    TaskPolicy,
)

_NO_FOLLOW_UP = FollowUp()
_NO_ARGUMENTS: Mapping[str, Any] = {}
#: past this many doublings an exponential delay stops growing (2**64 s
#: outlasts any clock, and a float power this large still fits)
_MAX_DOUBLINGS = 64


@attrs.frozen(slots=True, kw_only=True)
class PendingCall:
    """One ``add`` or ``replace``, checked and pickled by the producer: what to
    store, and the call's ``arguments`` by parameter name (read only when a
    strike names a parameter, so a producer may bind them lazily)."""

    function: str
    key: str
    when: float
    mode: ScheduleMode
    payload: bytes
    arguments: Mapping[str, Any] = _NO_ARGUMENTS


@overload
def plan_add(call: PendingCall, strikes: StrikeList, *, now: float) -> Schedule | None: ...


@overload
def plan_add(
    *, key: str, function: str, payload: bytes, when: float, mode: ScheduleMode, now: float
) -> Schedule: ...


def plan_add(
    call: PendingCall | None = None,
    strikes: StrikeList | None = None,
    *,
    now: float,
    key: str = "",
    function: str = "",
    payload: bytes = b"",
    when: float = 0.0,
    mode: ScheduleMode = ScheduleMode.ADD,
) -> Schedule | None:
    """The effect that stores a new execution (``add`` or ``replace``), or
    ``None`` when a strike matches the call: a struck call is not stored.

    ``Docket.add``/``replace`` and ``Batch`` pass a ``PendingCall`` and the
    strikes in effect; the keyword form (the fields of a call, no strikes)
    serves simulators and tests that schedule raw messages."""
    if call is None:
        message = TaskMessage(key=key, function=function, payload=payload, when=when)
        return Schedule(message=message, mode=mode, now=now)
    if strikes is not None and strikes.is_struck(call.function, call.arguments):
        return None
    message = TaskMessage(
        key=call.key, function=call.function, payload=call.payload, when=call.when
    )
    return Schedule(message=message, mode=call.mode, now=now)


def retry_delay(policy: RetryPolicy, attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based).

    ``Retry``: always ``delay``.  ``ExponentialRetry`` (pydocket's rule):
    ``delay`` after the first attempt, then ``delay * 2 ** (attempt - 1)``
    capped at ``maximum_delay``; a ``maximum_delay`` of 0 is a cap like any
    other (no wait from the second retry on), not "uncapped"."""
    if not policy.exponential or attempt <= 1:
        return policy.delay
    doubled = policy.delay * 2.0 ** min(attempt - 1, _MAX_DOUBLINGS)
    return min(doubled, policy.maximum_delay)


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


def liveness_window(heartbeat_interval: float, missed_heartbeats: int) -> float:
    """Seconds a worker counts as live after its last heartbeat:
    ``missed_heartbeats`` heartbeat intervals."""
    return heartbeat_interval * missed_heartbeats


def is_live(last_seen: float, now: float, window: float) -> bool:
    """Whether a worker last seen at ``last_seen`` is live at ``now``."""
    return last_seen > now - window
