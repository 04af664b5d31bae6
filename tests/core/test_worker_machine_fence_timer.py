"""A worker that cannot renew its leases stops its runs ``fence_after`` its
last renewal, on a timer of its own: not at the next renewal or heartbeat
tick, which may come up to an interval later, when another worker may take
the slot over already (simulator seed 6, a store acting again on resends:
two runs under a limit of one)."""

from __future__ import annotations

import pytest
from machines import (
    LIMIT,
    UNLIMITED_BATCHES,
    arrival,
    claim_all,
    deliver,
    fenced_with_no_answer,
    of_type,
    reply,
    start_limited,
    stepped,
)

from docket_core.sansio.effects import RenewLeases, StartTask
from docket_core.sansio.inputs import LeasesRenewed, Tick
from docket_core.sansio.values import TaskPolicy
from docket_core.sansio.worker import WorkerConfig, WorkerMachine


@pytest.mark.parametrize("taken_at", [0.0, 0.3, 0.6, 1.0, 1.2, 2.9])
@pytest.mark.parametrize("retry_delay", [0.05, 0.5, 2.0])
def test_runs_are_fenced_on_time_when_every_batch_is_lost(
    taken_at: float, retry_delay: float
) -> None:
    config = WorkerConfig(
        name="w1",
        redelivery_timeout=5.0,
        heartbeat_interval=2.0,
        retry_delay=retry_delay,
        batches_in_flight=UNLIMITED_BATCHES,  # (its first heartbeat is never answered)
    )
    machine = WorkerMachine(config, 0.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    start_limited(machine, arrival("d1", policy=TaskPolicy(concurrency=LIMIT)), now=taken_at)

    fenced_at = fenced_with_no_answer(machine, taken_at, taken_at + config.redelivery_timeout)
    assert fenced_at == pytest.approx(taken_at + config.fence_after)


def test_a_slot_taken_under_a_renewal_that_does_not_name_it_is_fenced_from_its_take() -> None:
    """A renewal decided while a delivery's slot step was out names the
    delivery but not the slot; answered, it renews the delivery's lease
    only, and the slot still counts from the step that took it.  The run is
    fenced ``fence_after`` that step, before another worker may take the
    slot as stale, not ``fence_after`` the renewal (simulator seed 1017: two
    runs under a limit of one)."""
    config = WorkerConfig(
        name="w1",
        redelivery_timeout=5.0,
        heartbeat_interval=2.0,
        retry_delay=0.5,
        batches_in_flight=UNLIMITED_BATCHES,  # (its first heartbeat is never answered)
    )
    machine = WorkerMachine(config, 0.0)
    machine.receive(Tick(now=0.0))
    machine.effects()
    (step,) = deliver(machine, arrival("d1", policy=TaskPolicy(concurrency=LIMIT)), now=1.0)
    machine.receive(Tick(now=1.5))
    (renewal,) = of_type(machine.effects(), RenewLeases)
    assert renewal.delivery_ids == ("d1",) and renewal.slots == ()
    assert of_type(reply(machine, step, stepped(step), now=1.6), StartTask)
    machine.store_replied([renewal], [LeasesRenewed(lost=(), lost_slots=())], 1.7)
    assert machine.effects() == []

    assert fenced_with_no_answer(machine, 1.7, 10.0) == pytest.approx(1.0 + config.fence_after)


@pytest.mark.parametrize("limited", [False, True])
def test_an_answer_that_comes_after_the_fence_never_starts_the_run(limited: bool) -> None:
    """A claim (or slot step) answered once the delivery's lease lapsed (a
    reply stalled past ``fence_after``): the run does not start before the
    next tick could fence it (simulator seeds 88 and 2002: two runs under a
    shared limit of one, each worker's answer arriving after a clock jump)."""
    machine = WorkerMachine(WorkerConfig(name="w1", batches_in_flight=UNLIMITED_BATCHES), 0.0)
    policy = TaskPolicy(concurrency=LIMIT) if limited else TaskPolicy()
    (sent,) = deliver(machine, arrival("d1", policy=policy, redelivered=True), now=0.0)
    late = machine.config.fence_after + 1.0
    if limited:
        effects = reply(machine, sent, stepped(sent), late)
    else:
        effects = claim_all(machine, sent, late)
    assert of_type(effects, StartTask) == []
    assert machine.counters["fenced"] == 1 and machine.counters["abandoned"] == 1
    assert "d1" not in machine.in_flight
    if limited:  # the slot it took goes back (the store frees it only for this holder)
        (release_step,) = effects
        assert release_step.release is not None and release_step.release.holder == "w1/d1"
