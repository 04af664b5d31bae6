"""On one server a read's new entries come in the round trip of its script,
read by a plain ``XREADGROUP`` right behind it (``ScriptedStore.run_read``):
handing the server's reply through Lua cost the server several times the
command.  What the script does first (queue the messages that came due) is
read by that same read, and what it cannot do loses no message: a server
that lost its scripts, a queue without its consumer group, a wake-up entry
an older docket left in the queue."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
import redis
from servers import Server

from docket_core import Docket
from docket_core.adapter import ReadResult
from docket_core.lua.base import ScriptedStore
from docket_core.lua.protocol import GROUP

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends(
        "redis-asyncio", "valkey-asyncio", "glide_valkey-asyncio", "glide_valkey-trio"
    ),
]


async def job(n: int) -> None:
    """Never runs: the tests read as a worker would, with no worker."""


def _store(docket: Docket) -> ScriptedStore:
    store = docket.adapter
    assert isinstance(store, ScriptedStore)
    assert store.reads_in_one_trip  # (one server without WAIT)
    return store


def _client(server_for: Callable[[], Server | None]) -> redis.Redis:
    server = server_for()
    assert server is not None
    return redis.Redis(host="127.0.0.1", port=server.port)  # sync: a side connection


async def _read(docket: Docket, scan_every: float = 0.0) -> ReadResult:
    return await _store(docket).read(
        worker="reader",
        count=10,
        now=time.time(),
        redelivery_timeout=60.0,
        block=0,
        stale_scan_every=scan_every,
    )


def _keys(result: ReadResult) -> list[str]:
    return sorted(d.message.key for d in result.deliveries)


async def _add(docket: Docket, *keys: str, when: Any = None) -> None:
    docket.register(job)
    for n, key in enumerate(keys):
        await docket.add(job, when, key=key)(n)


async def test_a_message_that_comes_due_is_read_by_the_read_that_queues_it(
    docket: Docket,
) -> None:
    from datetime import UTC, datetime, timedelta

    await _add(docket, "now")
    await _add(docket, "soon", when=datetime.now(UTC) + timedelta(milliseconds=200))
    assert _keys(await _read(docket)) == ["now"]
    await anyio.sleep(0.3)
    assert _keys(await _read(docket)) == ["soon"]
    assert _keys(await _read(docket)) == []


async def test_a_read_after_the_server_lost_its_scripts_hands_out_every_message(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    await _add(docket, "a", "b", "c")
    await _read(docket)  # (the scripts are loaded, and the stream made)
    await _add(docket, "d", "e")
    client = _client(server_for)
    try:
        assert client.script_flush() is True  # as after a restart
        # the script fails NOSCRIPT, the plain read behind it hands out d
        # and e: the script goes again, and nothing handed out is dropped
        assert _keys(await _read(docket)) == ["d", "e"]
        assert client.xpending(_store(docket).layout.stream, GROUP)["pending"] == 5
    finally:
        client.close()


async def test_a_queue_without_its_consumer_group_is_read_once_it_is_made_again(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    await _add(docket, "a")
    assert _keys(await _read(docket, scan_every=3600.0)) == ["a"]
    await _add(docket, "b")
    client = _client(server_for)
    try:
        # (a scan is not due, so only the plain read meets the missing group)
        assert client.xgroup_destroy(_store(docket).layout.stream, GROUP) == 1
    finally:
        client.close()
    # the read makes the group again, from the stream's start: the next one
    # hands out what the stream holds (a, which the lost group had handed
    # out, too)
    assert _keys(await _read(docket, scan_every=3600.0)) == []
    assert _keys(await _read(docket, scan_every=3600.0)) == ["a", "b"]


async def test_a_wake_up_entry_an_older_docket_left_in_the_queue_is_dropped(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    await _read(docket)  # (the stream and its group made)
    stream = _store(docket).layout.stream
    client = _client(server_for)
    try:
        client.xadd(stream, {"wake": "1"})
        await _add(docket, "a")
        assert _keys(await _read(docket)) == ["a"]
        assert client.xlen(stream) == 1  # the wake-up acknowledged and deleted
    finally:
        client.close()
