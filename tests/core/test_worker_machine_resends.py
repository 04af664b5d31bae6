"""The worker machine decides what follows a lost reply or a refusal: when
to send a batch again, with which ``now``, and when to give up or stop."""

from __future__ import annotations

from machines import LIMIT, arrival, deliver, end, make_machine, of_type, stepped

from docket_core.sansio.effects import (
    CancelTask,
    Claim,
    Finish,
    RenewLeases,
    StartTask,
    StopReason,
    StoreEffect,
)
from docket_core.sansio.inputs import (
    Claimed,
    ClaimVerdict,
    LeasesRenewed,
    ReplyLost,
    StoreFailed,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.local_slots import TAKE_LOST, SlotStep
from docket_core.sansio.values import TaskPolicy


def store_effects(effects: list[object]) -> list[StoreEffect]:
    return [e for e in effects if isinstance(e, StoreEffect)]


def test_a_lost_batch_is_sent_again_after_the_retry_delay_at_the_new_now() -> None:
    machine = make_machine(retry_delay=2.0, origin="w1#a")
    (claim,) = deliver(machine, arrival("d1"), now=1.0)
    assert isinstance(claim, Claim) and claim.request is not None
    assert claim.request.origin == "w1#a" and claim.request.seq == 1
    machine.receive(ReplyLost(effects=(claim,), now=1.5, reason="connection lost"))
    assert machine.effects() == []
    deadline = machine.next_deadline()
    assert deadline is not None and deadline <= 3.5
    machine.receive(Tick(now=3.4))
    assert of_type(machine.effects(), Claim) == []
    machine.receive(Tick(now=3.5))
    (again,) = of_type(machine.effects(), Claim)
    assert again.request == claim.request  # the same request: answered as the first
    assert again.now == 3.5  # the time of the attempt that runs
    assert machine.counters["store_errors"] == 1


def test_store_effects_are_held_back_until_the_resend() -> None:
    machine = make_machine(retry_delay=2.0)
    (claim,) = deliver(machine, arrival("d1"), now=0.0)
    machine.receive(ReplyLost(effects=(claim,), now=0.0, reason="gone"))
    assert deliver(machine, arrival("d2"), now=1.0) == []
    machine.receive(Tick(now=2.0))
    resent = of_type(machine.effects(), Claim)
    assert [e.items[0].delivery_id for e in resent] == ["d1", "d2"]
    assert all(e.now == 2.0 for e in resent)


def test_the_floor_rises_once_replies_arrive() -> None:
    machine = make_machine()
    (first,) = deliver(machine, arrival("d1"), now=0.0)
    assert isinstance(first, Claim) and first.request is not None
    assert first.request.floor == 1
    machine.store_replied([first], [Claimed(verdicts=(("d1", ClaimVerdict.SUPERSEDED),))], 0.0)
    (second,) = deliver(machine, arrival("d2"), now=0.0)
    assert isinstance(second, Claim) and second.request is not None
    assert (second.request.seq, second.request.floor) == (2, 2)


def test_three_refusals_in_a_row_are_fatal() -> None:
    machine = make_machine(retry_delay=1.0, refusals_allowed=3)
    (claim,) = deliver(machine, arrival("d1"), now=0.0)
    for attempt in range(3):
        assert machine.fatal is None
        machine.receive(StoreFailed(effects=(claim,), now=float(attempt), reason="ERR nope"))
        machine.receive(Tick(now=float(attempt) + 1))
        machine.effects()
    assert machine.fatal is not None and "ERR nope" in machine.fatal


def test_a_batch_unanswered_past_the_window_is_given_up() -> None:
    """Past one redelivery timeout the leases have lapsed: the deliveries are
    left to the store, which hands them out again."""
    machine = make_machine(retry_delay=1.0, redelivery_timeout=4.0)
    (claim,) = deliver(machine, arrival("d1"), now=0.0)
    now = 0.0
    while machine.in_flight:
        machine.receive(ReplyLost(effects=(claim,), now=now, reason="gone"))
        now += 1.0
        machine.receive(Tick(now=now))
        resent = of_type(machine.effects(), Claim)
        if resent:
            (claim,) = resent
    assert now == 5.0
    assert machine.counters["given_up"] == 1
    assert machine.fatal is None


def test_a_resent_take_reported_lost_never_starts() -> None:
    machine = make_machine()
    (step,) = deliver(machine, arrival("d1", policy=TaskPolicy(concurrency=LIMIT)), now=0.0)
    assert isinstance(step, SlotStep)
    machine.store_replied([step], [stepped(step, TAKE_LOST)], 1.0)
    assert of_type(machine.effects(), StartTask) == []
    assert "d1" not in machine.in_flight  # left to the store: no acknowledgement


def test_a_worker_that_cannot_renew_stops_its_runs_before_others_take_them() -> None:
    """Renewals go unanswered: three quarters into the redelivery timeout the
    machine stops the runs itself (another worker may take them over at the
    full timeout)."""
    machine = make_machine(redelivery_timeout=4.0, retry_delay=10.0)
    (claim,) = deliver(machine, arrival("d1"), now=0.0)
    machine.store_replied([claim], [Claimed(verdicts=(("d1", ClaimVerdict.CLAIMED),))], 0.0)
    assert of_type(machine.effects(), StartTask)
    machine.receive(Tick(now=1.0))
    (renew,) = of_type(machine.effects(), RenewLeases)
    machine.receive(ReplyLost(effects=(renew,), now=1.0, reason="gone"))
    machine.receive(Tick(now=2.9))
    assert machine.effects() == []
    machine.receive(Tick(now=3.0))
    assert machine.effects() == [CancelTask(delivery_id="d1", reason=StopReason.LEASE_LOST)]
    assert machine.in_flight["d1"].phase is Phase.ABANDONING
    assert machine.counters["fenced"] == 1
    # the abandoned run ends without a word to the store
    assert store_effects(end(machine, "d1", TaskOutcome.CANCELLED, 3.1)) == []


def test_a_confirmed_renewal_keeps_runs_going() -> None:
    machine = make_machine(redelivery_timeout=4.0)
    (claim,) = deliver(machine, arrival("d1"), now=0.0)
    machine.store_replied([claim], [Claimed(verdicts=(("d1", ClaimVerdict.CLAIMED),))], 0.0)
    machine.effects()
    for now in (1.0, 2.0, 3.0, 4.0, 5.0):
        machine.receive(Tick(now=now))
        for renew in of_type(machine.effects(), RenewLeases):
            machine.store_replied([renew], [LeasesRenewed()], now)
    assert machine.in_flight["d1"].phase is Phase.RUNNING
    assert machine.counters["fenced"] == 0


def test_a_finish_of_a_given_up_run_is_not_sent() -> None:
    machine = make_machine(retry_delay=1.0, redelivery_timeout=2.0)
    (claim,) = deliver(machine, arrival("d1"), now=0.0)
    machine.store_replied([claim], [Claimed(verdicts=(("d1", ClaimVerdict.CLAIMED),))], 0.0)
    machine.effects()
    (finish,) = of_type(end(machine, "d1", TaskOutcome.SUCCEEDED, 0.5), Finish)
    machine.receive(ReplyLost(effects=(finish,), now=0.5, reason="gone"))
    machine.receive(Tick(now=1.5))
    (finish,) = of_type(machine.effects(), Finish)
    machine.receive(ReplyLost(effects=(finish,), now=2.5, reason="gone"))
    assert "d1" not in machine.in_flight
    assert machine.next_deadline() is not None
