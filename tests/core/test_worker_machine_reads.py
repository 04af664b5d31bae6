"""The worker machine decides its reads: how many deliveries to ask for, how
long to block, when to recover lost deliveries, and when a worker running
until finished is done."""

from __future__ import annotations

from machines import arrival, make_machine, of_type

from docket_core.sansio.effects import Claim, Finish, Heartbeat, Read, RenewLeases, StartTask
from docket_core.sansio.inputs import (
    Claimed,
    ClaimVerdict,
    ReadDone,
    ReadFailed,
    ShutdownRequested,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.worker import WorkerMachine


def reading_machine(**settings: object) -> WorkerMachine:
    settings.setdefault("reads", True)
    settings.setdefault("read_block", 0.25)
    return make_machine(**settings)


def test_a_read_asks_for_the_free_capacity_and_only_one_is_out() -> None:
    machine = reading_machine(concurrency=3)
    machine.receive(Tick(now=0.0))
    (read,) = of_type(machine.effects(), Read)
    assert (read.count, read.block, read.recover, read.then_pending) == (3, 0.25, False, False)
    machine.receive(Tick(now=0.1))
    assert of_type(machine.effects(), Read) == []
    machine.receive(ReadDone(arrivals=(arrival("d1"),), next_due=None, now=0.2))
    effects = machine.effects()
    assert len(of_type(effects, Claim)) == 1
    (again,) = of_type(effects, Read)
    assert again.count == 2


def test_a_read_never_blocks_past_the_soonest_due_time() -> None:
    machine = reading_machine()
    machine.receive(Tick(now=0.0))
    machine.effects()
    machine.receive(ReadDone(arrivals=(), next_due=10.1, now=10.0))
    (read,) = of_type(machine.effects(), Read)
    assert abs(read.block - 0.1) < 1e-9


def test_a_full_worker_reads_again_once_a_delivery_ends() -> None:
    machine = reading_machine(concurrency=1)
    machine.receive(Tick(now=0.0))
    machine.effects()
    # (a delivery handed out again is claimed before it starts)
    machine.receive(ReadDone(arrivals=(arrival("d1", redelivered=True),), next_due=None, now=0.0))
    (claim,) = of_type(machine.effects(), Claim)
    assert machine.capacity == 0
    machine.store_replied([claim], [Claimed(verdicts=(("d1", ClaimVerdict.SUPERSEDED),))], 0.1)
    (read,) = of_type(machine.effects(), Read)
    assert read.count == 1


def test_runs_that_end_together_make_one_read_that_goes_out_with_their_ends() -> None:
    machine = reading_machine(concurrency=3)
    machine.receive(Tick(now=0.0))
    machine.effects()
    arrivals = tuple(arrival(f"d{i}", redelivered=True) for i in range(3))
    machine.receive(ReadDone(arrivals=arrivals, next_due=None, now=0.0))
    (claim,) = of_type(machine.effects(), Claim)
    verdicts = tuple((f"d{i}", ClaimVerdict.CLAIMED) for i in range(3))
    machine.store_replied([claim], [Claimed(verdicts=verdicts)], 0.1)
    machine.effects()  # (the starts)
    assert machine.capacity == 0
    for i in range(3):
        machine.receive(TaskEnded(delivery_id=f"d{i}", now=0.2, outcome=TaskOutcome.SUCCEEDED))
    effects = machine.effects()
    # the three ends, and one read for all their room in the same drain
    assert len(of_type(effects, Finish)) == 3
    (read,) = of_type(effects, Read)
    assert read.count == 3 and read.now == 0.2


def test_a_failed_read_is_followed_by_a_recovering_one_after_the_delay() -> None:
    machine = reading_machine(retry_delay=2.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    machine.receive(ReadFailed(now=1.0, reason="connection lost"))
    assert of_type(machine.effects(), Read) == []
    assert machine.next_deadline() == 2.0  # the heartbeat; the read waits until 3.0
    machine.receive(Tick(now=2.0))
    assert of_type(machine.effects(), Read) == []
    assert machine.next_deadline() == 3.0
    machine.receive(Tick(now=3.0))
    (read,) = of_type(machine.effects(), Read)
    assert read.recover and read.block == 0.0
    assert machine.counters["store_errors"] == 1


def test_until_finished_stops_once_an_empty_read_finds_nothing_pending() -> None:
    machine = reading_machine(until_finished=True)
    machine.receive(Tick(now=0.0))
    (read,) = of_type(machine.effects(), Read)
    assert read.then_pending
    machine.receive(ReadDone(arrivals=(), next_due=None, now=0.1, pending=1))
    assert not machine.finished
    machine.effects()
    machine.receive(ReadDone(arrivals=(), next_due=None, now=0.2, pending=0))
    assert machine.finished
    (goodbye,) = machine.effects()
    assert goodbye == Heartbeat(worker="w1", tasks=(), now=0.2, leaving=True)


def test_a_read_still_out_at_shutdown_is_taken_in_before_goodbye() -> None:
    """Deliveries a read brings must reach the machine (and be drained), or
    they would wait in the store for their leases to lapse."""
    machine = reading_machine()
    machine.receive(Tick(now=0.0))
    machine.effects()
    machine.receive(ShutdownRequested(now=0.1))
    assert of_type(machine.effects(), Heartbeat) == []
    machine.receive(ReadDone(arrivals=(arrival("d1"),), next_due=None, now=0.2))
    effects = machine.effects()
    assert of_type(effects, Claim) and not of_type(effects, Read)
    assert not machine.said_goodbye


def test_a_malformed_entry_is_buried_with_its_reason_and_never_claimed() -> None:
    from docket_core.sansio.effects import BuryMalformed
    from docket_core.sansio.inputs import Buried
    from docket_core.sansio.values import MalformedEntry

    machine = reading_machine(concurrency=2, execution_ttl=0.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    entry = MalformedEntry(delivery_id="bad", reason="no g", key="k", generation=None)
    machine.receive(ReadDone(arrivals=(arrival("d1"),), next_due=None, now=1.0, malformed=(entry,)))
    effects = machine.effects()
    (bury,) = of_type(effects, BuryMalformed)
    (claim,) = of_type(effects, Claim)
    assert bury.entry == entry and bury.now == 1.0 and bury.request is not None
    assert bury.ttl == 3600.0  # a failure nobody could run stays visible
    assert [item.delivery_id for item in claim.items] == ["d1"]
    assert "bad" not in machine.in_flight and machine.counters["malformed"] == 1
    machine.store_replied([bury], [Buried(delivery_id="bad", moved=True)], 1.1)
    assert machine.counters["dead_lettered"] == 1


def test_a_recovering_read_that_brings_more_than_the_room_runs_no_more_than_concurrency() -> None:
    """A recovering read hands back every delivery the store counts as this
    worker's: those beyond the room wait, held, and go on as runs end."""
    machine = reading_machine(concurrency=2, start_early=False)
    machine.receive(Tick(now=0.0))
    machine.effects()
    arrivals = tuple(arrival(f"d{i}", redelivered=True) for i in range(5))
    machine.receive(ReadDone(arrivals=arrivals, next_due=None, now=0.0))
    effects = machine.effects()
    (claim,) = of_type(effects, Claim)
    assert [item.delivery_id for item in claim.items] == ["d0", "d1"]
    assert of_type(effects, Read) == []  # (five held, none of them finishing)
    assert set(machine.in_flight) == {f"d{i}" for i in range(5)}
    machine.store_replied(
        [claim],
        [Claimed(verdicts=(("d0", ClaimVerdict.CLAIMED), ("d1", ClaimVerdict.CLAIMED)))],
        0.1,
    )
    started = of_type(machine.effects(), StartTask)
    assert [start.delivery_id for start in started] == ["d0", "d1"]
    # the waiting ones are held: their leases are renewed with the others'
    machine.receive(Tick(now=machine.config.renew_interval))
    (renewal,) = of_type(machine.effects(), RenewLeases)
    assert set(renewal.delivery_ids) == {f"d{i}" for i in range(5)}
    # one run ends: the oldest waiting delivery goes on, and only it
    machine.receive(TaskEnded(delivery_id="d0", now=0.2, outcome=TaskOutcome.SUCCEEDED))
    effects = machine.effects()
    assert len(of_type(effects, Finish)) == 1
    (claim,) = of_type(effects, Claim)
    assert [item.delivery_id for item in claim.items] == ["d2"]
    assert of_type(effects, Read) == []
