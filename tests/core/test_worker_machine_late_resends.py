"""A resend that comes too late is given up, not sent.

The store remembers a worker's outcomes for ``remember`` (more than two
resend windows) after its last request; a worker that stalls between a lost
reply and its resend (a pause, a clock jump) may find them forgotten, and a
forgotten resend acts again.  Seed 413 of the simulator: a resent acquisition
(today a step's take) that had parked its delivery parked it a second time,
after a release had queued it again (queued and parked at once: a second run)."""

from __future__ import annotations

from machines import LIMIT, arrival, deliver, make_machine, of_type

from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import (
    AcquireSlot,
    Claim,
    ReleaseSlot,
    StartTask,
    StoreEffect,
)
from docket_core.sansio.inputs import Arrival, Delivered, ReplyLost, Tick
from docket_core.sansio.local_slots import TAKE_PARKED, SlotStep, SlotStepped
from docket_core.sansio.values import ConcurrencyPolicy, ScheduleMode, TaskMessage, TaskPolicy
from docket_memory.shelf import Shelf
from docket_memory.simulate import drive
from docket_memory.store import MemoryStore

LIMITED = TaskPolicy(concurrency=LIMIT)
#: a limit of one slot, for the replay through the store
ONE = ConcurrencyPolicy(limit_key="one", max_concurrent=1)


def test_a_resend_due_past_the_window_is_given_up_not_sent() -> None:
    machine = make_machine(retry_delay=0.5, redelivery_timeout=5.0)
    (step,) = deliver(machine, arrival("d1", policy=LIMITED), now=0.0)
    machine.receive(ReplyLost(effects=(step,), now=0.0, reason="gone"))
    # held back behind the lost batch
    assert deliver(machine, arrival("d2"), now=0.2) == []
    # due at 0.5, but the worker stalled until past the resend window
    machine.receive(Tick(now=14.0))
    effects = machine.effects()
    assert of_type(effects, SlotStep) == []
    assert "d1" not in machine.in_flight  # left to the store
    assert machine.counters["given_up"] == 1
    # what waited behind it goes out now, stamped with the time it goes
    (claim,) = of_type(effects, Claim)
    assert [item.delivery_id for item in claim.items] == ["d2"] and claim.now == 14.0
    assert machine.outbox.resend_at is None


def test_a_loss_heard_late_counts_the_window_from_the_send() -> None:
    """Simulator seed 265: a batch's loss was heard 11.5 s after it went
    out, its resend went at once, and the store, whose memory of the
    request (12 s) had lapsed, judged its admission again: the window counts
    from the batch's send, so that batch is given up, not sent again."""
    machine = make_machine(retry_delay=0.5, redelivery_timeout=5.0)
    (step,) = deliver(machine, arrival("d1", policy=LIMITED), now=0.0)
    window = machine.config.resend_window
    machine.receive(ReplyLost(effects=(step,), now=window + 1.0, reason="gone"))
    assert of_type(machine.effects(), SlotStep) == []
    machine.receive(Tick(now=window + 2.0))
    assert of_type(machine.effects(), SlotStep) == []
    assert "d1" not in machine.in_flight  # left to the store
    assert machine.counters["given_up"] == 1
    # a loss heard in time is still sent again
    machine = make_machine(retry_delay=0.5, redelivery_timeout=5.0)
    (step,) = deliver(machine, arrival("d2", policy=LIMITED), now=20.0)
    machine.receive(ReplyLost(effects=(step,), now=20.5, reason="gone"))
    assert machine.effects() == []
    resend_at = machine.outbox.resend_at
    assert resend_at is not None and resend_at < 20.0 + window
    machine.receive(Tick(now=resend_at))
    (again,) = of_type(machine.effects(), SlotStep)
    assert again.takes[0].delivery_id == "d2"


def test_a_resend_in_time_is_still_sent_even_when_stopping() -> None:
    """The window is the store's memory: a stopping worker's one more try,
    a retry delay after the failure, still goes."""
    machine = make_machine(retry_delay=2.0, redelivery_timeout=5.0)
    (step,) = deliver(machine, arrival("d1", policy=LIMITED), now=0.0)
    machine.receive(ReplyLost(effects=(step,), now=0.0, reason="gone"))
    machine.outbox.stop()
    machine.receive(Tick(now=2.0))
    (again,) = of_type(machine.effects(), SlotStep)
    assert again.request == step.request and again.now == 2.0


def _read(store: MemoryStore, worker: str, now: float) -> list[Arrival]:
    result = drive(store.read(worker=worker, count=1, now=now, redelivery_timeout=5.0, block=0))
    return [Arrival(delivery=d, policy=TaskPolicy(concurrency=ONE)) for d in result.deliveries]


def _outside_holder(holder: str, now: float) -> AcquireSlot:
    """A slot taken by another worker's run (no request: nothing to remember)."""
    message = TaskMessage(key="elsewhere", function="f", payload=b"", when=now)
    return AcquireSlot(
        limit_key=ONE.limit_key,
        holder=holder,
        max_concurrent=1,
        now=now,
        stale_after=5.0,
        delivery_id="elsewhere",
        message=message,
    )


def test_a_stalled_worker_never_parks_a_woken_delivery_twice() -> None:
    """The machine and the memory store, replaying simulator seed 413."""
    shelf = Shelf(name="d")
    store = MemoryStore(name="d", shelf=shelf)
    machine = make_machine(name="w1", origin="w1#a", retry_delay=0.05, redelivery_timeout=5.0)
    drive(store.execute([_outside_holder("other", 0.0)]))  # the slot is taken
    add = plan_add(key="k", function="f", payload=b"", when=0.0, mode=ScheduleMode.ADD, now=0.0)
    drive(store.execute([add]))

    def run(effects: list[StoreEffect], now: float) -> None:
        machine.store_replied(effects, drive(store.execute(effects)), now)

    machine.receive(Delivered(arrivals=tuple(_read(store, "w1", 0.0)), now=0.0))
    (step,) = of_type(machine.effects(), SlotStep)  # claimed and parked in one step
    assert drive(store.execute([step])) == [
        SlotStepped(takes=(TAKE_PARKED,))
    ]  # parked (and acknowledged), but the reply is lost
    machine.receive(ReplyLost(effects=(step,), now=0.0, reason="gone"))

    # the slot frees (k is queued again), and a third run takes it
    release = ReleaseSlot(limit_key=ONE.limit_key, holder="other", now=1.0)
    drive(store.execute([release]))
    assert list(shelf.ready_ids) == ["k"] and not shelf.parked
    drive(store.execute([_outside_holder("third", 16.0)]))

    # w1 wakes from its stall long after the store forgot its requests
    machine.receive(Tick(now=20.0))
    run(of_type(machine.effects(), StoreEffect), 20.0)
    assert of_type(machine.effects(), StartTask) == []
    assert list(shelf.ready_ids) == ["k"], "k is queued once"
    assert not shelf.parked and not shelf.pool().waiters, "and waits behind no limit"
