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

from .cron import next_run
from .effects import BuryMalformed, Finish, Request, Schedule, StoreEffect
from .inputs import BlockedAction, FollowUp, TaskEnded, TaskOutcome
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
#: the policy a cancelled run ends under: neither retried nor perpetuated
_NO_FOLLOW_UP_POLICY = TaskPolicy()
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


#: the longest wait between two attempts: a century.  A longer one would not
#: fit a ``timedelta`` or would put the next attempt past ``datetime``'s year 9999
LONGEST_RETRY_DELAY = 100 * 365.25 * 86400.0


def retry_delay(policy: RetryPolicy, attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based).

    ``Retry``: always ``delay``.  ``ExponentialRetry`` (pydocket's rule):
    ``delay`` after the first attempt, then ``delay * 2 ** (attempt - 1)``
    capped at ``maximum_delay``; a ``maximum_delay`` of 0 is a cap like any
    other (no wait from the second retry on), not "uncapped".  Whatever the
    attempt number, the wait never exceeds ``LONGEST_RETRY_DELAY``: it never
    overflows."""
    if not policy.exponential or attempt <= 1:
        return min(policy.delay, LONGEST_RETRY_DELAY)
    ceiling = min(policy.maximum_delay, LONGEST_RETRY_DELAY)
    if policy.delay >= ceiling:
        return ceiling
    # doublings past _MAX_DOUBLINGS change nothing: the ceiling is reached long before
    return min(policy.delay * 2.0 ** min(attempt - 1, _MAX_DOUBLINGS), ceiling)


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
    cancelled: bool = False,
) -> StoreEffect:
    """What the end of a run leads to: a retry, the next perpetual run, or a
    recorded outcome.  The returned effect acknowledges the delivery.

    A run whose key was ``cancelled`` while it ran records how it ended
    (completed if it returned anyway, failed if it raised, cancelled if the
    cancellation took) and nothing follows it: no retry, no next run.

    - A failure with attempts left is scheduled again (attempt + 1) after the
      retry delay, or at the time the task asked for; it never shows FAILED.
    - A perpetual task that succeeded, or failed with no retry left, schedules
      its next run ``every`` seconds after this one started (start to start),
      or, on a cron schedule, at its first instant after both this run's end
      and this run's own instant (so no instant runs twice), unless it called
      ``cancel()``; cancelled runs do not perpetuate.  The
      run's own end (completed, or failed with its error) is published first.
    - A run an ``AdmissionBlocked`` stopped follows its flags
      (``_plan_blocked``); one a custom ``FailureHandler`` took on is neither
      retried nor perpetuated.
    - Anything else is recorded as completed, failed or cancelled.
    """
    now = ended.now
    if not may_follow(policy, ended):
        return _recorded(delivery_id, message, ended, outcome, error, execution_ttl, request)
    follow_up = ended.follow_up or _NO_FOLLOW_UP
    if follow_up.blocked is not None and not cancelled:
        return _plan_blocked(delivery_id, message, follow_up, now, execution_ttl, error, request)
    if cancelled or follow_up.failure_handled:
        policy = _NO_FOLLOW_UP_POLICY
    if outcome is TaskOutcome.FAILED and policy.retry is not None and not follow_up.retry_declined:
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
    next_at: float | None = None
    if (
        perpetual is not None
        and outcome is not TaskOutcome.CANCELLED
        and not follow_up.perpetual_cancelled
    ):
        next_at = follow_up.perpetual_at
        if next_at is None and perpetual.cron is not None:
            # the next instant after both the run's end and its own instant
            # (none left: the chain ends with this run)
            next_at = next_run(perpetual.cron, ended_at=now, scheduled_for=message.when)
        elif next_at is None:
            next_at = max(now, started_at + perpetual.every)
    if next_at is not None:
        payload = follow_up.perpetual_payload or message.payload
        failed = outcome is TaskOutcome.FAILED
        return Schedule(
            message=attrs.evolve(message, when=next_at, attempt=1, payload=payload),
            mode=ScheduleMode.REPLACE,
            now=now,
            acknowledge=delivery_id,
            expect_generation=message.generation,
            ended=ExecutionState.FAILED if failed else ExecutionState.COMPLETED,
            ended_error=error if failed else None,
            request=request,
        )
    return _recorded(delivery_id, message, ended, outcome, error, execution_ttl, request)


def may_follow(policy: TaskPolicy, ended: TaskEnded) -> bool:
    """Whether anything may follow this run's end (``plan_end``): a retry,
    a next perpetual run, what an ``AdmissionBlocked`` or a handler asked
    for.  ``False``: its end only records how it ended (a ``Finish``)."""
    return policy.retry is not None or policy.perpetual is not None or ended.follow_up is not None


def _recorded(
    delivery_id: str,
    message: TaskMessage,
    ended: TaskEnded,
    outcome: TaskOutcome,
    error: str | None,
    execution_ttl: float,
    request: Request | None,
) -> Finish:
    """The end of a run that nothing follows: its outcome recorded."""
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
        now=ended.now,
        ttl=execution_ttl,
        error=error,
        result=ended.result if execution_ttl > 0 else None,
        request=request,
    )


def _plan_blocked(
    delivery_id: str,
    message: TaskMessage,
    follow_up: FollowUp,
    now: float,
    execution_ttl: float,
    error: str | None,
    request: Request | None,
) -> StoreEffect:
    """A run an ``AdmissionBlocked`` stopped: scheduled again (the same
    attempt), dropped (cancelled), or, when the gate handled it, recorded
    failed unless it superseded the key itself."""
    if follow_up.blocked is BlockedAction.RESCHEDULE:
        when = now if follow_up.blocked_until is None else follow_up.blocked_until
        return Schedule(
            message=attrs.evolve(message, when=when),
            mode=ScheduleMode.REPLACE,
            now=now,
            acknowledge=delivery_id,
            expect_generation=message.generation,
            request=request,
        )
    dropped = follow_up.blocked is BlockedAction.DROP
    return Finish(
        delivery_id=delivery_id,
        key=message.key,
        generation=message.generation,
        state=ExecutionState.CANCELLED if dropped else ExecutionState.FAILED,
        now=now,
        ttl=execution_ttl,
        error=None if dropped else error,
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


def parked_retry_at(now: float, stale_after: float) -> float:
    """When a key parked behind a scoped limit runs again if no wake-up
    comes first: once a slot held then could have gone stale.  A wake-up
    lost to a crash between two steps of a chain (or to a release that
    came between a delivery's ``TakeSlot`` and its ``Park``) costs at most
    that long."""
    return now + stale_after


def liveness_window(heartbeat_interval: float, missed_heartbeats: int) -> float:
    """Seconds a worker counts as live after its last heartbeat:
    ``missed_heartbeats`` heartbeat intervals."""
    return heartbeat_interval * missed_heartbeats


def is_live(last_seen: float, now: float, window: float) -> bool:
    """Whether a worker last seen at ``last_seen`` is live at ``now``."""
    return last_seen > now - window
