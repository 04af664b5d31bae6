"""The entries a batch of finishes acknowledges leave the queue by a trim up
to the oldest delivery still pending (whole nodes of the stream at a time),
and by ``XDEL`` at and above it: what the group has yet to hand out, and
what a worker still holds, stay."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis
from servers import Server

from docket_core import Docket, ExecutionState
from docket_core.lua.base import ScriptedStore
from docket_core.lua.protocol import GROUP
from docket_core.sansio.effects import Finish
from docket_core.sansio.inputs import Finished
from docket_core.sansio.values import Delivery

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends(
        "redis-asyncio", "valkey-asyncio", "glide_valkey-asyncio", "glide_valkey-trio"
    ),
]


async def job(n: int) -> None:
    """Never runs: the tests act as a worker would, with no worker."""


def _finish(delivery: Delivery) -> Finish:
    return Finish(
        delivery_id=delivery.delivery_id,
        key=delivery.message.key,
        generation=delivery.message.generation,
        state=ExecutionState.COMPLETED,
        now=time.time(),
        ttl=60,
    )


async def _read(store: ScriptedStore, count: int) -> list[Delivery]:
    result = await store.read(
        worker="reader", count=count, now=time.time(), redelivery_timeout=60.0, block=0
    )
    return list(result.deliveries)


async def test_an_end_trims_what_was_handed_out_and_keeps_the_rest(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    store = docket.adapter
    assert isinstance(store, ScriptedStore)
    docket.register(job)
    for n in range(6):
        await docket.add(job, key=f"k{n}")(n)
    first, second = await _read(store, 2)
    server = server_for()
    assert server is not None
    client = redis.Redis(host="127.0.0.1", port=server.port)
    stream = store.layout.stream
    try:
        # the first ends while the second is pending: the first is trimmed,
        # the second (held) and the four not handed out yet stay
        outcomes = await store.execute([_finish(first)])
        assert outcomes == [Finished(delivery_id=first.delivery_id, recorded=True)]
        assert client.xlen(stream) == 5
        kept = [entry_id.decode() for entry_id, _ in client.xrange(stream)]
        assert kept[0] == second.delivery_id
        assert client.xpending(stream, GROUP)["pending"] == 1
        # the rest are handed out whole, and the last ends leave nothing
        rest = await _read(store, 10)
        assert sorted(d.message.key for d in rest) == ["k2", "k3", "k4", "k5"]
        # (ended newest first: each is at or above the oldest still pending)
        for delivery in [*reversed(rest), second]:
            await store.execute([_finish(delivery)])
        assert client.xlen(stream) == 0
        assert client.xpending(stream, GROUP)["pending"] == 0
    finally:
        client.close()
