"""What a read's deliveries ask of the store about their leases.

A delivery's lease counts from the read that handed it out.  When the read
was answered soon after it was asked (within half a renewal interval), its
``Claim`` leaves the leases as they are (``renew=False``: no ``XCLAIM`` on
the servers) and the machine counts them from the moment it asked for the
read, which is no later than the store handed them out; a read answered
late, or one that recovered what a lost reply handed out, renews them with
the claim.  A limited delivery's ``SlotStep`` claims it: its ``renew``
follows the same rule, and a delivery that waited in the worker for a slot
renews with its step.  Reads look for other workers' stale deliveries only
every ``stale_scan_every`` (a tenth of the redelivery timeout, at most a
second)."""

from __future__ import annotations

import pytest
from machines import arrival, fenced_with_no_answer, make_machine, of_type

from docket_core.sansio.effects import Claim, Effect, Read
from docket_core.sansio.inputs import Arrival, ReadDone, ReadFailed, Tick
from docket_core.sansio.local_slots import HOLD_FOR, SlotStep
from docket_core.sansio.values import ConcurrencyPolicy, TaskPolicy
from docket_core.sansio.worker import WorkerConfig, WorkerMachine

TIMEOUT = 8.0  # renew_interval 2.0, fence_after 6.0


def asked_at(when: float, **settings: object) -> tuple[WorkerMachine, Read]:
    """A reading machine that asked for its first read at ``when``."""
    settings.setdefault("reads", True)
    settings.setdefault("redelivery_timeout", TIMEOUT)
    machine = make_machine(**settings)
    machine.receive(Tick(now=when))
    (read,) = of_type(machine.effects(), Read)
    return machine, read


def answered(
    machine: WorkerMachine, now: float, *arrivals: Arrival, fresh: bool = True
) -> list[Effect]:
    machine.receive(ReadDone(arrivals=arrivals, next_due=None, now=now, fresh=fresh))
    return machine.effects()


@pytest.mark.parametrize("start_early", [True, False])
def test_a_read_answered_soon_is_claimed_without_renewing_and_counts_from_its_asking(
    start_early: bool,
) -> None:
    machine, _ = asked_at(1.0, start_early=start_early)
    (claim,) = of_type(answered(machine, 1.9, arrival("d1"), arrival("d2")), Claim)
    assert claim.renew is False
    assert claim.now == 1.9
    # the store handed them out after 1.0: their leases count from then
    assert {f.renewed_at for f in machine.in_flight.values()} == {1.0}


def test_a_read_answered_late_renews_with_its_claim() -> None:
    machine, _ = asked_at(1.0)
    (claim,) = of_type(answered(machine, 2.1, arrival("d1")), Claim)  # (> 1.0 + 2.0 / 2)
    assert claim.renew is True
    assert machine.in_flight["d1"].renewed_at == 2.1


def test_deliveries_the_store_handed_out_before_the_read_renew_with_their_claim() -> None:
    """A read that hands out what an earlier read brought (a partitioned
    docket keeps what its blocking reads bring): not fresh, however soon."""
    machine, _ = asked_at(1.0)
    (claim,) = of_type(answered(machine, 1.01, arrival("d1"), fresh=False), Claim)
    assert claim.renew is True
    assert machine.in_flight["d1"].renewed_at == 1.01


def test_a_fresh_lease_is_fenced_from_the_read_even_after_an_idle_confirmation() -> None:
    """An idle tick between the read's asking and its answer confirms every
    lease held (none) at its time: the fence still counts from the read."""
    machine, _ = asked_at(1.5)
    machine.receive(Tick(now=2.0))
    machine.effects()
    answered(machine, 2.4, arrival("d1"))
    assert machine.in_flight["d1"].renewed_at == 1.5
    fenced_at = fenced_with_no_answer(machine, 2.4, 1.5 + TIMEOUT)
    assert fenced_at == pytest.approx(1.5 + machine.config.fence_after)


def test_a_read_that_recovers_renews_with_its_claim() -> None:
    """A recovering read hands back what this worker held already (leases
    as old as the lost read): the claim renews them."""
    machine, _ = asked_at(1.0)
    machine.receive(ReadFailed(now=1.1, reason="no reply"))
    again = 1.1 + machine.config.retry_delay
    machine.receive(Tick(now=again))
    (read,) = of_type(machine.effects(), Read)
    assert read.recover
    effects = answered(machine, again + 0.1, arrival("d1"))
    (claim,) = of_type(effects, Claim)
    assert claim.renew is True
    # and the next read (asked as the effects were drained), answered soon, does not
    assert of_type(effects, Read)
    (claim,) = of_type(answered(machine, again + 0.2, arrival("d2")), Claim)
    assert claim.renew is False


def test_leases_left_unrenewed_are_fenced_from_the_reads_asking() -> None:
    """No renewal ever answered: the runs stop ``fence_after`` the moment
    the read was asked, not the moment it was answered."""
    machine, _ = asked_at(1.0)
    answered(machine, 1.9, arrival("d1"))
    fenced_at = fenced_with_no_answer(machine, 1.9, 1.0 + TIMEOUT)
    assert fenced_at == pytest.approx(1.0 + machine.config.fence_after)


@pytest.mark.parametrize(("timeout", "every"), [(300.0, 1.0), (10.0, 1.0), (5.0, 0.5), (0.2, 0.02)])
def test_reads_look_for_stale_deliveries_every_tenth_of_the_timeout_at_most_a_second(
    timeout: float, every: float
) -> None:
    assert WorkerConfig(name="w", redelivery_timeout=timeout).stale_scan_every == every
    _, read = asked_at(0.0, redelivery_timeout=timeout)
    assert read.stale_scan_every == every


# -- limited deliveries: their slot step claims them -------------------------------------------

SERIAL = TaskPolicy(concurrency=ConcurrencyPolicy(limit_key="limit:one", max_concurrent=1))


def test_a_read_answered_soon_takes_its_slots_without_renewing() -> None:
    machine, _ = asked_at(1.0)
    (step,) = of_type(answered(machine, 1.9, arrival("d1", policy=SERIAL)), SlotStep)
    assert step.renew is False
    assert machine.in_flight["d1"].renewed_at == 1.0


@pytest.mark.parametrize("late", [True, False])
def test_a_late_or_not_fresh_read_renews_with_its_slot_step(late: bool) -> None:
    machine, _ = asked_at(1.0)
    effects = answered(machine, 2.1 if late else 1.01, arrival("d1", policy=SERIAL), fresh=late)
    (step,) = of_type(effects, SlotStep)
    assert step.renew is True


def test_a_delivery_that_waited_here_renews_with_its_slot_step() -> None:
    """Its step goes out after the read, whenever: it renews."""
    machine, _ = asked_at(1.0)
    effects = answered(machine, 1.5, arrival("d1", policy=SERIAL), arrival("d2", policy=SERIAL))
    (first,) = of_type(effects, SlotStep)
    assert [take.delivery_id for take in first.takes] == ["d1"] and first.renew is False
    machine.receive(Tick(now=1.5 + HOLD_FOR))
    (waited,) = of_type(machine.effects(), SlotStep)
    assert [take.delivery_id for take in waited.takes] == ["d2"] and waited.renew is True
