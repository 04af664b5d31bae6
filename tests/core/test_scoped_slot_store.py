"""The single-slot steps of a scoped limit through the memory store (the
reference for ``TakeSlot``, ``ConfirmSlot``, ``Park``, ``WakeParked`` and
``Enlist``), and worker machines crashing between two of them: what each crash
leaves, and how the retry time recovers it (docs/cluster.md, section 4).  The
machine's side alone is in ``test_scoped_slot_chain.py``."""

from __future__ import annotations

import pytest
from machines import make_machine, of_type

from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import (
    AcquireSlot,
    Cancel,
    Claim,
    ClaimItem,
    Park,
    ReleaseSlot,
    Request,
    StartTask,
    StoreEffect,
    TakeSlot,
    WakeParked,
)
from docket_core.sansio.inputs import (
    Arrival,
    Claimed,
    Delivered,
    Outcome,
    Parked,
    SlotAcquired,
    SlotReleased,
    SlotTaken,
    TaskEnded,
    TaskOutcome,
    WokeParked,
)
from docket_core.sansio.values import (
    ConcurrencyPolicy,
    ExecutionState,
    ScheduleMode,
    TaskPolicy,
)
from docket_core.sansio.worker import WorkerMachine
from docket_memory.shelf import Pool, Shelf
from docket_memory.simulate import drive
from docket_memory.store import MemoryStore

SCOPED = ConcurrencyPolicy(limit_key="L", max_concurrent=1, scope="shared")
LIMITED = TaskPolicy(concurrency=SCOPED)
TIMEOUT = 5.0


def machine_of(docket: str, **settings: object) -> WorkerMachine:
    machine: WorkerMachine = make_machine(docket=docket, redelivery_timeout=TIMEOUT, **settings)
    return machine


# -- the steps through the memory store (the reference) -------------------------------


class Dockets:
    """Two dockets, "A" and "B", of one location: they share the scope's pool."""

    def __init__(self) -> None:
        self.now = 100.0
        self.pools: dict[str, Pool] = {}
        self.shelves = {name: Shelf(name=name, pools=self.pools) for name in "AB"}
        self.stores = {name: MemoryStore(name=name, shelf=s) for name, s in self.shelves.items()}
        self.seq = 0

    def run(self, docket: str, *effects: StoreEffect) -> list[Outcome]:
        outcomes: list[Outcome] = drive(self.stores[docket].execute(effects))
        return outcomes

    def request(self, worker: str = "w1") -> Request:
        self.seq += 1
        return Request(origin="o1", worker=worker, seq=self.seq, floor=1, remember=60.0)

    def claimed(self, docket: str, key: str, worker: str = "w1") -> tuple[str, int]:
        """Add ``key`` to ``docket``, hand it to ``worker`` and claim it."""
        add = plan_add(
            key=key, function="f", payload=b"", when=self.now, mode=ScheduleMode.ADD, now=self.now
        )
        self.run(docket, add)
        result = drive(
            self.stores[docket].read(
                worker=worker, count=1, now=self.now, redelivery_timeout=TIMEOUT, block=0
            )
        )
        (delivery,) = result.deliveries
        generation = delivery.message.generation
        item = ClaimItem(delivery_id=delivery.delivery_id, key=key, generation=generation)
        (claimed,) = self.run(docket, Claim(worker=worker, items=(item,), now=self.now))
        assert isinstance(claimed, Claimed)
        return delivery.delivery_id, generation

    def take(self, docket: str, delivery_id: str, holder: str, **fields: object) -> SlotTaken:
        effect = TakeSlot(
            scope="shared",
            limit_key="L",
            holder=holder,
            max_concurrent=1,
            now=float(fields.pop("now", self.now)),  # type: ignore[arg-type]
            stale_after=TIMEOUT,
            delivery_id=delivery_id,
            docket=docket,
            request=fields.pop("request", None) or self.request(),  # type: ignore[arg-type]
        )
        (taken,) = self.run(docket, effect)
        assert isinstance(taken, SlotTaken)
        return taken

    def park(self, docket: str, delivery_id: str, key: str, generation: int) -> Parked:
        held = self.shelves[docket].held[delivery_id]
        message = held.message
        assert message.generation == generation
        effect = Park(
            delivery_id=delivery_id,
            message=message,
            limit_key="L",
            scope="shared",
            now=self.now,
            retry_at=self.now + TIMEOUT,
            request=self.request(held.worker),
        )
        (parked,) = self.run(docket, effect)
        assert isinstance(parked, Parked)
        return parked

    def release(self, docket: str, holder: str, *, pass_on: bool = False) -> SlotReleased:
        effect = ReleaseSlot(
            limit_key="L",
            holder=holder,
            now=self.now,
            scope="shared",
            pass_on=pass_on,
            request=self.request(),
        )
        (released,) = self.run(docket, effect)
        assert isinstance(released, SlotReleased)
        return released

    def wake(self, runner: str, docket: str) -> WokeParked:
        effect = WakeParked(
            docket=docket, scope="shared", limit_key="L", now=self.now, request=self.request()
        )
        (woke,) = self.run(runner, effect)
        assert isinstance(woke, WokeParked)
        return woke

    @property
    def pool(self) -> Pool:
        return self.pools["shared"]


def test_a_full_limit_parks_in_the_docket_and_a_release_in_another_wakes_it() -> None:
    d = Dockets()
    a_id, _ = d.claimed("A", "a")
    assert d.take("A", a_id, "A/w1/a").acquired
    b_id, b_gen = d.claimed("B", "b", worker="w2")
    assert not d.take("B", b_id, "B/w2/b").acquired
    assert d.pool.waiting_dockets == {"L": {"B": d.now}}
    assert d.park("B", b_id, "b", b_gen) == Parked(delivery_id=b_id, parked=True)
    shelf_b = d.shelves["B"]
    assert shelf_b.records["b"].state is ExecutionState.SCHEDULED
    assert shelf_b.scoped_parked == {"b": ("shared", "L")} and b_id not in shelf_b.held
    assert shelf_b.next_due() == d.now + TIMEOUT  # the retry time
    # A's release names B; the wake-up runs in B (sent by A's worker)
    assert d.release("A", "A/w1/a") == SlotReleased(limit_key="L", woken=0, wake="B")
    assert d.pool.waiting_dockets == {}
    assert d.wake("A", "B") == WokeParked(docket="B", limit_key="L", woken=1)
    assert [m.key for m in shelf_b.ready.values()] == ["b"]
    assert state_of(shelf_b, "b") is ExecutionState.QUEUED
    assert not shelf_b.scoped_parked and not shelf_b.future
    assert drive(d.stores["B"].pending()) == 1


def test_a_wake_up_skips_a_cancelled_waiter_and_counts_the_rest() -> None:
    d = Dockets()
    holder_id, _ = d.claimed("A", "a")
    assert d.take("A", holder_id, "A/w1/a").acquired
    for key in ("b1", "b2", "b3"):
        d.now += 1.0
        delivery_id, generation = d.claimed("B", key, worker="w2")
        assert not d.take("B", delivery_id, f"B/w2/{key}").acquired
        d.park("B", delivery_id, key, generation)
    drive(d.stores["B"].execute([plan_cancel("b1", d.now)]))
    woke = d.wake("A", "B")
    assert (woke.woken, woke.remaining, woke.oldest) == (1, 1, 103.0)
    assert [m.key for m in d.shelves["B"].ready.values()] == ["b2"]


def test_a_crash_after_a_full_take_leaves_a_registration_passed_over() -> None:
    d = Dockets()
    holder_id, _ = d.claimed("A", "a")
    assert d.take("A", holder_id, "A/w1/a").acquired
    b_id, _ = d.claimed("B", "b", worker="w2")
    assert not d.take("B", b_id, "B/w2/b").acquired  # ...and the worker dies
    assert d.release("A", "A/w1/a").wake == "B"
    assert d.wake("A", "B") == WokeParked(docket="B", limit_key="L", woken=0)
    assert d.release("A", "", pass_on=True) == SlotReleased(limit_key="L", woken=0)
    # the delivery itself is handed out again once its lease lapsed
    d.now += TIMEOUT
    again = drive(
        d.stores["B"].read(worker="w3", count=1, now=d.now, redelivery_timeout=TIMEOUT, block=0)
    )
    assert [x.delivery_id for x in again.deliveries] == [b_id]


def test_a_crash_after_an_acquired_take_leaves_a_slot_taken_over_once_stale() -> None:
    d = Dockets()
    a_id, _ = d.claimed("A", "a")
    assert d.take("A", a_id, "A/w1/a").acquired  # ...and the worker dies
    b_id, _ = d.claimed("B", "b", worker="w2")
    assert not d.take("B", b_id, "B/w2/b", now=d.now + TIMEOUT - 0.1).acquired
    assert d.take("B", b_id, "B/w2/b", now=d.now + TIMEOUT).acquired
    assert set(d.pool.slots["L"]) == {"B/w2/b"}
    # the dead holder's late release frees nothing and wakes nobody
    assert d.release("A", "A/w1/a") == SlotReleased(limit_key="L", woken=0)


def test_a_parked_key_retries_at_its_time_and_leaves_its_parking() -> None:
    d = Dockets()
    a_id, _ = d.claimed("A", "a")
    assert d.take("A", a_id, "A/w1/a").acquired
    b_id, b_gen = d.claimed("B", "b", worker="w2")
    d.take("B", b_id, "B/w2/b")
    d.park("B", b_id, "b", b_gen)
    d.now += TIMEOUT
    retried = drive(
        d.stores["B"].read(worker="w2", count=1, now=d.now, redelivery_timeout=TIMEOUT, block=0)
    )
    assert [x.message.key for x in retried.deliveries] == ["b"]
    assert not d.shelves["B"].scoped_parked and not d.shelves["B"].scoped_waiters
    # a wake-up that comes later finds nobody: no second copy is queued
    assert d.wake("A", "B").woken == 0
    assert not d.shelves["B"].ready


def test_resends_answer_their_first_outcome() -> None:
    d = Dockets()
    a_id, _ = d.claimed("A", "a")
    request = d.request()
    assert d.take("A", a_id, "A/w1/a", request=request).acquired
    d.now += 1.0
    # the resend renews the slot to its own time
    assert d.take("A", a_id, "A/w1/a", request=request).acquired
    assert d.pool.slots["L"]["A/w1/a"] == d.now
    b_id, _ = d.claimed("B", "b", worker="w2")
    d.take("B", b_id, "B/w2/b")
    message = d.shelves["B"].held[b_id].message
    park = Park(
        delivery_id=b_id,
        message=message,
        limit_key="L",
        scope="shared",
        now=d.now,
        retry_at=d.now + TIMEOUT,
        request=d.request("w2"),
    )
    first = d.run("B", park)
    assert d.run("B", park) == first == [Parked(delivery_id=b_id, parked=True)]
    assert list(d.shelves["B"].scoped_waiters[("shared", "L")]) == ["b"]
    release = ReleaseSlot(
        limit_key="L", holder="A/w1/a", now=d.now, scope="shared", request=d.request()
    )
    assert d.run("A", release) == d.run("A", release)
    wake = WakeParked(docket="B", scope="shared", limit_key="L", now=d.now, request=d.request())
    assert d.run("A", wake) == d.run("A", wake)
    assert len(d.shelves["B"].ready) == 1  # woken once
    # the slot was taken over (stale) before a resend of its take came
    d.now += TIMEOUT + 1
    c_id, _ = d.claimed("A", "c")
    assert d.take("A", c_id, "A/w1/c").acquired
    late = d.take("A", a_id, "A/w1/a", request=request)
    assert late == SlotTaken(delivery_id=a_id, acquired=False, lost=True)


def test_a_release_hands_the_slot_to_a_waiter_of_the_scopes_own_docket_first() -> None:
    """The docket named like the scope parks through ``AcquireSlot`` in the
    same pool: a scoped release wakes it before any waiting docket."""
    d = Dockets()
    d.shelves["shared"] = shelf = Shelf(name="shared", pools=d.pools)
    d.stores["shared"] = MemoryStore(name="shared", shelf=shelf)
    a_id, _ = d.claimed("A", "a")
    assert d.take("A", a_id, "A/w1/a").acquired
    own_id, _ = d.claimed("shared", "own")
    acquire = AcquireSlot(
        limit_key="L",
        holder="shared/w1/own",
        max_concurrent=1,
        now=d.now,
        stale_after=TIMEOUT,
        delivery_id=own_id,
        message=shelf.held[own_id].message,
        request=d.request(),
    )
    assert d.run("shared", acquire) == [SlotAcquired(delivery_id=own_id, acquired=False)]
    b_id, _ = d.claimed("B", "b", worker="w2")
    assert not d.take("B", b_id, "B/w2/b").acquired
    assert d.release("A", "A/w1/a") == SlotReleased(limit_key="L", woken=1)
    assert [m.key for m in shelf.ready.values()] == ["own"]
    assert d.pool.waiting_dockets == {"L": {"B": d.now}}  # B's turn comes next


def state_of(shelf: Shelf, key: str) -> ExecutionState:
    return shelf.records[key].state


def plan_cancel(key: str, now: float) -> Cancel:
    return Cancel(key=key, now=now, ttl=60.0)


# -- workers crashing between two steps: the retry time recovers ----------------------


class Pair:
    """A worker machine on each of the dockets "A" and "B", over ``Dockets``."""

    def __init__(self) -> None:
        self.d = Dockets()
        self.machines = {name: machine_of(name, name=f"w{name}") for name in "AB"}
        #: keys whose task function started, in order
        self.started: list[str] = []

    def add(self, docket: str, key: str) -> None:
        d = self.d
        effect = plan_add(
            key=key, function="f", payload=b"", when=d.now, mode=ScheduleMode.ADD, now=d.now
        )
        d.run(docket, effect)

    def pump(self, docket: str, crash_after: type[StoreEffect] | None = None) -> None:
        """Carry out the machine's effects; with ``crash_after``, the worker
        dies once the store ran a batch with such a step (it never hears)."""
        machine = self.machines[docket]
        while effects := machine.effects():
            for effect in of_type(effects, StartTask):
                self.started.append(machine.in_flight[effect.delivery_id].message.key)
            batch = [e for e in effects if isinstance(e, StoreEffect)]
            if not batch:
                continue
            outcomes = self.d.run(docket, *batch)
            if crash_after is not None and of_type(batch, crash_after):
                del self.machines[docket]
                return
            machine.store_replied(batch, outcomes, self.d.now)

    def read(self, docket: str) -> None:
        machine = self.machines[docket]
        result = drive(
            self.d.stores[docket].read(
                worker=machine.config.name,
                count=4,
                now=self.d.now,
                redelivery_timeout=TIMEOUT,
                block=0,
            )
        )
        arrivals = tuple(Arrival(delivery=x, policy=LIMITED) for x in result.deliveries)
        if arrivals:
            machine.receive(Delivered(arrivals=arrivals, now=self.d.now))
            self.pump(docket)

    def end(self, docket: str, key: str, crash_after: type[StoreEffect] | None = None) -> None:
        machine = self.machines[docket]
        (delivery_id,) = [d for d, f in machine.in_flight.items() if f.message.key == key]
        machine.receive(
            TaskEnded(delivery_id=delivery_id, now=self.d.now, outcome=TaskOutcome.SUCCEEDED)
        )
        self.pump(docket, crash_after)

    def parked(self) -> list[str]:
        """Keys of "B" parked behind the scoped limit."""
        return sorted(self.d.shelves["B"].scoped_parked)


def _holder_and_parked(pair: Pair, *keys: str) -> None:
    """ "a" runs on A holding the slot; ``keys`` of B park behind it."""
    pair.add("A", "a")
    pair.read("A")
    assert pair.started == ["a"]
    for key in keys:
        pair.add("B", key)
        pair.d.now += 0.1
    pair.read("B")
    assert pair.parked() == sorted(keys)
    assert pair.d.pool.waiting_dockets == {"L": {"B": pytest.approx(pair.d.now, abs=1)}}


def _until_retry(pair: Pair, key: str) -> None:
    """Nothing wakes ``key`` before its retry time; at that time it runs."""
    pair.d.now += TIMEOUT - 0.5
    pair.read("B")
    assert key not in pair.started and key in pair.parked()
    pair.d.now += 0.5
    pair.read("B")
    assert pair.started[-1] == key and key not in pair.parked()


def test_a_crash_between_a_release_and_its_wake_up_is_recovered_by_the_retry_time() -> None:
    pair = Pair()
    _holder_and_parked(pair, "b")
    pair.end("A", "a", crash_after=ReleaseSlot)  # the release ran; no wake-up follows
    assert pair.d.pool.slots.get("L", {}) == {} and not pair.d.pool.waiting_dockets
    _until_retry(pair, "b")


def test_a_crash_between_a_wake_up_and_its_enlistment_is_recovered_by_the_retry_time() -> None:
    pair = Pair()
    _holder_and_parked(pair, "b1", "b2")
    pair.end("A", "a", crash_after=WakeParked)  # b1 woken; B not enlisted again
    assert pair.parked() == ["b2"] and not pair.d.pool.waiting_dockets
    pair.read("B")
    assert pair.started == ["a", "b1"]
    pair.end("B", "b1")  # its release finds no docket waiting
    assert pair.started == ["a", "b1"]
    _until_retry(pair, "b2")


def test_without_a_crash_the_chain_wakes_every_waiter_in_turn() -> None:
    pair = Pair()
    _holder_and_parked(pair, "b1", "b2")
    pair.end("A", "a")
    assert pair.d.pool.waiting_dockets == {"L": {"B": pytest.approx(pair.d.now, abs=1)}}
    pair.read("B")
    pair.end("B", "b1")
    pair.read("B")
    assert pair.started == ["a", "b1", "b2"]
    pair.end("B", "b2")
    assert not pair.parked() and not pair.d.pool.waiting_dockets
    assert all(not m.chains.open for m in pair.machines.values())


def test_a_release_between_a_take_and_its_park_is_caught_by_the_recheck() -> None:
    """The release came after B's ``TakeSlot`` found the limit full and
    before its ``Park``: its wake-up found nobody parked in B.  The recheck
    after the park takes the free slot, enlists B and gives the slot back,
    so b runs now, not at its retry time."""
    pair = Pair()
    pair.add("A", "a")
    pair.read("A")
    pair.add("B", "b")
    machine_b = pair.machines["B"]
    result = drive(
        pair.d.stores["B"].read(
            worker="wB", count=1, now=pair.d.now, redelivery_timeout=TIMEOUT, block=0
        )
    )
    arrivals = tuple(Arrival(delivery=x, policy=LIMITED) for x in result.deliveries)
    machine_b.receive(Delivered(arrivals=arrivals, now=pair.d.now))
    for expected in (Claim, TakeSlot):  # one batch at a time, up to the park
        (effect,) = machine_b.effects()
        assert isinstance(effect, expected)
        machine_b.store_replied([effect], pair.d.run("B", effect), pair.d.now)
    (park,) = machine_b.effects()
    assert isinstance(park, Park)
    pair.end("A", "a")  # released: B woken, nobody there; passed on to nobody
    assert not pair.d.pool.waiting_dockets and not pair.d.pool.slots.get("L")
    machine_b.store_replied([park], pair.d.run("B", park), pair.d.now)
    pair.pump("B")  # the recheck, its enlistment and release, the wake-up
    pair.read("B")
    assert pair.started == ["a", "b"]
