"""The synchronous world of the core property tests: one ``MemoryStore`` on a
fresh ``Shelf``, a virtual clock, and a few ``WorkerMachine``s whose
"running" tasks are just entries in a dict.  The memory store's coroutines
never suspend with ``block=0``, so they are driven to completion with
``run``.

``World`` holds what ``test_core_properties`` and
``test_early_start_properties`` drive alike (producers, task ends, ticks,
crashes, the single-run check, draining); each harness says how its workers
read and how their store effects travel.  ``WorldMachine`` holds the rules
and checks their state machines share."""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from typing import Any, Generic, TypeVar

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from docket_core.adapter import ReadResult
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import Cancel, CancelTask, Effect, StartTask, StopReason
from docket_core.sansio.inputs import (
    Arrival,
    CancelRequested,
    Scheduled,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.values import Delivery, ExecutionRecord, ScheduleMode, TaskPolicy
from docket_core.sansio.worker import WorkerConfig, WorkerMachine
from docket_memory.shelf import Shelf
from docket_memory.simulate import drive
from docket_memory.store import MemoryStore

T = TypeVar("T")

REDELIVERY = 40.0
HEARTBEAT = 5.0
#: long enough that no record expires during a run
TTL = 1e9
START = 1_000_000.0
#: the settings of the state machines' test cases
MACHINE_SETTINGS = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Drive a coroutine that never suspends to completion."""
    result: T = drive(coro)
    return result


@attrs.define
class Running:
    """A task function 'running' in the simulation."""

    key: str
    generation: int
    #: the reason of a CancelTask received, if any: it ends CANCELLED
    cancel: StopReason | None = None


@attrs.define
class SimWorker:
    name: str
    machine: WorkerMachine
    running: dict[str, Running] = attrs.field(factory=dict)


W = TypeVar("W", bound=SimWorker)


class World(Generic[W]):
    """The world: clock, store and workers, driven one step at a time."""

    #: the kind of worker the world keeps
    worker_type: type[W]
    #: the policy of every key, as the workers' registries would give it
    policies: dict[str, TaskPolicy]

    def __init__(
        self,
        workers: int,
        *,
        name: str,
        execution_ttl: float = TTL,
        concurrency: int = 3,
        **config: Any,
    ) -> None:
        self.now = START
        self.shelf = Shelf()
        self.store = MemoryStore(name=name, shelf=self.shelf)
        self.execution_ttl = execution_ttl
        self.concurrency = concurrency
        #: the rest of every worker's ``WorkerConfig``
        self.config = config
        self.serial = 0
        self.workers: list[W] = [self.fresh_worker() for _ in range(workers)]
        #: keys with at least one accepted add/replace
        self.accepted: set[str] = set()
        self.starts = 0

    def fresh_worker(self) -> W:
        self.serial += 1
        name = f"worker-{self.serial}"
        config = WorkerConfig(
            name=name,
            concurrency=self.concurrency,
            redelivery_timeout=REDELIVERY,
            heartbeat_interval=HEARTBEAT,
            execution_ttl=self.execution_ttl,
            **self.config,
        )
        return self.worker_type(name=name, machine=WorkerMachine(config, self.now))

    # -- producers -------------------------------------------------------------

    def add(self, key: str, mode: ScheduleMode, delay: float) -> Scheduled:
        effect = plan_add(
            key=key, function="f", payload=b"", when=self.now + delay, mode=mode, now=self.now
        )
        (outcome,) = run(self.store.execute([effect]))
        assert isinstance(outcome, Scheduled)
        if outcome.accepted:
            self.accepted.add(key)
        return outcome

    def cancel(self, key: str) -> None:
        run(self.store.execute([Cancel(key=key, now=self.now, ttl=self.execution_ttl)]))
        # the store's cancellation signal reaches every worker
        for worker in self.workers:
            worker.machine.receive(CancelRequested(key=key, now=self.now))
            self.pump(worker)

    # -- workers ---------------------------------------------------------------

    def pump(self, worker: W) -> None:
        """Carry out the machine's effects (each harness its own way)."""
        raise NotImplementedError

    def read(self, worker: W) -> None:
        """Read for the worker and hand it what came (each harness its own way)."""
        raise NotImplementedError

    def task_effect(self, worker: W, effect: Effect) -> bool:
        """Carry out a ``StartTask`` or ``CancelTask``; whether it was one."""
        if isinstance(effect, StartTask):
            flight = worker.machine.in_flight[effect.delivery_id]
            assert effect.delivery_id not in worker.running
            worker.running[effect.delivery_id] = Running(
                key=flight.message.key, generation=flight.message.generation
            )
            self.starts += 1
            self.started(worker, effect.delivery_id, flight.phase)
        elif isinstance(effect, CancelTask):
            running = worker.running.get(effect.delivery_id)
            if running is not None:
                running.cancel = effect.reason
        else:
            return False
        return True

    def started(self, worker: W, delivery_id: str, phase: Phase) -> None:
        """A task function started in ``phase`` (for the harness to note)."""

    def store_read(self, worker: W, count: int, recover: bool = False) -> ReadResult:
        """The store's read for ``worker``, at once (``block=0``)."""
        result: ReadResult = run(
            self.store.read(
                worker=worker.name,
                count=count,
                now=self.now,
                redelivery_timeout=REDELIVERY,
                block=0,
                recover=recover,
            )
        )
        return result

    def arrival(self, delivery: Delivery) -> Arrival:
        return Arrival(delivery=delivery, policy=self.policies[delivery.message.key])

    def end(
        self, worker: W, delivery_id: str, outcome: TaskOutcome, swallows: bool = False
    ) -> None:
        """A task function ends with ``outcome``; one asked to stop ends
        cancelled, unless it ``swallows`` the cancellation (it then ends as
        it returned or raised)."""
        running = worker.running.pop(delivery_id)
        if running.cancel is not None and not swallows:
            outcome = TaskOutcome.CANCELLED
        error = "RuntimeError: boom" if outcome is TaskOutcome.FAILED else None
        worker.machine.receive(
            TaskEnded(delivery_id=delivery_id, now=self.now, outcome=outcome, error=error)
        )
        self.pump(worker)

    def tick(self, worker: W) -> None:
        worker.machine.receive(Tick(now=self.now))
        self.pump(worker)

    def crash(self, index: int) -> None:
        """The worker's process dies: its machine and tasks vanish unannounced."""
        self.workers[index] = self.fresh_worker()

    # -- checks ----------------------------------------------------------------

    def lease_valid(self, worker: W, delivery_id: str) -> bool:
        held = self.shelf.held.get(delivery_id)
        return (
            held is not None
            and held.worker == worker.name
            and held.renewed_at > self.now - REDELIVERY
        )

    def check_single_runs(self, workers: Iterable[W]) -> None:
        """A key's current generation never runs twice at once with valid
        leases (among the task functions of ``workers``)."""
        owners: dict[tuple[str, int], list[str]] = {}
        for worker in workers:
            for delivery_id, running in worker.running.items():
                flight = worker.machine.in_flight[delivery_id]
                if flight.phase is Phase.ABANDONING or not self.lease_valid(worker, delivery_id):
                    continue
                owners.setdefault((running.key, running.generation), []).append(
                    f"{worker.name}:{delivery_id}"
                )
        for (key, generation), holders in owners.items():
            current = self.shelf.records.get(key)
            if current is not None and current.generation == generation:
                assert len(holders) == 1, (key, generation, holders)

    def check(self) -> None:
        raise NotImplementedError

    def settled(self, worker: W) -> bool:
        return worker.machine.idle and not worker.running

    def quiescent(self) -> bool:
        shelf = self.shelf
        return (
            not shelf.ready
            and not shelf.future
            and not shelf.held
            and not shelf.waiters
            and all(self.settled(w) for w in self.workers)
        )

    def work_off(self, worker: W) -> None:
        """One round of a worker's loop: its tasks end, it ticks and reads."""
        for delivery_id in sorted(worker.running):
            self.end(worker, delivery_id, TaskOutcome.SUCCEEDED)
        self.tick(worker)
        self.read(worker)

    def drain(self, rounds: int = 100) -> None:
        """Let time pass and every worker finish everything."""
        for _ in range(rounds):
            if self.quiescent():
                return
            self.now += REDELIVERY / 2
            for worker in self.workers:
                self.work_off(worker)
                self.check()
        raise AssertionError(
            f"not quiescent after {rounds} rounds: ready={dict(self.shelf.ready)} "
            f"future={self.shelf.future} held={self.shelf.held}"
        )


class WorldMachine(RuleBasedStateMachine):
    """The rules and checks the core state machines share."""

    sim: World[Any]
    #: how many workers a run may start (crashes start new ones)
    serials = 8

    def worker(self, index: int) -> Any:
        return self.sim.workers[index % len(self.sim.workers)]

    @rule(index=st.integers(0, 2))
    def read(self, index: int) -> None:
        self.sim.read(self.worker(index))

    @rule(index=st.integers(0, 2))
    def tick(self, index: int) -> None:
        self.sim.tick(self.worker(index))

    @precondition(lambda self: self.sim.serial < self.serials)
    @rule(index=st.integers(0, 2))
    def crash(self, index: int) -> None:
        self.sim.crash(index % len(self.sim.workers))

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "sim"):
            self.sim.check()

    def teardown(self) -> None:
        """Drain everything: no accepted task was lost."""
        if not hasattr(self, "sim"):
            return
        self.sim.drain()
        for key in sorted(self.sim.accepted):
            self.concluded(key, self.sim.shelf.records.get(key))
        self.drained()

    def concluded(self, key: str, record: ExecutionRecord | None) -> None:
        """An accepted ``key`` ended up as it should once drained."""
        assert record is not None and record.state.terminal, (key, record)

    def drained(self) -> None:
        """Checks of the drained world as a whole."""
