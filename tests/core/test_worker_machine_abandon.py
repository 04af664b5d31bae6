"""A worker that stops without draining (``AbandonRequested``): from then on
its machine hands out nothing, so no end of a run it abandons reaches the
store, and the store hands every delivery it held out again."""

from __future__ import annotations

import pytest
from machines import arrival, claim_all, deliver, end, make_machine, start

from docket_core.sansio.flight import Count
from docket_core.sansio.inputs import (
    AbandonRequested,
    CancelRequested,
    ShutdownRequested,
    TaskEnded,
    TaskOutcome,
    Tick,
)


@pytest.mark.parametrize("outcome", list(TaskOutcome))
def test_a_run_going_when_the_worker_abandons_ends_unrecorded(outcome: TaskOutcome) -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    machine.receive(AbandonRequested(now=1.0))
    assert end(machine, "d1", outcome, 2.0) == []
    assert machine.counters[Count.ABANDONED] == 1
    assert not machine.rescheduled
    assert machine.idle


def test_an_end_not_handed_out_yet_is_dropped() -> None:
    # (the flusher may take the effects after the stop, before it sees its
    # own cancellation: they must hold nothing)
    machine = make_machine()
    start(machine, arrival("d1"))
    machine.receive(TaskEnded(delivery_id="d1", now=1.0, outcome=TaskOutcome.CANCELLED))
    machine.receive(AbandonRequested(now=1.0))
    assert machine.effects() == []


def test_a_draining_stop_that_turns_into_an_abandon_sends_nothing_more() -> None:
    machine = make_machine()
    start(machine, arrival("d1"))
    start(machine, arrival("d2"))
    machine.receive(ShutdownRequested(now=1.0))
    machine.effects()
    machine.receive(AbandonRequested(now=5.0))
    for delivery_id in ("d1", "d2"):
        assert end(machine, delivery_id, TaskOutcome.CANCELLED, 6.0) == []
    machine.receive(Tick(now=100.0))  # no goodbye, no renewal, no heartbeat
    assert machine.effects() == []
    assert not machine.said_goodbye


def test_an_answer_that_comes_after_the_abandon_starts_nothing() -> None:
    machine = make_machine()
    (claim,) = deliver(machine, arrival("d1"), arrival("d2"))
    machine.receive(AbandonRequested(now=1.0))
    assert claim_all(machine, claim, now=1.0) == []
    machine.receive(CancelRequested(key="key-d1", now=2.0))
    assert machine.effects() == []
