"""A read looks for deliveries whose worker stopped renewing them only where
no read of the docket's went through them within ``stale_scan_every``
seconds (the ``StorageAdapter.read`` contract, on every backend): a busy
docket's reads mostly skip the look, and a delivery of a dead worker is
taken over at most that much later.  A look cut short by the read's count
goes on with the next read, however soon it comes.

The servers count a delivery's idle time on their own clock, so the
deliveries here really go stale (a half-second timeout, slept out); the
scans' times are the reads' ``now``."""

from __future__ import annotations

import time

import anyio
import pytest
from helpers import claim_as

from docket_core import Docket
from docket_core.adapter import ReadResult

pytestmark = pytest.mark.anyio

TIMEOUT = 0.5
EVERY = 30.0


async def noop(n: int) -> None:
    """Never runs here: the tests drive the store directly."""


async def held_by_a_dead_worker(docket: Docket, count: int) -> float:
    """``count`` deliveries claimed by worker ``dead``, stale once this
    returns; the time they were claimed."""
    docket.register(noop)
    for n in range(count):
        await docket.add(noop, key=f"k{n}")(n)
    claimed_at = time.time()
    assert len(await claim_as(docket, "dead", count, claimed_at)) == count
    return claimed_at


async def read(docket: Docket, now: float, count: int = 10, every: float = EVERY) -> ReadResult:
    return await docket.adapter.read(
        worker="w2",
        count=count,
        now=now,
        redelivery_timeout=TIMEOUT,
        block=0,
        stale_scan_every=every,
    )


async def test_a_read_within_the_interval_of_a_look_does_not_look_again(docket: Docket) -> None:
    claimed_at = await held_by_a_dead_worker(docket, 3)
    # a look, before they are stale: nothing to take over
    assert (await read(docket, claimed_at + 0.001)).deliveries == ()
    await anyio.sleep(TIMEOUT + 0.1)
    # stale now, but the last look was within EVERY: not looked for
    assert (await read(docket, claimed_at + 0.002)).deliveries == ()
    assert (await read(docket, claimed_at + EVERY - 1)).deliveries == ()
    # EVERY after the look: taken over
    taken = await read(docket, claimed_at + 0.001 + EVERY)
    assert sorted(d.message.key for d in taken.deliveries) == ["k0", "k1", "k2"]
    assert all(d.redelivered for d in taken.deliveries)


async def test_a_read_that_looks_every_time_takes_over_at_once(docket: Docket) -> None:
    claimed_at = await held_by_a_dead_worker(docket, 2)
    assert (await read(docket, claimed_at + 0.001)).deliveries == ()
    await anyio.sleep(TIMEOUT + 0.1)
    taken = await read(docket, time.time(), every=0)
    assert sorted(d.message.key for d in taken.deliveries) == ["k0", "k1"]


async def test_a_look_cut_short_goes_on_with_the_next_read(docket: Docket) -> None:
    claimed_at = await held_by_a_dead_worker(docket, 30)
    await anyio.sleep(TIMEOUT + 0.1)
    now = claimed_at + EVERY + 1  # (a look is due)
    keys: list[str] = []
    for step in range(30):
        # each read takes one over, and the look it cut short goes on at once
        (delivery,) = (await read(docket, now + step * 0.001, count=1)).deliveries
        assert delivery.redelivered
        keys.append(delivery.message.key)
    assert sorted(keys) == sorted(f"k{n}" for n in range(30))
    # through: the next look waits for EVERY
    assert (await read(docket, now + 0.1, count=1)).deliveries == ()
