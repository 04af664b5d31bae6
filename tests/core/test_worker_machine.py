"""Direct unit tests of ``WorkerMachine``: hand-made inputs and outcomes, no
store, no runtime, no event loop."""

from __future__ import annotations

import pytest
from machines import (
    arrival,
    claim_all,
    deliver,
    end,
    make_machine,
    of_type,
    recorded,
    reply,
    start,
)

from docket_core.sansio.effects import (
    CancelTask,
    Claim,
    ClaimItem,
    ErrorResult,
    Finish,
    Heartbeat,
    RenewLeases,
    Schedule,
    SeedPerpetuals,
    StartTask,
    StopReason,
)
from docket_core.sansio.errors import InternalError, InvalidTransition, UsageError
from docket_core.sansio.flight import Count
from docket_core.sansio.inputs import (
    CancelRequested,
    Claimed,
    ClaimVerdict,
    DeadlineExtended,
    Finished,
    FollowUp,
    HeartbeatSent,
    LeasesRenewed,
    Scheduled,
    ShutdownRequested,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.values import (
    ExecutionState,
    PerpetualPolicy,
    RetryPolicy,
    ScheduleMode,
    TaskMessage,
    TaskPolicy,
)
from docket_core.sansio.worker import WorkerConfig

#: what the machine sends to stop ``d1`` (task ``f``) at its deadline
TIMED_OUT = CancelTask(
    delivery_id="d1",
    reason=StopReason.TIMEOUT,
    result=ErrorResult(kind=TimeoutError, message="f timed out"),
)


# -- deliveries and claims ------------------------------------------------------


def test_one_claim_batches_every_delivery_of_one_input() -> None:
    machine = make_machine()
    effects = deliver(machine, arrival("d1"), arrival("d2"), arrival("d3"), now=5.0)
    assert effects == [
        Claim(
            worker="w1",
            items=(
                ClaimItem(delivery_id="d1", key="key-d1", generation=1),
                ClaimItem(delivery_id="d2", key="key-d2", generation=1),
                ClaimItem(delivery_id="d3", key="key-d3", generation=1),
            ),
            now=5.0,
        )
    ]
    assert {f.phase for f in machine.in_flight.values()} == {Phase.CLAIMING}
    assert machine.counters["delivered"] == 3


def test_separate_inputs_make_separate_claims() -> None:
    machine = make_machine()
    assert len(deliver(machine, arrival("d1"))) == 1
    assert len(deliver(machine, arrival("d2"))) == 1


def test_a_delivery_already_held_is_not_claimed_again() -> None:
    machine = make_machine()
    deliver(machine, arrival("d1"))
    assert deliver(machine, arrival("d1", redelivered=True)) == []
    assert len(machine.in_flight) == 1


def test_redelivered_counter() -> None:
    machine = make_machine()
    deliver(machine, arrival("d1", redelivered=True))
    assert machine.counters["redelivered"] == 1
    assert machine.counters["delivered"] == 0


def test_claimed_starts_the_task() -> None:
    machine = make_machine()
    effects = start(machine, arrival("d1"), now=1.0)
    assert effects == [StartTask(delivery_id="d1")]
    flight = machine.in_flight["d1"]
    assert flight.phase is Phase.RUNNING
    assert flight.started_at == 1.0
    assert machine.counters["started"] == 1


def test_mixed_verdicts() -> None:
    machine = make_machine()
    (claim,) = deliver(machine, arrival("d1"), arrival("d2"), arrival("d3"))
    effects = reply(
        machine,
        claim,
        Claimed(
            verdicts=(
                ("d1", ClaimVerdict.SUPERSEDED),
                ("d2", ClaimVerdict.CLAIMED),
                ("d3", ClaimVerdict.CANCELLED),
            )
        ),
    )
    assert effects == [StartTask(delivery_id="d2")]
    assert set(machine.in_flight) == {"d2"}


@pytest.mark.parametrize("verdict", [ClaimVerdict.SUPERSEDED, ClaimVerdict.CANCELLED])
def test_a_lost_claim_drops_the_delivery(verdict: ClaimVerdict) -> None:
    machine = make_machine()
    (claim,) = deliver(machine, arrival("d1"))
    assert claim_all(machine, claim, verdict=verdict) == []
    assert machine.in_flight == {}
    assert machine.idle
    assert machine.counters[verdict.value] == 1
    assert machine.counters[Count(verdict.value)] == 1


def test_counters_are_counts_read_by_plain_name_too() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    end(machine, "d1", TaskOutcome.SUCCEEDED, 1.0)
    assert set(machine.counters) <= set(Count)
    assert machine.counters[Count.STARTED] == machine.counters["started"] == 1
    assert machine.counters["succeeded"] == 1
    assert machine.counters["never-counted"] == 0


def test_a_verdict_for_an_unknown_delivery_is_ignored() -> None:
    machine = make_machine()
    (claim,) = deliver(machine, arrival("d1"))
    effects = reply(machine, claim, Claimed(verdicts=(("nope", ClaimVerdict.CLAIMED),)))
    assert effects == []
    assert machine.in_flight["d1"].phase is Phase.CLAIMING


# -- rejections ---------------------------------------------------------------------


def test_a_problem_is_a_recorded_failure_with_the_reason() -> None:
    machine = make_machine(execution_ttl=60.0)
    effects = deliver(machine, arrival("d1", generation=4, problem="unknown task 'f'"), now=3.0)
    assert effects == [
        Finish(
            delivery_id="d1",
            key="key-d1",
            generation=4,
            state=ExecutionState.FAILED,
            now=3.0,
            ttl=3600.0,
            error="unknown task 'f'",
        )
    ]
    assert machine.in_flight["d1"].phase is Phase.FINISHING
    assert machine.counters["failed"] == 1
    assert recorded(machine, effects[0]) == []
    assert machine.idle


def test_struck_is_a_cancellation() -> None:
    machine = make_machine(execution_ttl=60.0)
    effects = deliver(machine, arrival("d1", struck=True), now=3.0)
    (finish,) = effects
    assert isinstance(finish, Finish)
    assert finish.state is ExecutionState.CANCELLED
    assert finish.error is None
    assert finish.ttl == 60.0
    assert machine.counters["struck"] == 1


def test_rejections_and_claims_in_one_input() -> None:
    machine = make_machine()
    effects = deliver(
        machine, arrival("d1", struck=True), arrival("d2"), arrival("d3", problem="x")
    )
    assert [type(e) for e in effects] == [Finish, Finish, Claim]
    claim = effects[-1]
    assert isinstance(claim, Claim)
    assert [i.delivery_id for i in claim.items] == ["d2"]


# -- the end of a run ---------------------------------------------------------------


def test_success_is_completed_with_its_result() -> None:
    machine = make_machine(execution_ttl=60.0)
    start(machine, arrival("d1", generation=7))
    effects = end(machine, "d1", TaskOutcome.SUCCEEDED, 2.0, result=b"42")
    assert effects == [
        Finish(
            delivery_id="d1",
            key="key-d1",
            generation=7,
            state=ExecutionState.COMPLETED,
            now=2.0,
            ttl=60.0,
            result=b"42",
        )
    ]
    assert machine.in_flight["d1"].phase is Phase.FINISHING
    assert recorded(machine, effects[0], 2.0) == []
    assert machine.idle
    assert machine.counters["succeeded"] == 1


def test_fire_and_forget_keeps_no_result() -> None:
    machine = make_machine(execution_ttl=0.0)
    start(machine, arrival("d1"))
    (finish,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 2.0, result=b"42")
    assert isinstance(finish, Finish)
    assert finish.result is None
    assert finish.ttl == 0.0


def test_failure_without_retry_is_failed() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    (finish,) = end(machine, "d1", TaskOutcome.FAILED, 2.0, error="ValueError: no")
    assert isinstance(finish, Finish)
    assert finish.state is ExecutionState.FAILED
    assert finish.error == "ValueError: no"


def test_failure_with_a_retry_policy_is_scheduled_again() -> None:
    machine = make_machine()
    policy = TaskPolicy(retry=RetryPolicy(attempts=3, delay=5.0))
    start(machine, arrival("d1", policy=policy, generation=9), now=1.0)
    effects = end(machine, "d1", TaskOutcome.FAILED, 10.0, error="E: x")
    assert effects == [
        Schedule(
            message=TaskMessage(
                key="key-d1", function="f", payload=b"p", when=15.0, attempt=2, generation=9
            ),
            mode=ScheduleMode.REPLACE,
            now=10.0,
            acknowledge="d1",
            expect_generation=9,
        )
    ]
    assert machine.counters["retried"] == 1
    assert recorded(machine, effects[0], 10.0) == []
    assert machine.idle


def test_retry_at_asked_by_the_task() -> None:
    machine = make_machine()
    policy = TaskPolicy(retry=RetryPolicy(attempts=3, delay=5.0))
    start(machine, arrival("d1", policy=policy))
    (schedule,) = end(machine, "d1", TaskOutcome.FAILED, 10.0, follow_up=FollowUp(retry_at=100.0))
    assert isinstance(schedule, Schedule)
    assert schedule.message.when == 100.0


@pytest.mark.parametrize(
    ("attempt", "expected"), [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 10.0), (6, 10.0)]
)
def test_exponential_delays(attempt: int, expected: float) -> None:
    machine = make_machine()
    policy = TaskPolicy(
        retry=RetryPolicy(attempts=None, delay=1.0, exponential=True, maximum_delay=10.0)
    )
    start(machine, arrival("d1", policy=policy, attempt=attempt))
    (schedule,) = end(machine, "d1", TaskOutcome.FAILED, 100.0)
    assert isinstance(schedule, Schedule)
    assert schedule.message.when == 100.0 + expected
    assert schedule.message.attempt == attempt + 1


def test_exponential_without_a_cap() -> None:
    machine = make_machine()
    policy = TaskPolicy(retry=RetryPolicy(attempts=None, delay=1.0, exponential=True))
    start(machine, arrival("d1", policy=policy, attempt=11))
    (schedule,) = end(machine, "d1", TaskOutcome.FAILED, 0.0)
    assert isinstance(schedule, Schedule)
    assert schedule.message.when == 1024.0


def test_attempts_exhausted_is_failed() -> None:
    machine = make_machine()
    policy = TaskPolicy(retry=RetryPolicy(attempts=3, delay=5.0))
    start(machine, arrival("d1", policy=policy, attempt=3))
    (finish,) = end(machine, "d1", TaskOutcome.FAILED, 10.0, error="E: x")
    assert isinstance(finish, Finish)
    assert finish.state is ExecutionState.FAILED
    assert finish.error == "E: x"


def test_a_retried_success_is_completed() -> None:
    machine = make_machine()
    policy = TaskPolicy(retry=RetryPolicy(attempts=3, delay=5.0))
    start(machine, arrival("d1", policy=policy, attempt=2))
    (finish,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 10.0)
    assert isinstance(finish, Finish)
    assert finish.state is ExecutionState.COMPLETED


def test_perpetual_runs_start_to_start() -> None:
    machine = make_machine()
    policy = TaskPolicy(perpetual=PerpetualPolicy(every=10.0))
    start(machine, arrival("d1", policy=policy, attempt=1, generation=3), now=100.0)
    effects = end(machine, "d1", TaskOutcome.SUCCEEDED, 103.0)
    assert effects == [
        Schedule(
            message=TaskMessage(
                key="key-d1", function="f", payload=b"p", when=110.0, attempt=1, generation=3
            ),
            mode=ScheduleMode.REPLACE,
            now=103.0,
            acknowledge="d1",
            expect_generation=3,
            ended=ExecutionState.COMPLETED,
        )
    ]
    assert machine.counters["perpetuated"] == 1


def test_a_perpetual_run_longer_than_its_interval_runs_again_now() -> None:
    machine = make_machine()
    policy = TaskPolicy(perpetual=PerpetualPolicy(every=10.0))
    start(machine, arrival("d1", policy=policy), now=100.0)
    (schedule,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 125.0)
    assert isinstance(schedule, Schedule)
    assert schedule.message.when == 125.0


def test_a_perpetual_failure_still_perpetuates() -> None:
    machine = make_machine()
    policy = TaskPolicy(perpetual=PerpetualPolicy(every=10.0))
    start(machine, arrival("d1", policy=policy), now=100.0)
    (schedule,) = end(machine, "d1", TaskOutcome.FAILED, 101.0, error="E: x")
    assert isinstance(schedule, Schedule)
    assert schedule.message.when == 110.0
    assert schedule.message.attempt == 1


def test_perpetual_after_and_perpetuate() -> None:
    machine = make_machine()
    policy = TaskPolicy(perpetual=PerpetualPolicy(every=10.0))
    start(machine, arrival("d1", policy=policy), now=100.0)
    follow_up = FollowUp(perpetual_at=500.0, perpetual_payload=b"next")
    (schedule,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 101.0, follow_up=follow_up)
    assert isinstance(schedule, Schedule)
    assert schedule.message.when == 500.0
    assert schedule.message.payload == b"next"


def test_perpetual_cancelled_finishes() -> None:
    machine = make_machine()
    policy = TaskPolicy(perpetual=PerpetualPolicy(every=10.0))
    start(machine, arrival("d1", policy=policy), now=100.0)
    (finish,) = end(
        machine,
        "d1",
        TaskOutcome.SUCCEEDED,
        101.0,
        follow_up=FollowUp(perpetual_cancelled=True),
    )
    assert isinstance(finish, Finish)
    assert finish.state is ExecutionState.COMPLETED


def test_a_retried_perpetual_task_retries_first() -> None:
    machine = make_machine()
    policy = TaskPolicy(
        retry=RetryPolicy(attempts=2, delay=1.0), perpetual=PerpetualPolicy(every=10.0)
    )
    start(machine, arrival("d1", policy=policy), now=100.0)
    (schedule,) = end(machine, "d1", TaskOutcome.FAILED, 101.0)
    assert isinstance(schedule, Schedule)
    assert (schedule.message.when, schedule.message.attempt) == (102.0, 2)


def test_cancelled_runs_never_retry_or_perpetuate() -> None:
    machine = make_machine()
    policy = TaskPolicy(
        retry=RetryPolicy(attempts=None, delay=1.0), perpetual=PerpetualPolicy(every=10.0)
    )
    start(machine, arrival("d1", policy=policy), now=100.0)
    machine.receive(CancelRequested(key="key-d1", now=101.0))
    assert machine.effects() == [CancelTask(delivery_id="d1", reason=StopReason.CANCELLED)]
    assert machine.in_flight["d1"].phase is Phase.CANCELLING
    (finish,) = end(machine, "d1", TaskOutcome.CANCELLED, 102.0)
    assert isinstance(finish, Finish)
    assert finish.state is ExecutionState.CANCELLED
    assert machine.counters["cancelled"] == 1


def test_a_cancel_spares_a_key_added_again_after_it() -> None:
    """The cancel signal names the first generation it spares; a delivery of
    it or newer (the key was added again at once) runs on."""
    machine = make_machine()
    start(machine, arrival("d1", generation=7))
    machine.receive(CancelRequested(key="key-d1", now=1.0, generation=6))
    assert machine.effects() == []
    assert machine.in_flight["d1"].phase is Phase.RUNNING
    machine.receive(CancelRequested(key="key-d1", now=1.0, generation=7))
    assert machine.effects() == []
    machine.receive(CancelRequested(key="key-d1", now=1.0, generation=8))
    assert machine.effects() == [CancelTask(delivery_id="d1", reason=StopReason.CANCELLED)]


@pytest.mark.parametrize(
    ("outcome", "state"),
    [
        (TaskOutcome.SUCCEEDED, ExecutionState.COMPLETED),
        (TaskOutcome.FAILED, ExecutionState.FAILED),
    ],
)
def test_a_cancelled_run_that_ends_anyway_is_neither_retried_nor_perpetuated(
    outcome: TaskOutcome, state: ExecutionState
) -> None:
    machine = make_machine()
    policy = TaskPolicy(
        retry=RetryPolicy(attempts=None, delay=1.0), perpetual=PerpetualPolicy(every=10.0)
    )
    start(machine, arrival("d1", policy=policy), now=100.0)
    machine.receive(CancelRequested(key="key-d1", now=101.0, generation=2))
    machine.effects()
    (finish,) = end(machine, "d1", outcome, 102.0)
    assert isinstance(finish, Finish)
    assert finish.state is state
    assert machine.counters[outcome.value] == 1
    assert machine.counters["retried"] + machine.counters["perpetuated"] == 0


def test_a_cancelled_run_that_finishes_anyway_reports_what_it_did() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    machine.receive(CancelRequested(key="key-d1", now=1.0))
    machine.effects()
    (finish,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 2.0)
    assert isinstance(finish, Finish)
    assert finish.state is ExecutionState.COMPLETED


def test_cancel_requested_for_another_key_does_nothing() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    machine.receive(CancelRequested(key="other", now=1.0))
    assert machine.effects() == []
    assert machine.in_flight["d1"].phase is Phase.RUNNING


def test_cancel_twice_sends_one_cancel_task() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    machine.receive(CancelRequested(key="key-d1", now=1.0))
    machine.receive(CancelRequested(key="key-d1", now=1.5))
    assert machine.effects() == [CancelTask(delivery_id="d1", reason=StopReason.CANCELLED)]


def test_cancel_while_finishing_changes_nothing() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    (finish,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 2.0)
    machine.receive(CancelRequested(key="key-d1", now=2.5))
    assert machine.effects() == []
    assert recorded(machine, finish) == []
    assert machine.idle


def test_cancel_while_claiming_does_not_let_the_task_run_unchecked() -> None:
    machine = make_machine()
    (claim,) = deliver(machine, arrival("d1"))
    machine.receive(CancelRequested(key="key-d1", now=1.0))
    assert machine.effects() == []
    effects = claim_all(machine, claim, now=1.0)
    started = of_type(effects, StartTask)
    cancels = of_type(effects, CancelTask)
    assert not started or cancels, effects


def test_ending_an_unknown_delivery_is_an_internal_error() -> None:
    """The runtime ends only what the machine started: docket's bug."""
    machine = make_machine()
    with pytest.raises(InternalError, match="nope"):
        machine.receive(TaskEnded(delivery_id="nope", now=0.0, outcome=TaskOutcome.SUCCEEDED))
    assert not isinstance(machine.failed, UsageError)


def test_a_failed_machine_refuses_everything() -> None:
    """As h11's connections: after an error the machine may be half-way,
    so every later call raises, naming the first error."""
    machine = make_machine()
    start(machine, arrival("d1"))
    (finish,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 1.0)
    with pytest.raises(InvalidTransition):
        # a second end of the same run: FINISHING has no ``ended`` row
        machine.receive(TaskEnded(delivery_id="d1", now=2.0, outcome=TaskOutcome.SUCCEEDED))
    assert isinstance(machine.failed, InvalidTransition)
    calls = (
        lambda: machine.receive(Tick(now=3.0)),
        lambda: machine.store_replied([finish], [Finished(delivery_id="d1", recorded=True)], 3.0),
        machine.effects,
    )
    for call in calls:
        with pytest.raises(InternalError, match=r"failed earlier.*InvalidTransition") as caught:
            call()
        assert caught.value.__cause__ is machine.failed


def test_a_misuse_of_store_replied_fails_the_machine_too() -> None:
    machine = make_machine()
    (claim,) = deliver(machine, arrival("d1"))
    with pytest.raises(ValueError):
        machine.store_replied([claim], [], 0.0)
    with pytest.raises(InternalError, match="ValueError"):
        machine.receive(Tick(now=1.0))


def test_an_unknown_input_is_refused() -> None:
    machine = make_machine()
    with pytest.raises(TypeError):
        machine.receive(HeartbeatSent())


def test_an_outcome_for_a_finish_that_is_not_ours_is_ignored() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    finish = Finish(
        delivery_id="d1",
        key="key-d1",
        generation=1,
        state=ExecutionState.COMPLETED,
        now=0.0,
        ttl=1.0,
    )
    # still RUNNING: a stray Finished must not move it
    assert reply(machine, finish, Finished(delivery_id="d1", recorded=True)) == []
    assert machine.in_flight["d1"].phase is Phase.RUNNING


def test_finish_not_recorded_still_drops_the_delivery() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    (finish,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 1.0)
    assert reply(machine, finish, Finished(delivery_id="d1", recorded=False)) == []
    assert machine.idle


def test_schedule_not_accepted_still_drops_the_delivery() -> None:
    machine = make_machine()
    start(machine, arrival("d1", policy=TaskPolicy(retry=RetryPolicy(attempts=2, delay=1.0))))
    (schedule,) = end(machine, "d1", TaskOutcome.FAILED, 1.0)
    outcome = Scheduled(key="key-d1", accepted=False, generation=-1, state=None)
    assert reply(machine, schedule, outcome) == []
    assert machine.idle


# -- timeouts -------------------------------------------------------------------------


def test_next_deadline_includes_the_task_deadline() -> None:
    machine = make_machine(heartbeat_interval=100.0, redelivery_timeout=400.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    assert machine.next_deadline() == 100.0
    start(machine, arrival("d1", policy=TaskPolicy(timeout=5.0)), now=1.0)
    assert machine.in_flight["d1"].deadline == 6.0
    assert machine.next_deadline() == 6.0


def test_a_timeout_cancels_then_fails() -> None:
    machine = make_machine(heartbeat_interval=100.0, redelivery_timeout=400.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    start(machine, arrival("d1", policy=TaskPolicy(timeout=5.0)), now=1.0)
    machine.receive(Tick(now=5.9))
    assert machine.effects() == []
    machine.receive(Tick(now=6.0))
    assert machine.effects() == [TIMED_OUT]
    assert machine.in_flight["d1"].phase is Phase.TIMING_OUT
    assert machine.counters["timed_out"] == 1
    # no second CancelTask, and the deadline no longer counts
    machine.receive(Tick(now=7.0))
    assert machine.effects() == []
    assert machine.next_deadline() == 100.0
    (finish,) = end(machine, "d1", TaskOutcome.CANCELLED, 7.0)
    assert isinstance(finish, Finish)
    assert finish.state is ExecutionState.FAILED
    assert finish.error == "TimeoutError: task exceeded its timeout of 5.0s"


def test_a_timed_out_run_keeps_the_result_the_runtime_pickled_as_asked() -> None:
    """The core asks (``CancelTask.result``) and records what comes back."""
    machine = make_machine()
    start(machine, arrival("d1", policy=TaskPolicy(timeout=5.0)), now=0.0)
    machine.receive(Tick(now=5.0))
    assert TIMED_OUT in machine.effects()
    ended = TaskEnded(
        delivery_id="d1", now=5.1, outcome=TaskOutcome.CANCELLED, result=b"pickled TimeoutError"
    )
    machine.receive(ended)
    (finish,) = of_type(machine.effects(), Finish)
    assert (finish.state, finish.result) == (ExecutionState.FAILED, b"pickled TimeoutError")


def test_a_cancel_during_a_timeout_still_records_the_timeout() -> None:
    machine = make_machine()
    start(machine, arrival("d1", policy=TaskPolicy(timeout=5.0)), now=0.0)
    machine.receive(Tick(now=5.0))
    assert TIMED_OUT in machine.effects()
    machine.receive(CancelRequested(key="key-d1", now=5.1))
    assert of_type(machine.effects(), CancelTask) == []
    assert machine.in_flight["d1"].phase is Phase.TIMING_OUT
    (finish,) = end(machine, "d1", TaskOutcome.CANCELLED, 5.2)
    assert isinstance(finish, Finish)
    assert finish.state is ExecutionState.FAILED


def test_a_timeout_is_retried_when_the_policy_allows() -> None:
    machine = make_machine()
    policy = TaskPolicy(timeout=5.0, retry=RetryPolicy(attempts=2, delay=3.0))
    start(machine, arrival("d1", policy=policy), now=0.0)
    machine.receive(Tick(now=5.0))
    assert TIMED_OUT in machine.effects()
    (schedule,) = end(machine, "d1", TaskOutcome.CANCELLED, 5.5)
    assert isinstance(schedule, Schedule)
    assert (schedule.message.attempt, schedule.message.when) == (2, 8.5)


def test_a_timed_out_task_that_returns_anyway_completes() -> None:
    machine = make_machine()
    start(machine, arrival("d1", policy=TaskPolicy(timeout=5.0)), now=0.0)
    machine.receive(Tick(now=5.0))
    machine.effects()
    (finish,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 5.1)
    assert isinstance(finish, Finish)
    assert finish.state is ExecutionState.COMPLETED


def test_deadline_extended_moves_it() -> None:
    machine = make_machine(heartbeat_interval=100.0, redelivery_timeout=400.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    start(machine, arrival("d1", policy=TaskPolicy(timeout=5.0)), now=0.0)
    machine.receive(DeadlineExtended(delivery_id="d1", deadline=20.0))
    assert machine.next_deadline() == 20.0
    machine.receive(Tick(now=10.0))
    assert machine.effects() == []
    machine.receive(Tick(now=20.0))
    assert machine.effects() == [TIMED_OUT]


def test_deadline_extended_without_a_timeout_sets_one() -> None:
    machine = make_machine(heartbeat_interval=100.0, redelivery_timeout=400.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    start(machine, arrival("d1"), now=0.0)
    assert machine.next_deadline() == 100.0
    machine.receive(DeadlineExtended(delivery_id="d1", deadline=30.0))
    assert machine.next_deadline() == 30.0
    (finish,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 1.0)
    assert machine.next_deadline() == 100.0
    assert isinstance(finish, Finish)


def test_deadline_extended_for_unknown_delivery_is_ignored() -> None:
    machine = make_machine()
    machine.receive(DeadlineExtended(delivery_id="nope", deadline=30.0))
    assert machine.effects() == []


# -- leases -----------------------------------------------------------------------------


def test_leases_are_renewed_every_quarter_of_the_redelivery_timeout() -> None:
    machine = make_machine(redelivery_timeout=40.0, heartbeat_interval=1000.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    start(machine, arrival("d1"), now=0.0)
    deliver(machine, arrival("d2"), now=0.0)  # still claiming: held too
    assert machine.next_deadline() == 10.0
    machine.receive(Tick(now=9.9))
    assert machine.effects() == []
    machine.receive(Tick(now=10.0))
    assert machine.effects() == [
        RenewLeases(worker="w1", delivery_ids=("d1", "d2"), slots=(), now=10.0)
    ]
    assert machine.next_deadline() == 20.0
    machine.receive(Tick(now=15.0))
    assert machine.effects() == []
    machine.receive(Tick(now=20.0))
    assert len(of_type(machine.effects(), RenewLeases)) == 1


def test_an_idle_worker_renews_nothing() -> None:
    machine = make_machine(redelivery_timeout=40.0, heartbeat_interval=1000.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    machine.receive(Tick(now=50.0))
    assert machine.effects() == []
    assert machine.next_deadline() == 1000.0


def test_a_lost_lease_cancels_the_task_and_its_end_finishes_nothing() -> None:
    machine = make_machine(redelivery_timeout=40.0, heartbeat_interval=1000.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    start(machine, arrival("d1", policy=TaskPolicy(retry=RetryPolicy(attempts=5, delay=1.0))))
    machine.receive(Tick(now=10.0))
    (renew,) = machine.effects()
    assert isinstance(renew, RenewLeases)
    assert reply(machine, renew, LeasesRenewed(lost=("d1",)), 10.0) == [
        CancelTask(delivery_id="d1", reason=StopReason.LEASE_LOST)
    ]
    assert machine.in_flight["d1"].phase is Phase.ABANDONING
    assert machine.counters["lease_lost"] == 1
    # abandoned deliveries are no longer renewed
    machine.receive(Tick(now=20.0))
    assert machine.effects() == []
    for outcome in (TaskOutcome.CANCELLED,):
        assert end(machine, "d1", outcome, 11.0) == []
    assert machine.idle
    assert machine.counters["abandoned"] == 1


@pytest.mark.parametrize("outcome", list(TaskOutcome))
def test_an_abandoned_task_emits_nothing_whatever_its_outcome(outcome: TaskOutcome) -> None:
    machine = make_machine()
    start(machine, arrival("d1", policy=TaskPolicy(retry=RetryPolicy(attempts=5, delay=1.0))))
    renew = RenewLeases(worker="w1", delivery_ids=("d1",), slots=(), now=1.0)
    reply(machine, renew, LeasesRenewed(lost=("d1",)), 1.0)
    assert end(machine, "d1", outcome, 2.0) == []
    assert machine.idle


def test_lease_lost_while_cancelling_does_not_cancel_twice_for_the_same_reason() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    machine.receive(CancelRequested(key="key-d1", now=1.0))
    assert machine.effects() == [CancelTask(delivery_id="d1", reason=StopReason.CANCELLED)]
    renew = RenewLeases(worker="w1", delivery_ids=("d1",), slots=(), now=1.0)
    effects = reply(machine, renew, LeasesRenewed(lost=("d1",)), 1.0)
    assert effects == [CancelTask(delivery_id="d1", reason=StopReason.LEASE_LOST)]
    reply(machine, renew, LeasesRenewed(lost=("d1",)), 1.0)
    assert end(machine, "d1", TaskOutcome.CANCELLED, 2.0) == []


def test_lease_lost_while_finishing_keeps_the_finish() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    (finish,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 1.0)
    renew = RenewLeases(worker="w1", delivery_ids=("d1",), slots=(), now=1.0)
    assert reply(machine, renew, LeasesRenewed(lost=("d1",)), 1.0) == []
    assert machine.in_flight["d1"].phase is Phase.FINISHING
    assert recorded(machine, finish) == []
    assert machine.idle


# -- concurrency limits: test_worker_machine_slot_steps.py ---------------------------------


# -- capacity, heartbeats and shutdown --------------------------------------------------------


def test_capacity_counts_every_delivery_held_but_those_finishing() -> None:
    machine = make_machine(concurrency=3)
    assert machine.capacity == 3
    (claim,) = deliver(machine, arrival("d1"), arrival("d2"))
    assert machine.capacity == 1
    claim_all(machine, claim)
    assert machine.capacity == 1
    (finish,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 1.0)
    assert machine.capacity == 2  # its end is out: its room goes to the next read
    recorded(machine, finish)
    assert machine.capacity == 2
    deliver(machine, arrival("d3"), arrival("d4"))
    assert machine.capacity == 0  # never negative


def test_at_most_concurrency_finishing_deliveries_leave_their_room() -> None:
    machine = make_machine(concurrency=2)
    (claim,) = deliver(machine, arrival("d1"), arrival("d2"))
    claim_all(machine, claim)
    end(machine, "d1", TaskOutcome.SUCCEEDED, 1.0)
    end(machine, "d2", TaskOutcome.SUCCEEDED, 1.0)
    assert machine.capacity == 2  # both ends out
    (claim,) = deliver(machine, arrival("d3"), arrival("d4"))
    claim_all(machine, claim)
    end(machine, "d3", TaskOutcome.SUCCEEDED, 2.0)
    end(machine, "d4", TaskOutcome.SUCCEEDED, 2.0)
    # four ends out (none recorded yet): twice the concurrency is held, no room
    assert len(machine.in_flight) == 4
    assert machine.capacity == 0


def test_capacity_never_goes_negative() -> None:
    machine = make_machine(concurrency=1)
    deliver(machine, arrival("d1"), arrival("d2"))
    assert machine.capacity == 0


def test_config_validation() -> None:
    with pytest.raises(UsageError):
        WorkerConfig(name="w", concurrency=0)
    with pytest.raises(UsageError):
        WorkerConfig(name="w", redelivery_timeout=0)
    with pytest.raises(UsageError):
        WorkerConfig(name="w", heartbeat_interval=-1)
    assert WorkerConfig(name="w", redelivery_timeout=8.0).renew_interval == 2.0


def test_heartbeats_on_tick_every_interval() -> None:
    machine = make_machine(heartbeat_interval=2.0, tasks=("a", "b"), redelivery_timeout=1000.0)
    assert machine.next_deadline() == 0.0
    machine.receive(Tick(now=0.0))
    assert machine.effects() == [Heartbeat(worker="w1", tasks=("a", "b"), now=0.0)]
    assert machine.next_deadline() == 2.0
    machine.receive(Tick(now=1.0))
    assert machine.effects() == []
    machine.receive(Tick(now=2.5))
    assert machine.effects() == [Heartbeat(worker="w1", tasks=("a", "b"), now=2.5)]
    assert machine.next_deadline() == 4.5
    machine.receive(Tick(now=4.4))
    assert machine.effects() == []


def test_shutdown_when_idle_says_goodbye_at_once() -> None:
    machine = make_machine(tasks=("a",))
    machine.receive(ShutdownRequested(now=3.0))
    assert machine.capacity == 0
    assert machine.effects() == [Heartbeat(worker="w1", tasks=("a",), now=3.0, leaving=True)]
    assert machine.said_goodbye
    assert machine.next_deadline() is None
    machine.receive(Tick(now=10.0))
    assert machine.effects() == []


def test_shutdown_waits_for_in_flight_work() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    machine.receive(ShutdownRequested(now=1.0))
    assert machine.capacity == 0
    assert machine.effects() == []
    assert not machine.said_goodbye
    machine.receive(Tick(now=100.0))
    assert of_type(machine.effects(), Heartbeat) == []  # no heartbeat while leaving
    (finish,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 101.0)
    assert not machine.said_goodbye
    assert recorded(machine, finish, 102.0) == [
        Heartbeat(worker="w1", tasks=(), now=102.0, leaving=True)
    ]
    assert machine.said_goodbye
    assert machine.next_deadline() is None


def test_shutdown_while_claiming_says_goodbye_after_the_verdicts() -> None:
    machine = make_machine()
    (claim,) = deliver(machine, arrival("d1"))
    machine.receive(ShutdownRequested(now=1.0))
    assert machine.effects() == []
    effects = claim_all(machine, claim, now=2.0, verdict=ClaimVerdict.SUPERSEDED)
    assert effects == [Heartbeat(worker="w1", tasks=(), now=2.0, leaving=True)]


def test_shutdown_says_goodbye_after_the_last_abandoned_task_ends() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    machine.receive(ShutdownRequested(now=1.0))
    renew = RenewLeases(worker="w1", delivery_ids=("d1",), slots=(), now=1.0)
    reply(machine, renew, LeasesRenewed(lost=("d1",)), 1.0)
    effects = end(machine, "d1", TaskOutcome.CANCELLED, 2.0)
    machine.receive(Tick(now=3.0))
    effects += machine.effects()
    assert machine.idle
    goodbyes = [e for e in of_type(effects, Heartbeat) if e.leaving]
    assert len(goodbyes) == 1, effects
    assert machine.said_goodbye


def test_store_replied_checks_the_lengths_match() -> None:
    machine = make_machine()
    (claim,) = deliver(machine, arrival("d1"))
    assert isinstance(claim, Claim)
    with pytest.raises(ValueError):
        machine.store_replied([claim], [], 0.0)


def test_a_lease_lost_while_claiming_never_starts_the_task() -> None:
    machine = make_machine()
    (claim,) = deliver(machine, arrival("d1"))
    renew = RenewLeases(worker="w1", delivery_ids=("d1",), slots=(), now=1.0)
    reply(machine, renew, LeasesRenewed(lost=("d1",)), 1.0)
    effects = claim_all(machine, claim, now=1.0)
    assert of_type(effects, StartTask) == [], effects


def test_automatic_perpetual_tasks_are_seeded_again_on_an_interval() -> None:
    machine = make_machine(now=0.0, reseed_interval=60.0, heartbeat_interval=100.0)
    machine.receive(Tick(now=0.0))
    assert not [e for e in machine.effects() if isinstance(e, SeedPerpetuals)]
    assert machine.next_deadline() == 60.0
    machine.receive(Tick(now=60.0))
    assert [e for e in machine.effects() if isinstance(e, SeedPerpetuals)] == [SeedPerpetuals()]
    assert machine.next_deadline() == 100.0  # the heartbeat, then the re-seed at 120
    machine.receive(ShutdownRequested(now=61.0))
    machine.effects()
    machine.receive(Tick(now=130.0))
    assert not [e for e in machine.effects() if isinstance(e, SeedPerpetuals)]


def test_no_reseeding_unless_asked() -> None:
    machine = make_machine(now=0.0, heartbeat_interval=100.0)
    machine.receive(Tick(now=1000.0))
    assert not [e for e in machine.effects() if isinstance(e, SeedPerpetuals)]
