"""Connecting to servers: URLs with ACL users, unix sockets, clients an
application already has, and clear errors for bad URLs and dead servers."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from glide import GlideClient
from helpers import finish, make_worker
from servers import Server, redis_server_binary

from docket_core import Docket, ExecutionState, StoreUnavailable, UsageError
from docket_glide import GlideStore, configuration_from_url
from docket_redis import RedisStore

pytestmark = [pytest.mark.anyio, pytest.mark.backends("redis-asyncio", "glide_redis-asyncio")]


@pytest.fixture(scope="module")
def acl_server() -> Iterator[Server]:
    """A private server with a unix socket and an ACL user ``alice``."""
    binary = redis_server_binary()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed, and CI must run every backend")
        pytest.skip("redis-server is not installed")
    server = Server(binary)
    server.extra_args = [
        "--unixsocket",
        f"{server.directory}/redis.sock",
        "--unixsocketperm",
        "700",
    ]
    server.start()
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "alice", "on", ">s3cret", "~*", "&*", "+@all")
    admin.close()
    try:
        yield server
    finally:
        server.cleanup()


async def roundtrip(docket: Docket) -> None:
    async def double(x: int) -> int:
        return 2 * x

    execution = await docket.add(double)(21)
    await finish(make_worker(docket))
    stored = await docket.get_execution(execution.key)
    assert stored is not None and stored.state is ExecutionState.COMPLETED
    assert await execution.get_result() == 42


def url_for(backend: str, server: Server, credentials: str = "") -> str:
    scheme = "glide" if backend.startswith("glide") else "redis"
    return f"{scheme}://{credentials}127.0.0.1:{server.port}/0"


async def test_an_acl_user_in_the_url(backend: str, acl_server: Server) -> None:
    url = url_for(backend, acl_server, "alice:s3cret@")
    async with Docket(name=f"acl-{uuid.uuid4().hex}", url=url) as docket:
        await roundtrip(docket)


async def test_a_wrong_password_is_a_clear_error(backend: str, acl_server: Server) -> None:
    url = url_for(backend, acl_server, "alice:wrong@")
    with pytest.raises(StoreUnavailable):
        async with Docket(name="nope", url=url):
            pass


@pytest.mark.backends("redis-asyncio")
async def test_a_unix_socket_url(acl_server: Server) -> None:
    url = f"unix://{acl_server.directory}/redis.sock?db=0"
    async with Docket(name=f"unix-{uuid.uuid4().hex}", url=url) as docket:
        await roundtrip(docket)


async def test_an_adapter_from_a_client_the_application_has(
    backend: str, acl_server: Server
) -> None:
    name = f"own-{uuid.uuid4().hex}"
    if backend.startswith("glide"):
        configuration = configuration_from_url(url_for(backend, acl_server))
        client = await GlideClient.create(configuration)
        try:
            async with Docket(
                name, adapter=GlideStore(configuration, name=name, client=client)
            ) as d:
                await roundtrip(d)
            assert await client.ping() == b"PONG"  # the application's client stays open
        finally:
            await client.close()
    else:
        client = aioredis.Redis(port=acl_server.port, socket_timeout=None)
        try:
            async with Docket(name, adapter=RedisStore(client, name=name)) as d:
                await roundtrip(d)
            assert await client.ping() is True  # the application's client stays open
        finally:
            await client.aclose()


async def test_a_dead_server_is_a_clear_error(backend: str) -> None:
    from servers import free_port

    scheme = "glide" if backend.startswith("glide") else "redis"
    with pytest.raises(StoreUnavailable):
        async with Docket(name="dead", url=f"{scheme}://127.0.0.1:{free_port()}/0"):
            pass


@pytest.mark.backends("memory-asyncio")
async def test_unknown_and_malformed_urls_are_the_callers_error() -> None:
    with pytest.raises(UsageError, match="unknown docket URL scheme"):
        Docket(name="x", url="postgres://localhost/db")
    with pytest.raises(UsageError):
        Docket(name="x", url="glide://localhost:notaport/0")


@pytest.mark.backends("memory-asyncio")
def test_a_missing_adapter_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    # pretend redis-py is not installed: importing docket_redis then fails
    monkeypatch.setitem(sys.modules, "docket_redis", None)
    with pytest.raises(UsageError, match=r"pip install 'docket\[redis\]'"):
        Docket(name="x", url="redis://localhost:6379/0")
    monkeypatch.setitem(sys.modules, "docket_glide", None)
    with pytest.raises(UsageError, match=r"pip install 'docket\[glide\]'"):
        Docket(name="x", url="glide://localhost:6379/0")
