"""A worker machine keeps at most ``batches_in_flight`` batches out, and its
outbox's floor never passes a batch whose reply may still be resent
(``sansio.outbox``): a second batch out beside the first, a failure of the
first with the second still out, a batch lost behind a failed one.  And it
says when each batch is written (``BatchTurn``): a run that starts with its
claim never starts before it."""

from __future__ import annotations

from machines import arrival, deliver, make_machine, of_type

from docket_core.sansio.effects import (
    BatchTurn,
    CancelTask,
    Claim,
    Effect,
    Finish,
    Read,
    Request,
    StartTask,
    StoreEffect,
)
from docket_core.sansio.inputs import (
    Arrival,
    CancelRequested,
    Claimed,
    ClaimVerdict,
    HeartbeatSent,
    ReadDone,
    ReplyLost,
    StoreFailed,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.outbox import Outbox
from docket_core.sansio.worker import WorkerMachine


def claims(machine: WorkerMachine, *ids: str, now: float = 0.0) -> Claim:
    (claim,) = of_type(deliver(machine, *(arrival(d) for d in ids), now=now), Claim)
    return claim


def claimed(claim: Claim) -> Claimed:
    return Claimed(verdicts=tuple((i.delivery_id, ClaimVerdict.CLAIMED) for i in claim.items))


def seq(effect: StoreEffect) -> int:
    request: Request | None = getattr(effect, "request", None)
    assert request is not None
    return request.seq


def test_store_effects_wait_while_as_many_batches_are_out_as_may_be() -> None:
    machine = make_machine(batches_in_flight=2)
    first = claims(machine, "d1")
    second = claims(machine, "d2")
    assert machine.outbox.out == 2 and machine.outbox.full
    # a third batch waits for a reply: nothing of it is handed out
    assert of_type(deliver(machine, arrival("d3")), Claim) == []
    machine.store_replied([first], [claimed(first)], 0.1)
    (third,) = of_type(machine.effects(), Claim)
    assert [i.delivery_id for i in third.items] == ["d3"]
    assert machine.outbox.out == 2
    machine.store_replied([second], [claimed(second)], 0.2)
    machine.store_replied([third], [claimed(third)], 0.3)
    assert machine.outbox.out == 0


def test_one_batch_at_a_time_where_the_store_keeps_no_order() -> None:
    machine = make_machine(batches_in_flight=1)
    first = claims(machine, "d1")
    assert of_type(deliver(machine, arrival("d2")), Claim) == []
    machine.store_replied([first], [claimed(first)], 0.1)
    (second,) = of_type(machine.effects(), Claim)
    assert [i.delivery_id for i in second.items] == ["d2"]


def test_the_floor_stays_at_the_oldest_batch_out() -> None:
    machine = make_machine(batches_in_flight=2)
    first = claims(machine, "d1")
    second = claims(machine, "d2")
    assert machine.outbox.floor == seq(first)
    machine.store_replied([first], [claimed(first)], 0.1)
    assert machine.outbox.floor == seq(second)
    machine.store_replied([second], [claimed(second)], 0.2)
    assert machine.outbox.floor == seq(second) + 1


def test_a_reply_behind_a_refused_batch_keeps_the_floor_below_it() -> None:
    """The store refused the first batch (an error reply: the calls before
    the refused one ran, and their outcomes answer its resend) and answered
    the second: the requests made until the resend carry a floor at or
    below the first batch, so the store keeps what the resend needs."""
    machine = make_machine(batches_in_flight=2, retry_delay=1.0)
    first = claims(machine, "d1")
    second = claims(machine, "d2")
    machine.receive(StoreFailed(effects=(first,), now=0.1, reason="OOM"))
    machine.store_replied([second], [claimed(second)], 0.2)
    assert machine.outbox.floor == seq(first)
    assert machine.outbox.request().floor == seq(first)
    # the failed batch goes again at its time, and only then the floor moves
    machine.receive(Tick(now=1.1))
    (again,) = of_type(machine.effects(), Claim)
    assert seq(again) == seq(first)
    machine.store_replied([again], [claimed(again)], 1.2)
    assert machine.outbox.floor > seq(second)


def test_a_batch_lost_behind_a_lost_one_is_sent_again_after_it() -> None:
    """The connection of both batches dropped: both replies are lost, and the
    resend carries them in the order they went out, after one backoff (the
    second failure is part of the first, not a streak of its own)."""
    machine = make_machine(batches_in_flight=2, retry_delay=1.0)
    first = claims(machine, "d1")
    second = claims(machine, "d2")
    machine.receive(ReplyLost(effects=(first,), now=0.1, reason="gone"))
    machine.receive(ReplyLost(effects=(second,), now=0.1, reason="gone"))
    assert machine.outbox.resend_at == 1.1
    assert machine.outbox.floor == seq(first)
    machine.receive(Tick(now=1.1))
    resent = of_type(machine.effects(), Claim)
    assert [seq(c) for c in resent] == [seq(first), seq(second)]
    assert all(c.now == 1.1 for c in resent)


def test_a_batch_answered_behind_a_failed_one_does_not_end_its_streak() -> None:
    machine = make_machine(batches_in_flight=2, retry_delay=1.0, refusals_allowed=2)
    first = claims(machine, "d1")
    second = claims(machine, "d2")
    machine.receive(StoreFailed(effects=(first,), now=0.1, reason="ERR"))
    machine.store_replied([second], [claimed(second)], 0.2)
    machine.receive(Tick(now=1.1))
    (again,) = of_type(machine.effects(), Claim)
    machine.receive(StoreFailed(effects=(again,), now=1.2, reason="ERR"))
    assert machine.fatal is not None  # two refusals in a row: the reply between did not count


def test_the_outbox_counts_batches_answered_out_of_order() -> None:
    """A batch handed out and never sent (a stopping runtime's) leaves the
    count of those answered after it right."""
    outbox = Outbox(
        origin="o", worker="w", remember=30.0, retry_delay=1.0, resend_window=5.0,
        refusals_allowed=3, in_flight=2,
    )  # fmt: skip
    machine = make_machine(batches_in_flight=2)
    first, second = claims(machine, "d1"), claims(machine, "d2")
    outbox.sent([first])
    outbox.sent([second])
    outbox.replied([second])
    assert outbox.out == 1 and outbox.floor == seq(first)
    outbox.replied([first])
    assert outbox.out == 0


def reading_machine(batches_in_flight: int) -> WorkerMachine:
    """A machine that asked for a read at 0.0, its fresh deliveries starting
    with their claims."""
    machine = make_machine(batches_in_flight=batches_in_flight, reads=True, redelivery_timeout=40.0)
    machine.receive(Tick(now=0.0))
    effects = machine.effects()
    assert of_type(effects, Read)
    store = [e for e in effects if isinstance(e, StoreEffect)]
    # (its first heartbeat is answered: nothing is out)
    machine.store_replied(store, [HeartbeatSent() for _ in store], 0.0)
    assert machine.outbox.out == 0
    return machine


def read_done(machine: WorkerMachine, *arrivals: Arrival, now: float = 0.1) -> list[Effect]:
    machine.receive(ReadDone(arrivals=arrivals, next_due=None, now=now))
    return [e for e in machine.effects() if not isinstance(e, Read)]


def kinds(effects: list[Effect]) -> list[tuple[str, str]]:
    return [
        (type(e).__name__, getattr(e, "delivery_id", "") or e.items[0].delivery_id)  # type: ignore[attr-defined]
        for e in effects
    ]


def test_an_idle_workers_pickup_is_written_once_the_batches_ahead_are_answered() -> None:
    """An idle worker's claim goes out alone: a cancel sent once its run
    started finds the claim done, not queued behind a batch on the server."""
    machine = reading_machine(batches_in_flight=2)
    assert kinds(read_done(machine, arrival("d1"))) == [("Claim", "d1"), ("StartTask", "d1")]
    assert machine.batch_turn is BatchTurn.ALONE


def test_a_busy_workers_claim_is_written_before_the_runs_it_starts() -> None:
    machine = reading_machine(batches_in_flight=2)
    read_done(machine, arrival("d1"))
    # (d1 runs: the next read's runs start with a claim beside the batch out)
    assert kinds(read_done(machine, arrival("d2"), now=0.2)) == [
        ("Claim", "d2"),
        ("StartTask", "d2"),
    ]
    assert machine.batch_turn is BatchTurn.BEFORE_RUNS


def test_a_batch_without_a_claim_of_runs_it_starts_goes_beside() -> None:
    machine = reading_machine(batches_in_flight=2)
    (claim, _) = read_done(machine, arrival("d1"))
    machine.receive(TaskEnded(delivery_id="d1", now=0.2, outcome=TaskOutcome.SUCCEEDED))
    machine.store_replied([claim], [claimed(claim)], 0.3)  # type: ignore[list-item]
    assert of_type(machine.effects(), Finish)
    assert machine.batch_turn is BatchTurn.BESIDE


def test_a_run_waits_with_its_claim_while_the_batches_out_are_full() -> None:
    """A read comes back while as many batches are out as may be: its runs
    that start with their claim wait with it, and a cancel of one waits
    after it, so no run starts before its claim is on the wire."""
    machine = reading_machine(batches_in_flight=1)
    (first, _) = read_done(machine, arrival("d1"))
    assert machine.outbox.full
    assert read_done(machine, arrival("d2", key="k2"), now=0.2) == []
    assert machine.outbox.waiting_for_claim == {"d2"}
    machine.receive(CancelRequested(key="k2", now=0.3))
    assert of_type(machine.effects(), CancelTask) == []
    machine.store_replied([first], [claimed(first)], 0.4)  # type: ignore[list-item]
    effects = [e for e in machine.effects() if not isinstance(e, Read)]
    assert kinds(effects) == [("Claim", "d2"), ("StartTask", "d2"), ("CancelTask", "d2")]
    assert machine.batch_turn is BatchTurn.BEFORE_RUNS
    assert machine.outbox.waiting_for_claim == frozenset()
    assert isinstance(effects[1], StartTask)


def test_a_batch_held_back_goes_out_stamped_with_the_time_it_goes() -> None:
    """Store effects held while the batches out are full go out with the time
    of the reply that let them go, as a resend does: a store that stalled
    must not receive them with the time they were decided (a slot or lease
    they take or renew would look older than it is to other workers)."""
    machine = make_machine(batches_in_flight=1)
    first = claims(machine, "d1", now=1.0)
    assert of_type(deliver(machine, arrival("d2"), now=2.0), Claim) == []
    machine.store_replied([first], [claimed(first)], 9.0)
    (second,) = of_type(machine.effects(), Claim)
    assert [i.delivery_id for i in second.items] == ["d2"]
    assert second.now == 9.0
    # (and one that was never held keeps its own time)
    machine.store_replied([second], [claimed(second)], 9.5)
    (third,) = of_type(deliver(machine, arrival("d3"), now=9.7), Claim)
    assert third.now == 9.7
