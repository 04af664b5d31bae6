"""redis-py's ``execute_in_order`` (``docket_redis.line``): a worker's batches
share one connection, so the server runs and answers them in the order they
were made, even while an earlier one is out; a call that breaks the line
fails the calls behind it (they may or may not have run: the worker machine
resends them), and the next call opens a new line."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import pytest
import redis
from helpers import resume
from servers import Server, command

from docket_core import Docket
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import StoreEffect
from docket_core.sansio.errors import StoreUnavailable
from docket_core.sansio.inputs import Outcome, Scheduled
from docket_core.sansio.values import ScheduleMode
from docket_redis import RedisStore

pytestmark = [pytest.mark.anyio, pytest.mark.backends("redis-asyncio")]


def _add(key: str) -> StoreEffect:
    now = time.time()
    return plan_add(key=key, function="f", payload=b"p", when=now, mode=ScheduleMode.ADD, now=now)


def _accepted(outcomes: list[Outcome]) -> list[bool]:
    return [o.accepted for o in outcomes if isinstance(o, Scheduled)]


async def _store(docket: Docket) -> RedisStore:
    store = docket.adapter
    assert isinstance(store, RedisStore) and store.keeps_order
    await store.execute([_add(f"warm-{uuid.uuid4().hex}")])  # (scripts loaded)
    return store


async def test_calls_in_order_run_in_the_order_they_were_made(docket: Docket) -> None:
    """A long batch that adds a key last, then a short one that adds it too,
    before the first is answered: the short one always finds the key taken
    (on two connections the server may read the short one first)."""
    store = await _store(docket)
    for _ in range(20):
        key = f"k-{uuid.uuid4().hex}"
        long = [_add(f"{key}-{n}") for n in range(300)] + [_add(key)]
        results: dict[str, list[Outcome]] = {}

        async def run(
            name: str, effects: list[StoreEffect], results: dict[str, list[Outcome]] = results
        ) -> None:
            results[name] = await store.execute_in_order(effects)

        async with anyio.create_task_group() as group:
            group.start_soon(run, "long", long)
            await anyio.lowlevel.checkpoint()  # (the long one is on the wire)
            group.start_soon(run, "short", [_add(key)])
            await anyio.lowlevel.checkpoint()
            line = store._line  # (one connection for both)
            assert line is not None and line.callers == 2
        assert _accepted(results["long"])[-1] is True
        assert _accepted(results["short"]) == [False]
    assert store._line is None  # (nothing out: its connection is kept for the next)


async def test_calls_that_come_while_the_line_opens_read_in_the_order_they_wrote(
    docket: Docket,
) -> None:
    """The first call opens the line (connecting: it yields), and a second
    one comes meanwhile and waits for it: the opener writes first, so it
    reads first (the second would read the opener's replies as its own)."""
    store = await _store(docket)
    key = f"k-{uuid.uuid4().hex}"
    (taken,) = await store.execute_in_order([_add(key)])
    assert isinstance(taken, Scheduled) and taken.accepted
    await store._pool().disconnect()  # (the next line connects anew)
    store._callers.clear()
    results: dict[str, list[Outcome]] = {}

    async def run(name: str, effects: list[StoreEffect]) -> None:
        results[name] = await store.execute_in_order(effects)

    async with anyio.create_task_group() as group:
        group.start_soon(run, "opener", [_add(f"{key}-{n}") for n in range(20)])
        await anyio.lowlevel.checkpoint()
        line = store._line
        assert line is not None and line.connection is None  # (still connecting)
        group.start_soon(run, "waiter", [_add(key)])
    assert _accepted(results["opener"]) == [True] * 20
    assert _accepted(results["waiter"]) == [False]


async def test_a_call_behind_another_goes_out_before_it_first_yields(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    """``sends_at_once`` holds on the line too: a call made while another is
    out has written its batch on the same connection by the time its
    coroutine first yields (the server, paused, holds it in that client's
    query buffer)."""
    store = await _store(docket)
    server = server_for()
    assert server is not None
    key = f"k-{uuid.uuid4().hex}"
    command(server.port, "CLIENT", "PAUSE", "1000", "WRITE")  # (the first stays out)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(store.execute_in_order, [_add(f"{key}-first")])
            await anyio.sleep(0.05)
            line = store._line
            assert line is not None and line.callers == 1
            host, port = line.connection._writer.get_extra_info("sockname")[:2]
            assert _query_buffer(server, f"{host}:{port}") == 0
            call = store.execute_in_order([_add(key)])
            yielded: Any = call.send(None)
            assert line.callers == 2 and store._line is line
            assert _query_buffer(server, f"{host}:{port}") > 0
            command(server.port, "CLIENT", "UNPAUSE")
            (outcome,) = await resume(call, yielded)
            assert isinstance(outcome, Scheduled) and outcome.accepted
    finally:
        command(server.port, "CLIENT", "UNPAUSE")


def _query_buffer(server: Server, address: str) -> int:
    """The bytes the server holds unread from the client at ``address``
    (asked over a blocking socket: the event loop does not turn)."""
    side = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        (client,) = [c for c in side.client_list() if c["addr"] == address]
        return int(client["qbuf"])
    finally:
        side.close()


async def test_a_broken_line_fails_the_calls_behind_it_and_a_new_one_opens(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    store = await _store(docket)
    server = server_for()
    assert server is not None
    key = f"k-{uuid.uuid4().hex}"
    errors: list[BaseException] = []

    async def run(effects: list[StoreEffect]) -> None:
        try:
            await store.execute_in_order(effects)
        except StoreUnavailable as error:
            errors.append(error)

    command(server.port, "CLIENT", "PAUSE", "2000", "WRITE")  # (both stay out)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(run, [_add(f"{key}-1")])
            await anyio.lowlevel.checkpoint()
            group.start_soon(run, [_add(f"{key}-2")])
            await anyio.sleep(0.1)
            line = store._line
            assert line is not None and line.callers == 2
            command(server.port, "CLIENT", "KILL", "TYPE", "normal")
    finally:
        command(server.port, "CLIENT", "UNPAUSE")
    assert len(errors) == 2  # both failed: neither ran, and the resend is the core's
    assert line.broken is not None and store._line is None
    (outcome,) = await store.execute_in_order([_add(f"{key}-1")])
    assert isinstance(outcome, Scheduled) and outcome.accepted
