"""The pydocket 0.15 bug (a blocked redelivery released the slot its running
copy held), replayed step by step on two worker machines over one memory
store, with the cases around it; the property machine is in
``test_concurrency_properties.py``."""

from __future__ import annotations

from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import (
    AcquireSlot,
    CancelTask,
    Effect,
    ReleaseSlot,
    RenewLeases,
    StartTask,
    StopReason,
    StoreEffect,
)
from docket_core.sansio.flight import Count
from docket_core.sansio.inputs import (
    Arrival,
    Delivered,
    Scheduled,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.local_slots import SlotStep
from docket_core.sansio.values import (
    ConcurrencyPolicy,
    Delivery,
    ExecutionState,
    HeldSlot,
    ScheduleMode,
    TaskPolicy,
)
from docket_core.sansio.worker import WorkerConfig, WorkerMachine
from docket_memory.shelf import Shelf
from docket_memory.simulate import drive
from docket_memory.store import MemoryStore

TIMEOUT = 5.0  # redelivery timeout (and slot staleness), seconds of virtual time


# -- the two-worker regression, step by step ---------------------------------------------

L = "x:concurrency:task"
LIMITED = TaskPolicy(concurrency=ConcurrencyPolicy(limit_key=L, max_concurrent=1))


def acquisitions(effects: list[Effect]) -> list[tuple[str, str]]:
    """(holder, task key) of the slots asked for: by ``AcquireSlot``, or by
    the takes of a ``SlotStep`` (a limit of the docket's own)."""
    asked: list[tuple[str, str]] = []
    for e in effects:
        if isinstance(e, AcquireSlot):
            asked.append((e.holder, e.message.key))
        elif isinstance(e, SlotStep):
            asked += [(t.holder, t.message.key) for t in e.takes]
    return asked


def releases(effects: list[Effect]) -> list[ReleaseSlot]:
    """The slots released: by ``ReleaseSlot``, or by a ``SlotStep``."""
    return [
        r
        for e in effects
        for r in ((e,) if isinstance(e, ReleaseSlot) else (getattr(e, "release", None),))
        if isinstance(r, ReleaseSlot)
    ]


class Rig:
    """Two (or more) worker machines over one memory store, driven by hand.
    Keys starting with "U" are not limited; every other key is limited by L."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.shelf = Shelf()
        self.store = MemoryStore(name="x", shelf=self.shelf)
        self.machines: dict[str, WorkerMachine] = {}
        #: every effect each machine emitted, in order
        self.emitted: dict[str, list[Effect]] = {}

    def worker(self, name: str) -> WorkerMachine:
        config = WorkerConfig(name=name, concurrency=4, redelivery_timeout=TIMEOUT)
        machine = self.machines[name] = WorkerMachine(config, self.now)
        self.emitted[name] = []
        return machine

    def add(self, key: str) -> int:
        effect = plan_add(
            key=key,
            function="task",
            payload=b"",
            when=self.now,
            mode=ScheduleMode.ADD,
            now=self.now,
        )
        (outcome,) = drive(self.store.execute([effect]))
        assert isinstance(outcome, Scheduled) and outcome.accepted
        return outcome.generation

    def pump(self, name: str) -> list[Effect]:
        machine = self.machines[name]
        emitted: list[Effect] = []
        while effects := machine.effects():
            emitted.extend(effects)
            batch = [e for e in effects if isinstance(e, StoreEffect)]
            if batch:
                outcomes = drive(self.store.execute(batch))
                machine.store_replied(batch, outcomes, self.now)
        self.emitted[name].extend(emitted)
        return emitted

    def read(self, name: str, count: int = 1) -> list[Delivery]:
        result = drive(
            self.store.read(
                worker=name, count=count, now=self.now, redelivery_timeout=TIMEOUT, block=0
            )
        )
        deliveries = list(result.deliveries)
        if deliveries:
            arrivals = tuple(
                Arrival(delivery=d, policy=TaskPolicy() if d.message.key[0] == "U" else LIMITED)
                for d in deliveries
            )
            self.machines[name].receive(Delivered(arrivals=arrivals, now=self.now))
            self.pump(name)
        return deliveries

    def end(self, name: str, delivery_id: str) -> list[Effect]:
        self.machines[name].receive(
            TaskEnded(delivery_id=delivery_id, now=self.now, outcome=TaskOutcome.SUCCEEDED)
        )
        return self.pump(name)

    def renew_slot_only(self, name: str, holder: str) -> None:
        (outcome,) = drive(
            self.store.execute(
                [
                    RenewLeases(
                        worker=name,
                        delivery_ids=(),
                        slots=(HeldSlot(limit_key=L, holder=holder),),
                        now=self.now,
                    )
                ]
            )
        )
        assert outcome is not None

    def waiting_keys(self) -> list[str]:
        return [m.key for m in self.shelf.waiters.get(L, ())]

    def started(self, name: str) -> list[str]:
        return [e.delivery_id for e in self.emitted[name] if isinstance(e, StartTask)]


def blocked_redelivery() -> tuple[Rig, str, str]:
    """Worker A runs K holding L's only slot; K's lease lapses (its slot stays
    fresh); worker B gets the redelivered copy, whose acquisition is parked."""
    rig = Rig()
    a, b = rig.worker("A"), rig.worker("B")
    rig.add("K")
    (delivery,) = rig.read("A")
    assert rig.started("A") == [delivery.delivery_id]
    holder_a = a.holder(delivery.delivery_id)
    assert set(rig.shelf.slots[L]) == {holder_a}

    # A stops renewing its delivery lease, but its slot is renewed
    for _ in range(3):
        rig.now += TIMEOUT / 2
        rig.renew_slot_only("A", holder_a)

    (copy,) = rig.read("B")
    assert copy.redelivered and copy.message.key == "K"
    assert copy.delivery_id == delivery.delivery_id  # the same message, another worker
    acquires = acquisitions(rig.emitted["B"])
    assert [holder for holder, _ in acquires] == [b.holder(copy.delivery_id)]
    assert acquires[0][0] != holder_a
    assert rig.started("B") == []  # blocked
    assert b.idle and b.counters[Count.PARKED] == 1
    return rig, delivery.delivery_id, holder_a


def test_a_blocked_redelivery_of_a_running_task_never_releases_its_slot() -> None:
    rig, delivery_id, holder_a = blocked_redelivery()
    b = rig.machines["B"]
    # B's cleanup released nothing: A's slot is still there
    assert not releases(rig.emitted["B"])
    assert set(rig.shelf.slots[L]) == {holder_a}
    assert rig.waiting_keys() == ["K"]

    # a third task C on the same limit is parked too: nobody took A's slot
    rig.add("C")
    (c,) = rig.read("B")
    assert c.message.key == "C"
    assert rig.started("B") == []
    assert not releases(rig.emitted["B"])
    assert set(rig.shelf.slots[L]) == {holder_a}
    assert rig.waiting_keys() == ["K", "C"]
    assert b.counters[Count.PARKED] == 2

    # A finishes: its own release (the only one) wakes the oldest *live*
    # waiter; K's parked copy is dead (A's run of it has just been recorded,
    # in the same round trip before the release), so C goes next
    assert rig.waiting_keys() == ["K", "C"]
    effects = rig.end("A", delivery_id)
    assert [r.holder for r in releases(effects)] == [holder_a]
    assert len(rig.shelf.ready) == 1
    (woken,) = rig.shelf.ready.values()
    assert woken.key == "C"
    assert rig.waiting_keys() == []
    assert not any(rig.shelf.slots.values())


def test_a_blocked_redelivery_never_lets_two_run_at_once() -> None:
    """Drive the scenario to the end: at no point do two tasks of L run."""
    rig, delivery_id, _ = blocked_redelivery()
    rig.add("C")
    rig.read("B")
    running: dict[str, str] = {"A": delivery_id}
    rig.end("A", delivery_id)
    del running["A"]
    for _ in range(50):
        for name in ("A", "B"):
            before = len(rig.started(name))
            rig.read(name, count=4)
            for started in rig.started(name)[before:]:
                running[f"{name}:{started}"] = started
            assert len(running) <= 1, f"two tasks of L run at once: {running}"
            assert len(rig.shelf.slots.get(L, {})) <= 1
        for ident, started in list(running.items()):
            name = ident.split(":")[0]
            del running[ident]
            rig.end(name, started)
        rig.now += 0.5
    assert not rig.shelf.ready and not rig.shelf.held and not rig.waiting_keys()
    assert not any(rig.shelf.slots.values())
    record = rig.shelf.records["C"]
    assert record.state is ExecutionState.COMPLETED


def test_a_limit_is_taken_over_only_after_its_holder_was_stale_for_the_timeout() -> None:
    rig = Rig()
    rig.worker("A")
    rig.worker("B")
    rig.add("K")
    rig.read("A")
    holder_a = next(iter(rig.shelf.slots[L]))
    rig.machines.pop("A")  # A crashes: nothing renews its lease or its slot
    rig.add("C")
    rig.now += TIMEOUT - 0.5
    rig.read("B")  # C: blocked while A's slot is not yet stale
    assert rig.started("B") == [] and rig.waiting_keys() == ["C"]
    rig.now += 0.5  # now A's slot (and K's lease) are stale
    rig.read("B", count=4)
    assert holder_a not in rig.shelf.slots.get(L, {})
    # the stale slot went to exactly one task: K's redelivered copy or C
    assert len(rig.started("B")) == 1
    assert len(rig.shelf.slots[L]) == 1


def test_a_blocked_redelivery_runs_the_task_only_once() -> None:
    rig, delivery_id, _ = blocked_redelivery()
    rig.add("C")
    rig.read("B")
    rig.end("A", delivery_id)
    assert rig.shelf.records["K"].state is ExecutionState.COMPLETED
    b = rig.machines["B"]
    for _ in range(10):
        rig.read("B", count=4)
        for running in [d for d, f in b.in_flight.items() if f.phase is Phase.RUNNING]:
            rig.end("B", running)
        rig.now += 0.5
    assert rig.shelf.records["C"].state is ExecutionState.COMPLETED
    # K's copy asked for the slot once (and was parked), C twice; K never ran again
    asked = [key for _, key in acquisitions(rig.emitted["B"])]
    assert asked == ["K", "C", "C"]


def test_a_blocked_redelivery_belongs_to_its_new_owner_and_the_old_one_stops() -> None:
    """Once B took the delivery over (A's lease ran out), the record follows B's
    copy, parked behind the limit; A learns at its next renewal that the
    delivery is gone and stops its run without recording anything."""
    rig, delivery_id, _ = blocked_redelivery()
    record = rig.shelf.records["K"]
    assert (record.state, record.worker) == (ExecutionState.SCHEDULED, None)
    a = rig.machines["A"]
    a.receive(Tick(now=rig.now))
    effects = rig.pump("A")
    cancels = [e for e in effects if isinstance(e, CancelTask)]
    assert [(c.delivery_id, c.reason) for c in cancels] == [(delivery_id, StopReason.LEASE_LOST)]
    assert a.in_flight[delivery_id].phase is Phase.ABANDONING


def test_a_worker_that_lost_its_slot_while_paused_does_not_keep_running() -> None:
    rig = Rig()
    a = rig.worker("A")
    rig.worker("B")
    rig.add("U0")  # not limited
    rig.add("K1")  # limited by L
    first, second = rig.read("A", count=2)
    assert (first.message.key, second.message.key) == ("U0", "K1")
    assert sorted(rig.started("A")) == sorted([first.delivery_id, second.delivery_id])
    rig.add("W")
    rig.read("B")
    assert rig.waiting_keys() == ["W"]
    rig.now += TIMEOUT + 0.1  # A is paused: it renews nothing
    (taken,) = rig.read("B", count=1)  # B takes over U0, the first stale delivery
    assert taken.message.key == "U0" and taken.redelivered
    a.receive(Tick(now=rig.now))  # A resumes
    rig.pump("A")
    rig.read("B", count=2)  # W, woken when A's stale slot was dropped
    k1 = second.delivery_id
    k1_running = k1 in a.in_flight and a.in_flight[k1].phase is Phase.RUNNING
    w_running = any(f.message.key == "W" for f in rig.machines["B"].in_flight.values())
    assert not (k1_running and w_running), "K1 and W both run under L (max 1)"


def test_waiters_are_woken_first_in_first_out_when_the_reader_is_quick() -> None:
    rig = Rig()
    rig.worker("A")
    rig.worker("B")
    for key in "abcd":
        rig.add(key)
    (a,) = rig.read("A", count=1)
    # B holds no slot of L: its deliveries park in the store (in A they
    # would wait in the worker for A's slot: local_slots)
    rig.read("B", count=3)
    assert rig.waiting_keys() == ["b", "c", "d"]
    rig.end("A", a.delivery_id)  # the release wakes b
    assert rig.waiting_keys() == ["c", "d"]
    rig.read("A", count=4)  # the reader comes straight back
    assert rig.waiting_keys() == ["c", "d"]
