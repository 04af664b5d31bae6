"""Many concurrent operations on one Docket share a bounded set of
connections: adds wait for a pooled connection instead of failing, and every
``get_result`` waiting in a process listens through one shared subscriber.

The servers are looked at on every node that holds a docket's keys
(``data_ports()``: a cluster's every primary, a sentinel set's primary)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import anyio
import pytest
import redis
from servers import Server, Servers

from docket_core import Docket, Execution, Worker
from docket_core.lua.base import ScriptedStore
from docket_core.partitioned import PartitionedStore

pytestmark = pytest.mark.anyio

ADDS = 10_000
WAITS = 1_000


async def echo(n: int) -> int:
    return n


@contextmanager
def data_nodes(server: Servers) -> Iterator[list[redis.Redis]]:
    """A side connection to every node that holds the docket's keys (sync:
    they never wait on the event loop under test)."""
    clients = [redis.Redis(host="127.0.0.1", port=port) for port in server.data_ports()]
    try:
        yield clients
    finally:
        for client in clients:
            client.close()


async def all_listening(server: Servers | None, docket: Docket) -> int:
    """Wait until every ``get_result`` is subscribed (on whichever node its
    subscriber connection reached); return how many connections the data
    nodes have then."""
    if server is None:
        await anyio.sleep(0.2)
        return 0
    pattern = "{" + docket.name + "}:events:*"
    with data_nodes(server) as clients:
        while len({c for client in clients for c in client.pubsub_channels(pattern)}) < WAITS:
            await anyio.sleep(0.02)
    return await connected(server)


async def pause(server: Servers | None, seconds: float) -> None:
    """Make every data node hold every client's commands for a while."""
    if server is not None:
        with data_nodes(server) as clients:
            for client in clients:
                pause_ms = str(int(seconds * 1000))
                client.execute_command("CLIENT", "PAUSE", pause_ms, "ALL")  # type: ignore[no-untyped-call]


async def connected(server: Servers | None) -> int:
    """How many clients the data nodes have, all together."""
    if server is None:
        return 0
    with data_nodes(server) as clients:
        return sum(int(client.info("clients")["connected_clients"]) for client in clients)


async def test_ten_thousand_concurrent_adds_and_a_thousand_result_waits(
    docket: Docket, server_for: Callable[[], Servers | None]
) -> None:
    server = server_for()
    docket.register(echo)
    later = datetime.now(UTC) + timedelta(days=1)
    added: list[Execution] = []

    async def add_later(n: int) -> None:
        added.append(await docket.add(echo, when=later, key=f"later-{n}")(n))

    await pause(server, 0.3)  # the adds pile up: they must wait, not fail
    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            for n in range(ADDS):
                group.start_soon(add_later, n)
    assert len(added) == ADDS

    executions = [await docket.add(echo, key=f"now-{n}")(n) for n in range(WAITS)]
    results: dict[int, int] = {}

    async def wait(n: int) -> None:
        results[n] = await executions[n].get_result(timeout=timedelta(seconds=60))

    worker = Worker(
        docket,
        name=f"worker-{uuid.uuid4().hex[:8]}",
        concurrency=100,
        minimum_check_interval=timedelta(milliseconds=5),
        schedule_automatic_tasks=False,
    )
    before = await connected(server)
    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            for n in range(WAITS):
                group.start_soon(wait, n)
            # every wait listens through the one shared subscriber connection
            assert await all_listening(server, docket) - before <= 60
            async with anyio.create_task_group() as running:
                running.start_soon(worker.run_forever)
                while len(results) < WAITS:
                    await anyio.sleep(0.01)
                running.cancel_scope.cancel()
    assert results == {n: n for n in range(WAITS)}
    assert worker.counters["succeeded"] == WAITS


@pytest.mark.backends("redis-asyncio")
async def test_a_redis_url_gets_a_bounded_waiting_pool(docket_url: str) -> None:
    from redis.asyncio import BlockingConnectionPool, Redis

    from docket_redis import RedisStore
    from docket_redis.store import MAX_CONNECTIONS, POOL_TIMEOUT

    default = RedisStore.from_url(docket_url, name="pools")
    tuned = RedisStore.from_url(
        f"{docket_url}?max_connections=7&timeout=2.5&socket_connect_timeout=1.5", name="pools"
    )
    try:
        assert isinstance(default.client, Redis) and isinstance(tuned.client, Redis)
        pool = default.client.connection_pool
        assert isinstance(pool, BlockingConnectionPool)
        assert (pool.max_connections, pool.timeout) == (MAX_CONNECTIONS, POOL_TIMEOUT)
        # a new connection may take as long to connect as a command waits for
        # one (redis-py's 5 s failed adds on a loop busy with 10,000 of them)
        assert pool.connection_kwargs["socket_connect_timeout"] == POOL_TIMEOUT
        pool = tuned.client.connection_pool
        assert isinstance(pool, BlockingConnectionPool)
        assert (pool.max_connections, pool.timeout) == (7, 2.5)
        assert pool.connection_kwargs["socket_connect_timeout"] == 1.5
    finally:
        await default.close()
        await tuned.close()


@pytest.mark.backends("redis-asyncio", "glide_valkey-asyncio", "glide_valkey-trio")
async def test_listeners_of_a_channel_share_one_subscription(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    from docket_core.lua.base import ScriptedStore

    server = server_for()
    assert server is not None and isinstance(docket.adapter, ScriptedStore)
    adapter = docket.adapter
    admin = redis.Redis(host="127.0.0.1", port=server.port)
    channel, other = "{" + docket.name + "}:shared", "{" + docket.name + "}:other"

    def subscribers(name: str) -> int:
        count: int = admin.pubsub_numsub(name)[0][1]
        return count

    async def unsubscribed(name: str) -> None:
        # (GLIDE sends an unsubscription in the background)
        while subscribers(name):
            await anyio.sleep(0.01)

    try:
        with anyio.fail_after(10):
            async with adapter.listen(channel) as first:
                async with adapter.listen(channel) as second, adapter.listen(other) as third:
                    assert (subscribers(channel), subscribers(other)) == (1, 1)
                    admin.publish(channel, b"both")
                    admin.publish(other, b"third")
                    assert await anext(first) == b"both"
                    assert await anext(second) == b"both"
                    assert await anext(third) == b"third"
                admin.publish(channel, b"first")  # the other listeners left
                assert await anext(first) == b"first"
                await unsubscribed(other)
                assert subscribers(channel) == 1
            await unsubscribed(channel)
    finally:
        admin.close()


@pytest.mark.backends(
    "redis-asyncio", "glide_valkey-asyncio", "redis_cluster-asyncio", "glide_cluster-asyncio"
)
async def test_the_partitions_of_a_docket_listen_through_one_subscriber(
    make_docket: Callable[..., Any], server_for: Callable[[], Servers | None]
) -> None:
    """A worker listens for cancellations in every partition of its docket:
    the partitions' stores share the home store's subscriber, so three
    partitions open the connections one does (one client, not three)."""
    server = server_for()
    assert server is not None

    async def subscriber_connections(partitions: int) -> int:
        docket = await make_docket(partitions=partitions)
        adapter = docket.adapter
        channels = (
            [part.layout.cancel_channel for part in adapter.parts]
            if isinstance(adapter, PartitionedStore)
            else [cast(ScriptedStore, adapter).layout.cancel_channel]
        )
        await anyio.sleep(0.3)  # (what opening left behind settles)
        before = await connected(server)
        with data_nodes(server) as clients, anyio.fail_after(10):
            async with adapter.cancellations():
                while not all(
                    sum(client.pubsub_numsub(channel)[0][1] for client in clients)
                    for channel in channels
                ):
                    await anyio.sleep(0.02)
                return await connected(server) - before

    one = await subscriber_connections(1)
    three = await subscriber_connections(3)
    assert one >= 1
    assert three <= one, (one, three)
