"""A resent store effect gets its first outcome back, on every backend.

A reply can be lost after the store ran the effect (a server killed after its
append-only-file write, a connection killed), and the worker machine then
sends the batch again.  These tests send an effect, act on the store as the
world would meanwhile, and send the same effect again (same ``Request``, the
``now`` of the new attempt), as the machine does.
"""

from __future__ import annotations

import time

import anyio
import attrs
import pytest
from helpers import acquisition, claim_as

from docket_core import Docket
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import (
    Cancel,
    Claim,
    ClaimItem,
    Finish,
    ReleaseSlot,
    Request,
    Schedule,
)
from docket_core.sansio.inputs import (
    Cancelled,
    Claimed,
    ClaimVerdict,
    Finished,
    Scheduled,
    SlotAcquired,
)
from docket_core.sansio.values import ExecutionState, ScheduleMode

pytestmark = pytest.mark.anyio


async def noop(n: int) -> None:
    """Never runs here: the tests drive the store directly."""


def request(seq: int, floor: int = 1, origin: str = "w1#test") -> Request:
    return Request(origin=origin, worker="w1", seq=seq, floor=floor, remember=600.0)


async def add(docket: Docket, *keys: str) -> None:
    docket.register(noop)
    for n, key in enumerate(keys):
        await docket.add(noop, key=key)(n)


async def test_a_resent_acquisition_that_parked_stays_parked(docket: Docket) -> None:
    """The chaos run's double run: b parks, a's release wakes b (queued
    again), and only then b's resent acquisition arrives.  It must answer
    'parked' as the first send did, and take no slot."""
    now = time.time()
    await add(docket, "a", "b")
    a, b = await claim_as(docket, "w1", 2, now)
    hold = acquisition(a, "w1/a", "L", 1, now=now, request=request(1))
    wait = acquisition(b, "w1/b", "L", 1, now=now, request=request(2))
    assert await docket.adapter.execute([hold, wait]) == [
        SlotAcquired(delivery_id=a.delivery_id, acquired=True),
        SlotAcquired(delivery_id=b.delivery_id, acquired=False),
    ]
    release = ReleaseSlot(limit_key="L", holder="w1/a", now=now, request=request(3))
    await docket.adapter.execute([release])

    (again,) = await docket.adapter.execute([attrs.evolve(wait, now=now + 1)])
    assert again == SlotAcquired(delivery_id=b.delivery_id, acquired=False)

    # b, woken, runs once, on whichever worker reads it: the slot is free for it
    (woken,) = await claim_as(docket, "w2", 1, now + 1)
    assert woken.message.key == "b"
    (taken,) = await docket.adapter.execute([acquisition(woken, "w2/b", "L", 1, now=now + 1)])
    assert taken == SlotAcquired(delivery_id=woken.delivery_id, acquired=True)


async def test_a_resent_acquisition_renews_its_slot(docket: Docket) -> None:
    """A resend long after the first send renews the slot to its own now, so
    the slot is not stale on arrival and nobody takes it over."""
    now = time.time()
    await add(docket, "a", "b")
    a, b = await claim_as(docket, "w1", 2, now)
    first = acquisition(a, "w1/a", "L", 1, now=now, stale_after=30.0, request=request(1))
    assert (await docket.adapter.execute([first]))[0] == SlotAcquired(
        delivery_id=a.delivery_id, acquired=True
    )
    later = now + 100
    (again,) = await docket.adapter.execute([attrs.evolve(first, now=later)])
    assert again == SlotAcquired(delivery_id=a.delivery_id, acquired=True)
    other = acquisition(b, "w1/b", "L", 1, now=later, stale_after=30.0)
    assert (await docket.adapter.execute([other]))[0] == SlotAcquired(
        delivery_id=b.delivery_id, acquired=False
    )


async def test_a_resent_acquisition_whose_slot_was_taken_over_is_lost(docket: Docket) -> None:
    now = time.time()
    await add(docket, "a", "b")
    a, b = await claim_as(docket, "w1", 2, now)
    first = acquisition(a, "w1/a", "L", 1, now=now, stale_after=30.0, request=request(1))
    await docket.adapter.execute([first])
    later = now + 100
    takeover = acquisition(b, "w2/b", "L", 1, now=later, stale_after=30.0)
    assert (await docket.adapter.execute([takeover]))[0] == SlotAcquired(
        delivery_id=b.delivery_id, acquired=True
    )
    (again,) = await docket.adapter.execute([attrs.evolve(first, now=later)])
    assert again == SlotAcquired(delivery_id=a.delivery_id, acquired=False, lost=True)


async def test_a_resent_claim_of_a_delivery_taken_over_is_lost(docket: Docket) -> None:
    now = time.time()
    await add(docket, "a")
    taken = await docket.adapter.read(worker="w1", count=1, now=now, redelivery_timeout=60, block=0)
    (delivery,) = taken.deliveries
    item = ClaimItem(
        delivery_id=delivery.delivery_id, key="a", generation=delivery.message.generation
    )
    claim = Claim(worker="w1", items=(item,), now=now, request=request(1))
    assert await docket.adapter.execute([claim]) == [
        Claimed(verdicts=((delivery.delivery_id, ClaimVerdict.CLAIMED),))
    ]
    # w1's lease lapses and w2 takes the delivery over (the servers measure
    # idleness on their own clock, so this waits a little for real)
    await anyio.sleep(0.05)
    later = time.time() + 100
    over = await docket.adapter.read(
        worker="w2", count=1, now=later, redelivery_timeout=0.02, block=0
    )
    assert [d.delivery_id for d in over.deliveries] == [delivery.delivery_id]
    (again,) = await docket.adapter.execute([attrs.evolve(claim, now=later)])
    assert again == Claimed(verdicts=((delivery.delivery_id, ClaimVerdict.LOST),))


async def test_a_resent_finish_answers_its_first_outcome(docket: Docket) -> None:
    now = time.time()
    await add(docket, "a")
    (delivery,) = await claim_as(docket, "w1", 1, now)
    finish = Finish(
        delivery_id=delivery.delivery_id,
        key="a",
        generation=delivery.message.generation,
        state=ExecutionState.COMPLETED,
        now=now,
        ttl=0,
        request=request(1),
    )
    first = Finished(delivery_id=delivery.delivery_id, recorded=True)
    assert await docket.adapter.execute([finish]) == [first]
    # the record is gone (ttl 0); a second run would say "not recorded"
    assert await docket.adapter.execute([attrs.evolve(finish, now=now + 1)]) == [first]


async def test_a_resent_retry_is_scheduled_once(docket: Docket) -> None:
    now = time.time()
    await add(docket, "a")
    (delivery,) = await claim_as(docket, "w1", 1, now)
    retry = Schedule(
        message=attrs.evolve(delivery.message, when=now + 60, attempt=2),
        mode=ScheduleMode.REPLACE,
        now=now,
        acknowledge=delivery.delivery_id,
        expect_generation=delivery.message.generation,
        request=request(1),
    )
    (first,) = await docket.adapter.execute([retry])
    assert isinstance(first, Scheduled) and first.accepted
    assert await docket.adapter.execute([attrs.evolve(retry, now=now + 1)]) == [first]
    record = await docket.adapter.get_record("a")
    assert record is not None and record.generation == first.generation
    assert record.state is ExecutionState.SCHEDULED


async def test_outcomes_below_the_floor_are_forgotten(docket: Docket) -> None:
    """Once the sender's floor passes a request, its outcome is dropped: a
    (never sent) resend of it would act again."""
    now = time.time()
    await add(docket, "a", "b")
    cancel = Cancel(key="a", now=now, ttl=60, request=request(1))
    assert await docket.adapter.execute([cancel]) == [
        Cancelled(key="a", previous=ExecutionState.QUEUED)
    ]
    assert await docket.adapter.execute([cancel]) == [
        Cancelled(key="a", previous=ExecutionState.QUEUED)
    ]
    later = Cancel(key="b", now=now, ttl=60, request=request(2, floor=2))
    await docket.adapter.execute([later])
    assert await docket.adapter.execute([cancel]) == [
        Cancelled(key="a", previous=ExecutionState.CANCELLED)
    ]


async def test_each_origin_has_its_own_outcomes(docket: Docket) -> None:
    """A restarted worker of the same name is a new origin: its request 1 is
    not answered with its predecessor's outcome."""
    now = time.time()
    await add(docket, "a", "b")
    first = Cancel(key="a", now=now, ttl=60, request=request(1, origin="w1#one"))
    second = Cancel(key="b", now=now, ttl=60, request=request(1, origin="w1#two"))
    assert await docket.adapter.execute([first, second]) == [
        Cancelled(key="a", previous=ExecutionState.QUEUED),
        Cancelled(key="b", previous=ExecutionState.QUEUED),
    ]


async def test_a_resend_without_identity_takes_the_slot(docket: Docket) -> None:
    """The failure the requests prevent, on every backend: resent as before
    the fix (no request, so neither remembered nor checked against its
    holder), the acquisition of a parked delivery takes the freed slot while
    its woken message is queued again for a second run."""
    now = time.time()
    await add(docket, "a", "b")
    a, b = await claim_as(docket, "w1", 2, now)
    wait = acquisition(b, "w1/b", "L", 1, now=now, request=request(2))
    await docket.adapter.execute([acquisition(a, "w1/a", "L", 1, now=now, request=request(1))])
    await docket.adapter.execute([wait])
    await docket.adapter.execute(
        [ReleaseSlot(limit_key="L", holder="w1/a", now=now, request=request(3))]
    )
    (again,) = await docket.adapter.execute([attrs.evolve(wait, now=now + 1, request=None)])
    assert again == SlotAcquired(delivery_id=b.delivery_id, acquired=True)
    (woken,) = await claim_as(docket, "w2", 1, now + 1)
    assert woken.message.key == "b"


async def test_a_late_finish_of_a_delivery_taken_over_changes_nothing(docket: Docket) -> None:
    """w1's finish arrives after its lease lapsed and w2 took the delivery
    over: the run is w2's to record."""
    now = time.time()
    await add(docket, "a")
    (delivery,) = await claim_as(docket, "w1", 1, now)
    await anyio.sleep(0.05)
    over = await docket.adapter.read(
        worker="w2", count=1, now=now + 100, redelivery_timeout=0.02, block=0
    )
    assert [d.delivery_id for d in over.deliveries] == [delivery.delivery_id]
    late = Finish(
        delivery_id=delivery.delivery_id,
        key="a",
        generation=delivery.message.generation,
        state=ExecutionState.FAILED,
        now=now + 100,
        ttl=60,
        request=request(1),
    )
    assert await docket.adapter.execute([late]) == [
        Finished(delivery_id=delivery.delivery_id, recorded=False)
    ]
    record = await docket.adapter.get_record("a")
    assert record is not None and record.state is ExecutionState.RUNNING


def test_a_producer_add_is_not_remembered() -> None:
    """Producers do not resend: their effects carry no request."""
    effect = plan_add(key="k", function="f", payload=b"", when=0.0, mode=ScheduleMode.ADD, now=0)
    assert effect.request is None
