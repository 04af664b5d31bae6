"""A limit whose scope is shared by dockets takes single-slot steps
(docs/cluster.md, section 4; ``docket_core.sansio.scoped_slots``): the worker
machine's side, effect by effect, then the same steps through the memory
store (the reference), crashes between them included."""

from __future__ import annotations

import pytest
from machines import (
    arrival,
    deliver,
    end,
    make_machine,
    of_type,
    recorded,
    reply,
    start,
    start_limited,
    stepped,
)

from docket_core.sansio.effects import (
    ConfirmSlot,
    Enlist,
    Finish,
    Heartbeat,
    Park,
    ReleaseSlot,
    StartTask,
    TakeSlot,
    WakeParked,
)
from docket_core.sansio.flight import Count
from docket_core.sansio.inputs import (
    CancelRequested,
    Enlisted,
    Finished,
    Parked,
    ReplyLost,
    ShutdownRequested,
    SlotAcquired,
    SlotConfirmed,
    SlotReleased,
    SlotTaken,
    TaskOutcome,
    Tick,
    WokeParked,
)
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.local_slots import SlotStep
from docket_core.sansio.scoped_slots import CHAIN, Answer, Link, chain_scope
from docket_core.sansio.values import (
    ConcurrencyPolicy,
    ExecutionState,
    HeldSlot,
    TaskPolicy,
)
from docket_core.sansio.worker import WorkerMachine

SCOPED = ConcurrencyPolicy(limit_key="L", max_concurrent=1, scope="shared")
LIMITED = TaskPolicy(concurrency=SCOPED)
ONE_SCRIPT = ConcurrencyPolicy(limit_key="L", max_concurrent=1)
TIMEOUT = 5.0


def machine_of(docket: str = "A", **settings: object) -> WorkerMachine:
    machine: WorkerMachine = make_machine(docket=docket, redelivery_timeout=TIMEOUT, **settings)
    return machine


def taking(machine: WorkerMachine, delivery_id: str = "d1", now: float = 0.0) -> TakeSlot:
    (take,) = start(machine, arrival(delivery_id, policy=LIMITED), now=now)
    assert isinstance(take, TakeSlot)
    return take


def phase_of(machine: WorkerMachine, delivery_id: str) -> Phase:
    return machine.in_flight[delivery_id].phase


def running(machine: WorkerMachine, delivery_id: str = "d1") -> TakeSlot:
    take = taking(machine, delivery_id)
    (confirm,) = reply(machine, take, SlotTaken(delivery_id=delivery_id, acquired=True))
    assert isinstance(confirm, ConfirmSlot)
    (started,) = reply(machine, confirm, SlotConfirmed(delivery_id=delivery_id))
    assert started == StartTask(delivery_id=delivery_id)
    return take


# -- which path -------------------------------------------------------------------


def test_a_scope_of_its_own_takes_the_chain_and_the_rest_the_one_script_path() -> None:
    assert chain_scope(SCOPED, "A") == "shared"
    assert chain_scope(ConcurrencyPolicy(limit_key="L", max_concurrent=1), "A") is None
    # a docket's own name is its own namespace: its slots live with it
    own = ConcurrencyPolicy(limit_key="L", max_concurrent=1, scope="A")
    assert chain_scope(own, "A") is None
    assert chain_scope(None, "A") is None
    for policy in (ConcurrencyPolicy(limit_key="L", max_concurrent=1), own):
        machine = machine_of("A")
        # (one step claims it into a slot: local_slots)
        (step,) = deliver(machine, arrival("d1", policy=TaskPolicy(concurrency=policy)))
        assert isinstance(step, SlotStep) and [t.limit_key for t in step.takes] == ["L"]


# -- acquiring ----------------------------------------------------------------------


def test_take_then_confirm_then_run() -> None:
    machine = machine_of("A")
    take = taking(machine)
    assert take == TakeSlot(
        scope="shared",
        limit_key="L",
        holder="A/w1/d1",
        max_concurrent=1,
        now=0.0,
        stale_after=TIMEOUT,
        delivery_id="d1",
        docket="A",
    )
    assert take.request is not None
    assert machine.in_flight["d1"].phase is Phase.TAKING
    (confirm,) = reply(machine, take, SlotTaken(delivery_id="d1", acquired=True))
    assert confirm == ConfirmSlot(
        worker="w1",
        delivery_id="d1",
        key="key-d1",
        generation=1,
        limit_key="L",
        scope="shared",
        now=0.0,
    )
    flight = machine.in_flight["d1"]
    assert flight.phase is Phase.CONFIRMING and flight.slot == "L"
    # a slot taken is renewed while its confirmation is out
    machine.receive(Tick(now=TIMEOUT / 4))
    (renew,) = [e for e in machine.effects() if not isinstance(e, Heartbeat)]
    assert getattr(renew, "slots", None) == (
        HeldSlot(limit_key="L", holder="A/w1/d1", scope="shared"),
    )
    assert reply(machine, confirm, SlotConfirmed(delivery_id="d1")) == [StartTask(delivery_id="d1")]
    assert phase_of(machine, "d1") is Phase.RUNNING


def test_a_confirmation_that_finds_the_delivery_lost_releases_the_slot() -> None:
    machine = machine_of("A")
    take = taking(machine)
    (confirm,) = reply(machine, take, SlotTaken(delivery_id="d1", acquired=True))
    effects = reply(machine, confirm, SlotConfirmed(delivery_id="d1", lost=True))
    assert of_type(effects, StartTask) == []
    (release,) = of_type(effects, ReleaseSlot)
    assert (release.holder, release.scope, release.pass_on) == ("A/w1/d1", "shared", False)
    assert "d1" not in machine.in_flight
    assert machine.counters[Count.LEASE_LOST] == 1 and machine.counters[Count.ABANDONED] == 1


def test_a_full_limit_parks_the_key_to_retry_after_the_stale_time() -> None:
    machine = machine_of("A")
    take = taking(machine, now=3.0)
    (park,) = reply(machine, take, SlotTaken(delivery_id="d1", acquired=False), now=3.0)
    assert isinstance(park, Park)
    assert (park.scope, park.limit_key, park.retry_at) == ("shared", "L", 3.0 + TIMEOUT)
    assert park.request is not None
    assert machine.in_flight["d1"].phase is Phase.PARKING
    # parked: the delivery is settled; the slot is taken once more for it
    (recheck,) = reply(machine, park, Parked(delivery_id="d1", parked=True), now=3.0)
    assert isinstance(recheck, TakeSlot) and recheck.holder == take.holder
    assert recheck.request != take.request or recheck.request is not take.request
    assert "d1" not in machine.in_flight and machine.counters[Count.PARKED] == 1
    # still full: the docket is registered again, nothing follows
    assert reply(machine, recheck, SlotTaken(delivery_id="d1", acquired=False)) == []
    assert machine.chains.open == 0


def test_a_recheck_that_finds_room_enlists_and_hands_the_slot_on() -> None:
    """A release between the take and the park found nobody parked: the
    recheck takes that free slot and gives it back, waking the oldest docket."""
    machine = machine_of("A")
    take = taking(machine)
    (park,) = reply(machine, take, SlotTaken(delivery_id="d1", acquired=False))
    (recheck,) = reply(machine, park, Parked(delivery_id="d1", parked=True), now=1.0)
    enlist, release = reply(machine, recheck, SlotTaken(delivery_id="d1", acquired=True), now=1.5)
    assert enlist == Enlist(scope="shared", limit_key="L", docket="A", since=1.0, now=1.5)
    assert isinstance(release, ReleaseSlot)
    assert (release.holder, release.scope, release.pass_on) == (take.holder, "shared", False)
    (wake,) = reply(machine, release, SlotReleased(limit_key="L", woken=0, wake="A"), now=1.5)
    assert wake == WakeParked(docket="A", scope="shared", limit_key="L", now=1.5)
    assert reply(machine, enlist, Enlisted(docket="A", limit_key="L")) == []
    done = WokeParked(docket="A", limit_key="L", woken=1)
    assert reply(machine, wake, done) == []
    assert machine.chains.open == 0


def test_a_park_that_only_settled_the_delivery_rechecks_nothing() -> None:
    machine = machine_of("A")
    take = taking(machine)
    (park,) = reply(machine, take, SlotTaken(delivery_id="d1", acquired=False))
    assert reply(machine, park, Parked(delivery_id="d1", parked=False)) == []
    assert machine.chains.open == 0


def test_a_lost_park_counts_a_lost_lease() -> None:
    machine = machine_of("A")
    take = taking(machine)
    (park,) = reply(machine, take, SlotTaken(delivery_id="d1", acquired=False))
    assert reply(machine, park, Parked(delivery_id="d1", parked=False, lost=True)) == []
    assert machine.counters[Count.LEASE_LOST] == 1 and machine.counters[Count.PARKED] == 0


def test_a_resent_take_whose_slot_was_taken_over_is_a_lost_lease() -> None:
    machine = machine_of("A")
    take = taking(machine)
    outcome = SlotTaken(delivery_id="d1", acquired=False, lost=True)
    assert reply(machine, take, outcome) == []  # no park: another worker holds it
    assert "d1" not in machine.in_flight and machine.counters[Count.LEASE_LOST] == 1


@pytest.mark.parametrize("acquired", [True, False])
def test_a_cancel_while_taking_never_runs(acquired: bool) -> None:
    machine = machine_of("A")
    take = taking(machine)
    machine.receive(CancelRequested(key="key-d1", now=0.5))
    assert machine.effects() == []
    assert machine.in_flight["d1"].phase is Phase.TAKING_CANCELLED
    effects = reply(machine, take, SlotTaken(delivery_id="d1", acquired=acquired), now=1.0)
    assert of_type(effects, StartTask) == [] and of_type(effects, ConfirmSlot) == []
    if acquired:  # it ends cancelled, then gives the slot back
        finish, release = effects
        assert isinstance(finish, Finish) and finish.state is ExecutionState.CANCELLED
        assert isinstance(release, ReleaseSlot) and release.holder == take.holder
    else:  # the park settles it (a cancelled key concludes there)
        (park,) = effects
        assert isinstance(park, Park)


@pytest.mark.parametrize("acquired", [True, False])
def test_a_lease_lost_while_taking_never_runs(acquired: bool) -> None:
    machine = machine_of("A")
    take = taking(machine)
    machine._lease_lost("d1", 0.0)
    assert machine.in_flight["d1"].phase is Phase.TAKING_LOST
    effects = reply(machine, take, SlotTaken(delivery_id="d1", acquired=acquired))
    if acquired:  # abandoned at once, its slot given back
        (release,) = effects
        assert isinstance(release, ReleaseSlot) and release.holder == take.holder
    else:
        assert effects == []
    assert "d1" not in machine.in_flight


def test_a_cancel_while_confirming_ends_cancelled_and_releases() -> None:
    machine = machine_of("A")
    take = taking(machine)
    (confirm,) = reply(machine, take, SlotTaken(delivery_id="d1", acquired=True))
    machine.receive(CancelRequested(key="key-d1", now=0.5))
    assert machine.in_flight["d1"].phase is Phase.CONFIRMING_CANCELLED
    finish, release = reply(machine, confirm, SlotConfirmed(delivery_id="d1"))
    assert isinstance(finish, Finish) and finish.state is ExecutionState.CANCELLED
    assert isinstance(release, ReleaseSlot)


# -- releasing ----------------------------------------------------------------------


def test_the_release_chain_wakes_the_waiting_docket_and_enlists_the_rest() -> None:
    machine = machine_of("A")
    running(machine)
    finish, release = end(machine, "d1", TaskOutcome.SUCCEEDED, now=2.0)
    # the record first: a woken waiter sees the run concluded
    assert isinstance(finish, Finish) and isinstance(release, ReleaseSlot)
    assert (release.scope, release.holder, release.pass_on) == ("shared", "A/w1/d1", False)
    machine.store_replied(
        [finish, release],
        [recorded_outcome(finish), SlotReleased(limit_key="L", woken=0, wake="B")],
        2.0,
    )
    (wake,) = machine.effects()
    assert wake == WakeParked(docket="B", scope="shared", limit_key="L", now=2.0)
    assert wake.request is not None
    woke = WokeParked(docket="B", limit_key="L", woken=1, remaining=2, oldest=1.25)
    (enlist,) = reply(machine, wake, woke, now=2.1)
    assert enlist == Enlist(scope="shared", limit_key="L", docket="B", since=1.25, now=2.1)
    assert reply(machine, enlist, Enlisted(docket="B", limit_key="L")) == []
    assert machine.chains.open == 0


def test_a_wake_up_that_finds_nobody_is_passed_on() -> None:
    machine = machine_of("A")
    running(machine)
    finish, release = end(machine, "d1", TaskOutcome.SUCCEEDED, now=2.0)
    recorded(machine, finish)
    (wake,) = reply(machine, release, SlotReleased(limit_key="L", woken=0, wake="B"))
    (passed,) = reply(machine, wake, WokeParked(docket="B", limit_key="L", woken=0), now=2.5)
    assert isinstance(passed, ReleaseSlot)
    assert (passed.pass_on, passed.scope, passed.limit_key) == (True, "shared", "L")
    (again,) = reply(machine, passed, SlotReleased(limit_key="L", woken=0, wake="C"))
    assert isinstance(again, WakeParked) and again.docket == "C"
    assert reply(machine, again, WokeParked(docket="C", limit_key="L", woken=1)) == []
    assert machine.chains.open == 0


def test_a_one_script_release_that_woke_none_of_its_own_hands_on_to_a_docket() -> None:
    """A docket's own limit is shared with dockets naming it as their scope:
    its release wakes their waiters too, in the docket's own namespace."""
    machine = machine_of("A")
    start_limited(machine, arrival("d1", policy=TaskPolicy(concurrency=ONE_SCRIPT)))
    (step,) = end(machine, "d1", TaskOutcome.SUCCEEDED, now=2.0)
    assert isinstance(step, SlotStep) and step.release is not None
    assert step.release.scope is None and step.finish is not None
    (wake,) = reply(machine, step, stepped(step, wake="B"))
    assert wake == WakeParked(docket="B", scope="A", limit_key="L", now=0.0)


def test_goodbye_waits_for_the_chain_and_a_given_up_link_ends_it() -> None:
    machine = machine_of("A", retry_delay=0.5)
    running(machine)
    finish, release = end(machine, "d1", TaskOutcome.SUCCEEDED, now=2.0)
    recorded(machine, finish)
    (wake,) = reply(machine, release, SlotReleased(limit_key="L", woken=0, wake="B"))
    machine.receive(ShutdownRequested(now=2.0))
    assert of_type(machine.effects(), Heartbeat) == []  # a link is out
    machine.receive(ReplyLost(effects=(wake,), now=2.0, reason="gone"))
    machine.receive(Tick(now=3.0))  # stopping: one more try, then given up
    (resent,) = of_type(machine.effects(), WakeParked)
    machine.receive(ReplyLost(effects=(resent,), now=3.0, reason="gone"))
    (goodbye,) = of_type(machine.effects(), Heartbeat)
    assert goodbye.leaving and machine.chains.open == 0


def test_every_answer_of_every_link_has_a_row() -> None:
    rows = {
        Link.RECHECKING: {Answer.FULL, Answer.ROOM},
        Link.RELEASING: {Answer.HANDED_ON, Answer.SETTLED},
        Link.WAKING: {Answer.WOKE, Answer.WOKE_SOME, Answer.WOKE_NONE},
        Link.ENLISTING: {Answer.ENLISTED},
    }
    assert set(CHAIN) == {(link, answer) for link, answers in rows.items() for answer in answers}


def recorded_outcome(finish: Finish) -> Finished:
    return Finished(delivery_id=finish.delivery_id, recorded=True)


def _acquired(delivery_id: str) -> SlotAcquired:
    return SlotAcquired(delivery_id=delivery_id, acquired=True)
