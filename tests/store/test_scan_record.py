"""The reads' record of their scan for stale deliveries (``P:scan``) is the
store's own state, read by every read: one that is broken (a cursor that is
no stream id, a key that is no hash) starts the scan over, instead of
failing every read of the docket."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import pytest
import redis
from servers import Server, Servers

from docket_core import Docket

pytestmark = [pytest.mark.anyio, pytest.mark.backends("redis-asyncio", "glide_valkey-asyncio")]

TIMEOUT = 0.5


async def noop(n: int) -> None:
    """Never runs here: the tests drive the store directly."""


@pytest.mark.parametrize("broken", ["cursor", "type"])
async def test_a_broken_scan_record_is_made_again(
    docket: Docket, server_for: Callable[[], Servers | None], broken: str
) -> None:
    from helpers import claim_as

    docket.register(noop)
    for n in range(2):
        await docket.add(noop, key=f"k{n}")(n)
    await claim_as(docket, "dead", 2, time.time())
    await anyio.sleep(TIMEOUT + 0.1)
    server = server_for()
    assert isinstance(server, Server)
    key = "{" + docket.name + "}:scan"
    with redis.Redis(host="127.0.0.1", port=server.port) as client:
        client.delete(key)
        if broken == "cursor":
            client.hset(key, mapping={"at": "x", "cursor": "nope"})
        else:
            client.set(key, "not a hash")
    taken = await docket.adapter.read(
        worker="w2",
        count=10,
        now=time.time(),
        redelivery_timeout=TIMEOUT,
        block=0,
        stale_scan_every=30.0,
    )
    assert sorted(d.message.key for d in taken.deliveries) == ["k0", "k1"]
    with redis.Redis(host="127.0.0.1", port=server.port) as client:
        assert client.hget(key, "cursor") == b"0-0"
