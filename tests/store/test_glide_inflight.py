"""GLIDE's in-flight limit: past half the client's ``inflight_requests_limit``
the store's requests wait their turn (GLIDE would refuse them), first come,
first served, and a waiter cancelled while it waits gives up nothing."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anyio
import pytest
from servers import Server

from docket_core import Docket
from docket_glide.store import GlideStore, InFlight, configuration_from_url

pytestmark = pytest.mark.anyio


async def test_requests_past_the_limit_wait_their_turn_in_order() -> None:
    inflight = InFlight(1)
    order: list[int] = []
    release = anyio.Event()

    async def request(n: int) -> None:
        await inflight.acquire()
        try:
            order.append(n)
            await release.wait()
        finally:
            inflight.release()

    async with anyio.create_task_group() as group:
        for n in range(5):
            group.start_soon(request, n)
            await anyio.sleep(0.01)
        assert order == [0]  # the others wait
        release.set()
    assert order == [0, 1, 2, 3, 4]
    await inflight.acquire()  # the turn came back
    with anyio.move_on_after(0.05) as scope:
        await inflight.acquire()
    assert scope.cancelled_caught


async def test_a_waiter_cancelled_in_line_takes_no_turn_with_it() -> None:
    inflight = InFlight(1)
    await inflight.acquire()
    with anyio.move_on_after(0.01):
        await inflight.acquire()  # gives up waiting
    got: list[str] = []

    async def later() -> None:
        await inflight.acquire()
        got.append("later")

    async with anyio.create_task_group() as group:
        group.start_soon(later)
        await anyio.sleep(0.01)
        assert got == []
        inflight.release()
    assert got == ["later"]


async def test_a_turn_given_to_a_waiter_cancelled_at_once_is_not_lost() -> None:
    """The turn handed over as its waiter is being cancelled is used (the
    cancellation came too late) or passed on to the next waiter."""
    inflight = InFlight(1)
    await inflight.acquire()
    got: list[str] = []

    async def waiter(name: str, scope: anyio.CancelScope) -> None:
        with scope:
            await inflight.acquire()
            try:
                got.append(name)
            finally:
                inflight.release()

    first = anyio.CancelScope()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(waiter, "first", first)
            group.start_soon(waiter, "second", anyio.CancelScope())
            await anyio.sleep(0.01)
            inflight.release()  # first's turn...
            first.cancel()  # ...as first is cancelled, before it runs again
    assert got[-1:] == ["second"]
    await inflight.acquire()  # the one turn is back


@pytest.mark.backends("glide_redis-asyncio")
async def test_many_adds_at_once_on_a_client_with_a_small_in_flight_limit(
    server_for: Callable[[], Server | None],
) -> None:
    server = server_for()
    assert server is not None
    name = f"test-{uuid.uuid4().hex}"
    url = f"glide://127.0.0.1:{server.port}/0"
    store = GlideStore(configuration_from_url(url, inflight_requests_limit=4), name=name)
    async with Docket(name=name, url=url, adapter=store) as docket:

        async def noop(n: int) -> None: ...

        docket.register(noop)
        async with anyio.create_task_group() as group:
            for n in range(300):
                group.start_soon(docket.add(noop), n)
        assert await docket.adapter.pending() == 300
