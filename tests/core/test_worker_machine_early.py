"""A fresh delivery of a task without admission controls, limit or timeout
starts with its claim (``lifecycle``: ``START_EARLY``): the verdict confirms
the run or voids it, and an end that came first waits for the verdict."""

from __future__ import annotations

import pytest
from machines import LIMIT, arrival, end, make_machine, of_type, recorded, reply

from docket_core.sansio.admission import CooldownPolicy
from docket_core.sansio.effects import (
    CancelTask,
    Claim,
    Effect,
    Finish,
    Heartbeat,
    Read,
    RenewLeases,
    Schedule,
    StartTask,
    StopReason,
)
from docket_core.sansio.inputs import (
    Arrival,
    CancelRequested,
    Claimed,
    ClaimVerdict,
    LeasesRenewed,
    ReadDone,
    ReplyLost,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.local_slots import SlotStep
from docket_core.sansio.values import ExecutionState, PerpetualPolicy, RetryPolicy, TaskPolicy
from docket_core.sansio.worker import WorkerMachine

RETRY = TaskPolicy(retry=RetryPolicy(attempts=3, delay=1.0))


def reading_machine(**settings: object) -> WorkerMachine:
    """A machine that asked for a read at 0.0 (its deliveries come at 0.1)."""
    settings.setdefault("reads", True)
    settings.setdefault("redelivery_timeout", 40.0)
    machine = make_machine(**settings)
    machine.receive(Tick(now=0.0))
    assert of_type(machine.effects(), Read)
    return machine


def read_done(machine: WorkerMachine, *arrivals: Arrival, now: float = 0.1) -> list[Effect]:
    machine.receive(ReadDone(arrivals=arrivals, next_due=None, now=now))
    return [e for e in machine.effects() if not isinstance(e, Read)]


def started_early(machine: WorkerMachine, a: Arrival) -> Claim:
    """Deliver ``a``: its claim and its start go out together; the claim."""
    claim, start = read_done(machine, a)
    assert isinstance(claim, Claim) and isinstance(start, StartTask)
    assert start.delivery_id == a.delivery.delivery_id
    assert machine.in_flight[start.delivery_id].phase is Phase.EARLY_RUNNING
    return claim


def verdict(
    machine: WorkerMachine, claim: Claim, v: ClaimVerdict, now: float = 0.2
) -> list[Effect]:
    """The claim's verdict; the effects that follow (but the next read)."""
    verdicts = tuple((item.delivery_id, v) for item in claim.items)
    return [
        e for e in reply(machine, claim, Claimed(verdicts=verdicts), now) if not isinstance(e, Read)
    ]


def ended(
    machine: WorkerMachine, delivery_id: str, outcome: TaskOutcome, now: float, **fields: object
) -> list[Effect]:
    return [e for e in end(machine, delivery_id, outcome, now, **fields) if not isinstance(e, Read)]


def test_a_fresh_delivery_starts_with_its_claim() -> None:
    machine = reading_machine()
    claim = started_early(machine, arrival("d1"))
    assert [item.delivery_id for item in claim.items] == ["d1"]
    assert claim.now == 0.1
    assert machine.counters["started"] == 1
    assert machine.in_flight["d1"].started_at == 0.1
    assert verdict(machine, claim, ClaimVerdict.CLAIMED) == []
    assert machine.in_flight["d1"].phase is Phase.RUNNING
    (finish,) = ended(machine, "d1", TaskOutcome.SUCCEEDED, now=0.3)
    assert isinstance(finish, Finish) and finish.state is ExecutionState.COMPLETED
    assert of_type(recorded(machine, finish), Finish) == []
    assert "d1" not in machine.in_flight
    assert machine.counters["started"] == 1 and machine.counters["succeeded"] == 1


@pytest.mark.parametrize(
    "a",
    [
        arrival("d1", redelivered=True),
        arrival("d1", policy=TaskPolicy(concurrency=LIMIT)),
        arrival("d1", policy=TaskPolicy(timeout=5.0)),
        arrival("d1", policy=TaskPolicy(admission=(CooldownPolicy(key="c", window=1.0),))),
    ],
    ids=["redelivered", "limited", "timeout", "admission"],
)
def test_other_deliveries_start_only_once_claimed(a: Arrival) -> None:
    machine = reading_machine()
    (claim,) = read_done(machine, a)
    # (a limit of the docket's own: the step that claims it into a slot)
    assert isinstance(claim, Claim | SlotStep)
    assert machine.in_flight["d1"].phase is Phase.CLAIMING
    assert machine.counters["started"] == 0


def test_a_read_older_than_the_fence_starts_nothing_before_its_claim() -> None:
    """Deliveries that took longer than ``fence_after`` to arrive may have
    been taken over by another worker: claimed first."""
    machine = reading_machine(redelivery_timeout=4.0)  # fence_after 3.0
    (claim,) = read_done(machine, arrival("d1"), now=3.5)
    assert isinstance(claim, Claim)
    assert machine.in_flight["d1"].phase is Phase.CLAIMING


def test_no_early_start_where_the_store_may_send_the_claim_late() -> None:
    """``start_early`` off (a store whose calls go out a loop turn later: a
    cluster pipeline): a fresh delivery waits for its verdict to start."""
    machine = reading_machine(start_early=False)
    (claim,) = read_done(machine, arrival("d1"))
    assert isinstance(claim, Claim)
    assert machine.in_flight["d1"].phase is Phase.CLAIMING
    (start,) = verdict(machine, claim, ClaimVerdict.CLAIMED)
    assert isinstance(start, StartTask) and start.delivery_id == "d1"


def test_no_early_start_while_a_failed_batch_waits_for_its_resend() -> None:
    """The claim would be held back with the batch: the run would have no
    claim on its way."""
    machine = make_machine(reads=True, retry_delay=1.0)
    machine.receive(Tick(now=0.0))
    (heartbeat,) = of_type(machine.effects(), Heartbeat)
    machine.receive(ReplyLost(effects=(heartbeat,), now=0.05, reason="gone"))
    assert read_done(machine, arrival("d1")) == []  # (the claim is held back)
    assert machine.in_flight["d1"].phase is Phase.CLAIMING


def test_an_end_before_the_verdict_is_recorded_once_claimed() -> None:
    machine = reading_machine()
    claim = started_early(machine, arrival("d1", policy=RETRY))
    assert ended(machine, "d1", TaskOutcome.FAILED, now=0.15, error="E: x") == []
    assert machine.in_flight["d1"].phase is Phase.EARLY_ENDED
    assert machine.rescheduled  # (the end line's arrow, known before the verdict)
    (retry,) = verdict(machine, claim, ClaimVerdict.CLAIMED)
    assert isinstance(retry, Schedule)
    assert retry.acknowledge == "d1" and retry.message.attempt == 2
    assert retry.now == 0.15 and retry.message.when == 1.15  # (as of the end)
    assert machine.in_flight["d1"].phase is Phase.FINISHING
    assert machine.counters["retried"] == 1


@pytest.mark.parametrize("v", [ClaimVerdict.CANCELLED, ClaimVerdict.SUPERSEDED, ClaimVerdict.LOST])
def test_an_end_before_a_lost_verdict_is_never_recorded(v: ClaimVerdict) -> None:
    machine = reading_machine()
    claim = started_early(machine, arrival("d1"))
    assert ended(machine, "d1", TaskOutcome.SUCCEEDED, now=0.15) == []
    effects = verdict(machine, claim, v)
    assert not of_type(effects, Finish) and not of_type(effects, Schedule)
    assert "d1" not in machine.in_flight
    assert machine.counters[v.value] == 1 and machine.counters["succeeded"] == 0


@pytest.mark.parametrize(
    ("v", "reason"),
    [
        (ClaimVerdict.CANCELLED, StopReason.CANCELLED),
        (ClaimVerdict.SUPERSEDED, StopReason.CANCELLED),
        (ClaimVerdict.LOST, StopReason.LEASE_LOST),
    ],
)
def test_a_lost_verdict_stops_the_run_unrecorded(v: ClaimVerdict, reason: StopReason) -> None:
    machine = reading_machine()
    claim = started_early(machine, arrival("d1"))
    (stop,) = verdict(machine, claim, v)
    assert stop == CancelTask(delivery_id="d1", reason=reason)
    assert machine.in_flight["d1"].phase is Phase.ABANDONING
    assert ended(machine, "d1", TaskOutcome.CANCELLED, now=0.3) == []
    assert "d1" not in machine.in_flight
    assert machine.counters["abandoned"] == 1


def test_a_cancel_before_the_verdict_stops_the_run_and_nothing_follows() -> None:
    machine = reading_machine()
    claim = started_early(machine, arrival("d1", "k", policy=RETRY))
    machine.receive(CancelRequested(key="k", now=0.12))
    (stop,) = machine.effects()
    assert stop == CancelTask(delivery_id="d1", reason=StopReason.CANCELLED)
    assert machine.in_flight["d1"].phase is Phase.EARLY_CANCELLING
    # claimed: the cancel came after the claim, and the run ends as a run
    # cancelled while it ran (it raised anyway: no retry)
    assert verdict(machine, claim, ClaimVerdict.CLAIMED) == []
    assert machine.in_flight["d1"].phase is Phase.CANCELLING
    (finish,) = ended(machine, "d1", TaskOutcome.FAILED, now=0.3, error="E: x")
    assert isinstance(finish, Finish) and finish.state is ExecutionState.FAILED


def test_a_cancelled_run_that_ended_before_the_verdict_is_not_retried() -> None:
    machine = reading_machine()
    claim = started_early(machine, arrival("d1", "k", policy=RETRY))
    machine.receive(CancelRequested(key="k", now=0.12))
    machine.effects()
    assert ended(machine, "d1", TaskOutcome.FAILED, now=0.13, error="E: x") == []
    assert machine.in_flight["d1"].phase is Phase.EARLY_CANCELLED
    assert not machine.rescheduled
    (finish,) = verdict(machine, claim, ClaimVerdict.CLAIMED)
    assert isinstance(finish, Finish) and finish.state is ExecutionState.FAILED


def test_a_cancel_then_a_cancelled_verdict_records_nothing() -> None:
    machine = reading_machine()
    claim = started_early(machine, arrival("d1", "k"))
    machine.receive(CancelRequested(key="k", now=0.12))
    machine.effects()
    assert verdict(machine, claim, ClaimVerdict.CANCELLED) == []  # (already stopping)
    assert machine.in_flight["d1"].phase is Phase.ABANDONING
    assert ended(machine, "d1", TaskOutcome.CANCELLED, now=0.3) == []
    assert not machine.in_flight


def test_a_claim_never_answered_stops_the_run() -> None:
    machine = reading_machine(retry_delay=1.0, redelivery_timeout=4.0)
    claim = started_early(machine, arrival("d1"))
    machine.receive(ReplyLost(effects=(claim,), now=0.2, reason="gone"))
    assert machine.effects() == []
    # its lease cannot be renewed either: the fence stops the run first
    now = 0.2
    stops: list[CancelTask] = []
    while not stops and now < 10.0:
        now += 0.5
        machine.receive(Tick(now=now))
        effects = machine.effects()
        stops = of_type(effects, CancelTask)
        for effect in effects:
            if isinstance(effect, Claim | RenewLeases):
                machine.receive(ReplyLost(effects=(effect,), now=now, reason="gone"))
    assert stops == [CancelTask(delivery_id="d1", reason=StopReason.LEASE_LOST)]
    assert now <= 3.2  # fence_after (3.0) after the read
    assert machine.in_flight["d1"].phase is Phase.ABANDONING
    ended(machine, "d1", TaskOutcome.CANCELLED, now=now)
    assert not machine.in_flight


def test_a_claim_given_up_voids_an_end_that_waited_for_it() -> None:
    machine = reading_machine(retry_delay=1.0, redelivery_timeout=4.0)
    claim = started_early(machine, arrival("d1"))
    assert ended(machine, "d1", TaskOutcome.SUCCEEDED, now=0.15) == []
    machine.receive(ReplyLost(effects=(claim,), now=0.2, reason="gone"))
    machine.effects()
    machine.receive(ReplyLost(effects=(claim,), now=5.0, reason="gone"))  # past the window
    assert not of_type(machine.effects(), Finish)
    assert not machine.in_flight
    assert machine.counters["given_up"] == 1


def test_a_lease_lost_before_the_verdict_stops_the_run() -> None:
    machine = reading_machine()
    claim = started_early(machine, arrival("d1"))
    renewal = RenewLeases(worker="w1", delivery_ids=("d1",), slots=(), now=0.15)
    (stop,) = reply(machine, renewal, LeasesRenewed(lost=("d1",)), 0.15)
    assert stop == CancelTask(delivery_id="d1", reason=StopReason.LEASE_LOST)
    assert verdict(machine, claim, ClaimVerdict.CLAIMED) == []  # (stays abandoning)
    assert machine.in_flight["d1"].phase is Phase.ABANDONING
    assert ended(machine, "d1", TaskOutcome.CANCELLED, now=0.3) == []
    assert not machine.in_flight


def test_a_claim_given_up_after_a_stall_stops_the_run() -> None:
    """A worker that stalled past the resend window gives its claim up (before
    any fence): the run the store never confirmed is stopped."""
    machine = reading_machine(retry_delay=1.0, redelivery_timeout=4.0)
    claim = started_early(machine, arrival("d1"))
    machine.receive(ReplyLost(effects=(claim,), now=0.2, reason="gone"))
    machine.effects()
    machine.receive(Tick(now=60.0))
    stops = of_type(machine.effects(), CancelTask)
    assert stops == [CancelTask(delivery_id="d1", reason=StopReason.LEASE_LOST)]
    assert machine.in_flight["d1"].phase is Phase.ABANDONING
    assert machine.counters["given_up"] == 1 and machine.counters["fenced"] == 0


@pytest.mark.parametrize("reported", [None, 0.5])
def test_a_perpetual_run_counts_its_next_start_from_when_its_function_started(
    reported: float | None,
) -> None:
    """Start to start: from the start the runtime reports with the end (the
    function may begin later than the machine handed it over), else from
    the hand-over."""
    machine = reading_machine()
    policy = TaskPolicy(perpetual=PerpetualPolicy(every=1.0))
    claim = started_early(machine, arrival("d1", policy=policy))  # (handed over at 0.1)
    verdict(machine, claim, ClaimVerdict.CLAIMED)
    (again,) = of_type(
        end(machine, "d1", TaskOutcome.SUCCEEDED, now=1.2, started_at=reported), Schedule
    )
    assert again.message.when == (1.5 if reported is not None else 1.2)


def test_a_claim_of_runs_that_start_with_it_leads_its_batch() -> None:
    """What waits to be sent (another run's end) goes after it: a store that
    sends a batch's first round at once has the claim out before the runs."""
    machine = reading_machine()
    claim = started_early(machine, arrival("d1"))
    verdict(machine, claim, ClaimVerdict.CLAIMED)
    machine.receive(TaskEnded(delivery_id="d1", now=0.3, outcome=TaskOutcome.SUCCEEDED))
    machine.receive(Tick(now=0.3))
    machine.receive(ReadDone(arrivals=(arrival("d2"),), next_due=None, now=0.35))
    effects = [e for e in machine.effects() if not isinstance(e, Read)]
    assert [type(e) for e in effects] == [Claim, Finish, StartTask]
    (claim2, finish, start) = effects
    assert isinstance(claim2, Claim) and [i.delivery_id for i in claim2.items] == ["d2"]
    assert isinstance(finish, Finish) and finish.delivery_id == "d1"
    assert isinstance(start, StartTask) and start.delivery_id == "d2"
