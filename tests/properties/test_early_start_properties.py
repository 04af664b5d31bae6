"""Early starts under random interleavings: a fresh delivery of a task
without admission controls, limit or timeout starts with its claim
(``lifecycle``: ``START_EARLY``), and here every claim stays on the wire
until a rule answers it (or loses its reply), while adds, replaces, cancels,
task ends, crashes and clock jumps come in between.

A synchronous harness on the world of ``test_core_properties``
(``core_harness``): one ``MemoryStore``, a virtual clock, worker machines
that ask for their own reads (``Read``, answered with ``ReadDone``), each
sending one batch of store effects at a time.  Checked after every step,
besides the usual (one run of a key's current generation at a time on a
valid lease, nothing lost once drained):

- nothing is recorded for an early run before its claim came back
  ``claimed``, and never for one whose claim did not: no ``Finish`` or
  follow-up ``Schedule`` of it goes out first;
- a run whose claim came back anything else is being stopped;
- every delivery a machine holds runs exactly in the executing phases.
"""

from __future__ import annotations

import attrs
from core_harness import MACHINE_SETTINGS, REDELIVERY, SimWorker, World, WorldMachine, run
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from docket_core.sansio import lifecycle
from docket_core.sansio.effects import (
    Claim,
    Effect,
    Finish,
    Read,
    Schedule,
    StopReason,
    StoreEffect,
)
from docket_core.sansio.inputs import Claimed, ClaimVerdict, ReadDone, ReplyLost, TaskOutcome
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.values import (
    ConcurrencyPolicy,
    ExecutionState,
    RetryPolicy,
    ScheduleMode,
    TaskPolicy,
)

KEYS = ("a", "b", "c", "d")
POLICIES = {
    "a": TaskPolicy(),
    "b": TaskPolicy(retry=RetryPolicy(attempts=3, delay=2.0)),
    # claimed before they start: a timeout, a limit
    "c": TaskPolicy(timeout=20.0, retry=RetryPolicy(attempts=2, delay=1.0)),
    "d": TaskPolicy(concurrency=ConcurrencyPolicy(limit_key="limit:d", max_concurrent=1)),
}


@attrs.define
class Worker(SimWorker):
    #: the read the machine asked for, not yet carried out
    asked: Read | None = None
    #: the batch on the wire: until it is answered the machine's effects
    #: wait in it, as the runtime drains them one round at a time
    transit: list[StoreEffect] | None = None
    #: deliveries that started with their claim -> the claim's verdict, once known
    early: dict[str, ClaimVerdict | None] = attrs.field(factory=dict)


class Harness(World[Worker]):
    worker_type = Worker
    policies = POLICIES

    def __init__(self, workers: int) -> None:
        self.early_starts = 0
        super().__init__(workers, name="early", retry_delay=1.0, reads=True)

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
        elif not self.task_effect(worker, effect) and isinstance(effect, StoreEffect):
            batch.append(effect)

    def started(self, worker: Worker, delivery_id: str, phase: Phase) -> None:
        if phase is Phase.EARLY_RUNNING:
            worker.early[delivery_id] = None
            self.early_starts += 1
        else:  # (a delivery handed back to this worker, started once claimed)
            worker.early.pop(delivery_id, None)

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
        for outcome in () if lost else outcomes:  # (a verdict the machine heard)
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
        result = self.store_read(worker, asked.count, recover=asked.recover)
        for delivery in result.deliveries:
            assert delivery.redelivered == (delivery.delivery_id in held_before)
        arrivals = tuple(
            self.arrival(d)
            for d in result.deliveries
            if d.delivery_id not in worker.machine.in_flight
        )
        worker.machine.receive(ReadDone(arrivals=arrivals, next_due=None, now=self.now))
        self.pump(worker)

    # -- checks ------------------------------------------------------------------------

    def check(self) -> None:
        settled = [worker for worker in self.workers if worker.transit is None]
        # (a worker with a batch on the wire: its latest effects wait for the reply)
        for worker in settled:
            held = worker.machine.outbox.waiting_for_claim
            for delivery_id, flight in worker.machine.in_flight.items():
                # it runs exactly while the machine says it does, once its
                # claim is on the wire (a run whose claim is held back waits)
                executing = flight.phase in lifecycle.EXECUTING and delivery_id not in held
                assert (delivery_id in worker.running) == executing, (
                    worker.name,
                    delivery_id,
                    flight.phase,
                )
            for delivery_id, running in worker.running.items():
                verdict = worker.early.get(delivery_id)
                if verdict is not None and verdict is not ClaimVerdict.CLAIMED:
                    # the store voided the run: it is being stopped
                    assert running.cancel is not None, (worker.name, delivery_id, verdict)
        self.check_single_runs(settled)
        for record in self.shelf.records.values():
            assert record.cancel_ttl is None or record.state is ExecutionState.RUNNING, record

    def settled(self, worker: Worker) -> bool:
        return super().settled(worker) and worker.transit is None

    def work_off(self, worker: Worker) -> None:
        """A round of the worker's loop, its batch on the wire answered
        before and after."""
        self.answer(worker)
        super().work_off(worker)
        self.answer(worker)


class EarlyStartMachine(WorldMachine):
    sim: Harness
    serials = 6

    @initialize(workers=st.integers(1, 3))
    def start(self, workers: int) -> None:
        self.sim = Harness(workers)
        for worker in self.sim.workers:
            self.sim.tick(worker)

    @rule(
        key=st.sampled_from(KEYS),
        mode=st.sampled_from(ScheduleMode),
        delay=st.sampled_from([0.0, 0.0, 0.0, 1.0, 5.0]),
    )
    def add(self, key: str, mode: ScheduleMode, delay: float) -> None:
        self.sim.add(key, mode, delay)

    @rule(key=st.sampled_from(KEYS))
    def cancel(self, key: str) -> None:
        self.sim.cancel(key)

    @precondition(lambda self: any(w.running for w in self.sim.workers))
    @rule(pick=st.integers(0, 8))
    def cancel_running(self, pick: int) -> None:
        """Cancel the key of a running task: while its claim is on the wire
        or after it came back."""
        running = [r.key for w in self.sim.workers for _, r in sorted(w.running.items())]
        self.sim.cancel(running[pick % len(running)])

    @rule(jump=st.sampled_from([0.1, 1.0, 3.0, REDELIVERY / 2, REDELIVERY + 1]))
    def advance_clock(self, jump: float) -> None:
        self.sim.now += jump

    @precondition(lambda self: any(w.transit for w in self.sim.workers))
    @rule(index=st.integers(0, 2), lost=st.booleans(), ran=st.booleans())
    def answer(self, index: int, lost: bool, ran: bool) -> None:
        """The batch on a worker's wire is answered, or its reply is lost
        (after the store ran it, or before)."""
        busy = [w for w in self.sim.workers if w.transit]
        self.sim.answer(busy[index % len(busy)], lost=lost, ran=ran)

    @precondition(lambda self: any(w.running for w in self.sim.workers))
    @rule(pick=st.integers(0, 8), outcome=st.sampled_from(TaskOutcome))
    def end_task(self, pick: int, outcome: TaskOutcome) -> None:
        running = [(w, d) for w in self.sim.workers for d in sorted(w.running)]
        worker, delivery_id = running[pick % len(running)]
        self.sim.end(worker, delivery_id, outcome)


EarlyStartMachine.TestCase.settings = MACHINE_SETTINGS
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
