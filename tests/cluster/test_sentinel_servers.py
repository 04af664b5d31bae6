"""The session's sentinel set works through redis-py, and fails over.

Smoke tests of the test servers themselves (``sentinel_set``), through
redis-py's asyncio ``Sentinel``: writes reach the primary and its replica,
and after ``SENTINEL FAILOVER`` the same client writes to the new primary.
One test pins the window docs/cluster.md plans around: after a failover the
old primary stays a master for seconds, a client still connected to it keeps
writing there (to be lost), and only ``WAIT`` tells: no replica has them.
"""

from __future__ import annotations

import uuid

import anyio
import pytest
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel
from servers import SentinelSet, command, info

pytestmark = [pytest.mark.anyio, pytest.mark.backends("memory-asyncio")]

#: what a client meets while the primary changes (its connection dropped, or
#: the old primary turned replica)
_FAILOVER_ERRORS = (redis_errors.ConnectionError, redis_errors.ReadOnlyError)


async def _write(client: Redis, key: str, value: str) -> None:
    """SET, retried through the errors of a failover for up to 10 s."""
    with anyio.fail_after(10):
        while True:
            try:
                await client.set(key, value)
                return
            except _FAILOVER_ERRORS:
                await anyio.sleep(0.05)


async def test_writes_reach_the_primary_and_its_replica(
    sentinel_set: SentinelSet, sentinel: Sentinel
) -> None:
    host, port = await sentinel.discover_master(sentinel_set.service)
    primary = sentinel_set.primary()
    assert (host, port) == ("127.0.0.1", primary.port)
    (replica,) = [node for node in sentinel_set.data_nodes if node is not primary]
    assert [("127.0.0.1", replica.port)] == await sentinel.discover_slaves(sentinel_set.service)
    client = sentinel.master_for(sentinel_set.service)
    key = f"smoke-{uuid.uuid4().hex}"
    await client.set(key, "v")
    assert await client.execute_command("WAIT", 1, 5000) == 1
    assert command(primary.port, "GET", key) == b"v"
    assert command(replica.port, "GET", key) == b"v"
    assert sentinel_set.url() == (
        "redis+sentinel://"
        + ",".join(f"127.0.0.1:{s.port}" for s in sentinel_set.sentinel_nodes)
        + "/docket/0"
    )


async def test_after_a_failover_the_client_writes_to_the_new_primary(
    sentinel_set: SentinelSet, sentinel: Sentinel
) -> None:
    client = sentinel.master_for(sentinel_set.service)
    before = f"before-{uuid.uuid4().hex}"
    await client.set(before, "kept")
    assert await client.execute_command("WAIT", 1, 5000) == 1
    old = sentinel_set.primary()

    new = await anyio.to_thread.run_sync(sentinel_set.failover)

    assert new is not old and sentinel_set.primary() is new
    assert await sentinel.discover_master(sentinel_set.service) == ("127.0.0.1", new.port)
    assert info(new.port, "replication")["role"] == "master"
    assert info(old.port, "replication")["master_port"] == str(new.port)
    after = f"after-{uuid.uuid4().hex}"
    await _write(client, after, "written")
    assert command(new.port, "GET", after) == b"written"
    assert command(new.port, "GET", before) == b"kept"  # replicated before the failover


async def test_the_old_primary_takes_writes_until_it_is_turned_replica(
    sentinel_set: SentinelSet, sentinel: Sentinel
) -> None:
    """The split-brain window a failover opens: the sentinels name the new
    primary at once, but the old one stays a master (a sentinel turns it 8 to
    18 s later), and a client connected before keeps writing there."""
    client = sentinel.master_for(sentinel_set.service)
    await client.set(f"warm-{uuid.uuid4().hex}", "1")  # a pooled connection to the primary
    old = sentinel_set.primary()
    try:
        new = await anyio.to_thread.run_sync(
            lambda: sentinel_set.failover(convert_old_primary=False)
        )
        key = f"stray-{uuid.uuid4().hex}"
        await client.set(key, "lost")  # no error: written to the old primary
        assert command(old.port, "GET", key) == b"lost"
        assert command(new.port, "GET", key) is None
        # WAIT tells: the old primary has no replica left to take the write
        assert await client.execute_command("WAIT", 1, 200) == 0
    finally:
        if info(old.port, "replication")["role"] == "master":
            command(old.port, "REPLICAOF", "127.0.0.1", sentinel_set.primary().port)
        await anyio.to_thread.run_sync(sentinel_set.wait_healthy)
    # turned replica, it dropped the stray write for the new primary's data
    with anyio.fail_after(10):
        while command(old.port, "EXISTS", key):
            await anyio.sleep(0.05)
