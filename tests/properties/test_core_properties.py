"""Random interleavings of producers, workers, crashes and clock jumps.

A synchronous simulation: one ``MemoryStore`` on a fresh ``Shelf``, a virtual
clock, and a few ``WorkerMachine``s whose "running" tasks are just entries in
a dict.  The memory store's coroutines never suspend with ``block=0``, so they
are driven to completion with ``run`` (the world of ``core_harness``,
which ``test_early_start_properties`` drives too).  Hypothesis picks the order of events;
after every step the invariants below are checked, and ``teardown`` drains
everything and checks that no accepted task was lost.
"""

from __future__ import annotations

import pytest
from core_harness import (
    MACHINE_SETTINGS,
    REDELIVERY,
    START,
    TTL,
    Running,
    SimWorker,
    World,
    WorldMachine,
    run,
)
from hypothesis import HealthCheck, settings
from hypothesis import Phase as Stage
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule, run_state_machine_as_test

from docket_core.sansio.effects import Effect, StopReason, StoreEffect
from docket_core.sansio.inputs import Delivered, TaskOutcome
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.values import (
    ConcurrencyPolicy,
    ExecutionRecord,
    ExecutionState,
    RetryPolicy,
    ScheduleMode,
    TaskPolicy,
)

KEYS = ("a", "b", "c", "d", "e", "f")
#: "e" and "f" share one concurrency slot
LIMIT = ConcurrencyPolicy(limit_key="limit:ef", max_concurrent=1)
POLICIES = {
    "a": TaskPolicy(),
    "b": TaskPolicy(retry=RetryPolicy(attempts=3, delay=2.0)),
    "c": TaskPolicy(
        retry=RetryPolicy(attempts=None, delay=1.0, exponential=True, maximum_delay=8.0)
    ),
    "d": TaskPolicy(timeout=20.0, retry=RetryPolicy(attempts=2, delay=1.0)),
    "e": TaskPolicy(concurrency=LIMIT),
    "f": TaskPolicy(concurrency=LIMIT, retry=RetryPolicy(attempts=2, delay=1.0)),
}


#: the phases of a running task function (the machine's own set, spelled out)
EXECUTING = (Phase.RUNNING, Phase.CANCELLING, Phase.TIMING_OUT, Phase.ABANDONING)


class Simulation(World[SimWorker]):
    """The world: clock, store and workers, driven one step at a time; the
    store settles every batch at once."""

    worker_type = SimWorker
    policies = POLICIES

    def __init__(self, workers: int = 3, execution_ttl: float = TTL, concurrency: int = 3) -> None:
        super().__init__(workers, name="sim", execution_ttl=execution_ttl, concurrency=concurrency)

    # -- workers ---------------------------------------------------------------

    def pump(self, worker: SimWorker) -> None:
        """Carry out every effect the machine produced, until it has none."""
        machine = worker.machine
        while effects := machine.effects():
            store: list[StoreEffect] = []
            for effect in effects:
                self.runtime_effect(worker, effect, store)
            if store:
                outcomes = run(self.store.execute(store))
                machine.store_replied(store, outcomes, self.now)

    def runtime_effect(self, worker: SimWorker, effect: Effect, store: list[StoreEffect]) -> None:
        if not self.task_effect(worker, effect):
            assert isinstance(effect, StoreEffect)
            store.append(effect)

    def read(self, worker: SimWorker) -> None:
        capacity = worker.machine.capacity
        if capacity == 0:
            return
        before = {
            delivery_id: (held.worker, held.renewed_at)
            for delivery_id, held in self.shelf.held.items()
        }
        result = self.store_read(worker, capacity)
        assert len(result.deliveries) <= capacity
        for delivery in result.deliveries:
            previous = before.get(delivery.delivery_id)
            if previous is not None:
                # the store hands out a held delivery only once its lease ran out
                holder, renewed_at = previous
                assert renewed_at <= self.now - REDELIVERY, (
                    f"{delivery.delivery_id} held by {holder} (renewed at "
                    f"{renewed_at - START}) handed to {worker.name} at {self.now - START}"
                )
                assert delivery.redelivered
            else:
                assert not delivery.redelivered
        if result.deliveries:
            arrivals = tuple(self.arrival(d) for d in result.deliveries)
            worker.machine.receive(Delivered(arrivals=arrivals, now=self.now))
            self.pump(worker)

    def end(
        self, worker: SimWorker, delivery_id: str, outcome: TaskOutcome, swallows: bool = False
    ) -> None:
        """A task function ends (see ``World.end``); nothing follows a run
        whose key was cancelled while it ran."""
        running = worker.running[delivery_id]
        record = self.shelf.records.get(running.key)
        cancelled_run = (
            record is not None
            and record.generation == running.generation
            and record.cancel_ttl is not None
        )
        super().end(worker, delivery_id, outcome, swallows)
        if cancelled_run and self.lease_valid_after_end(running):
            # nothing follows a run whose key was cancelled while it ran
            after = self.shelf.records.get(running.key)
            assert after is None or after.state.terminal, after

    def lease_valid_after_end(self, running: Running) -> bool:
        """Whether no other copy of the run's generation is out: the end
        just recorded was this run's own."""
        return not any(
            held.message.key == running.key and held.message.generation == running.generation
            for held in self.shelf.held.values()
        )

    # -- checks ----------------------------------------------------------------

    def check(self) -> None:
        shelf = self.shelf
        # replace leaves at most one scheduled or queued message per key, and it
        # is the key's current generation
        waiting: dict[str, list[int]] = {}
        for message in shelf.ready.values():
            waiting.setdefault(message.key, []).append(message.generation)
        for message in shelf.future.values():
            waiting.setdefault(message.key, []).append(message.generation)
        for key, generations in waiting.items():
            assert len(generations) == 1, (key, generations)
            record = shelf.records[key]
            assert generations[0] == record.generation, (key, generations, record)
            assert record.state in (ExecutionState.SCHEDULED, ExecutionState.QUEUED), record
        assert set(shelf.ready_ids) == {m.key for m in shelf.ready.values()}
        for delivery_id, message in shelf.ready.items():
            assert shelf.ready_ids[message.key] == delivery_id
        # only a running record carries a cancel's mark
        for record in shelf.records.values():
            assert record.cancel_ttl is None or record.state is ExecutionState.RUNNING, record
        # a key's current generation never runs twice at once with valid leases
        for worker in self.workers:
            for delivery_id in worker.running:
                flight = worker.machine.in_flight.get(delivery_id)
                assert flight is not None, (worker.name, delivery_id)
                assert flight.phase in EXECUTING
        self.check_single_runs(self.workers)
        # a limit is never exceeded by task functions holding a live slot
        limited = [
            (worker.name, delivery_id)
            for worker in self.workers
            for delivery_id in worker.running
            if worker.machine.in_flight[delivery_id].slot is not None
            and self.shelf.slots.get(LIMIT.limit_key, {}).get(
                worker.machine.holder(delivery_id), -1e18
            )
            > self.now - REDELIVERY
        ]
        assert len(limited) <= LIMIT.max_concurrent, limited
        assert len(shelf.slots.get(LIMIT.limit_key, {})) <= LIMIT.max_concurrent
        # every delivery a machine holds, the machine is running or finishing,
        # or it waits in the worker for the slot of a run there
        # (local_slots); the simulation settles claims and finishes synchronously
        for worker in self.workers:
            for delivery_id, flight in worker.machine.in_flight.items():
                if delivery_id in worker.machine.local.waits:
                    assert flight.phase is Phase.ARRIVED
                    assert any(f.slot == LIMIT.limit_key for f in worker.machine.in_flight.values())
                    continue
                assert flight.phase in EXECUTING, (
                    worker.name,
                    delivery_id,
                    flight.phase,
                )
                assert delivery_id in worker.running


class DocketMachine(WorldMachine):
    sim: Simulation

    execution_ttl = TTL
    #: the keys this machine uses (rules draw from ``KEYS`` and map onto these)
    keys: tuple[str, ...] = KEYS

    def key(self, drawn: str) -> str:
        return self.keys[KEYS.index(drawn) % len(self.keys)]

    @initialize(
        workers=st.integers(min_value=2, max_value=3),
        keys=st.lists(st.sampled_from(KEYS), max_size=4),
    )
    def start(self, workers: int, keys: list[str]) -> None:
        self.sim = Simulation(workers=workers, execution_ttl=self.execution_ttl)
        for key in keys:
            self.sim.add(self.key(key), ScheduleMode.ADD, 0.0)

    # -- producers -------------------------------------------------------------

    @rule(
        key=st.sampled_from(KEYS),
        mode=st.sampled_from(ScheduleMode),
        delay=st.sampled_from([0.0, 0.0, 1.0, 5.0, 30.0]),
    )
    def add(self, key: str, mode: ScheduleMode, delay: float) -> None:
        outcome = self.sim.add(self.key(key), mode, delay)
        if mode is ScheduleMode.REPLACE:
            assert outcome.accepted

    @rule(key=st.sampled_from(KEYS))
    def cancel(self, key: str) -> None:
        key = self.key(key)
        running = self.sim.shelf.records.get(key)
        self.sim.cancel(key)
        record = self.sim.shelf.records.get(key)
        if running is not None and running.state is ExecutionState.RUNNING:
            # a running key is only marked: its run records its own end
            assert record is not None and record.state is ExecutionState.RUNNING, record
            assert record.generation == running.generation
            assert record.cancel_ttl is not None
        else:
            assert record is None or record.state.terminal
        assert key not in self.sim.shelf.future
        assert key not in self.sim.shelf.ready_ids

    # -- time --------------------------------------------------------------------

    @rule(
        jump=st.sampled_from([0.1, 1.0, 3.0, 11.0, REDELIVERY / 2, REDELIVERY + 1, 3 * REDELIVERY])
    )
    def advance_clock(self, jump: float) -> None:
        self.sim.now += jump

    # -- workers -------------------------------------------------------------------

    @rule()
    def work(self) -> None:
        """Every worker looks at the clock and reads, as their loops would."""
        for worker in self.sim.workers:
            self.sim.tick(worker)
            self.sim.read(worker)

    def any_running(self) -> bool:
        return any(w.running for w in self.sim.workers)

    @precondition(any_running)
    @rule(pick=st.integers(0, 8), outcome=st.sampled_from(TaskOutcome), swallows=st.booleans())
    def end_task(self, pick: int, outcome: TaskOutcome, swallows: bool) -> None:
        """One running task function returns, raises or gives up (even one
        asked to stop, when it swallows the cancellation)."""
        running = [
            (worker, delivery_id)
            for worker in self.sim.workers
            for delivery_id in sorted(worker.running)
        ]
        worker, delivery_id = running[pick % len(running)]
        self.sim.end(worker, delivery_id, outcome, swallows=swallows)

    @precondition(
        lambda self: any(r.cancel is not None for w in self.sim.workers for r in w.running.values())
    )
    @rule()
    def end_cancelled(self) -> None:
        """Task functions that were asked to stop do stop."""
        for worker in self.sim.workers:
            for delivery_id, running in sorted(worker.running.items()):
                if running.cancel is not None:
                    self.sim.end(worker, delivery_id, TaskOutcome.CANCELLED)

    # -- checks ----------------------------------------------------------------------

    def concluded(self, key: str, record: ExecutionRecord | None) -> None:
        if self.sim.execution_ttl < TTL:
            # a terminal record is deleted at once (ttl 0) or expires
            assert record is None or record.state.terminal, record
            return
        assert record is not None, key
        assert record.state.terminal, record

    def drained(self) -> None:
        for record in self.sim.shelf.records.values():
            assert record.state.terminal, record
        assert not self.sim.shelf.waiters


DocketMachine.TestCase.settings = MACHINE_SETTINGS
TestDocketMachine = DocketMachine.TestCase


class FireAndForgetMachine(DocketMachine):
    """The same world on a docket whose records are deleted when they end."""

    execution_ttl = 0.0
    keys = ("a", "d")


def test_fire_and_forget_docket() -> None:
    run_state_machine_as_test(
        FireAndForgetMachine,
        settings=settings(
            max_examples=300,
            stateful_step_count=50,
            deadline=None,
            derandomize=True,
            database=None,
            # a known failure: no need to shrink it on every run
            phases=[Stage.explicit, Stage.generate],
            report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


# -- a few scripted scenarios, through the same harness ----------------------------------


def test_a_crashed_workers_message_is_redelivered_after_the_timeout() -> None:
    sim = Simulation(workers=2)
    sim.add("a", ScheduleMode.ADD, 0.0)
    sim.read(sim.workers[0])
    assert len(sim.workers[0].running) == 1
    sim.crash(0)
    sim.now += REDELIVERY - 1
    sim.read(sim.workers[1])
    assert not sim.workers[1].running
    sim.now += 1
    sim.read(sim.workers[1])
    (delivery_id,) = sim.workers[1].running
    assert sim.workers[1].machine.counters["redelivered"] == 1
    sim.end(sim.workers[1], delivery_id, TaskOutcome.SUCCEEDED)
    assert sim.shelf.records["a"].state is ExecutionState.COMPLETED
    assert sim.quiescent()


def test_replace_while_running_runs_the_new_one_and_keeps_the_newest_record() -> None:
    sim = Simulation(workers=2)
    sim.add("a", ScheduleMode.ADD, 0.0)
    sim.read(sim.workers[0])
    (old,) = sim.workers[0].running
    replaced = sim.add("a", ScheduleMode.REPLACE, 0.0)
    sim.read(sim.workers[1])
    (new,) = sim.workers[1].running
    sim.end(sim.workers[1], new, TaskOutcome.SUCCEEDED)
    sim.end(sim.workers[0], old, TaskOutcome.FAILED)
    record = sim.shelf.records["a"]
    assert (record.state, record.generation) == (ExecutionState.COMPLETED, replaced.generation)


def test_a_silent_worker_loses_its_lease_and_abandons() -> None:
    sim = Simulation(workers=2)
    sim.add("a", ScheduleMode.ADD, 0.0)
    first, second = sim.workers
    sim.read(first)
    (delivery_id,) = first.running
    sim.now += REDELIVERY + 1
    sim.read(second)
    assert delivery_id in second.running
    sim.tick(first)
    assert first.running[delivery_id].cancel is StopReason.LEASE_LOST
    sim.end(first, delivery_id, TaskOutcome.CANCELLED)
    running = sim.shelf.records["a"]
    assert running.state is ExecutionState.RUNNING
    sim.end(second, delivery_id, TaskOutcome.SUCCEEDED)
    assert sim.shelf.records["a"].state is ExecutionState.COMPLETED
    assert sim.quiescent()


def test_renewed_leases_are_not_taken_over() -> None:
    sim = Simulation(workers=2)
    sim.add("a", ScheduleMode.ADD, 0.0)
    first, second = sim.workers
    sim.read(first)
    for _ in range(10):
        sim.now += REDELIVERY / 4
        sim.tick(first)
        sim.read(second)
        assert not second.running
    assert len(first.running) == 1


def test_retries_through_the_store() -> None:
    sim = Simulation(workers=1)
    sim.add("b", ScheduleMode.ADD, 0.0)
    (worker,) = sim.workers
    for attempt in (1, 2, 3):
        sim.read(worker)
        (delivery_id,) = worker.running
        assert worker.machine.in_flight[delivery_id].message.attempt == attempt
        sim.end(worker, delivery_id, TaskOutcome.FAILED)
        sim.now += 2.0
    record = sim.shelf.records["b"]
    assert record.state is ExecutionState.FAILED
    assert record.attempt == 3
    assert sim.quiescent()


@pytest.mark.parametrize("key", KEYS)
def test_every_key_drains(key: str) -> None:
    sim = Simulation(workers=2)
    sim.add(key, ScheduleMode.ADD, 5.0)
    sim.drain()
    assert sim.shelf.records[key].state is ExecutionState.COMPLETED


def test_generation_is_not_reused_after_a_record_expires() -> None:
    """With ``execution_ttl == 0`` (fire-and-forget) a cancel deletes the record;
    a stale delivery of the cancelled execution must not pass for the next one."""
    sim = Simulation(workers=2, execution_ttl=0.0)
    first, second = sim.workers
    sim.add("a", ScheduleMode.ADD, 0.0)
    sim.read(first)
    (stale,) = first.running
    sim.crash(0)
    sim.cancel("a")
    sim.add("a", ScheduleMode.ADD, 0.0)
    sim.now += REDELIVERY + 1
    sim.read(second)
    assert stale not in second.running, "a cancelled execution ran again"


def test_a_run_cancelled_before_its_worker_died_never_runs_again() -> None:
    """The cancel only marks a running key; its worker dies before recording
    the end, and the copy handed out again concludes it cancelled."""
    sim = Simulation(workers=2)
    first, second = sim.workers
    sim.add("b", ScheduleMode.ADD, 0.0)
    sim.read(first)
    sim.cancel("b")
    assert sim.shelf.records["b"].state is ExecutionState.RUNNING
    sim.crash(0)
    sim.now += REDELIVERY + 1
    sim.read(second)
    assert not second.running
    record = sim.shelf.records["b"]
    assert (record.state, record.cancel_ttl) == (ExecutionState.CANCELLED, None)
    assert sim.starts == 1
    assert sim.quiescent()


def test_a_cancelled_run_that_swallows_it_ends_as_it_did_and_is_not_retried() -> None:
    sim = Simulation(workers=1)
    (worker,) = sim.workers
    sim.add("b", ScheduleMode.ADD, 0.0)
    sim.read(worker)
    (delivery_id,) = worker.running
    sim.cancel("b")
    sim.end(worker, delivery_id, TaskOutcome.FAILED, swallows=True)
    record = sim.shelf.records["b"]
    assert (record.state, record.error) == (ExecutionState.FAILED, "RuntimeError: boom")
    sim.drain()
    assert sim.starts == 1
