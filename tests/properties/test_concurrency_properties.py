"""Concurrency limits decided by the core, proven by properties.

A hypothesis ``RuleBasedStateMachine`` drives several ``WorkerMachine``s over
one ``MemoryStore`` on a virtual clock: adds, reads (deliveries and
redeliveries of running tasks), slow and failing tasks, cancels, small clock
steps and clock jumps, worker crashes (also in the middle of a batch), stalls
(a paused worker renews nothing until it resumes), lease faults (a worker whose
delivery leases lapse while its slots stay fresh) and shutdowns.  The
invariants are checked after every store round trip and every step; the
teardown lets everything settle and checks that nothing leaked and that every
task ran exactly once (at least once when a fault touched it).

Below the machine, explicit tests replay the pydocket 0.15 bug (a blocked
redelivery released the slot its running copy held) step by step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import Phase as HypothesisPhase
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import (
    AcquireSlot,
    Cancel,
    CancelTask,
    Effect,
    ReleaseSlot,
    RenewLeases,
    StartTask,
    StopReason,
    StoreEffect,
)
from docket_core.sansio.inputs import (
    Arrival,
    Cancelled,
    CancelRequested,
    Delivered,
    Outcome,
    Scheduled,
    ShutdownRequested,
    SlotAcquired,
    SlotReleased,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.values import (
    ConcurrencyPolicy,
    Delivery,
    ExecutionState,
    HeldSlot,
    ScheduleMode,
    TaskPolicy,
)
from docket_core.sansio.worker import InFlight, WorkerConfig, WorkerMachine
from docket_memory.shelf import Shelf
from docket_memory.simulate import drive
from docket_memory.store import MemoryStore

TIMEOUT = 5.0  # redelivery timeout (and slot staleness), seconds of virtual time
TTL = 1e9  # records outlive the run: a missing one is a loss
LIMITS = {"one": 1, "two": 2}
#: a key's limit is part of its name; "free" keys are not limited
KEYS = [f"{limit}-{i}" for limit in ("one", "one", "two", "free") for i in range(3)]
KEYS = sorted(set(KEYS))
DURATIONS = [0.05, 0.5, 2.0, 12.0]  # 12 s outlives the redelivery timeout


def policy_for(key: str) -> TaskPolicy:
    limit = key.split("-")[0]
    if limit not in LIMITS:
        return TaskPolicy()
    return TaskPolicy(concurrency=ConcurrencyPolicy(limit_key=limit, max_concurrent=LIMITS[limit]))


Ident = tuple[str, int]  # (key, generation): one execution


@attrs.define
class Sim:
    name: str
    machine: WorkerMachine
    #: delivery id -> (end time, outcome) of task functions running here
    running: dict[str, tuple[float, TaskOutcome]] = attrs.field(factory=dict)
    alive: bool = True
    #: paused: renews nothing, reads nothing, its tasks make no progress
    stalled: bool = False
    #: lease fault: its renewals carry its slots but not its deliveries
    slots_only: bool = False
    missed_cancels: list[str] = attrs.field(factory=list)


class ConcurrencyMachine(RuleBasedStateMachine):
    workers = Bundle("workers")
    tasks = Bundle("tasks")

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000_000.0
        self.shelf = Shelf()
        self.store = MemoryStore(name="props", shelf=self.shelf)
        self.sims: dict[str, Sim] = {}
        self.serial = 0
        #: every accepted add, with its planned duration and outcome
        self.plans: dict[Ident, tuple[float, TaskOutcome]] = {}
        self.starts: Counter[Ident] = Counter()
        #: executions touched by a fault: at least once, not exactly once
        self.tainted: set[Ident] = set()
        self.cancelled: set[Ident] = set()
        #: holders that got SlotAcquired(acquired=True), and those released since
        self.acquired: set[str] = set()
        self.released: set[str] = set()
        #: holders whose slot went stale (eligible for takeover) at some point
        self.evicted: set[str] = set()
        self.parked = 0
        self.woken = 0
        #: whether runtimes read by themselves after every step
        self.eager = True

    # -- plumbing ------------------------------------------------------------------

    def spawn(self) -> str:
        self.serial += 1
        name = f"w{self.serial}"
        config = WorkerConfig(
            name=name,
            concurrency=1 + self.serial % 3,
            redelivery_timeout=TIMEOUT,
            heartbeat_interval=2.0,
            execution_ttl=TTL,
        )
        self.sims[name] = Sim(name, WorkerMachine(config, self.now))
        return name

    def live(self) -> list[Sim]:
        return [s for s in self.sims.values() if s.alive]

    def healthy(self) -> list[Sim]:
        return [s for s in self.sims.values() if s.alive and not s.stalled]

    def sim(self, name: str) -> Sim | None:
        sim = self.sims[name]
        return sim if sim.alive and not sim.stalled else None

    def ident(self, flight: InFlight) -> Ident:
        return (flight.message.key, flight.message.generation)

    def note_stale(self) -> None:
        """Remember every holder the store may now take over (as it would see it)."""
        cutoff = self.now - TIMEOUT
        for slots in self.shelf.slots.values():
            for holder, renewed in slots.items():
                if renewed <= cutoff:
                    self.evicted.add(holder)

    def execute(self, effects: Sequence[StoreEffect]) -> list[Outcome]:
        self.note_stale()
        outcomes: list[Outcome] = drive(self.store.execute(effects))
        return outcomes

    def pump(self, sim: Sim, *, lose: bool = False) -> None:
        """Carry out a worker's effects until it has none (the runtime's flusher)."""
        machine = sim.machine
        while effects := machine.effects():
            batch: list[StoreEffect] = []
            for effect in effects:
                self.runtime_effect(sim, effect)
                if isinstance(effect, StoreEffect):
                    batch.append(effect)
            if not batch:
                continue
            if lose:  # the batch dies with its worker
                self.crash_sim(sim)
                return
            sent = [self.faulty(sim, effect) for effect in batch]
            for effect in sent:
                if isinstance(effect, ReleaseSlot):
                    self.check_release(sim, effect)
            outcomes = self.execute(sent)
            for effect, outcome in zip(sent, outcomes, strict=True):
                if isinstance(effect, AcquireSlot):
                    assert isinstance(outcome, SlotAcquired)
                    if outcome.acquired:
                        # a holder (worker/delivery) acquires again only once its previous
                        # run gave the slot back or lost it (the delivery came back to it)
                        holding = self.acquired - self.released - self.evicted
                        assert effect.holder not in holding, "a holder acquired twice"
                        self.acquired.add(effect.holder)
                        self.released.discard(effect.holder)
                        self.evicted.discard(effect.holder)
                    else:
                        self.parked += 1
                        self.check_parked(effect)
                elif isinstance(effect, ReleaseSlot):
                    assert isinstance(outcome, SlotReleased)
                    self.woken += outcome.woken
            machine.store_replied(batch, outcomes, self.now)
            self.check_limits()

    def faulty(self, sim: Sim, effect: StoreEffect) -> StoreEffect:
        if sim.slots_only and isinstance(effect, RenewLeases):
            return attrs.evolve(effect, delivery_ids=())
        return effect

    def runtime_effect(self, sim: Sim, effect: Effect) -> None:
        if isinstance(effect, StartTask):
            flight = sim.machine.in_flight[effect.delivery_id]
            ident = self.ident(flight)
            assert ident not in self.cancelled, f"{ident} started after it was cancelled"
            if flight.policy.concurrency is not None:
                assert flight.slot == flight.policy.concurrency.limit_key
                holder = sim.machine.holder(effect.delivery_id)
                assert holder in self.shelf.slots.get(flight.slot, {}), (
                    f"{ident} starts without its slot"
                )
            self.starts[ident] += 1
            if ident not in self.tainted:
                assert self.starts[ident] == 1, f"{ident} started twice without a fault"
            duration, outcome = self.plans[ident]
            sim.running[effect.delivery_id] = (self.now + duration, outcome)
        elif isinstance(effect, CancelTask) and effect.delivery_id in sim.running:
            sim.running[effect.delivery_id] = (self.now, TaskOutcome.CANCELLED)

    def deliver(self, sim: Sim, deliveries: Sequence[Delivery]) -> None:
        if not deliveries:
            return
        for delivery in deliveries:
            if delivery.redelivered:
                self.tainted.add((delivery.message.key, delivery.message.generation))
        arrivals = tuple(Arrival(delivery=d, policy=policy_for(d.message.key)) for d in deliveries)
        sim.machine.receive(Delivered(arrivals=arrivals, now=self.now))
        self.pump(sim)

    def read_into(self, sim: Sim) -> None:
        capacity = sim.machine.capacity
        if capacity <= 0:
            return
        self.note_stale()
        result = drive(
            self.store.read(
                worker=sim.name, count=capacity, now=self.now, redelivery_timeout=TIMEOUT, block=0
            )
        )
        self.deliver(sim, result.deliveries)

    def finish_due(self, sim: Sim, *, lose: bool = False) -> None:
        for delivery_id, (end, outcome) in list(sim.running.items()):
            if end > self.now or not sim.alive:
                continue
            del sim.running[delivery_id]
            error = "RuntimeError: boom" if outcome is TaskOutcome.FAILED else None
            sim.machine.receive(
                TaskEnded(delivery_id=delivery_id, now=self.now, outcome=outcome, error=error)
            )
            self.pump(sim, lose=lose)

    def tick(self, sim: Sim) -> None:
        deadline = sim.machine.next_deadline()
        if deadline is not None and deadline <= self.now:
            sim.machine.receive(Tick(now=self.now))
            self.pump(sim)

    def taint_all(self, sim: Sim) -> None:
        for flight in sim.machine.in_flight.values():
            self.tainted.add(self.ident(flight))

    def crash_sim(self, sim: Sim) -> None:
        self.taint_all(sim)
        sim.alive = False
        sim.running.clear()

    def after_step(self) -> None:
        """What every live runtime does between two steps: end due tasks, tick,
        and (when the readers are eager) read."""
        for sim in self.healthy():
            self.finish_due(sim)
        for sim in self.healthy():
            self.tick(sim)
        if self.eager:
            for sim in self.healthy():
                if sim.machine.accepting:
                    self.read_into(sim)
        for sim in self.live():
            if sim.machine.said_goodbye:
                assert not sim.machine.in_flight
                sim.alive = False  # a clean exit
            elif sim.stalled or sim.slots_only:
                self.taint_all(sim)
        self.note_stale()

    # -- invariants ----------------------------------------------------------------

    def check_release(self, sim: Sim, effect: ReleaseSlot) -> None:
        holder = effect.holder
        assert holder.startswith(f"{sim.name}/"), f"{sim.name} released {holder}'s slot"
        assert holder in self.acquired, f"{holder} released a slot it never acquired"
        assert holder not in self.released, f"{holder} released its slot twice"
        slots = self.shelf.slots.get(effect.limit_key, {})
        assert holder in slots or holder in self.evicted, (
            f"{holder} released a slot of {effect.limit_key} it does not hold"
        )
        self.released.add(holder)

    def check_parked(self, effect: AcquireSlot) -> None:
        slots = self.shelf.slots.get(effect.limit_key, {})
        assert len(slots) >= effect.max_concurrent, "parked although a slot was free"
        assert all(t > self.now - TIMEOUT for t in slots.values()), (
            "parked although a stale slot could be taken over"
        )

    def check_limits(self) -> None:
        for limit_key, slots in self.shelf.slots.items():
            assert len(slots) <= LIMITS[limit_key], f"{limit_key} has {len(slots)} slots"
        running: Counter[str] = Counter()
        for sim in self.healthy():
            for delivery_id in sim.running:
                flight = sim.machine.in_flight.get(delivery_id)
                if flight is None or flight.policy.concurrency is None:
                    continue
                if flight.phase not in (Phase.RUNNING, Phase.CANCELLING, Phase.TIMING_OUT):
                    continue  # abandoned: another worker owns it now
                holder = sim.machine.holder(delivery_id)
                if holder in self.evicted:
                    continue  # its worker was paused past the timeout (see the xfail below)
                limit_key = flight.policy.concurrency.limit_key
                assert flight.slot == limit_key
                assert holder in self.shelf.slots.get(limit_key, {}), (
                    f"{holder} runs {self.ident(flight)} but its slot is gone"
                )
                running[limit_key] += 1
                assert running[limit_key] <= LIMITS[limit_key], (
                    f"{running[limit_key]} tasks run under {limit_key} (max {LIMITS[limit_key]})"
                )

    @invariant()
    def never_over_the_limit(self) -> None:
        self.check_limits()

    @invariant()
    def waiters_do_not_poll(self) -> None:
        """A parked message is only in the waiters: never queued or scheduled."""
        for waiting in self.shelf.waiters.values():
            for message in waiting:
                assert message.key not in self.shelf.future or (
                    self.shelf.future[message.key].generation != message.generation
                )
                queued = self.shelf.ready_ids.get(message.key)
                if queued is not None:
                    assert self.shelf.ready[queued].generation != message.generation

    # -- rules ---------------------------------------------------------------------

    @initialize(target=workers)
    def first_workers(self) -> Any:
        return multiple(self.spawn(), self.spawn())

    @rule(on=st.booleans())
    def eager_readers(self, on: bool) -> None:
        self.eager = on
        self.after_step()

    @precondition(lambda self: len(self.live()) < 4)
    @rule(target=workers)
    def add_worker(self) -> str:
        return self.spawn()

    @rule(
        target=tasks,
        batch=st.lists(
            st.tuples(
                st.sampled_from(KEYS),
                st.sampled_from([0.0, 0.0, 0.0, 1.0]),
                st.sampled_from(DURATIONS),
                st.booleans(),
            ),
            min_size=2,
            max_size=8,
        ),
    )
    def add(self, batch: list[tuple[str, float, float, bool]]) -> Any:
        for key, delay, duration, fails in batch:
            effect = plan_add(
                key=key,
                function="task",
                payload=b"",
                when=self.now + delay,
                mode=ScheduleMode.ADD,
                now=self.now,
            )
            (outcome,) = self.execute([effect])
            assert isinstance(outcome, Scheduled)
            if outcome.accepted:
                result = TaskOutcome.FAILED if fails else TaskOutcome.SUCCEEDED
                self.plans[(key, outcome.generation)] = (duration, result)
        self.after_step()
        return multiple(*sorted({key for key, *_ in batch}))

    @rule(worker=workers)
    def read(self, worker: str) -> None:
        sim = self.sim(worker)
        if sim is not None and sim.machine.accepting:
            self.read_into(sim)
        self.after_step()

    @rule(dt=st.sampled_from([0.05, 0.3, 1.0, 2.0]))
    def advance(self, dt: float) -> None:
        self.now += dt
        self.after_step()

    @rule(dt=st.floats(min_value=TIMEOUT, max_value=3 * TIMEOUT))
    def clock_jump(self, dt: float) -> None:
        """Every process sees the jump; their timers fire before anyone reads."""
        self.now += dt
        self.after_step()

    @rule(task=tasks)
    def cancel(self, task: str) -> None:
        record = self.shelf.records.get(task)
        (done,) = self.execute([Cancel(key=task, now=self.now, ttl=TTL)])
        assert isinstance(done, Cancelled)
        if record is not None and not record.state.terminal:
            self.cancelled.add((task, record.generation))
        for sim in self.live():
            if sim.stalled:
                sim.missed_cancels.append(task)
                continue
            sim.machine.receive(CancelRequested(key=task, now=self.now))
            self.pump(sim)
        self.after_step()

    @rule(worker=consumes(workers))
    def crash(self, worker: str) -> None:
        sim = self.sims[worker]
        if sim.alive:
            self.crash_sim(sim)
        self.after_step()

    @rule(worker=workers)
    def crash_while_finishing(self, worker: str) -> None:
        """The outcome of a task never reaches the store: its worker died with it."""
        sim = self.sim(worker)
        if sim is not None and sim.running:
            delivery_id = next(iter(sim.running))
            sim.running[delivery_id] = (self.now, sim.running[delivery_id][1])
            self.finish_due(sim, lose=True)
        self.after_step()

    @rule(worker=workers)
    def stall(self, worker: str) -> None:
        sim = self.sim(worker)
        if sim is not None:
            self.taint_all(sim)
            sim.stalled = True
        self.after_step()

    @rule(worker=workers)
    def resume(self, worker: str) -> None:
        sim = self.sims[worker]
        if sim.alive and sim.stalled:
            self.resume_sim(sim)
        self.after_step()

    @rule(worker=workers, on=st.booleans())
    def lease_fault(self, worker: str, on: bool) -> None:
        """The pydocket shape: delivery leases lapse while slots are renewed."""
        sim = self.sim(worker)
        if sim is not None:
            sim.slots_only = on
            self.taint_all(sim)
        self.after_step()

    @rule(worker=workers)
    def shutdown(self, worker: str) -> None:
        sim = self.sim(worker)
        if sim is not None and len([s for s in self.healthy() if s.machine.accepting]) > 1:
            sim.machine.receive(ShutdownRequested(now=self.now))
            self.pump(sim)
        self.after_step()

    def resume_sim(self, sim: Sim) -> None:
        sim.stalled = False
        for key in sim.missed_cancels:
            sim.machine.receive(CancelRequested(key=key, now=self.now))
        sim.missed_cancels.clear()
        self.pump(sim)
        self.tick(sim)

    # -- the end -------------------------------------------------------------------

    def teardown(self) -> None:
        """Faults stop; run on until quiet; nothing leaked, everything ran."""
        for sim in self.live():
            sim.slots_only = False
            if sim.stalled:
                self.resume_sim(sim)
        if not [s for s in self.live() if s.machine.accepting]:
            self.spawn()
        for _ in range(20_000):
            for sim in self.live():
                self.finish_due(sim)
                if sim.alive:
                    self.read_into(sim)
                    self.tick(sim)
            self.after_step()
            self.check_limits()
            busy = any(s.machine.in_flight or s.running for s in self.live())
            if not busy and drive(self.store.pending()) == 0:
                break
            self.now += 0.25
        else:
            raise AssertionError("the system never became quiet")
        event(f"starts: {min(sum(self.starts.values()) // 10 * 10, 50)}+")
        event(f"parked: {min(self.parked, 5)}, woken: {min(self.woken, 5)}")
        event(f"faults: {'yes' if self.tainted else 'no'}, takeovers: {bool(self.evicted)}")
        shelf = self.shelf
        assert not shelf.ready and not shelf.future and not shelf.held
        assert not any(shelf.slots.values()), f"slots leaked: {shelf.slots}"
        assert not any(shelf.waiters.values()), f"waiters left behind: {shelf.waiters}"
        # every holder that acquired a slot gave it back or lost it to a takeover
        for holder in self.acquired - self.released:
            assert holder in self.evicted, f"{holder} never released its slot"
        for ident in self.plans:
            key, generation = ident
            record = shelf.records.get(key)
            assert record is not None and record.generation >= generation, f"{ident} vanished"
            if record.generation == generation:
                assert record.state.terminal, f"{ident} ended {record.state}"
            if ident in self.cancelled:
                if ident not in self.tainted:
                    assert self.starts[ident] <= 1
                continue
            assert record.generation == generation or record.state is not ExecutionState.RUNNING
            if ident in self.tainted:
                assert self.starts[ident] >= 1, f"{ident} never ran"
            else:
                assert self.starts[ident] == 1, f"{ident} ran {self.starts[ident]} times"


SETTINGS = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

ConcurrencyMachine.TestCase.settings = SETTINGS
TestConcurrencyMachine = ConcurrencyMachine.TestCase


def test_the_properties_catch_a_release_by_a_blocked_delivery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pydocket 0.15 bug planted in the core: a parked delivery's cleanup
    releases a slot anyway.  The machine must notice."""
    original = WorkerMachine._slot

    def release_when_parked(self: WorkerMachine, outcome: SlotAcquired, now: float) -> None:
        flight = self.in_flight.get(outcome.delivery_id)
        original(self, outcome, now)
        if flight is not None and not outcome.acquired and flight.policy.concurrency:
            self._effects.append(
                ReleaseSlot(
                    limit_key=flight.policy.concurrency.limit_key,
                    holder=self.holder(outcome.delivery_id),
                    now=now,
                )
            )

    monkeypatch.setattr(WorkerMachine, "_slot", release_when_parked)
    with pytest.raises(AssertionError, match="never acquired"):
        run_state_machine_as_test(
            ConcurrencyMachine,
            settings=settings(
                SETTINGS,
                max_examples=300,
                database=None,
                phases=[HypothesisPhase.generate],
                print_blob=False,
                report_multiple_bugs=False,
            ),
        )


# -- the two-worker regression, step by step ---------------------------------------------

L = "x:concurrency:task"
LIMITED = TaskPolicy(concurrency=ConcurrencyPolicy(limit_key=L, max_concurrent=1))


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
    fresh); worker B gets the redelivered copy, whose AcquireSlot is parked."""
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
    acquires = [e for e in rig.emitted["B"] if isinstance(e, AcquireSlot)]
    assert [e.holder for e in acquires] == [b.holder(copy.delivery_id)]
    assert acquires[0].holder != holder_a
    assert rig.started("B") == []  # blocked
    assert b.idle and b.counters["parked"] == 1
    return rig, delivery.delivery_id, holder_a


def test_a_blocked_redelivery_of_a_running_task_never_releases_its_slot() -> None:
    rig, delivery_id, holder_a = blocked_redelivery()
    b = rig.machines["B"]
    # B's cleanup released nothing: A's slot is still there
    assert not [e for e in rig.emitted["B"] if isinstance(e, ReleaseSlot)]
    assert set(rig.shelf.slots[L]) == {holder_a}
    assert rig.waiting_keys() == ["K"]

    # a third task C on the same limit is parked too: nobody took A's slot
    rig.add("C")
    (c,) = rig.read("B")
    assert c.message.key == "C"
    assert rig.started("B") == []
    assert not [e for e in rig.emitted["B"] if isinstance(e, ReleaseSlot)]
    assert set(rig.shelf.slots[L]) == {holder_a}
    assert rig.waiting_keys() == ["K", "C"]
    assert b.counters["parked"] == 2

    # A finishes: its own release (the only one) wakes the oldest *live*
    # waiter; K's parked copy is dead (A's run of it has just been recorded,
    # in the same round trip before the release), so C goes next
    assert rig.waiting_keys() == ["K", "C"]
    effects = rig.end("A", delivery_id)
    releases = [e for e in effects if isinstance(e, ReleaseSlot)]
    assert [r.holder for r in releases] == [holder_a]
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
    asked = [e.message.key for e in rig.emitted["B"] if isinstance(e, AcquireSlot)]
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
    assert rig.started("A") == [first.delivery_id, second.delivery_id]
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
    for key in "abcd":
        rig.add(key)
    (a, *_) = rig.read("A", count=4)
    assert rig.waiting_keys() == ["b", "c", "d"]
    rig.end("A", a.delivery_id)  # the release wakes b
    assert rig.waiting_keys() == ["c", "d"]
    rig.read("A", count=4)  # the reader comes straight back
    assert rig.waiting_keys() == ["c", "d"]
