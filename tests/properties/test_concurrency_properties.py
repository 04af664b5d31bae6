"""Concurrency limits decided by the core, proven by properties.

A hypothesis ``RuleBasedStateMachine`` drives several ``WorkerMachine``s over
one ``MemoryStore`` on a virtual clock: adds, reads (deliveries and
redeliveries of running tasks), slow and failing tasks, cancels, small clock
steps and clock jumps, worker crashes (also in the middle of a batch), stalls
(a paused worker renews nothing until it resumes), lease faults (a worker whose
delivery leases lapse while its slots stay fresh) and shutdowns.  The "scoped"
limit names a scope of its own, so it takes the chain of single-slot steps
(``docket_core.sansio.scoped_slots``), and workers crash between its steps:
after a ``TakeSlot`` (before its ``ConfirmSlot`` or ``Park``), after a
``ReleaseSlot`` (before its ``WakeParked``), after a ``WakeParked`` (before
its ``Enlist``).  The invariants are checked after every store round trip
and every step; the teardown lets everything settle and checks that nothing
leaked and that every task ran exactly once (at least once when a fault
touched it).  The pydocket 0.15 bug, step by step: ``test_concurrency_regressions.py``.
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

from docket_core.sansio import scoped_slots
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import (
    AcquireSlot,
    Cancel,
    CancelTask,
    Effect,
    ReleaseSlot,
    RenewLeases,
    Request,
    StartTask,
    StoreEffect,
    TakeSlot,
    WakeParked,
)
from docket_core.sansio.inputs import (
    AbandonRequested,
    Arrival,
    Cancelled,
    CancelRequested,
    Delivered,
    Outcome,
    Scheduled,
    ShutdownRequested,
    SlotAcquired,
    SlotReleased,
    SlotTaken,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.local_slots import TAKE_ACQUIRED, TAKE_PARKED, SlotStep, SlotStepped
from docket_core.sansio.values import (
    ConcurrencyPolicy,
    Delivery,
    ExecutionState,
    ScheduleMode,
    TaskPolicy,
)
from docket_core.sansio.worker import InFlight, WorkerConfig, WorkerMachine
from docket_memory import scoped_chain
from docket_memory.shelf import Shelf
from docket_memory.simulate import drive
from docket_memory.store import MemoryStore

TIMEOUT = 5.0  # redelivery timeout (and slot staleness), seconds of virtual time
TTL = 1e9  # records outlive the run: a missing one is a loss
LIMITS = {"one": 1, "two": 2, "scoped": 1}
#: the scope of the "scoped" limit: not the docket's, so it takes the chain
SCOPE = "elsewhere"
#: a key's limit is part of its name; "free" keys are not limited
KEYS = [f"{limit}-{i}" for limit in ("one", "one", "two", "scoped", "free") for i in range(3)]
KEYS = sorted(set(KEYS))
DURATIONS = [0.05, 0.5, 2.0, 12.0]  # 12 s outlives the redelivery timeout


def policy_for(key: str) -> TaskPolicy:
    limit = key.split("-")[0]
    if limit not in LIMITS:
        return TaskPolicy()
    scope = SCOPE if limit == "scoped" else None
    return TaskPolicy(
        concurrency=ConcurrencyPolicy(limit_key=limit, max_concurrent=LIMITS[limit], scope=scope)
    )


#: a chain's steps a worker may be set to die right after (``crash_in_chain``)
CHAIN_STEPS: dict[str, type[StoreEffect]] = {
    "take": TakeSlot,
    "release": ReleaseSlot,
    "wake": WakeParked,
}


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
    #: dies right after the store ran a batch with a step of this kind
    crash_after: type[StoreEffect] | None = None


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
        #: origin -> the request numbers of the steps sent (a resend releases nothing)
        self.stepped: dict[str, set[int]] = {}
        #: workers that died between two steps of a chain
        self.chain_crashes = 0
        #: whether runtimes read by themselves after every step
        self.eager = True
        #: an invariant failed in the middle of a batch (``pump``)
        self.broken = False

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

    def slots_of(self, limit_key: str) -> dict[str, float]:
        """The holders of a limit's slots, wherever its scope keeps them."""
        scope = SCOPE if limit_key == "scoped" else None
        return self.shelf.pool(scope).slots.get(limit_key, {})

    def all_slots(self) -> dict[str, dict[str, float]]:
        return {key: self.slots_of(key) for key in LIMITS}

    def note_stale(self) -> None:
        """Remember every holder the store may now take over (as it would see it)."""
        cutoff = self.now - TIMEOUT
        for slots in self.all_slots().values():
            for holder, renewed in slots.items():
                if renewed <= cutoff:
                    self.evicted.add(holder)

    def execute(self, effects: Sequence[StoreEffect]) -> list[Outcome]:
        self.note_stale()
        outcomes: list[Outcome] = drive(self.store.execute(effects))
        return outcomes

    def pump(self, sim: Sim, *, lose: bool = False) -> None:
        """Carry out a worker's effects until it has none (the runtime's flusher)."""
        try:
            self._pump(sim, lose=lose)
        except AssertionError:
            # an invariant failed with a batch unanswered: the machine holds
            # its next ones back for good, so ``teardown`` (which runs anyway)
            # would only hide this failure behind "never became quiet"
            self.broken = True
            raise

    def _pump(self, sim: Sim, *, lose: bool = False) -> None:
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
                elif isinstance(effect, SlotStep) and effect.release is not None:
                    self.check_release(sim, effect.release, effect.request)
            outcomes = self.execute(sent)
            for effect, outcome in zip(sent, outcomes, strict=True):
                if isinstance(effect, SlotStep):
                    assert isinstance(outcome, SlotStepped)
                    self.check_step(effect, outcome)
                elif isinstance(effect, AcquireSlot | TakeSlot):
                    assert isinstance(outcome, SlotAcquired | SlotTaken)
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
            if sim.crash_after is not None and any(isinstance(e, sim.crash_after) for e in sent):
                # the step ran; its worker dies before it hears, and sends no next step
                self.chain_crashes += 1
                self.crash_sim(sim)
                return
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
                assert holder in self.slots_of(flight.slot), f"{ident} starts without its slot"
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

    def check_release(self, sim: Sim, effect: ReleaseSlot, step: Request | None = None) -> None:
        if effect.pass_on:
            return  # a wake-up passed on: it releases nothing
        if step is not None:  # (the release of a SlotStep: a resend of it releases nothing)
            if step.seq in self.stepped.setdefault(step.origin, set()):
                return
            self.stepped[step.origin].add(step.seq)
        holder = effect.holder
        assert holder.startswith(f"{sim.name}/"), f"{sim.name} released {holder}'s slot"
        assert holder in self.acquired, f"{holder} released a slot it never acquired"
        assert holder not in self.released, f"{holder} released its slot twice"
        slots = self.slots_of(effect.limit_key)
        assert holder in slots or holder in self.evicted, (
            f"{holder} released a slot of {effect.limit_key} it does not hold"
        )
        self.released.add(holder)

    def check_step(self, effect: SlotStep, outcome: SlotStepped) -> None:
        """A step's takes, as ``AcquireSlot``'s acquisitions are checked (a take
        after a release that woke a waiter parks behind it, free slot or not)."""
        self.woken += outcome.woken
        handed = bool(outcome.woken or outcome.wake)
        for index, (take, answer) in enumerate(zip(effect.takes, outcome.takes, strict=True)):
            holder = take.holder
            if answer == TAKE_ACQUIRED:
                holding = self.acquired - self.released - self.evicted
                assert holder not in holding, "a holder acquired twice"
                self.acquired.add(holder)
                self.released.discard(holder)
                self.evicted.discard(holder)
            elif answer == TAKE_PARKED:
                self.parked += 1
                if not (index == 0 and handed):
                    self.check_parked_in(take.limit_key, take.max_concurrent)

    def check_parked(self, effect: AcquireSlot | TakeSlot) -> None:
        self.check_parked_in(effect.limit_key, effect.max_concurrent)

    def check_parked_in(self, limit_key: str, max_concurrent: int) -> None:
        slots = self.slots_of(limit_key)
        assert len(slots) >= max_concurrent, "parked although a slot was free"
        assert all(t > self.now - TIMEOUT for t in slots.values()), (
            "parked although a stale slot could be taken over"
        )

    def check_limits(self) -> None:
        for limit_key, slots in self.all_slots().items():
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
                assert holder in self.slots_of(limit_key), (
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
            for message in (waiter.message for waiter in waiting):
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

    @rule(worker=consumes(workers))
    def abandon(self, worker: str) -> None:
        """A stop without draining: the runs still going end cancelled, and
        nothing more reaches the store (then the process exits); the store
        hands out again what the worker held."""
        sim = self.sims[worker]
        if sim.alive:
            machine = sim.machine
            machine.receive(AbandonRequested(now=self.now))
            for delivery_id in list(sim.running):
                machine.receive(
                    TaskEnded(delivery_id=delivery_id, now=self.now, outcome=TaskOutcome.CANCELLED)
                )
            machine.receive(Tick(now=self.now + 60.0))
            assert machine.effects() == [], "an abandoned worker sent something"
            self.crash_sim(sim)
        self.after_step()

    @rule(worker=workers, step=st.sampled_from(sorted(CHAIN_STEPS)))
    def crash_in_chain(self, worker: str, step: str) -> None:
        """The worker dies right after the store runs its next step of this
        kind, before it hears the answer: between a ``TakeSlot`` and its
        ``ConfirmSlot``/``Park``, a ``ReleaseSlot`` and its ``WakeParked``,
        a ``WakeParked`` and its ``Enlist``."""
        sim = self.sim(worker)
        if sim is not None:
            sim.crash_after = CHAIN_STEPS[step]
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
        if self.broken:
            return
        for sim in self.live():
            sim.slots_only = False
            sim.crash_after = None
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
        event(f"crashes in a chain: {min(self.chain_crashes, 3)}")
        shelf = self.shelf
        assert not shelf.ready and not shelf.future and not shelf.held
        slots = self.all_slots()
        assert not any(slots.values()), f"slots leaked: {slots}"
        assert not any(shelf.waiters.values()), f"waiters left behind: {shelf.waiters}"
        assert not shelf.scoped_parked and not shelf.scoped_waiters, "scoped waiters left"
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
    original = WorkerMachine._stepped

    def release_when_parked(
        self: WorkerMachine, effect: SlotStep, outcome: SlotStepped, now: float
    ) -> None:
        original(self, effect, outcome, now)
        for take, answer in zip(effect.takes, outcome.takes, strict=True):
            if answer == TAKE_PARKED:
                self._effects.append(
                    ReleaseSlot(
                        limit_key=take.limit_key, holder=self.holder(take.delivery_id), now=now
                    )
                )

    monkeypatch.setattr(WorkerMachine, "_stepped", release_when_parked)
    with pytest.raises(AssertionError, match="never acquired"):
        run_state_machine_as_test(
            ConcurrencyMachine,
            settings=settings(
                SETTINGS,
                max_examples=1000,
                database=None,
                derandomize=True,
                phases=[HypothesisPhase.generate],
                print_blob=False,
                report_multiple_bugs=False,
            ),
        )


def test_the_properties_catch_a_scoped_park_that_never_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key parked behind the scoped limit must come back by itself: its
    wake-up may never come (its worker died between two steps of a chain,
    or the holder died and nobody took its stale slot over).  Planted: a
    retry time that never comes.  The machine must notice (a fixed seed: the
    search is the same each run)."""
    monkeypatch.setattr(scoped_slots, "parked_retry_at", lambda now, stale_after: now + 1e9)
    with pytest.raises(AssertionError, match="never became quiet"):
        run_state_machine_as_test(
            ConcurrencyMachine,
            settings=settings(
                SETTINGS,
                max_examples=2000,
                database=None,
                derandomize=True,
                phases=[HypothesisPhase.generate],
                print_blob=False,
                report_multiple_bugs=False,
            ),
        )


def test_the_properties_catch_a_scoped_take_past_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted: a ``TakeSlot`` that always acquires."""

    def always(shelf: Shelf, effect: TakeSlot) -> SlotTaken:
        shelf.pool(effect.scope).slots.setdefault(effect.limit_key, {})[effect.holder] = effect.now
        return SlotTaken(delivery_id=effect.delivery_id, acquired=True)

    monkeypatch.setitem(scoped_chain.STEPS, TakeSlot, always)
    with pytest.raises(AssertionError, match="scoped"):
        run_state_machine_as_test(
            ConcurrencyMachine,
            settings=settings(
                SETTINGS,
                max_examples=300,
                database=None,
                derandomize=True,
                phases=[HypothesisPhase.generate],
                print_blob=False,
                report_multiple_bugs=False,
            ),
        )
