"""The simulator's slot invariant ("a slot is released only by its holder, or
after a takeover of a stale slot") knows every takeover, however fast it
follows the slot's going stale (seed 103 at 20k steps, before the fix)."""

from __future__ import annotations

import pytest

from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import ReleaseSlot, StoreEffect
from docket_core.sansio.inputs import Arrival, ReadDone, ReplyLost, TaskEnded, TaskOutcome
from docket_core.sansio.values import ScheduleMode
from docket_memory.simulate import (
    REDELIVERY_TIMEOUT,
    SHARED_LIMIT,
    InvariantViolated,
    Simulation,
    SimWorker,
    drive,
)

#: keys of each docket under the shared limit (one slot, both dockets)
KEY_OF_A, KEY_OF_B = "key-0", "key-6"


def _quiet_simulation() -> tuple[Simulation, SimWorker, SimWorker]:
    """Two workers (one a docket), no random faults, no clock skew."""
    simulation = Simulation(0, workers=2)
    simulation.faults = False
    a, b = simulation.workers
    a.skew = b.skew = 0.0
    assert (a.docket, b.docket) == ("sim-a", "sim-b")
    for key in (KEY_OF_A, KEY_OF_B):
        limit = simulation.policy_for(key).concurrency
        assert limit is not None and limit.limit_key == SHARED_LIMIT
        assert limit.max_concurrent == 1
        assert simulation.docket_of(key) == (a.docket if key == KEY_OF_A else b.docket)
    return simulation, a, b


def _add(simulation: Simulation, key: str) -> None:
    effect = plan_add(
        key=key,
        function="task",
        payload=b"",
        when=simulation.now,
        mode=ScheduleMode.ADD,
        now=simulation.now,
    )
    drive(simulation.stores[simulation.docket_of(key)].execute([effect]))


def _exchange(simulation: Simulation, worker: SimWorker, *, lose: bool = False) -> None:
    """One batch of the machine's effects; with ``lose`` the store never gets
    it and the machine hears nothing back."""
    machine = worker.machine
    batch: list[StoreEffect] = []
    for effect in machine.effects():
        simulation.runtime_effect(worker, effect)
        if isinstance(effect, StoreEffect):
            batch.append(effect)
    assert batch
    now = simulation.clock(worker)
    if lose:
        machine.receive(ReplyLost(effects=tuple(batch), now=now, reason="test"))
        assert machine.outbox.resend_at is not None
    else:
        outcomes = drive(simulation.stores[worker.docket].execute(batch))
        machine.store_replied(batch, outcomes, now)


def _start(simulation: Simulation, worker: SimWorker, key: str) -> str:
    """Add ``key`` and let ``worker`` read, claim and start it (taking its
    slot); returns its delivery id."""
    _add(simulation, key)
    simulation.tick(worker)  # asks for a read
    simulation.read(worker)
    (delivery_id,) = worker.running
    return delivery_id


def _held_back_release(simulation: Simulation, worker: SimWorker, delivery_id: str) -> None:
    """The run ends, but the batch with its release gets no reply (the store
    never saw it): the machine holds the release back until its resend."""
    del worker.running[delivery_id]
    worker.machine.receive(
        TaskEnded(
            delivery_id=delivery_id, now=simulation.clock(worker), outcome=TaskOutcome.SUCCEEDED
        )
    )
    _exchange(simulation, worker, lose=True)


@pytest.mark.parametrize("taken_by", ["acquisition", "read"])
def test_a_release_after_a_takeover_right_after_a_clock_jump_is_allowed(taken_by: str) -> None:
    """A's slot goes stale in a clock jump and B's very next store call takes
    it away, before any check saw it stale: a resent acquisition takes it
    over (seed 103), or a read drops it.  A's release, resent later, frees
    nothing and breaks no invariant."""
    simulation, a, b = _quiet_simulation()
    first = _start(simulation, a, KEY_OF_A)
    holder = a.machine.holder(first)
    pool = simulation.shelves[a.docket].pool("shared")
    assert set(pool.slots[SHARED_LIMIT]) == {holder}
    _held_back_release(simulation, a, first)

    simulation.now += 3.0
    _add(simulation, KEY_OF_B)
    simulation.tick(b)  # asks for a read
    if taken_by == "acquisition":
        # B claims its delivery, but its acquisition gets no reply
        read = drive(
            simulation.stores[b.docket].read(
                worker=b.name,
                count=1,
                now=simulation.clock(b),
                redelivery_timeout=REDELIVERY_TIMEOUT,
                block=0,
            )
        )
        b.read = None
        arrivals = tuple(
            Arrival(delivery=d, policy=simulation.policy_for(d.message.key))
            for d in read.deliveries
        )
        b.machine.receive(ReadDone(arrivals=arrivals, next_due=None, now=simulation.clock(b)))
        _exchange(simulation, b)  # the claim
        _exchange(simulation, b, lose=True)  # the acquisition
        assert not b.running

    simulation.now += 2.5  # a clock jump: A's slot is stale, B's leases are not
    simulation.tick(b)  # the resent acquisition takes the slot over
    if taken_by == "read":
        simulation.read(b)  # drops the stale slot; B takes it
    (second,) = b.running
    assert set(pool.slots[SHARED_LIMIT]) == {b.machine.holder(second)}

    simulation.tick(a)  # the resend: Finish, then the release of the lost slot
    assert a.machine.outbox.resend_at is None
    assert set(pool.slots[SHARED_LIMIT]) == {b.machine.holder(second)}, "B keeps its slot"
    simulation.check()


def test_a_second_release_of_a_slot_is_still_caught() -> None:
    """The check stays strict: a holder that released its slot (it was never
    taken over) may not release it again."""
    simulation, a, _ = _quiet_simulation()
    first = _start(simulation, a, KEY_OF_A)
    a.running[first] = (simulation.clock(a), TaskOutcome.SUCCEEDED)
    simulation.finish_due(a)  # ends and releases its slot
    pool = simulation.shelves[a.docket].pool("shared")
    assert not pool.slots.get(SHARED_LIMIT)
    again = ReleaseSlot(
        limit_key=SHARED_LIMIT, holder=a.machine.holder(first), now=simulation.now, scope="shared"
    )
    simulation.now += REDELIVERY_TIMEOUT * 3  # long after: still not a takeover
    simulation.check()
    with pytest.raises(InvariantViolated, match="does not hold"):
        simulation.check_release(a, again)
