"""``docket_core.sansio.decisions`` on its own: plain values in, effects out."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from docket_core.sansio.decisions import (
    LONGEST_RETRY_DELAY,
    PendingCall,
    failure_ttl,
    may_follow,
    may_retry,
    plan_add,
    plan_end,
    plan_reject,
    retry_delay,
)
from docket_core.sansio.effects import Finish, Schedule
from docket_core.sansio.inputs import FollowUp, TaskEnded, TaskOutcome
from docket_core.sansio.strikes import Operator, StrikeInstruction, StrikeList
from docket_core.sansio.values import (
    ExecutionState,
    PerpetualPolicy,
    RetryPolicy,
    ScheduleMode,
    TaskMessage,
    TaskPolicy,
)


def call(**changes: Any) -> PendingCall:
    fields: dict[str, Any] = {
        "function": "send",
        "key": "k1",
        "when": 50.0,
        "mode": ScheduleMode.ADD,
        "payload": b"pickled",
        "arguments": {"customer": 7},
    }
    fields.update(changes)
    return PendingCall(**fields)


def strikes(*instructions: StrikeInstruction) -> StrikeList:
    strike_list = StrikeList()
    for instruction in instructions:
        strike_list.apply(instruction)
    return strike_list


def strike(
    function: str | None, parameter: str | None = None, value: Any = None
) -> StrikeInstruction:
    return StrikeInstruction(
        function=function, parameter=parameter, operator=Operator.EQUAL, value=value
    )


class Untouchable(Mapping[str, Any]):
    """Arguments that fail the test if anyone reads them."""

    def __getitem__(self, name: str) -> Any:
        raise AssertionError("the arguments were read")

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("the arguments were read")

    def __len__(self) -> int:
        raise AssertionError("the arguments were read")


# -- plan_add ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(ScheduleMode))
def test_a_call_no_strike_matches_is_scheduled_as_given(mode: ScheduleMode) -> None:
    effect = plan_add(call(mode=mode), StrikeList(), now=40.0)
    assert effect == Schedule(
        message=TaskMessage(key="k1", function="send", payload=b"pickled", when=50.0),
        mode=mode,
        now=40.0,
    )


def test_the_keyword_form_schedules_the_same_message() -> None:
    keyword = plan_add(
        key="k1", function="send", payload=b"pickled", when=50.0, mode=ScheduleMode.ADD, now=40.0
    )
    assert keyword == plan_add(call(), StrikeList(), now=40.0)


@pytest.mark.parametrize(
    "instruction",
    [
        strike("send"),
        strike(None, "customer", 7),
        strike("send", "customer", 7),
    ],
    ids=["the function", "an argument value", "the function with that value"],
)
def test_a_struck_call_is_not_stored(instruction: StrikeInstruction) -> None:
    assert plan_add(call(), strikes(instruction), now=40.0) is None


@pytest.mark.parametrize(
    "instruction",
    [
        strike("other"),
        strike(None, "customer", 8),
        strike("other", "customer", 7),
        strike(None, "region", 7),
    ],
    ids=["another function", "another value", "another function's value", "another parameter"],
)
def test_a_strike_that_does_not_match_lets_the_call_through(
    instruction: StrikeInstruction,
) -> None:
    assert isinstance(plan_add(call(), strikes(instruction), now=40.0), Schedule)


def test_a_restored_strike_no_longer_stops_the_call() -> None:
    lifted = attrs.evolve(strike("send"), restore=True)
    assert isinstance(plan_add(call(), strikes(strike("send"), lifted), now=40.0), Schedule)


@pytest.mark.parametrize(
    "strike_list",
    [StrikeList(), strikes(strike("other")), strikes(strike("send"))],
    ids=["no strikes", "another task struck", "this task struck"],
)
def test_arguments_are_read_only_when_a_strike_names_a_parameter(
    strike_list: StrikeList,
) -> None:
    # producers bind the arguments lazily: a strike list with no parameter
    # conditions must not make every add pay for binding them
    plan_add(call(arguments=Untouchable()), strike_list, now=40.0)


# -- retry_delay ----------------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1, 2, 7])
def test_a_linear_retry_waits_its_delay_after_every_attempt(attempt: int) -> None:
    assert retry_delay(RetryPolicy(attempts=None, delay=3.0), attempt) == 3.0


@pytest.mark.parametrize(
    ("attempt", "expected"), [(1, 2.0), (2, 4.0), (3, 8.0), (4, 10.0), (40, 10.0)]
)
def test_an_exponential_retry_doubles_up_to_its_maximum(attempt: int, expected: float) -> None:
    policy = RetryPolicy(attempts=None, delay=2.0, exponential=True, maximum_delay=10.0)
    assert retry_delay(policy, attempt) == expected


def test_a_maximum_delay_of_zero_caps_like_any_other() -> None:
    # pydocket: the first retry waits minimum_delay, later ones the capped
    # doubling; 0 is not "uncapped"
    policy = RetryPolicy(attempts=None, delay=1.0, exponential=True, maximum_delay=0.0)
    assert [retry_delay(policy, attempt) for attempt in (1, 2, 3)] == [1.0, 0.0, 0.0]


def test_an_exponential_policy_without_a_maximum_is_uncapped() -> None:
    policy = RetryPolicy(attempts=None, delay=1.0, exponential=True)
    assert policy.maximum_delay == math.inf
    assert retry_delay(policy, 11) == 1024.0


def test_a_very_late_attempt_does_not_overflow() -> None:
    policy = RetryPolicy(attempts=None, delay=1.0, exponential=True)
    assert retry_delay(policy, 10_000) == LONGEST_RETRY_DELAY


@pytest.mark.parametrize(("attempts", "attempt", "expected"), [(3, 2, True), (3, 3, False)])
def test_may_retry_counts_attempts_in_total(attempts: int, attempt: int, expected: bool) -> None:
    assert may_retry(RetryPolicy(attempts=attempts, delay=0.0), attempt) is expected
    assert may_retry(RetryPolicy(attempts=None, delay=0.0), 10**6)


# -- plan_end ---------------------------------------------------------------------------

MESSAGE = TaskMessage(key="k", function="f", payload=b"p", when=0.0, attempt=2, generation=4)


def ended(now: float = 100.0, follow_up: FollowUp | None = None) -> TaskEnded:
    return TaskEnded(delivery_id="1-0", now=now, outcome=TaskOutcome.FAILED, follow_up=follow_up)


def end(policy: TaskPolicy, outcome: TaskOutcome, **changes: Any) -> Any:
    return plan_end(
        delivery_id="1-0",
        message=MESSAGE,
        policy=policy,
        ended=changes.pop("task_ended", ended()),
        outcome=outcome,
        error=changes.pop("error", None),
        started_at=changes.pop("started_at", 90.0),
        execution_ttl=changes.pop("execution_ttl", 60.0),
        cancelled=changes.pop("cancelled", False),
    )


def test_a_failure_with_attempts_left_is_retried_after_the_core_delay() -> None:
    policy = TaskPolicy(
        retry=RetryPolicy(attempts=5, delay=1.0, exponential=True, maximum_delay=30.0)
    )
    effect = end(policy, TaskOutcome.FAILED)
    assert isinstance(effect, Schedule)
    assert effect.message.when == 100.0 + retry_delay(policy.retry, 2)  # type: ignore[arg-type]
    assert effect.message.attempt == 3
    assert effect.mode is ScheduleMode.REPLACE
    assert (effect.acknowledge, effect.expect_generation) == ("1-0", 4)


def test_a_forced_retry_time_wins_over_the_delay() -> None:
    policy = TaskPolicy(retry=RetryPolicy(attempts=5, delay=1.0))
    effect = end(policy, TaskOutcome.FAILED, task_ended=ended(follow_up=FollowUp(retry_at=500.0)))
    assert isinstance(effect, Schedule) and effect.message.when == 500.0


def test_a_failure_without_attempts_left_is_recorded_failed() -> None:
    policy = TaskPolicy(retry=RetryPolicy(attempts=2, delay=1.0))
    effect = end(policy, TaskOutcome.FAILED, error="ValueError: no")
    assert isinstance(effect, Finish)
    assert (effect.state, effect.error, effect.ttl) == (ExecutionState.FAILED, "ValueError: no", 60)


def test_a_perpetual_task_runs_again_start_to_start() -> None:
    policy = TaskPolicy(perpetual=PerpetualPolicy(every=30.0))
    effect = end(policy, TaskOutcome.SUCCEEDED)
    assert isinstance(effect, Schedule)
    assert (effect.message.when, effect.message.attempt) == (120.0, 1)


def test_each_end_of_a_perpetual_run_is_published_with_the_next_run() -> None:
    """pydocket publishes every perpetual run's end (``failed`` with its
    error, or ``completed``); a retry in between publishes none."""
    policy = TaskPolicy(perpetual=PerpetualPolicy(every=30.0))
    done = end(policy, TaskOutcome.SUCCEEDED)
    failed = end(policy, TaskOutcome.FAILED, error="ValueError: no")
    assert isinstance(done, Schedule) and isinstance(failed, Schedule)
    assert (done.ended, done.ended_error) == (ExecutionState.COMPLETED, None)
    assert (failed.ended, failed.ended_error) == (ExecutionState.FAILED, "ValueError: no")
    assert failed.message.when == 120.0  # the next run still comes
    retried = end(
        TaskPolicy(retry=RetryPolicy(attempts=5, delay=1.0), perpetual=PerpetualPolicy(every=30.0)),
        TaskOutcome.FAILED,
        error="ValueError: no",
    )
    assert isinstance(retried, Schedule) and retried.ended is None
    exhausted = end(
        TaskPolicy(retry=RetryPolicy(attempts=2, delay=1.0), perpetual=PerpetualPolicy(every=30.0)),
        TaskOutcome.FAILED,
        error="ValueError: no",
    )
    assert isinstance(exhausted, Schedule)
    assert (exhausted.ended, exhausted.message.attempt) == (ExecutionState.FAILED, 1)


def test_a_cancelled_perpetual_task_is_recorded_cancelled() -> None:
    policy = TaskPolicy(perpetual=PerpetualPolicy(every=30.0))
    effect = end(policy, TaskOutcome.CANCELLED)
    assert isinstance(effect, Finish) and effect.state is ExecutionState.CANCELLED


@pytest.mark.parametrize(
    ("outcome", "state"),
    [
        (TaskOutcome.SUCCEEDED, ExecutionState.COMPLETED),
        (TaskOutcome.FAILED, ExecutionState.FAILED),
        (TaskOutcome.CANCELLED, ExecutionState.CANCELLED),
    ],
)
def test_a_run_cancelled_while_it_ran_records_its_end_and_nothing_follows(
    outcome: TaskOutcome, state: ExecutionState
) -> None:
    """Its key was cancelled: no retry, no next perpetual run (not even one
    the task asked for), only the end it really had."""
    policy = TaskPolicy(
        retry=RetryPolicy(attempts=None, delay=1.0), perpetual=PerpetualPolicy(every=30.0)
    )
    asked = ended(follow_up=FollowUp(retry_at=500.0, perpetual_at=600.0))
    error = "ValueError: late" if outcome is TaskOutcome.FAILED else None
    effect = end(policy, outcome, task_ended=asked, error=error, cancelled=True)
    assert isinstance(effect, Finish)
    assert (effect.state, effect.error, effect.generation) == (state, error, 4)
    assert isinstance(end(policy, outcome, task_ended=asked, error=error), Schedule) is (
        outcome is not TaskOutcome.CANCELLED
    )


@given(
    outcome=st.sampled_from(TaskOutcome),
    error=st.none() | st.just("ValueError: no"),
    result=st.none() | st.just(b"result"),
    ttl=st.sampled_from([0.0, 60.0]),
    cancelled=st.booleans(),
)
def test_an_end_nothing_may_follow_is_recorded_as_the_long_way_records_it(
    outcome: TaskOutcome, error: str | None, result: bytes | None, ttl: float, cancelled: bool
) -> None:
    """Without a retry, a perpetual policy or a follow-up, ``plan_end`` goes
    straight to the record (``may_follow``): the same ``Finish`` as the way
    through every branch gives (taken with a follow-up that asks nothing)."""
    plain = TaskPolicy()

    def planned(follow_up: FollowUp | None) -> Any:
        task_ended = TaskEnded(
            delivery_id="1-0", now=100.0, outcome=outcome, result=result, follow_up=follow_up
        )
        assert may_follow(plain, task_ended) is (follow_up is not None)
        return end(
            plain,
            outcome,
            task_ended=task_ended,
            error=error,
            execution_ttl=ttl,
            cancelled=cancelled,
        )

    short = planned(None)
    assert isinstance(short, Finish)
    assert short == planned(FollowUp())


def test_anything_that_may_follow_an_end_takes_the_long_way() -> None:
    task_ended = ended()
    assert not may_follow(TaskPolicy(), task_ended)
    assert may_follow(TaskPolicy(retry=RetryPolicy(attempts=2, delay=1.0)), task_ended)
    assert may_follow(TaskPolicy(perpetual=PerpetualPolicy(every=30.0)), task_ended)
    assert may_follow(TaskPolicy(), ended(follow_up=FollowUp(retry_at=5.0)))


def test_a_rejected_delivery_fails_with_its_problem_or_is_cancelled() -> None:
    failed = plan_reject(
        delivery_id="1-0", message=MESSAGE, now=1.0, execution_ttl=0.0, problem="unknown task"
    )
    struck = plan_reject(
        delivery_id="1-0", message=MESSAGE, now=1.0, execution_ttl=0.0, problem=None
    )
    assert (failed.state, failed.ttl) == (ExecutionState.FAILED, failure_ttl(0.0))
    assert (struck.state, struck.ttl) == (ExecutionState.CANCELLED, 0.0)
    assert failure_ttl(0.0) == 3600.0 and failure_ttl(7200.0) == 7200.0


def test_pending_calls_are_plain_values() -> None:
    assert call() == call()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        call().key = "other"  # type: ignore[misc]
    assert not hasattr(call(), "__dict__")
