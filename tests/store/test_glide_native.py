"""GLIDE script calls through the native ``invoke_script`` (``docket_glide.native``).

The GLIDE this project installs takes them (a GLIDE that changed the native
call's signature or the client's internals fails the first test: the store
would have gone back to ``invoke_script``, slower); their replies and errors
are ``invoke_script``'s; a client they do not fit (trio's, a signature not
theirs, one without the internals) goes through ``invoke_script``; and a call
cancelled before its reply keeps its buffer in GLIDE's pending table until the
reply, which the native side may still be reading."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from glide import RequestError
from servers import Server

from docket_core import Docket
from docket_core.lua.protocol import ScriptCall, number
from docket_glide import GlideStore
from docket_glide import native as native_module
from docket_glide.native import NativeScripts
from docket_glide.store import _SCRIPTS

pytestmark = pytest.mark.anyio


def _url(server_for: Callable[[], Server | None]) -> str:
    server = server_for()
    assert server is not None
    return f"glide://127.0.0.1:{server.port}/0"


async def _opened(docket: Docket) -> GlideStore:
    """The docket's store, after one script call made its native calls."""
    store = docket.adapter
    assert isinstance(store, GlideStore)
    await store.pending()
    return store


async def _both(store: GlideStore, native: NativeScripts, call: ScriptCall) -> tuple[Any, Any]:
    """The reply (or the error) of ``call`` through each path."""
    client = store.client
    assert client is not None
    outcomes: list[Any] = []
    for sent in (
        native.invoke(call),
        client.invoke_script(_SCRIPTS[call.name], keys=list(call.keys), args=list(call.args)),
    ):
        try:
            outcomes.append(await sent)
        except RequestError as error:
            outcomes.append((type(error), str(error)))
    return outcomes[0], outcomes[1]


async def noop(n: int) -> None: ...


@asynccontextmanager
async def _noop_docket(
    server_for: Callable[[], Server | None],
) -> AsyncIterator[tuple[Docket, GlideStore]]:
    """A docket on the server with ``noop`` registered, and its store, opened."""
    async with Docket(name=f"native-{uuid.uuid4().hex}", url=_url(server_for)) as docket:
        docket.register(noop)
        yield docket, await _opened(docket)


async def _through_invoke_script(server_for: Callable[[], Server | None]) -> None:
    """The store's script calls go through ``invoke_script``, and work."""
    async with _noop_docket(server_for) as (docket, store):
        assert store._native == (store.client, None)
        for n in range(3):
            await docket.add(noop)(n)
        assert await store.pending() == 3


@pytest.mark.backends("glide_redis-asyncio")
async def test_this_glide_takes_native_calls_with_invoke_scripts_replies(
    server_for: Callable[[], Server | None],
) -> None:
    async with _noop_docket(server_for) as (docket, store):
        assert store._native is not None and store._native[0] is store.client
        native = store._native[1]
        assert native is not None, "this GLIDE no longer fits docket_glide.native"
        for n in range(5):
            await docket.add(noop, key=f"task-{n}")(n)
        assert await store.pending() == 5
        layout = store.layout
        calls = [
            layout.call("inspect", "pending", "0"),
            layout.call("inspect", "depths", number(time.time())),
            layout.call("inspect", "snapshot", "10", number(time.time())),
            layout.call("inspect", "no such inspection"),  # an error reply
            ScriptCall(name="inspect", keys=(), args=()),  # no keys, no arguments
        ]
        for call in calls:
            through_native, through_glide = await _both(store, native, call)
            assert through_native == through_glide
        assert isinstance(through_native, tuple) and through_native[0] is not None


@pytest.mark.backends("glide_valkey-trio")
async def test_a_client_under_trio_goes_through_invoke_script(
    server_for: Callable[[], Server | None],
) -> None:
    await _through_invoke_script(server_for)


@pytest.mark.backends("glide_redis-asyncio")
async def test_a_glide_the_native_calls_do_not_fit_goes_through_invoke_script(
    server_for: Callable[[], Server | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert NativeScripts.for_client(object(), _SCRIPTS) is None
    monkeypatch.setattr(native_module, "SIGNATURE", "void (*)(void)")
    await _through_invoke_script(server_for)


@pytest.mark.backends("glide_redis-asyncio")
async def test_a_glide_of_an_untested_version_goes_through_invoke_script(
    server_for: Callable[[], Server | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert native_module.INSTALLED in native_module.TESTED, "test docket_glide.native on it"
    monkeypatch.setattr(native_module, "INSTALLED", "2.5")
    await _through_invoke_script(server_for)


@pytest.mark.backends("glide_redis-asyncio")
async def test_a_call_cancelled_before_its_reply_keeps_its_buffer_until_the_reply(
    server_for: Callable[[], Server | None],
) -> None:
    server = server_for()
    assert server is not None
    async with Docket(name=f"native-{uuid.uuid4().hex}", url=_url(server_for)) as docket:
        store = await _opened(docket)
        native = store._native[1] if store._native else None
        assert native is not None and store.client is not None
        pending: dict[int, Any] = store.client._pending_futures
        admin = aioredis.Redis(port=server.port)
        try:
            await admin.execute_command("CLIENT", "PAUSE", "300", "ALL")  # type: ignore[no-untyped-call]
            with anyio.move_on_after(0.05) as scope:
                await native.invoke(store.layout.call("inspect", "pending", "0"))
            assert scope.cancelled_caught
            held = [held for held in pending.values() if isinstance(held, native_module._Pending)]
            assert len(held) == 1 and held[0].buffer.startswith(store.layout.stream.encode())
            with anyio.fail_after(5):
                while pending:
                    await anyio.sleep(0.01)
        finally:
            await admin.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]
            await admin.aclose()
        assert await store.pending() == 0
