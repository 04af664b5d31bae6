"""A worker machine keeps at most ``batches_in_flight`` batches out, and its
outbox's floor never passes a batch whose reply may still be resent
(``sansio.outbox``): a second batch out beside the first, a failure of the
first with the second still out, a batch lost behind a failed one."""

from __future__ import annotations

from machines import arrival, deliver, make_machine, of_type

from docket_core.sansio.effects import Claim, Request, StoreEffect
from docket_core.sansio.inputs import Claimed, ClaimVerdict, ReplyLost, StoreFailed, Tick
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
