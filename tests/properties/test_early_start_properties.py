"""Early starts under random interleavings: a fresh delivery of a task
without admission controls, limit or timeout starts with its claim
(``lifecycle``: ``START_EARLY``), and here every claim stays on the wire
until a rule answers it (or loses its reply), while adds, replaces, cancels,
task ends, crashes and clock jumps come in between.

A synchronous harness like ``test_core_properties``'s: one ``MemoryStore``,
a virtual clock, worker machines that ask for their own reads (``Read``,
answered with ``ReadDone``), each sending one batch of store effects at a
time.  Checked after every step, besides the usual (one run of a key's
current generation at a time on a valid lease, nothing lost once drained):

- nothing is recorded for an early run before its claim came back
  ``claimed``, and never for one whose claim did not: no ``Finish`` or
  follow-up ``Schedule`` of it goes out first;
- a run whose claim came back anything else is being stopped;
- every delivery a machine holds runs exactly in the executing phases.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from docket_core.sansio import lifecycle
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import (
    Cancel,
    CancelTask,
    Claim,
    Effect,
    Finish,
    Read,
    Schedule,
    StartTask,
    StopReason,
    StoreEffect,
)
from docket_core.sansio.inputs import (
    Arrival,
    CancelRequested,
    Claimed,
    ClaimVerdict,
    ReadDone,
    ReplyLost,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.values import (
    ConcurrencyPolicy,
    ExecutionState,
    RetryPolicy,
    ScheduleMode,
    TaskPolicy,
)
from docket_core.sansio.worker import WorkerConfig, WorkerMachine
from docket_memory.shelf import Shelf
from docket_memory.simulate import drive
from docket_memory.store import MemoryStore

T = TypeVar("T")

REDELIVERY = 40.0
START = 1_000_000.0
TTL = 1e9
KEYS = ("a", "b", "c", "d")
POLICIES = {
    "a": TaskPolicy(),
    "b": TaskPolicy(retry=RetryPolicy(attempts=3, delay=2.0)),
    # claimed before they start: a timeout, a limit
    "c": TaskPolicy(timeout=20.0, retry=RetryPolicy(attempts=2, delay=1.0)),
    "d": TaskPolicy(concurrency=ConcurrencyPolicy(limit_key="limit:d", max_concurrent=1)),
}


def run(coro: Coroutine[Any, Any, T]) -> T:
    result: T = drive(coro)
    return result


@attrs.define
class Running:
    key: str
    generation: int
    cancel: StopReason | None = None


@attrs.define
class Worker:
    name: str
    machine: WorkerMachine
    running: dict[str, Running] = attrs.field(factory=dict)
    #: the read the machine asked for, not yet carried out
    asked: Read | None = None
    #: the batch on the wire: until it is answered the machine's effects
    #: wait in it, as the runtime drains them one round at a time
    transit: list[StoreEffect] | None = None
    #: deliveries that started with their claim -> the claim's verdict, once known
    early: dict[str, ClaimVerdict | None] = attrs.field(factory=dict)


class Harness:
    def __init__(self, workers: int) -> None:
        self.now = START
        self.shelf = Shelf()
        self.store = MemoryStore(name="early", shelf=self.shelf)
        self.serial = 0
        self.workers = [self.fresh_worker() for _ in range(workers)]
        self.accepted: set[str] = set()
        self.early_starts = 0

    def fresh_worker(self) -> Worker:
        self.serial += 1
        config = WorkerConfig(
            name=f"worker-{self.serial}",
            concurrency=3,
            redelivery_timeout=REDELIVERY,
            heartbeat_interval=5.0,
            execution_ttl=TTL,
            retry_delay=1.0,
            reads=True,
        )
        return Worker(name=config.name, machine=WorkerMachine(config, self.now))

    # -- producers -----------------------------------------------------------------

    def add(self, key: str, mode: ScheduleMode, delay: float) -> None:
        effect = plan_add(
            key=key, function="f", payload=b"", when=self.now + delay, mode=mode, now=self.now
        )
        (outcome,) = run(self.store.execute([effect]))
        if outcome.accepted:  # type: ignore[attr-defined]
            self.accepted.add(key)

    def cancel(self, key: str) -> None:
        run(self.store.execute([Cancel(key=key, now=self.now, ttl=TTL)]))
        for worker in self.workers:
            worker.machine.receive(CancelRequested(key=key, now=self.now))
            self.pump(worker)

    # -- workers -----------------------------------------------------------------------

    def pump(self, worker: Worker) -> None:
        """Carry out the machine's effects, round after round; a batch with
        a claim stays on the wire until ``answer``."""
        machine = worker.machine
        while worker.transit is None and (effects := machine.effects()):
            batch: list[StoreEffect] = []
            for effect in effects:
                self.runtime_effect(worker, effect, batch)
            if any(isinstance(e, Claim) for e in batch):
                worker.transit = batch
            elif batch:
                self.send(worker, batch)

    def runtime_effect(self, worker: Worker, effect: Effect, batch: list[StoreEffect]) -> None:
        if isinstance(effect, Read):
            assert worker.asked is None
            worker.asked = effect
        elif isinstance(effect, StartTask):
            flight = worker.machine.in_flight[effect.delivery_id]
            assert effect.delivery_id not in worker.running
            worker.running[effect.delivery_id] = Running(
                key=flight.message.key, generation=flight.message.generation
            )
            if flight.phase is Phase.EARLY_RUNNING:
                worker.early[effect.delivery_id] = None
                self.early_starts += 1
            else:  # (a delivery handed back to this worker, started once claimed)
                worker.early.pop(effect.delivery_id, None)
        elif isinstance(effect, CancelTask):
            running = worker.running.get(effect.delivery_id)
            if running is not None:
                running.cancel = effect.reason
        elif isinstance(effect, StoreEffect):
            batch.append(effect)

    def send(self, worker: Worker, batch: list[StoreEffect], *, lost: bool = False) -> None:
        for effect in batch:
            ended = (
                effect.delivery_id
                if isinstance(effect, Finish)
                else effect.acknowledge
                if isinstance(effect, Schedule)
                else None
            )
            if ended is not None and ended in worker.early:
                # nothing is recorded for an early run before it was claimed
                assert worker.early[ended] is ClaimVerdict.CLAIMED, (ended, worker.early[ended])
        outcomes = run(self.store.execute(batch))
        for outcome in outcomes:
            if isinstance(outcome, Claimed):
                for delivery_id, verdict in outcome.verdicts:
                    if delivery_id in worker.early and worker.early[delivery_id] is None:
                        worker.early[delivery_id] = verdict
        if lost:
            worker.machine.receive(ReplyLost(effects=tuple(batch), now=self.now, reason="sim"))
        else:
            worker.machine.store_replied(batch, outcomes, self.now)

    def answer(self, worker: Worker, *, lost: bool = False, ran: bool = True) -> None:
        batch, worker.transit = worker.transit, None
        if batch is None:
            return
        if lost and not ran:
            worker.machine.receive(ReplyLost(effects=tuple(batch), now=self.now, reason="sim"))
        else:
            self.send(worker, batch, lost=lost)
        self.pump(worker)

    def read(self, worker: Worker) -> None:
        asked, worker.asked = worker.asked, None
        if asked is None:
            return
        held_before = set(self.shelf.held)
        result = run(
            self.store.read(
                worker=worker.name,
                count=asked.count,
                now=self.now,
                redelivery_timeout=REDELIVERY,
                block=0,
                recover=asked.recover,
            )
        )
        for delivery in result.deliveries:
            assert delivery.redelivered == (delivery.delivery_id in held_before)
        arrivals = tuple(
            Arrival(delivery=d, policy=POLICIES[d.message.key])
            for d in result.deliveries
            if d.delivery_id not in worker.machine.in_flight
        )
        worker.machine.receive(ReadDone(arrivals=arrivals, next_due=None, now=self.now))
        self.pump(worker)

    def tick(self, worker: Worker) -> None:
        worker.machine.receive(Tick(now=self.now))
        self.pump(worker)

    def end(self, worker: Worker, delivery_id: str, outcome: TaskOutcome) -> None:
        running = worker.running.pop(delivery_id)
        if running.cancel is not None:
            outcome = TaskOutcome.CANCELLED
        error = "RuntimeError: boom" if outcome is TaskOutcome.FAILED else None
        worker.machine.receive(
            TaskEnded(delivery_id=delivery_id, now=self.now, outcome=outcome, error=error)
        )
        self.pump(worker)

    def crash(self, index: int) -> None:
        self.workers[index] = self.fresh_worker()

    # -- checks ------------------------------------------------------------------------

    def lease_valid(self, worker: Worker, delivery_id: str) -> bool:
        held = self.shelf.held.get(delivery_id)
        return (
            held is not None
            and held.worker == worker.name
            and held.renewed_at > self.now - REDELIVERY
        )

    def check(self) -> None:
        owners: dict[tuple[str, int], list[str]] = {}
        for worker in self.workers:
            if worker.transit is not None:
                continue  # (the machine's latest effects wait for the reply)
            for delivery_id, flight in worker.machine.in_flight.items():
                # it runs exactly while the machine says it does
                assert (delivery_id in worker.running) == (flight.phase in lifecycle.EXECUTING), (
                    worker.name,
                    delivery_id,
                    flight.phase,
                )
            for delivery_id, running in worker.running.items():
                flight = worker.machine.in_flight[delivery_id]
                verdict = worker.early.get(delivery_id)
                if verdict is not None and verdict is not ClaimVerdict.CLAIMED:
                    # the store voided the run: it is being stopped
                    assert running.cancel is not None, (worker.name, delivery_id, verdict)
                if flight.phase is Phase.ABANDONING or not self.lease_valid(worker, delivery_id):
                    continue
                owners.setdefault((running.key, running.generation), []).append(
                    f"{worker.name}:{delivery_id}"
                )
        for (key, generation), holders in owners.items():
            current = self.shelf.records.get(key)
            if current is not None and current.generation == generation:
                assert len(holders) == 1, (key, generation, holders)
        for record in self.shelf.records.values():
            assert record.cancel_ttl is None or record.state is ExecutionState.RUNNING, record

    def quiescent(self) -> bool:
        shelf = self.shelf
        return (
            not shelf.ready
            and not shelf.future
            and not shelf.held
            and not shelf.waiters
            and all(w.machine.idle and not w.running and w.transit is None for w in self.workers)
        )

    def drain(self, rounds: int = 100) -> None:
        for _ in range(rounds):
            if self.quiescent():
                return
            self.now += REDELIVERY / 2
            for worker in self.workers:
                self.answer(worker)
                for delivery_id in sorted(worker.running):
                    self.end(worker, delivery_id, TaskOutcome.SUCCEEDED)
                self.tick(worker)
                self.read(worker)
                self.answer(worker)
                self.check()
        raise AssertionError(f"not quiescent: {self.shelf.ready} {self.shelf.held}")


class EarlyStartMachine(RuleBasedStateMachine):
    harness: Harness

    @initialize(workers=st.integers(1, 3))
    def start(self, workers: int) -> None:
        self.harness = Harness(workers)
        for worker in self.harness.workers:
            self.harness.tick(worker)

    def worker(self, index: int) -> Worker:
        return self.harness.workers[index % len(self.harness.workers)]

    @rule(
        key=st.sampled_from(KEYS),
        mode=st.sampled_from(ScheduleMode),
        delay=st.sampled_from([0.0, 0.0, 0.0, 1.0, 5.0]),
    )
    def add(self, key: str, mode: ScheduleMode, delay: float) -> None:
        self.harness.add(key, mode, delay)

    @rule(key=st.sampled_from(KEYS))
    def cancel(self, key: str) -> None:
        self.harness.cancel(key)

    @precondition(lambda self: any(w.running for w in self.harness.workers))
    @rule(pick=st.integers(0, 8))
    def cancel_running(self, pick: int) -> None:
        """Cancel the key of a running task: while its claim is on the wire
        or after it came back."""
        running = [r.key for w in self.harness.workers for _, r in sorted(w.running.items())]
        self.harness.cancel(running[pick % len(running)])

    @rule(jump=st.sampled_from([0.1, 1.0, 3.0, REDELIVERY / 2, REDELIVERY + 1]))
    def advance_clock(self, jump: float) -> None:
        self.harness.now += jump

    @rule(index=st.integers(0, 2))
    def read(self, index: int) -> None:
        self.harness.read(self.worker(index))

    @rule(index=st.integers(0, 2))
    def tick(self, index: int) -> None:
        self.harness.tick(self.worker(index))

    @precondition(lambda self: any(w.transit for w in self.harness.workers))
    @rule(index=st.integers(0, 2), lost=st.booleans(), ran=st.booleans())
    def answer(self, index: int, lost: bool, ran: bool) -> None:
        """The batch on a worker's wire is answered, or its reply is lost
        (after the store ran it, or before)."""
        busy = [w for w in self.harness.workers if w.transit]
        self.harness.answer(busy[index % len(busy)], lost=lost, ran=ran)

    @precondition(lambda self: any(w.running for w in self.harness.workers))
    @rule(pick=st.integers(0, 8), outcome=st.sampled_from(TaskOutcome))
    def end_task(self, pick: int, outcome: TaskOutcome) -> None:
        running = [(w, d) for w in self.harness.workers for d in sorted(w.running)]
        worker, delivery_id = running[pick % len(running)]
        self.harness.end(worker, delivery_id, outcome)

    @precondition(lambda self: self.harness.serial < 6)
    @rule(index=st.integers(0, 2))
    def crash(self, index: int) -> None:
        self.harness.crash(index % len(self.harness.workers))

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "harness"):
            self.harness.check()

    def teardown(self) -> None:
        if not hasattr(self, "harness"):
            return
        harness = self.harness
        harness.drain()
        for key in sorted(harness.accepted):
            record = harness.shelf.records.get(key)
            assert record is not None and record.state.terminal, (key, record)


EarlyStartMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEarlyStartMachine = EarlyStartMachine.TestCase


def test_the_harness_starts_early_and_races_a_cancel() -> None:
    """A fixed scenario: the cancel comes while the claim is on the wire; the
    claim answers cancelled, the run is stopped, nothing is recorded by it."""
    harness = Harness(1)
    (worker,) = harness.workers
    harness.tick(worker)
    harness.add("a", ScheduleMode.ADD, 0.0)
    harness.read(worker)
    (delivery_id,) = worker.running
    assert worker.transit is not None and harness.early_starts == 1
    harness.cancel("a")
    assert worker.machine.in_flight[delivery_id].phase is Phase.EARLY_CANCELLING
    harness.answer(worker)
    assert worker.early[delivery_id] is ClaimVerdict.CANCELLED
    assert worker.running[delivery_id].cancel is StopReason.CANCELLED
    harness.end(worker, delivery_id, TaskOutcome.CANCELLED)
    record = harness.shelf.records["a"]
    assert record.state is ExecutionState.CANCELLED
    assert not worker.machine.in_flight and harness.quiescent()
