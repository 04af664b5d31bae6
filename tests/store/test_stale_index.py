"""The servers' index of the limits that have waiters (``S:stale``): what it
holds after each change to a limit, what a read looks at through it, and the
set of waiting limits an older docket kept (``S:waiting``), taken over.

``tests/contract/test_stale_slots.py`` checks on every backend that the
reads free what they must; these look at the keys on the server.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
from helpers import acquisition, claim_as
from servers import Server

from docket_core import Docket
from docket_core.sansio.effects import AcquireSlot, ReleaseSlot, RenewLeases
from docket_core.sansio.inputs import SlotAcquired
from docket_core.sansio.values import Delivery, HeldSlot, TaskMessage

pytestmark = [pytest.mark.anyio, pytest.mark.backends("redis-asyncio", "glide_valkey-asyncio")]

TIMEOUT = 60.0


async def noop(n: int) -> None:
    """Never runs here: the tests drive the store directly."""


def inspector(server: Server | None) -> redis.Redis:
    assert server is not None
    return redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True)


async def deliveries_of(docket: Docket, now: float, *keys: str) -> dict[str, Delivery]:
    docket.register(noop)
    async with docket.batch() as batch:
        for n, key in enumerate(keys):
            batch.add(noop, key=key)(n)
    return {d.message.key: d for d in await claim_as(docket, "w1", len(keys), now)}


def acquire(delivery: Delivery, limit: str, now: float) -> AcquireSlot:
    holder = f"h-{delivery.message.key}"
    return acquisition(delivery, holder, limit, 1, now=now, stale_after=TIMEOUT)


async def woken_by_read(docket: Docket, now: float) -> list[str]:
    read = await docket.adapter.read(
        worker="w2", count=100, now=now, redelivery_timeout=TIMEOUT, block=0
    )
    return sorted(d.message.key for d in read.deliveries if not d.redelivered)


async def test_the_index_follows_every_change_of_a_waiting_limit(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    """Scored with the oldest slot renewal, or the last wake-up while nobody
    holds a slot; gone once the last waiter is woken."""
    client = inspector(server_for())
    stale = "{" + docket.name + "}:stale"
    now = time.time()
    found = await deliveries_of(docket, now, "a", "b", "c")
    await docket.adapter.execute([acquire(found["a"], "L", now + 1)])
    assert client.zscore(stale, "L") is None  # nobody waits yet
    await docket.adapter.execute([acquire(found[k], "L", now + 2) for k in "bc"])
    assert client.zscore(stale, "L") == pytest.approx(now + 1)
    renewal = HeldSlot(limit_key="L", holder="h-a")
    await docket.adapter.execute(
        [RenewLeases(worker="w1", delivery_ids=(), slots=(renewal,), now=now + 5)]
    )
    assert client.zscore(stale, "L") == pytest.approx(now + 5)
    await docket.adapter.execute([ReleaseSlot(limit_key="L", holder="h-a", now=now + 6)])
    assert client.zscore(stale, "L") == pytest.approx(now + 6)  # b woken, nobody holds
    (b,) = await claim_as(docket, "w2", 1, now + 7)
    await docket.adapter.execute([acquire(b, "L", now + 8)])
    assert client.zscore(stale, "L") == pytest.approx(now + 8)
    await docket.adapter.execute([ReleaseSlot(limit_key="L", holder="h-b", now=now + 9)])
    assert client.zscore(stale, "L") is None  # c woken: nobody waits
    assert not client.exists(stale)


async def test_a_read_looks_only_at_the_limits_due(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    """Of 2,000 limits with a waiter, one holder stopped renewing: a read
    frees that slot and wakes its waiter, and looks at no other limit."""
    client = inspector(server_for())
    now = time.time()
    limits = [f"L{n}" for n in range(2000)]
    ghost = TaskMessage(key="ghost", function="noop", payload=b"", when=now)
    await docket.adapter.execute(
        [
            AcquireSlot(
                limit_key=limit,
                holder=f"ghost-{limit}",
                max_concurrent=1,
                now=now - TIMEOUT / 2 if limit == "L7" else now,
                stale_after=TIMEOUT,
                delivery_id="",
                message=ghost,
            )
            for limit in limits
        ]
    )
    found = await deliveries_of(docket, now, *(f"k{limit}" for limit in limits))
    parked = await docket.adapter.execute(
        [acquire(found[f"k{limit}"], limit, now) for limit in limits]
    )
    assert {p.acquired for p in parked if isinstance(p, SlotAcquired)} == {False}
    assert client.zcard("{" + docket.name + "}:stale") == 2000

    client.config_resetstat()
    assert await woken_by_read(docket, now + TIMEOUT / 2 + 1) == ["kL7"]
    calls = {
        name.removeprefix("cmdstat_"): stats["calls"]
        for name, stats in client.info("commandstats").items()
    }
    assert calls.get("zremrangebyscore") == 1
    assert calls.get("hget", 0) < 10


async def test_the_waiting_limits_an_older_docket_kept_are_looked_at(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    """An older docket kept the limits with waiters in a set, ``S:waiting``:
    a read moves them into the index, so their stale slots are freed."""
    client = inspector(server_for())
    prefix = "{" + docket.name + "}"
    now = time.time()
    found = await deliveries_of(docket, now, "a", "b")
    await docket.adapter.execute([acquire(found[k], "L", now) for k in "ab"])
    client.zrem(f"{prefix}:stale", "L")  # as the older docket left it
    client.sadd(f"{prefix}:waiting", "L")
    assert await woken_by_read(docket, now + 1) == []
    assert not client.exists(f"{prefix}:waiting")
    assert client.zscore(f"{prefix}:stale", "L") == pytest.approx(now)
    assert await woken_by_read(docket, now + TIMEOUT + 1) == ["b"]
