"""A worker that cannot renew its leases stops its runs ``fence_after`` its
last renewal, on a timer of its own: not at the next renewal or heartbeat
tick, which may come up to an interval later, when another worker may take
the slot over already (simulator seed 6, a store acting again on resends:
two runs under a limit of one)."""

from __future__ import annotations

import pytest
from machines import LIMIT, UNLIMITED_BATCHES, arrival, of_type, start_limited

from docket_core.sansio.effects import CancelTask, StopReason, StoreEffect
from docket_core.sansio.inputs import ReplyLost, Tick
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

    now, fenced_at = taken_at, None
    while fenced_at is None and now < taken_at + config.redelivery_timeout:
        deadline = machine.next_deadline()
        assert deadline is not None
        now = max(deadline, now)
        machine.receive(Tick(now=now))
        effects = machine.effects()
        batch = tuple(e for e in effects if isinstance(e, StoreEffect))
        if batch:  # the store never answers
            machine.receive(ReplyLost(effects=batch, now=now, reason="gone"))
            effects += machine.effects()
        if any(stop.reason is StopReason.LEASE_LOST for stop in of_type(effects, CancelTask)):
            fenced_at = now
    assert fenced_at is not None
    assert fenced_at == pytest.approx(taken_at + config.fence_after)
