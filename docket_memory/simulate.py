"""A deterministic simulator: the core and the memory store on a virtual clock.

Random workloads (adds, replaces, cancels, retries, concurrency limits, and
keys without controls, whose fresh deliveries start with their claim) run on
several simulated workers of two dockets, which share one scoped limit and
each have limits of their own, while faults strike: worker crashes, effect batches
lost with their worker, batches whose reply is lost (run by the store or not;
the worker machine sends them again; a batch out behind it on the same
connection shares its fate), batches refused (an error reply, after the calls
before the refused one ran), a second batch sent while the first is out (a
worker that may keep two out hears a reply later, and the store runs both
in order), crashes after a step of a scoped
limit's chain (``docket_core.sansio.scoped_slots``) before the next,
deliveries handed to a worker late, clock skew between workers, clock jumps.
The shared limit takes that chain: a take in the scope, a confirm or a park
in the docket; a release in the scope, a wake-up in the waiting docket, an
enlistment of the rest.  After every step the invariants are checked; at the end
faults stop, the clock runs on until everything is quiet, and no task may be
lost.  Everything comes from one seed, so a failure replays exactly:

    python -m docket_memory.simulate --seed 7 --steps 100000

Invariants checked (``sim_invariants``):

- a concurrency limit is never exceeded by tasks running on live workers (of
  both dockets, for the limit they share);
- a slot is released only by its holder (or after a takeover of a stale slot);
- a delivery whose lease is valid is never handed to a second worker;
- the same generation of a key never runs on two live workers at once, and
  while it runs it neither waits behind a limit nor is queued again;
- admission controls (a debounce and a cooldown shared by two keys each, a
  rate limit shared by both dockets, a cooldown beside a concurrency limit),
  in the frame of the times the store recorded: a rate limit never admits
  more than ``limit`` starts in any window of ``per``, a cooldown never two
  starts within its window, a debounce never two starts within ``settle``;
  an execution is admitted once (a redelivered one is admitted again as
  itself, counting nothing);
- nothing is lost: once quiet, every accepted add ended (completed, failed or
  cancelled) or was superseded by a later accepted add of the same key, and
  the store holds no messages, slots or waiters (a docket may stay
  registered as waiting for the shared limit with nothing parked there, after
  a crash or a park that found its key superseded: the next release passes
  it over, and a server expires it with the slot set).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any

import attrs

from docket_core.sansio.admission import (
    Admit,
    Control,
    CooldownPolicy,
    DebouncePolicy,
    RateLimitPolicy,
)
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import (
    AcquireSlot,
    BatchTurn,
    Cancel,
    CancelTask,
    Claim,
    ConfirmSlot,
    Effect,
    Enlist,
    Park,
    Read,
    ReleaseSlot,
    StartTask,
    StoreEffect,
    TakeSlot,
    WakeParked,
)
from docket_core.sansio.inputs import (
    Arrival,
    CancelRequested,
    Outcome,
    ReadDone,
    ReadFailed,
    ReplyLost,
    Scheduled,
    StoreFailed,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.local_slots import SlotStep
from docket_core.sansio.values import (
    ConcurrencyPolicy,
    Delivery,
    RetryPolicy,
    ScheduleMode,
    TaskPolicy,
)
from docket_core.sansio.worker import WorkerConfig, WorkerMachine

from .shelf import Pool, Shelf
from .sim_invariants import MAX_SKEW, InvariantChecks
from .sim_invariants import InvariantViolated as InvariantViolated
from .store import MemoryStore

REDELIVERY_TIMEOUT = 5.0
#: the steps of a scoped limit's chains: a worker may crash after any one
CHAIN_STEPS = (TakeSlot, ConfirmSlot, Park, ReleaseSlot, WakeParked, Enlist)
#: how often a batch with such a step is the last its worker sends
CHAIN_CRASH_ODDS = 0.01
#: long enough that no record expires during a run: a missing one is a loss
RECORD_TTL = 1e9
LIMITS = {"limit-0": 1, "limit-1": 1, "limit-2": 2}
#: even key index -> its limit: a key of each docket under the shared one
#: (which takes the scoped chain), two keys of one docket under each of the
#: others (which take the one-script path), so that both paths are contended
LIMIT_OF = {0: "limit-0", 6: "limit-0", 4: "limit-1", 8: "limit-1", 2: "limit-2", 10: "limit-2"}
#: the dockets simulated; ``SHARED_LIMIT`` is scoped by ``SCOPE``, so both share it
DOCKETS = ("sim-a", "sim-b")
SCOPE = "shared"
SHARED_LIMIT = "limit-0"
#: key index -> its admission controls (odd keys have no concurrency limit)
ADMISSION: dict[int, tuple[Control, ...]] = {
    1: (DebouncePolicy(key="debounce", settle=2.0),),
    5: (DebouncePolicy(key="debounce", settle=2.0),),
    3: (CooldownPolicy(key="cooldown", window=2.0),),
    7: (CooldownPolicy(key="cooldown", window=2.0),),
    9: (RateLimitPolicy(key="rate", limit=2, per=3.0, scope=SCOPE),),
    11: (RateLimitPolicy(key="rate", limit=2, per=3.0, scope=SCOPE),),
    2: (CooldownPolicy(key="limited", window=1.0),),
}


#: key indices without admission controls or a limit (of both dockets): a
#: fresh delivery of one starts with its claim, not after it (``lifecycle``)
PLAIN = frozenset({12, 13, 14, 15})


def releases(effects: Sequence[StoreEffect]) -> Iterator[ReleaseSlot]:
    """The slot releases among ``effects``, the ones inside steps too (with
    the step's request: a resend of the step is one of the release)."""
    for effect in effects:
        if isinstance(effect, ReleaseSlot):
            yield effect
        elif isinstance(effect, SlotStep) and effect.release is not None:
            yield attrs.evolve(effect.release, request=effect.request)


def claimed_deliveries(effects: Sequence[StoreEffect]) -> Iterator[str]:
    """The deliveries that ``effects`` claim (a claim, or a step that claims)."""
    for effect in effects:
        if isinstance(effect, Claim):
            yield from (item.delivery_id for item in effect.items)
        elif isinstance(effect, SlotStep):
            yield from (take.delivery_id for take in effect.takes)
        elif isinstance(effect, Admit | AcquireSlot | TakeSlot):
            yield effect.delivery_id


def drive(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a memory-store coroutine that never suspends to its result."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value
    coroutine.close()
    raise RuntimeError("a memory store call suspended inside the simulator")


@attrs.frozen
class Sent:
    """A batch the store has had: its fate, and what the worker will hear."""

    effects: list[StoreEffect]
    #: "ok", "lost" (its reply never comes) or "refused" (an error reply)
    kind: str
    outcomes: list[Outcome] | None
    #: whether its request reached the store (one behind it may then too)
    reached: bool


@attrs.define
class SimWorker:
    name: str
    docket: str
    machine: WorkerMachine
    skew: float
    #: delivery id -> (end time, outcome)
    running: dict[str, tuple[float, TaskOutcome]] = attrs.field(factory=dict)
    #: the read the machine asked for, not yet carried out
    read: Read | None = None
    #: a read's result not yet handed to the machine (delayed delivery)
    delayed: list[Delivery] = attrs.field(factory=list)
    #: batches sent whose replies the worker has not heard yet, in order
    out: list[Sent] = attrs.field(factory=list)
    #: the deliveries a sent claim (or claiming step) named
    claimed: set[str] = attrs.field(factory=set)
    alive: bool = True


class Simulation(InvariantChecks):
    def __init__(
        self, seed: int, *, workers: int = 3, keys: int = 16, remember_outcomes: bool = True
    ) -> None:
        self.rng = random.Random(seed)
        self.now = 1_000_000.0
        #: one pool per scope, shared by the dockets' shelves
        self.pools: dict[str, Pool] = {}
        self.shelves = {name: Shelf(name=name, pools=self.pools) for name in DOCKETS}
        self.stores = {
            name: MemoryStore(name=name, shelf=shelf) for name, shelf in self.shelves.items()
        }
        for store in self.stores.values():
            store.remember_outcomes = remember_outcomes
        self.shelf, self.store = self.shelves[DOCKETS[0]], self.stores[DOCKETS[0]]
        #: (origin, seq) of every request sent to a store: a resend is not a
        #: second release
        self.sent: set[tuple[str, int]] = set()
        self.keys = [f"key-{i}" for i in range(keys)]
        self.policies: dict[str, TaskPolicy] = {}
        self.workers: list[SimWorker] = []
        self.serial = 0
        self.faults = True
        #: (docket, key, generation) of every accepted add
        self.accepted: list[tuple[str, str, int]] = []
        #: slot holders whose slots a store call took away (taken over or
        #: dropped as stale): their late releases are allowed
        self.evicted: set[str] = set()
        self.steps = 0
        #: (scope, kind, key) of a control -> execution -> when the store admitted it
        self.admitted: dict[tuple[str | None, str, str], dict[str, float]] = {}
        #: (scope, key) of a debounce -> its latest dropped submission's time
        self.quiet_from: dict[tuple[str | None, str], float] = {}
        #: (origin, seq) of every admission the store judged
        self.judged: set[tuple[str, int]] = set()
        #: workers that died after a step of a chain
        self.chain_crashes = 0
        #: batches sent behind another one still out, and batches refused
        self.behind = 0
        self.refusals = 0
        for i in range(workers):
            self.spawn(DOCKETS[i % len(DOCKETS)])

    # -- helpers -------------------------------------------------------------------

    def spawn(self, docket: str) -> SimWorker:
        self.serial += 1
        config = WorkerConfig(
            name=f"w{self.serial}",
            docket=docket,
            concurrency=self.rng.randint(1, 4),
            redelivery_timeout=REDELIVERY_TIMEOUT,
            heartbeat_interval=2.0,
            execution_ttl=RECORD_TTL,
            origin=f"w{self.serial}#sim",
            reads=True,
            retry_delay=self.rng.choice([0.05, 0.5, 2.0]),
            batches_in_flight=self.rng.choice([1, 2]),
        )
        skew = self.rng.uniform(-MAX_SKEW, MAX_SKEW)
        worker = SimWorker(config.name, docket, WorkerMachine(config, self.now + skew), skew)
        self.workers.append(worker)
        return worker

    def clock(self, worker: SimWorker) -> float:
        return self.now + worker.skew

    def slot_holders(self) -> set[str]:
        """The holders of every slot of every pool."""
        return {h for pool in self.pools.values() for slots in pool.slots.values() for h in slots}

    def note_evictions(self, before: set[str], effects: Sequence[StoreEffect] = ()) -> None:
        """Remember the holders (of ``before``, the holders before a store
        call) whose slots the call took away other than by their own release:
        known at once, even when a stale slot is taken over in the very call
        that first finds it stale."""
        released = {e.holder for e in releases(effects)}
        self.evicted |= before - released - self.slot_holders()

    @staticmethod
    def docket_of(key: str) -> str:
        """Keys alternate between the dockets in pairs, so each docket has
        keys under every limit."""
        return DOCKETS[(int(key.split("-")[1]) // 2) % len(DOCKETS)]

    def policy_for(self, key: str) -> TaskPolicy:
        policy = self.policies.get(key)
        if policy is None:
            index = int(key.split("-")[1])
            limit = None
            if index % 2 == 0 and index not in PLAIN:
                limit_key = LIMIT_OF.get(index, f"limit-{index % len(LIMITS)}")
                limit = ConcurrencyPolicy(
                    limit_key=limit_key,
                    max_concurrent=LIMITS[limit_key],
                    scope=SCOPE if limit_key == SHARED_LIMIT else None,
                )
            retry = RetryPolicy(attempts=3, delay=0.5) if index % 3 == 0 else None
            policy = self.policies[key] = TaskPolicy(
                retry=retry, concurrency=limit, admission=ADMISSION.get(index, ())
            )
        return policy

    def pump(self, worker: SimWorker, *, lose: bool = False) -> None:
        """Carry out the machine's effects until it has none.  A worker that
        may keep two batches out hears the reply to one later at times
        (``SimWorker.out``): the simulation goes on, and the machine may hand
        out the next batch before that reply.  The store runs each batch as
        it is sent; a lost reply loses the replies behind it on the same
        connection too."""
        machine = worker.machine
        while True:
            effects = machine.effects()
            store = [effect for effect in effects if isinstance(effect, StoreEffect)]
            if store and machine.batch_turn is BatchTurn.ALONE and worker.out:
                # (the runtime writes it once the batches ahead are answered)
                if not self.hear(worker):
                    return
            if store and not lose:
                worker.claimed.update(claimed_deliveries(store))
            self.runtime_effects(worker, effects)
            if store:
                if lose:
                    self.crash(worker)  # the batch never reached the store
                    return
                if not self.send(worker, store):
                    return
                if (
                    self.faults
                    and len(worker.out) <= machine.config.batches_in_flight
                    and self.rng.random() < 0.5
                ):
                    return  # its reply comes later: the worker goes on meanwhile
            elif effects:
                continue
            if not worker.out:
                return
            if not self.hear(worker):
                return

    def runtime_effects(self, worker: SimWorker, effects: Sequence[Effect]) -> list[StoreEffect]:
        """Carry out the runtime's effects; returns the store's, in order."""
        store: list[StoreEffect] = []
        for effect in effects:
            self.runtime_effect(worker, effect)
            if isinstance(effect, StoreEffect):
                store.append(effect)
        return store

    def send(self, worker: SimWorker, store: list[StoreEffect]) -> bool:
        """The store runs a batch as it arrives (``SimWorker.out`` keeps its
        answer until the worker hears it); False when the worker died.  Its
        reply may be lost (after the batch ran, or before), and a batch
        behind a lost one on the same connection shares its fate; it may come
        back refused (an error reply: the calls before the refused one ran)."""
        before = worker.out[-1] if worker.out else None
        # (most often for acquisitions: a lost "parked" is the costly case)
        costly = any(
            isinstance(e, AcquireSlot | Admit | TakeSlot | Park)
            or (isinstance(e, SlotStep) and bool(e.takes))
            for e in store
        )
        odds = 0.25 if costly else 0.03
        reply_lost = (before is not None and before.kind == "lost") or (
            self.faults and self.rng.random() < odds
        )
        # or the worker dies after a step of a chain, before the next
        chain_crash = (
            self.faults
            and any(isinstance(e, CHAIN_STEPS) for e in store)
            and self.rng.random() < CHAIN_CRASH_ODDS
        )
        refused = not reply_lost and not chain_crash and self.faults and self.rng.random() < 0.01
        reached = before is None or before.reached
        if refused:
            # (the calls before the refused one ran: a resend answers them
            # from the store's memory)
            self.run(worker, store[: self.rng.randrange(len(store))])
            worker.out.append(Sent(store, "refused", None, reached))
            return True
        outcomes: list[Outcome] | None = None
        if reached and (not reply_lost or chain_crash or self.rng.random() < 0.7):
            outcomes = self.run(worker, store)
        else:
            reached = False
        if chain_crash:
            self.chain_crashes += 1
            self.crash(worker)
            return False
        worker.out.append(Sent(store, "lost" if reply_lost else "ok", outcomes, reached))
        return True

    def run(self, worker: SimWorker, store: list[StoreEffect]) -> list[Outcome]:
        """The store runs ``store`` now."""
        if not store:
            return []
        for release in releases(store):
            self.check_release(worker, release)
        holders = self.slot_holders()
        displaced = self.displaced(worker.docket)
        outcomes: list[Outcome] = drive(self.stores[worker.docket].execute(store))
        self.note_evictions(holders, store)
        self.note_admissions(store, outcomes, displaced)
        return outcomes

    def hear(self, worker: SimWorker) -> bool:
        """The worker hears the replies to its batches out, in order; False
        when a refusal was fatal (the runtime stops the worker)."""
        machine = worker.machine
        sent, worker.out = worker.out, []
        self.behind += max(len(sent) - 1, 0)
        for batch in sent:
            now = self.clock(worker)
            effects = tuple(batch.effects)
            if batch.kind == "refused":
                self.refusals += 1
                machine.receive(StoreFailed(effects=effects, now=now, reason="simulated"))
                if machine.fatal is not None:
                    self.crash(worker)  # (leases recover what it held)
                    return False
            elif batch.outcomes is None or batch.kind == "lost":
                machine.receive(ReplyLost(effects=effects, now=now, reason="simulated"))
            else:
                machine.store_replied(batch.effects, batch.outcomes, now)
            self.check()
        return True

    def runtime_effect(self, worker: SimWorker, effect: Effect) -> None:
        if isinstance(effect, Read):
            assert worker.read is None, "the machine asked for a second read at once"
            worker.read = effect
        elif isinstance(effect, StartTask):
            # a run starts with its claim on the wire, or after its verdict
            assert effect.delivery_id in worker.claimed, (
                f"{worker.name} started {effect.delivery_id} before sending its claim"
            )
            duration = self.rng.choice([0.05, 0.2, 1.0, 3.0, 12.0])
            outcome = TaskOutcome.FAILED if self.rng.random() < 0.2 else TaskOutcome.SUCCEEDED
            worker.running[effect.delivery_id] = (self.clock(worker) + duration, outcome)
        elif isinstance(effect, CancelTask) and effect.delivery_id in worker.running:
            worker.running[effect.delivery_id] = (self.clock(worker), TaskOutcome.CANCELLED)

    # -- actions -----------------------------------------------------------------------

    def add(self) -> None:
        key = self.rng.choice(self.keys)
        mode = ScheduleMode.REPLACE if self.rng.random() < 0.3 else ScheduleMode.ADD
        delay = self.rng.choice([0.0, 0.0, 0.1, 1.0, 4.0])
        effect = plan_add(
            key=key, function="task", payload=b"", when=self.now + delay, mode=mode, now=self.now
        )
        docket = self.docket_of(key)
        (outcome,) = drive(self.stores[docket].execute([effect]))
        assert isinstance(outcome, Scheduled)
        if outcome.accepted:
            self.accepted.append((docket, key, outcome.generation))

    def cancel(self) -> None:
        key = self.rng.choice(self.keys)
        docket = self.docket_of(key)
        drive(self.stores[docket].execute([Cancel(key=key, now=self.now, ttl=RECORD_TTL)]))
        for worker in self.live(docket):
            worker.machine.receive(CancelRequested(key=key, now=self.clock(worker)))
            self.pump(worker)

    def read(self, worker: SimWorker) -> None:
        """Carry out the read the machine asked for, if any."""
        read, worker.read = worker.read, None
        if read is None:
            return
        holders = self.slot_holders()
        result = drive(
            self.stores[worker.docket].read(
                worker=worker.name,
                count=read.count,
                now=self.clock(worker),
                redelivery_timeout=read.redelivery_timeout,
                block=0,
                recover=read.recover,
                stale_scan_every=read.stale_scan_every,
            )
        )
        self.note_evictions(holders)  # (a read drops stale slots)
        deliveries = list(result.deliveries)
        if self.faults and self.rng.random() < 0.03:
            # the reply is lost: the store handed the deliveries out, and the
            # machine's next read must recover them
            worker.machine.receive(ReadFailed(now=self.clock(worker), reason="simulated"))
            self.pump(worker)
            return
        if self.faults and deliveries and self.rng.random() < 0.1:
            worker.delayed.extend(deliveries)  # handed over at a later step
            return
        self.deliver(worker, deliveries, result.fresh)

    def deliver(self, worker: SimWorker, deliveries: list[Delivery], fresh: bool = True) -> None:
        held = worker.machine.in_flight
        arrivals = tuple(
            Arrival(delivery=d, policy=self.policy_for(d.message.key))
            for d in deliveries
            if d.delivery_id not in held
        )
        next_due = self.shelves[worker.docket].next_due()
        worker.machine.receive(
            ReadDone(arrivals=arrivals, next_due=next_due, now=self.clock(worker), fresh=fresh)
        )
        self.pump(worker)

    def finish_due(self, worker: SimWorker) -> None:
        now = self.clock(worker)
        for delivery_id, (end, outcome) in list(worker.running.items()):
            if end <= now:
                del worker.running[delivery_id]
                error = "RuntimeError: simulated" if outcome is TaskOutcome.FAILED else None
                worker.machine.receive(
                    TaskEnded(delivery_id=delivery_id, now=now, outcome=outcome, error=error)
                )
                lose = self.faults and self.rng.random() < 0.01
                self.pump(worker, lose=lose)
                if not worker.alive:
                    return

    def tick(self, worker: SimWorker) -> None:
        deadline = worker.machine.next_deadline()
        if deadline is not None and deadline <= self.clock(worker):
            worker.machine.receive(Tick(now=self.clock(worker)))
            self.pump(worker)

    def crash(self, worker: SimWorker) -> None:
        worker.alive = False
        worker.running.clear()
        worker.out.clear()
        self.workers.remove(worker)
        self.spawn(worker.docket)

    def live(self, docket: str | None = None) -> list[SimWorker]:
        return [w for w in self.workers if w.alive and docket in (None, w.docket)]

    # -- running ------------------------------------------------------------------------

    def step(self) -> None:
        self.steps += 1
        roll = self.rng.random()
        workers = self.live()
        worker = self.rng.choice(workers)
        if roll < 0.25:
            self.add()
        elif roll < 0.28:
            self.cancel()
        elif roll < 0.50:
            self.read(worker)
        elif roll < 0.55 and worker.delayed:
            delayed, worker.delayed = worker.delayed, []
            self.deliver(worker, delayed)
        elif roll < 0.80:
            self.now += self.rng.choice([0.01, 0.05, 0.2, 0.5])
        elif roll < 0.805 and self.faults:
            self.now += self.rng.uniform(REDELIVERY_TIMEOUT, 3 * REDELIVERY_TIMEOUT)
        elif roll < 0.81 and self.faults:
            self.crash(worker)
        for each in self.live():
            self.finish_due(each)
        for each in self.live():
            self.tick(each)
        self.check()

    def settle(self, max_rounds: int = 100_000) -> None:
        """Stop faults and run on until nothing is left anywhere."""
        self.faults = False
        for _ in range(max_rounds):
            for worker in self.live():
                if worker.delayed:
                    delayed, worker.delayed = worker.delayed, []
                    self.deliver(worker, delayed)
                self.read(worker)
                self.finish_due(worker)
                self.tick(worker)
            self.check()
            busy = any(w.machine.in_flight or w.running for w in self.live())
            pending = sum(drive(store.pending()) for store in self.stores.values())
            if not busy and pending == 0:
                break
            self.now += 0.25
        else:
            raise InvariantViolated("the simulation did not settle")
        self.check_nothing_lost()


def simulate(seed: int, steps: int, *, remember_outcomes: bool = True) -> Simulation:
    simulation = Simulation(seed, remember_outcomes=remember_outcomes)
    for _ in range(steps):
        simulation.step()
    simulation.settle()
    return simulation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docket_memory.simulate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed")
    parser.add_argument("--steps", type=int, default=10_000)
    options = parser.parse_args(argv)
    total = 0
    started = time.perf_counter()
    for seed in range(options.seed, options.seed + options.seeds):
        try:
            simulation = simulate(seed, options.steps)
        except InvariantViolated as violation:
            print(f"seed {seed}: INVARIANT VIOLATED: {violation}", file=sys.stderr)
            return 1
        total += simulation.steps
        counters: dict[str, int] = {}
        for worker in simulation.workers:
            for name, count in worker.machine.counters.items():
                counters[name] = counters.get(name, 0) + count
        admitted = sum(len(starts) for starts in simulation.admitted.values())
        print(
            f"seed {seed}: {simulation.steps} steps, {len(simulation.accepted)} adds, "
            f"{admitted} admissions, {simulation.chain_crashes} crashes in a chain, "
            f"{simulation.behind} batches sent behind another, {simulation.refusals} refused, ok"
        )
    elapsed = time.perf_counter() - started
    print(f"{total} steps in {elapsed:.2f}s: {total / elapsed:,.0f} steps/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
