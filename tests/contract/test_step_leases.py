"""A slot step's takes renew their deliveries' leases only when asked
(``SlotStep.renew``, on every backend): a worker whose read was answered soon
leaves the leases as that read made them (the machine counts them from the
read), and one that read late, or recovered a lost read, renews them with the
step, as ``Claim.renew`` does for unlimited tasks.

The servers count a delivery's idle time on their own clock, so the leases
here really age (a one-second timeout, slept out); every ``now`` is the
clock's."""

from __future__ import annotations

import time

import anyio
import pytest

from docket_core import ConcurrencyLimit, Docket
from docket_core.sansio.effects import Request
from docket_core.sansio.local_slots import TAKE_ACQUIRED, SlotStep, SlotStepped, SlotTake

pytestmark = pytest.mark.anyio

TIMEOUT = 1.0
LIMIT = ConcurrencyLimit("customer", 1)


async def limited(customer: int, limit: ConcurrencyLimit = LIMIT) -> None:
    """Never runs here: the tests drive the store directly."""


async def test_a_step_renews_the_leases_of_its_takes_only_when_asked(docket: Docket) -> None:
    docket.register(limited)
    for n in range(2):
        await docket.add(limited, key=f"k{n}")(n)
    taken = await docket.adapter.read(
        worker="w1", count=2, now=time.time(), redelivery_timeout=TIMEOUT, block=0
    )
    deliveries = sorted(taken.deliveries, key=lambda d: d.message.key)
    assert [d.message.key for d in deliveries] == ["k0", "k1"]
    await anyio.sleep(0.6)
    now = time.time()
    steps = [
        SlotStep(
            takes=(SlotTake(d.delivery_id, d.message, f"customer:{n}", 1, f"w1/{d.delivery_id}"),),
            stale_after=60.0,
            now=now,
            renew=renew,
            request=Request(origin="o1", worker="w1", seq=n + 1, floor=0, remember=60.0),
        )
        for n, (d, renew) in enumerate(zip(deliveries, (False, True), strict=True))
    ]
    outcomes = await docket.adapter.execute(steps)
    assert [o.takes for o in outcomes if isinstance(o, SlotStepped)] == [(TAKE_ACQUIRED,)] * 2
    # k0's lease is 1.2 s old by now (from the read), k1's 0.6 s (from its step)
    await anyio.sleep(0.6)
    again = await docket.adapter.read(
        worker="w2",
        count=10,
        now=time.time(),
        redelivery_timeout=TIMEOUT,
        block=0,
        stale_scan_every=0,
    )
    assert [d.message.key for d in again.deliveries] == ["k0"]
    assert again.deliveries[0].redelivered
