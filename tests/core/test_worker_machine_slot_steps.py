"""The worker machine on limits of the docket's own namespace: one
``SlotStep`` claims a delivery into a slot, one records a run's end and
releases (or hands on) its slot, and a delivery waits in the worker for a slot
its own runs hold (``docket_core.sansio.local_slots``)."""

from __future__ import annotations

from machines import (
    LIMIT,
    arrival,
    claim_all,
    deliver,
    end,
    make_machine,
    message,
    of_type,
    reply,
    start_limited,
    stepped,
)

from docket_core.sansio.effects import (
    AcquireSlot,
    Claim,
    Finish,
    ReleaseSlot,
    RenewLeases,
    Schedule,
    StartTask,
    WakeParked,
)
from docket_core.sansio.inputs import (
    CancelRequested,
    LeasesRenewed,
    ReplyLost,
    ShutdownRequested,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.local_slots import (
    DEPTH,
    HOLD_FOR,
    TAKE_ACQUIRED,
    TAKE_CANCELLED,
    TAKE_LOST,
    TAKE_PARKED,
    TAKE_SUPERSEDED,
    SlotStep,
    SlotTake,
    local_limit,
)
from docket_core.sansio.values import (
    ConcurrencyPolicy,
    ExecutionState,
    HeldSlot,
    RetryPolicy,
    TaskPolicy,
)
from docket_core.sansio.worker import WorkerMachine

LIMITED = TaskPolicy(concurrency=LIMIT)
ONE = ConcurrencyPolicy(limit_key="limit:one", max_concurrent=1)
SERIAL = TaskPolicy(concurrency=ONE)


def test_a_limited_task_is_claimed_into_a_slot_by_one_step() -> None:
    machine = make_machine(name="w7", redelivery_timeout=60.0)
    (step,) = deliver(machine, arrival("d1", policy=LIMITED), now=2.0)
    assert isinstance(step, SlotStep)
    assert step.takes == (SlotTake("d1", message("key-d1"), LIMIT.limit_key, 2, "w7/d1"),)
    assert (step.stale_after, step.now) == (60.0, 2.0)
    assert step.finish is None and step.release is None
    assert step.request is not None
    assert machine.in_flight["d1"].phase is Phase.CLAIMING
    assert machine.holder("d1") == step.takes[0].holder
    # no Claim, no AcquireSlot: the step is both
    assert of_type([step], Claim) == [] and of_type([step], AcquireSlot) == []


def test_the_deliveries_of_one_read_share_one_step() -> None:
    machine = make_machine()
    (step, claim) = deliver(
        machine,
        arrival("d1", policy=LIMITED),
        arrival("d2", policy=TaskPolicy(concurrency=ONE)),
        arrival("d3"),
    )
    assert isinstance(step, SlotStep) and isinstance(claim, Claim)
    assert [t.delivery_id for t in step.takes] == ["d1", "d2"]
    assert [item.delivery_id for item in claim.items] == ["d3"]


def test_which_limits_take_steps() -> None:
    assert local_limit(LIMITED, "A") == LIMIT
    own = ConcurrencyPolicy(limit_key="L", max_concurrent=1, scope="A")
    assert local_limit(TaskPolicy(concurrency=own), "A") == own
    other = ConcurrencyPolicy(limit_key="L", max_concurrent=1, scope="B")
    assert local_limit(TaskPolicy(concurrency=other), "A") is None
    assert local_limit(TaskPolicy(), "A") is None


def test_a_parked_delivery_is_dropped_and_releases_nothing() -> None:
    machine = make_machine()
    (step,) = deliver(machine, arrival("d1", policy=LIMITED))
    assert reply(machine, step, stepped(step, TAKE_PARKED)) == []
    assert machine.idle
    assert machine.counters["parked"] == 1


def test_a_take_that_was_not_claimed_is_dropped_and_counted() -> None:
    machine = make_machine()
    answers = (TAKE_LOST, TAKE_SUPERSEDED, TAKE_CANCELLED)
    policies = [
        TaskPolicy(concurrency=ConcurrencyPolicy(limit_key=f"l{i}", max_concurrent=1))
        for i in range(3)
    ]
    (step,) = deliver(machine, *(arrival(f"d{i}", policy=p) for i, p in enumerate(policies)))
    assert reply(machine, step, stepped(step, *answers)) == []
    assert machine.idle
    assert [machine.counters[c] for c in ("lost", "superseded", "cancelled")] == [1, 1, 1]
    assert machine.counters["started"] == 0


def test_a_slot_starts_the_task_and_its_end_is_one_step_with_the_release() -> None:
    machine = make_machine(redelivery_timeout=40.0, heartbeat_interval=1000.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    assert start_limited(machine, arrival("d1", policy=LIMITED)) == [StartTask(delivery_id="d1")]
    assert machine.in_flight["d1"].slot == LIMIT.limit_key
    # the slot is renewed with the lease
    machine.receive(Tick(now=10.0))
    (renew,) = machine.effects()
    assert isinstance(renew, RenewLeases)
    assert renew.slots == (HeldSlot(limit_key=LIMIT.limit_key, holder="w1/d1"),)
    (step,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 12.0)
    assert isinstance(step, SlotStep) and isinstance(step.finish, Finish)
    assert step.finish.state is ExecutionState.COMPLETED
    assert step.release == ReleaseSlot(limit_key=LIMIT.limit_key, holder="w1/d1", now=12.0)
    assert step.takes == ()
    # the step goes as the finish's request (one request, one memo entry)
    assert step.request == step.finish.request
    assert machine.chains.open == 1
    assert reply(machine, step, stepped(step), 12.0) == []
    assert machine.idle
    assert machine.chains.open == 0


def test_a_release_that_names_a_waiting_docket_goes_on_with_its_chain() -> None:
    machine = make_machine(docket="A")
    start_limited(machine, arrival("d1", policy=LIMITED))
    (step,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 1.0)
    (wake,) = reply(machine, step, stepped(step, wake="B"), 1.0)
    assert isinstance(wake, WakeParked)
    assert (wake.docket, wake.limit_key) == ("B", LIMIT.limit_key)


def test_a_slot_is_released_after_the_retry_is_scheduled() -> None:
    machine = make_machine()
    policy = TaskPolicy(concurrency=LIMIT, retry=RetryPolicy(attempts=2, delay=1.0))
    start_limited(machine, arrival("d1", policy=policy))
    schedule, step = end(machine, "d1", TaskOutcome.FAILED, 1.0)
    assert isinstance(schedule, Schedule) and isinstance(step, SlotStep)
    assert step.finish is None and step.release is not None and step.takes == ()
    assert step.request is not None and step.request != schedule.request


def test_an_abandoned_slot_holder_still_releases_its_slot() -> None:
    machine = make_machine()
    start_limited(machine, arrival("d1", policy=LIMITED))
    renew = RenewLeases(worker="w1", delivery_ids=("d1",), slots=(), now=1.0)
    reply(machine, renew, LeasesRenewed(lost=("d1",)), 1.0)
    (step,) = end(machine, "d1", TaskOutcome.CANCELLED, 2.0)
    assert isinstance(step, SlotStep) and step.finish is None
    assert step.release == ReleaseSlot(limit_key=LIMIT.limit_key, holder="w1/d1", now=2.0)


def test_a_delivery_that_never_took_a_slot_never_releases() -> None:
    machine = make_machine()
    (step,) = deliver(machine, arrival("d1", policy=LIMITED), arrival("d2", policy=LIMITED))
    assert reply(machine, step, stepped(step, TAKE_PARKED, TAKE_ACQUIRED), 1.0) == [
        StartTask(delivery_id="d2")
    ]
    (end_step,) = end(machine, "d2", TaskOutcome.SUCCEEDED, 2.0)
    assert isinstance(end_step, SlotStep) and end_step.release is not None
    assert end_step.release.holder == "w1/d2"
    # a rejected (struck) limited delivery never asks for a slot, so never releases one
    effects = deliver(machine, arrival("d3", policy=LIMITED, struck=True))
    assert of_type(effects, SlotStep) == [] and of_type(effects, ReleaseSlot) == []


def test_cancel_while_claiming_then_a_slot_never_starts_and_releases_it() -> None:
    machine = make_machine()
    (step,) = deliver(machine, arrival("d1", policy=LIMITED))
    machine.receive(CancelRequested(key="key-d1", now=1.0))
    assert machine.effects() == []  # nothing runs yet, nothing to cancel
    assert machine.in_flight["d1"].phase is Phase.CLAIMING_CANCELLED
    (end_step,) = reply(machine, step, stepped(step), 2.0)
    assert isinstance(end_step, SlotStep) and isinstance(end_step.finish, Finish)
    assert end_step.finish.state is ExecutionState.CANCELLED
    assert end_step.release == ReleaseSlot(limit_key=LIMIT.limit_key, holder="w1/d1", now=2.0)
    assert machine.counters["started"] == 0
    reply(machine, end_step, stepped(end_step), 2.0)
    assert machine.idle


def test_cancel_while_claiming_then_parked_is_dropped() -> None:
    machine = make_machine()
    (step,) = deliver(machine, arrival("d1", policy=LIMITED))
    machine.receive(CancelRequested(key="key-d1", now=1.0))
    assert reply(machine, step, stepped(step, TAKE_PARKED)) == []
    assert machine.idle


def test_a_lost_lease_while_claiming_then_a_slot_ends_unrecorded_releasing_it() -> None:
    machine = make_machine()
    (step,) = deliver(machine, arrival("d1", policy=LIMITED))
    renew = RenewLeases(worker="w1", delivery_ids=("d1",), slots=(), now=1.0)
    reply(machine, renew, LeasesRenewed(lost=("d1",)), 1.0)
    (end_step,) = reply(machine, step, stepped(step), 2.0)
    assert isinstance(end_step, SlotStep) and end_step.finish is None
    assert end_step.release is not None and end_step.release.holder == "w1/d1"
    assert machine.idle and machine.counters["abandoned"] == 1


# -- waiting in the worker ------------------------------------------------------------


def _three_serial(machine: WorkerMachine, now: float = 0.0) -> SlotStep:
    """d1, d2 and d3 of one one-slot limit, read at once: d1's step goes out."""
    (step,) = deliver(machine, *(arrival(f"d{i}", policy=SERIAL) for i in (1, 2, 3)), now=now)
    assert isinstance(step, SlotStep)
    return step


def test_deliveries_wait_in_the_worker_for_the_slot_its_run_holds_first_in_first_out() -> None:
    machine = make_machine()
    step = _three_serial(machine)
    assert [t.delivery_id for t in step.takes] == ["d1"]
    assert [machine.in_flight[d].phase for d in ("d2", "d3")] == [Phase.ARRIVED] * 2
    # waiting here takes no room: each takes the room of the run that hands
    # it its slot, so the worker reads on for the limits whose slots it frees
    assert machine.capacity == machine.config.concurrency - 1
    assert reply(machine, step, stepped(step), 0.1) == [StartTask(delivery_id="d1")]
    (handoff,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 0.2)
    assert isinstance(handoff, SlotStep) and handoff.finish is not None
    assert handoff.release is not None and handoff.release.holder == "w1/d1"
    assert [t.delivery_id for t in handoff.takes] == ["d2"]
    assert machine.in_flight["d2"].phase is Phase.CLAIMING
    assert reply(machine, handoff, stepped(handoff), 0.3) == [StartTask(delivery_id="d2")]
    assert "d1" not in machine.in_flight
    (handoff,) = end(machine, "d2", TaskOutcome.SUCCEEDED, 0.4)
    assert isinstance(handoff, SlotStep) and [t.delivery_id for t in handoff.takes] == ["d3"]


def test_a_slot_the_store_hands_to_its_own_waiter_parks_the_ones_waiting_here() -> None:
    machine = make_machine()
    step = _three_serial(machine)
    reply(machine, step, stepped(step), 0.1)
    (handoff,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 0.2)
    # the release woke a waiter the store parked before: d2 parks behind it,
    # and d3, with no run of the limit here any more, takes a step of its own
    (next_step,) = reply(machine, handoff, stepped(handoff, TAKE_PARKED), 0.3)
    assert isinstance(next_step, SlotStep) and next_step.release is None
    assert [t.delivery_id for t in next_step.takes] == ["d3"]
    assert "d2" not in machine.in_flight and machine.counters["parked"] == 1


def test_a_delivery_waits_here_at_most_hold_for() -> None:
    machine = make_machine(redelivery_timeout=600.0, heartbeat_interval=1000.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    step = _three_serial(machine, now=1.0)
    reply(machine, step, stepped(step), 1.0)
    assert machine.next_deadline() == 1.0 + HOLD_FOR
    machine.receive(Tick(now=1.0 + HOLD_FOR))
    (late,) = machine.effects()
    assert isinstance(late, SlotStep) and [t.delivery_id for t in late.takes] == ["d2", "d3"]
    assert machine.next_deadline() > 1.0 + HOLD_FOR


def test_no_wait_here_behind_a_run_that_holds_its_slot_long() -> None:
    machine = make_machine()
    (step,) = deliver(machine, arrival("d1", policy=SERIAL), now=0.0)
    reply(machine, step, stepped(step), 0.0)
    (late,) = deliver(machine, arrival("d2", policy=SERIAL), now=HOLD_FOR)
    assert isinstance(late, SlotStep) and [t.delivery_id for t in late.takes] == ["d2"]


def test_at_most_depth_deliveries_wait_here_a_slot() -> None:
    machine = make_machine(concurrency=100)
    arrivals = [arrival(f"d{i}", policy=SERIAL) for i in range(DEPTH + 3)]
    (step,) = deliver(machine, *arrivals)
    assert isinstance(step, SlotStep)
    # the first takes the slot, DEPTH wait, the rest take the store's way
    assert [t.delivery_id for t in step.takes] == ["d0", f"d{DEPTH + 1}", f"d{DEPTH + 2}"]
    assert sum(f.phase is Phase.ARRIVED for f in machine.in_flight.values()) == DEPTH


def test_a_stopping_worker_sends_every_waiting_delivery_its_step() -> None:
    machine = make_machine()
    step = _three_serial(machine)
    machine.receive(ShutdownRequested(now=0.5))
    (late,) = of_type(machine.effects(), SlotStep)
    assert [t.delivery_id for t in late.takes] == ["d2", "d3"]
    assert reply(machine, step, stepped(step), 0.6) == [StartTask(delivery_id="d1")]


def test_a_waiting_delivery_cancelled_or_lost_waits_on_its_claim_finds_out() -> None:
    machine = make_machine(redelivery_timeout=2.0, heartbeat_interval=1000.0)
    step = _three_serial(machine)
    machine.receive(CancelRequested(key="key-d2", now=0.1))
    renew = RenewLeases(worker="w1", delivery_ids=("d3",), slots=(), now=0.1)
    reply(machine, renew, LeasesRenewed(lost=("d3",)), 0.1)
    assert [machine.in_flight[d].phase for d in ("d2", "d3")] == [Phase.ARRIVED] * 2
    # their leases are still renewed: the store holds them for this worker
    machine.receive(Tick(now=machine.config.renew_interval + 0.1))
    (renewal,) = of_type(machine.effects(), RenewLeases)
    assert {"d2", "d3"} <= set(renewal.delivery_ids)
    reply(machine, step, stepped(step), 0.2)
    (handoff,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 0.3)
    assert isinstance(handoff, SlotStep) and [t.delivery_id for t in handoff.takes] == ["d2"]
    (last,) = reply(machine, handoff, stepped(handoff, TAKE_CANCELLED), 0.4)
    assert isinstance(last, SlotStep) and [t.delivery_id for t in last.takes] == ["d3"]
    assert reply(machine, last, stepped(last, TAKE_LOST), 0.5) == []
    assert machine.idle


def test_a_step_given_up_leaves_its_deliveries_to_the_store() -> None:
    machine = make_machine(retry_delay=1.0, redelivery_timeout=2.0)
    start_limited(machine, arrival("d1", policy=LIMITED))
    (step,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 0.0)
    machine.receive(ReplyLost(effects=(step,), now=0.0, reason="gone"))
    machine.receive(Tick(now=1.0))
    (again,) = of_type(machine.effects(), SlotStep)
    assert again.now == 1.0 and again.request == step.request  # a resend at the new now
    machine.receive(ReplyLost(effects=(again,), now=2.5, reason="gone"))
    assert machine.counters["given_up"] == 1
    assert machine.idle and machine.chains.open == 0


def test_a_resent_take_answered_lost_never_starts() -> None:
    machine = make_machine()
    (step,) = deliver(machine, arrival("d1", policy=LIMITED))
    assert of_type(reply(machine, step, stepped(step, TAKE_LOST), 1.0), StartTask) == []
    assert "d1" not in machine.in_flight  # left to the store: no acknowledgement


# -- no room for a run: READY ------------------------------------------------------------


def _ready_behind_two_runs(machine: WorkerMachine) -> SlotStep:
    """Concurrency 2, steps that take 0.5 s and a run of 0.5 s: u1 and u2
    run, and d2's step, sent ahead of the room while d1's end was out (u1
    is expected to end within a step's round trip), comes back with a slot:
    d2 waits ``READY``.  Returns d2's step."""
    (step,) = deliver(machine, arrival("d1", policy=LIMITED), now=0.0)
    assert reply(machine, step, stepped(step), 0.5) == [StartTask(delivery_id="d1")]
    (claim,) = deliver(machine, arrival("u1", redelivered=True), now=0.5)
    assert claim_all(machine, claim, 0.5) == [StartTask(delivery_id="u1")]
    assert machine.capacity == 0
    (end_step,) = end(machine, "d1", TaskOutcome.SUCCEEDED, 1.0)
    assert machine.capacity == 1  # d1's end is out: its room goes to a read
    (step,) = deliver(machine, arrival("d2", policy=LIMITED), now=1.0)
    # d2's step is out, and u1 is expected to end within its round trip:
    # a read may go out ahead of d2's answer
    assert machine.capacity == 1
    (claim,) = deliver(machine, arrival("u2", redelivered=True), now=1.1)
    assert claim_all(machine, claim, 1.2) == [StartTask(delivery_id="u2")]
    assert reply(machine, end_step, stepped(end_step), 1.2) == []
    assert reply(machine, step, stepped(step), 1.3) == []  # no room: no start
    assert machine.in_flight["d2"].phase is Phase.READY
    assert machine.in_flight["d2"].slot == LIMIT.limit_key
    assert machine.capacity == 0
    return step


def test_a_worker_whose_runs_are_long_next_to_a_step_asks_nothing_ahead() -> None:
    machine = make_machine(concurrency=2)
    (step,) = deliver(machine, arrival("d1", policy=LIMITED), now=0.0)
    assert reply(machine, step, stepped(step), 0.5) == [StartTask(delivery_id="d1")]
    (claim,) = deliver(machine, arrival("u1", redelivered=True), now=0.5)
    claim_all(machine, claim, 0.5)
    end(machine, "d1", TaskOutcome.SUCCEEDED, 100.5)  # a run of 100 s, a step of 0.5 s
    assert machine.capacity == 1
    deliver(machine, arrival("d2", policy=LIMITED), now=100.5)
    assert machine.capacity == 0


def test_a_slot_that_comes_back_with_no_room_waits_ready_and_starts_when_a_run_ends() -> None:
    machine = make_machine(concurrency=2)
    _ready_behind_two_runs(machine)
    # its slot is renewed with its lease while it waits
    machine.receive(Tick(now=machine.config.renew_interval))
    (renew,) = of_type(machine.effects(), RenewLeases)
    assert "d2" in renew.delivery_ids
    assert HeldSlot(limit_key=LIMIT.limit_key, holder="w1/d2") in renew.slots
    effects = end(machine, "u1", TaskOutcome.SUCCEEDED, 2.0)
    assert of_type(effects, StartTask) == [StartTask(delivery_id="d2")]
    assert len(of_type(effects, Finish)) == 1
    assert machine.in_flight["d2"].phase is Phase.RUNNING
    assert machine.in_flight["d2"].started_at == 2.0
    assert machine.counters["started"] == 4


def test_a_ready_delivery_cancelled_never_starts_and_releases_its_slot() -> None:
    machine = make_machine(concurrency=2)
    _ready_behind_two_runs(machine)
    machine.receive(CancelRequested(key="key-d2", now=1.5))
    (step,) = machine.effects()
    assert isinstance(step, SlotStep) and isinstance(step.finish, Finish)
    assert step.finish.state is ExecutionState.CANCELLED
    assert step.release == ReleaseSlot(limit_key=LIMIT.limit_key, holder="w1/d2", now=1.5)
    # a run that ends makes no start of it
    assert of_type(end(machine, "u1", TaskOutcome.SUCCEEDED, 2.0), StartTask) == []
    assert machine.counters["started"] == 3


def test_a_ready_delivery_whose_lease_is_lost_never_starts_and_releases_its_slot() -> None:
    machine = make_machine(concurrency=2)
    _ready_behind_two_runs(machine)
    renew = RenewLeases(worker="w1", delivery_ids=("d2",), slots=(), now=1.5)
    (step,) = reply(machine, renew, LeasesRenewed(lost=("d2",)), 1.5)
    assert isinstance(step, SlotStep) and step.finish is None
    assert step.release == ReleaseSlot(limit_key=LIMIT.limit_key, holder="w1/d2", now=1.5)
    assert "d2" not in machine.in_flight and machine.counters["abandoned"] == 1
    assert of_type(end(machine, "u1", TaskOutcome.SUCCEEDED, 2.0), StartTask) == []
