"""A read frees the slots of a limit with waiters whose holders stopped
renewing them, and wakes a waiter for each, on every backend (the
``StorageAdapter.read`` contract).

The stores find such limits through an index kept by every change to a
limit's slots and waiters (``S:stale`` on the servers, ``Pool.watched`` in
memory), so these tests move a limit's times every way they move, and check
that a read neither misses a limit that is due nor wakes one that is not.
The tests drive the store directly, at virtual times (a read's ``now``).
"""

from __future__ import annotations

import time

import pytest
from helpers import acquisition, claim_as

from docket_core import Docket
from docket_core.sansio.effects import AcquireSlot, ReleaseSlot, RenewLeases
from docket_core.sansio.inputs import LeasesRenewed, SlotAcquired, SlotReleased
from docket_core.sansio.values import Delivery, HeldSlot

pytestmark = pytest.mark.anyio

#: the holders' and the reads' timeout
TIMEOUT = 60.0


async def noop(n: int) -> None:
    """Never runs here: the tests drive the store directly."""


async def take_or_park(docket: Docket, now: float, *keys: str) -> dict[str, Delivery]:
    """Deliveries of ``keys``; the first takes limit L's one slot (as holder
    ``h-<key>``) at ``now``, the others park behind it."""
    docket.register(noop)
    for n, key in enumerate(keys):
        await docket.add(noop, key=key)(n)
    deliveries = {d.message.key: d for d in await claim_as(docket, "w1", len(keys), now)}
    outcomes = await docket.adapter.execute([acquire(deliveries[key], now) for key in keys])
    assert [o.acquired for o in outcomes if isinstance(o, SlotAcquired)] == [True] + [False] * (
        len(keys) - 1
    )
    return deliveries


def acquire(delivery: Delivery, now: float) -> AcquireSlot:
    return acquisition(delivery, f"h-{delivery.message.key}", "L", 1, now=now, stale_after=TIMEOUT)


async def woken_by_read(docket: Docket, now: float) -> list[str]:
    """The keys a read at ``now`` hands out afresh (a waiter it, or an
    earlier step, queued again); deliveries handed back as redelivered (the
    memory store's leases run on the virtual clock) are not counted."""
    read = await docket.adapter.read(
        worker="w2", count=10, now=now, redelivery_timeout=TIMEOUT, block=0
    )
    return sorted(d.message.key for d in read.deliveries if not d.redelivered)


async def renew(docket: Docket, holder: str, now: float) -> LeasesRenewed:
    (renewed,) = await docket.adapter.execute(
        [
            RenewLeases(
                worker="w1",
                delivery_ids=(),
                slots=(HeldSlot(limit_key="L", holder=holder),),
                now=now,
            )
        ]
    )
    assert isinstance(renewed, LeasesRenewed)
    return renewed


async def test_a_waiter_is_woken_once_its_holder_stopped_renewing(docket: Docket) -> None:
    now = time.time()
    await take_or_park(docket, now, "a", "b")
    assert await woken_by_read(docket, now + TIMEOUT / 2) == []
    assert await woken_by_read(docket, now + TIMEOUT + 1) == ["b"]
    # the stale holder lost its slot
    assert (await renew(docket, "h-a", now + TIMEOUT + 2)).lost_slots == ("h-a",)


async def test_a_renewal_puts_the_wake_up_off(docket: Docket) -> None:
    now = time.time()
    await take_or_park(docket, now, "a", "b")
    assert (await renew(docket, "h-a", now + 40)).lost_slots == ()
    assert await woken_by_read(docket, now + TIMEOUT + 1) == []
    assert await woken_by_read(docket, now + 40 + TIMEOUT + 1) == ["b"]


async def test_a_slot_taken_over_counts_from_its_new_holder(docket: Docket) -> None:
    """c takes a's stale slot over (no read freed it first): b waits on,
    until c in turn stops renewing."""
    now = time.time()
    await take_or_park(docket, now, "a", "b")
    await docket.add(noop, key="c")(2)
    (c,) = await claim_as(docket, "w1", 1, now)
    (taken,) = await docket.adapter.execute([acquire(c, now + TIMEOUT + 1)])
    assert taken == SlotAcquired(delivery_id=c.delivery_id, acquired=True)
    assert await woken_by_read(docket, now + TIMEOUT + 2) == []
    assert await woken_by_read(docket, now + 2 * TIMEOUT + 2) == ["b"]


async def test_a_woken_waiter_that_never_takes_the_slot_passes_it_on(docket: Docket) -> None:
    """a releases and b is woken, but b never comes for the slot (its worker
    died before, say): once the timeout has passed since b was woken, c is."""
    now = time.time()
    await take_or_park(docket, now, "a", "b", "c")
    (released,) = await docket.adapter.execute(
        [ReleaseSlot(limit_key="L", holder="h-a", now=now + 1)]
    )
    assert released == SlotReleased(limit_key="L", woken=1)
    assert await woken_by_read(docket, now + 2) == ["b"]
    assert await woken_by_read(docket, now + TIMEOUT / 2) == []
    assert await woken_by_read(docket, now + TIMEOUT + 2) == ["c"]


async def test_a_release_moves_the_wake_up_to_the_next_holder(docket: Docket) -> None:
    """b, woken by a's release, takes the slot late and renews nothing: c is
    woken once b's slot is stale, counted from b's taking it."""
    now = time.time()
    await take_or_park(docket, now, "a", "b", "c")
    await docket.adapter.execute([ReleaseSlot(limit_key="L", holder="h-a", now=now + 1)])
    (b,) = await claim_as(docket, "w2", 1, now + 2)
    (taken,) = await docket.adapter.execute([acquire(b, now + 30)])
    assert taken == SlotAcquired(delivery_id=b.delivery_id, acquired=True)
    assert await woken_by_read(docket, now + TIMEOUT + 2) == []
    assert await woken_by_read(docket, now + 30 + TIMEOUT + 1) == ["c"]


async def test_a_holder_without_waiters_keeps_its_slot_until_it_is_taken_over(
    docket: Docket,
) -> None:
    """Nobody waits: whether a read frees the stale slot (the memory store)
    or leaves it to the slot set's expiry (the servers), the next
    acquisition gets it, and its old holder has lost it."""
    now = time.time()
    await take_or_park(docket, now, "a")
    await woken_by_read(docket, now + TIMEOUT + 1)
    await docket.add(noop, key="b")(1)
    (b,) = await claim_as(docket, "w1", 1, now + TIMEOUT + 2)
    (taken,) = await docket.adapter.execute([acquire(b, now + TIMEOUT + 2)])
    assert taken == SlotAcquired(delivery_id=b.delivery_id, acquired=True)
    assert (await renew(docket, "h-a", now + TIMEOUT + 3)).lost_slots == ("h-a",)
