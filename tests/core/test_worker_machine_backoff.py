"""The worker machine backs off while the store keeps failing (out of memory,
failing over), and a stopping worker gives up what it cannot send instead of
waiting a whole resend window."""

from __future__ import annotations

from machines import arrival, deliver, end, make_machine, of_type

from docket_core.sansio.effects import Claim, Finish, Heartbeat, StoreEffect
from docket_core.sansio.inputs import (
    Claimed,
    ClaimVerdict,
    ReplyLost,
    ShutdownRequested,
    StoreFailed,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.outbox import BACKOFF_CAP
from docket_core.sansio.worker import WorkerMachine


def fail_and_resend(machine: WorkerMachine, claim: Claim, now: float) -> tuple[Claim, float]:
    """Lose the reply of ``claim`` at ``now``; tick at the resend time and
    return the resent claim and that time."""
    machine.receive(ReplyLost(effects=(claim,), now=now, reason="OOM command not allowed"))
    deadline = machine.outbox.resend_at
    assert deadline is not None
    machine.receive(Tick(now=deadline - 0.001))
    assert of_type(machine.effects(), Claim) == []
    machine.receive(Tick(now=deadline))
    (again,) = of_type(machine.effects(), Claim)
    return again, deadline


def test_resends_back_off_doubling_up_to_a_cap() -> None:
    machine = make_machine(retry_delay=1.0, redelivery_timeout=300.0)
    (claim,) = deliver(machine, arrival("d1"), now=0.0)
    assert isinstance(claim, Claim)
    now, delays = 0.0, []
    for _ in range(6):
        claim, resent_at = fail_and_resend(machine, claim, now)
        delays.append(resent_at - now)
        now = resent_at
    assert delays == [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert BACKOFF_CAP == 4
    assert machine.fatal is None and "d1" in machine.in_flight
    # a reply ends the streak: the next failure waits one retry delay again
    machine.store_replied([claim], [Claimed(verdicts=(("d1", ClaimVerdict.CLAIMED),))], now)
    machine.effects()
    (finish,) = of_type(end(machine, "d1", TaskOutcome.SUCCEEDED, now + 1), Finish)
    machine.receive(ReplyLost(effects=(finish,), now=now + 1, reason="gone"))
    assert machine.outbox.resend_at == now + 2


def test_refusals_back_off_too_until_they_are_fatal() -> None:
    machine = make_machine(retry_delay=1.0, refusals_allowed=3)
    (claim,) = deliver(machine, arrival("d1"), now=0.0)
    machine.receive(StoreFailed(effects=(claim,), now=0.0, reason="ERR nope"))
    assert machine.outbox.resend_at == 1.0
    machine.receive(Tick(now=1.0))
    machine.effects()
    machine.receive(StoreFailed(effects=(claim,), now=1.0, reason="ERR nope"))
    assert machine.outbox.resend_at == 3.0
    machine.receive(Tick(now=3.0))
    machine.effects()
    machine.receive(StoreFailed(effects=(claim,), now=3.0, reason="ERR nope"))
    assert machine.fatal is not None


def test_a_stopping_worker_gives_up_what_it_cannot_send_after_one_more_try() -> None:
    """The store is down as the worker stops: the finish of its last run is
    sent once more, then left to redelivery, and the worker goes quiet long
    before a resend window (the redelivery timeout) has passed."""
    machine = make_machine(retry_delay=1.0, redelivery_timeout=300.0)
    (claim,) = deliver(machine, arrival("d1"), now=0.0)
    machine.store_replied([claim], [Claimed(verdicts=(("d1", ClaimVerdict.CLAIMED),))], 0.0)
    machine.effects()
    machine.receive(ShutdownRequested(now=0.5))
    (finish,) = of_type(end(machine, "d1", TaskOutcome.SUCCEEDED, 1.0), Finish)
    now = 1.0
    batch: tuple[StoreEffect, ...] = (finish,)
    goodbyes, finishes = 0, []
    while batch:
        # every batch is lost, the goodbye heartbeat included
        goodbyes += len([e for e in batch if isinstance(e, Heartbeat) and e.leaving])
        finishes += [e.request for e in batch if isinstance(e, Finish)]
        machine.receive(ReplyLost(effects=batch, now=now, reason="connection refused"))
        batch = tuple(e for e in machine.effects() if isinstance(e, StoreEffect))
        while not batch and not machine.quiet:
            deadline = machine.next_deadline()
            assert deadline is not None
            now = max(deadline, now)
            machine.receive(Tick(now=now))
            batch = tuple(e for e in machine.effects() if isinstance(e, StoreEffect))
    assert now <= 1.0 + 1.0 + 2.0  # a resend of the finish, one of the goodbye
    assert goodbyes == 2
    assert finishes == [finish.request] * 2  # sent once more (the same request), then given up
    assert machine.quiet
    assert machine.counters["given_up"] >= 1
    assert "d1" not in machine.in_flight
    assert machine.said_goodbye
