"""A resend the store no longer remembers acts again: on every backend, an
acquisition of a delivery its sender no longer holds (its first send parked
and acknowledged it) answers lost, and takes and parks nothing.

The worker machine never resends past its window (the store's memory
outlasts it); these tests stand for a store that forgot anyway (a failover,
a flushed memo), by resending under another origin."""

from __future__ import annotations

import time

import attrs
import pytest
from helpers import acquisition, claim_as

from docket_core import Docket
from docket_core.sansio.effects import ReleaseSlot, Request
from docket_core.sansio.inputs import SlotAcquired

pytestmark = pytest.mark.anyio


async def noop(n: int) -> None:
    """Never runs here: the tests drive the store directly."""


def request(seq: int, origin: str = "w1#first") -> Request:
    return Request(origin=origin, worker="w1", seq=seq, floor=1, remember=600.0)


async def add(docket: Docket, *keys: str) -> None:
    docket.register(noop)
    for n, key in enumerate(keys):
        await docket.add(noop, key=key)(n)


@pytest.mark.parametrize("slot_free", [True, False], ids=["slot-free", "slot-taken"])
async def test_a_forgotten_acquisition_of_a_parked_delivery_is_lost(
    docket: Docket, slot_free: bool
) -> None:
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
    await docket.adapter.execute([release])  # b is queued again
    (woken,) = await claim_as(docket, "w2", 1, now + 1)
    assert woken.message.key == "b"
    if not slot_free:
        (taken,) = await docket.adapter.execute([acquisition(woken, "w2/b", "L", 1, now=now + 1)])
        assert taken.acquired

    forgotten = attrs.evolve(wait, now=now + 1, request=request(2, origin="w1#forgot"))
    (again,) = await docket.adapter.execute([forgotten])
    assert again == SlotAcquired(delivery_id=b.delivery_id, acquired=False, lost=True)

    # b runs once, on w2: the slot is (or stays) w2's, and b waits nowhere
    if slot_free:
        (taken,) = await docket.adapter.execute([acquisition(woken, "w2/b", "L", 1, now=now + 1)])
        assert taken == SlotAcquired(delivery_id=woken.delivery_id, acquired=True)
    snapshot = await docket.adapter.snapshot(now + 1)
    assert [m.key for m in snapshot.future] == []
    # (a, whose release freed the slot, never recorded its end here)
    assert sorted(r.message.key for r in snapshot.running) == ["a", "b"]
