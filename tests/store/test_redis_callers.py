"""redis-py's script calls on one server go out on a few connections the store
keeps out of the pool between calls (``RedisStore._send_on_own_connection``):
they are reused, one the server closed meanwhile connects anew before the
next call (as the pool checks what it hands out), a call cancelled mid-flight
leaves no reply behind for the next call to read, and closing the docket
gives them back."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import anyio
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio.connection import Connection as RedisConnection
from servers import Server

from docket_core import Disposition, Docket, ExecutionState
from docket_redis import RedisStore
from docket_redis.store import CALLERS_KEPT, _packed

pytestmark = [pytest.mark.anyio, pytest.mark.backends("redis-asyncio")]


async def echo(n: int) -> int:
    return n


def store_of(docket: Docket) -> RedisStore:
    assert isinstance(docket.adapter, RedisStore)
    return docket.adapter


async def warmed(
    docket: Docket, server_for: Callable[[], Server | None]
) -> tuple[Server, RedisStore]:
    """The docket's server and store, after one add (a connection kept)."""
    server = server_for()
    assert server is not None
    docket.register(echo)
    await docket.add(echo, key="warm")(0)
    return server, store_of(docket)


def client_ids(server: Server) -> set[int]:
    side = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        me = side.client_id()
        return {int(c["id"]) for c in side.client_list() if int(c["id"]) != me}
    finally:
        side.close()


async def test_sequential_calls_reuse_one_kept_connection(docket: Docket) -> None:
    docket.register(echo)
    store = store_of(docket)
    await docket.add(echo)(0)
    kept = list(store._callers)
    assert len(kept) == 1
    for n in range(1, 50):
        await docket.add(echo)(n)
    assert store._callers == kept  # the same connection, every time


async def test_concurrent_calls_keep_at_most_a_few_connections(docket: Docket) -> None:
    docket.register(echo)
    store = store_of(docket)
    async with anyio.create_task_group() as group:
        for n in range(200):
            group.start_soon(docket.add(echo), n)
    assert 1 <= len(store._callers) <= CALLERS_KEPT
    pool = store._pool()
    # the others went back to the pool, for blocking reads and pub/sub
    assert len(pool._in_use_connections) <= CALLERS_KEPT + len(store._readers or [])


async def test_a_kept_connection_the_server_closed_connects_anew(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    server, store = await warmed(docket, server_for)
    (connection,) = store._callers
    before = client_ids(server)
    side = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        # every connection of the docket's client goes (the kept one too)
        for client in side.client_list():
            if int(client["id"]) in before:
                side.client_kill_filter(_id=int(client["id"]))
    finally:
        side.close()
    await anyio.sleep(0.05)  # (the event loop sees the connections close)
    execution = await docket.add(echo, key="second")(2)
    assert execution.disposition is Disposition.SCHEDULED
    assert store._callers == [connection]  # reconnected in place
    stored = await docket.get_execution("second")
    assert stored is not None and stored.state is ExecutionState.QUEUED


async def test_a_call_cancelled_in_flight_leaves_no_reply_for_the_next(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    server, store = await warmed(docket, server_for)
    side = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        side.execute_command("CLIENT", "PAUSE", "300", "WRITE")  # type: ignore[no-untyped-call]
        with anyio.move_on_after(0.1) as scope:
            await docket.add(echo, key="cut-short")(1)
        assert scope.cancelled_caught
        assert store._callers == []  # the connection went back to the pool, closed
        await anyio.sleep(0.3)  # (the pause ends; the cut-short add runs on the server)
    finally:
        side.close()
    # the next call reads its own reply, not the cut-short one's
    execution = await docket.add(echo, key="next")(2)
    assert execution.key == "next" and execution.disposition is Disposition.SCHEDULED
    assert (await docket.get_execution("next")) is not None


async def test_closing_the_docket_gives_the_kept_connections_back(docket_url: str) -> None:
    async with Docket(name=f"test-{uuid.uuid4().hex}", url=docket_url) as docket:
        docket.register(echo)
        store = store_of(docket)
        await docket.add(echo)(1)
        assert len(store._callers) == 1
    assert store._callers == []


# -- the packer ----------------------------------------------------------------------------

_ARGUMENTS = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["EVALSHA", "WAIT"]), st.lists(_ARGUMENTS)), max_size=4))
def test_script_calls_are_packed_as_redis_py_packs_them(
    raw: list[tuple[str, list[object]]],
) -> None:
    connection = RedisConnection()
    commands = [(name, *arguments) for name, arguments in raw]
    assert b"".join(_packed(connection, commands)) == b"".join(connection.pack_commands(commands))


def test_the_packer_leaves_other_encodings_and_split_names_to_redis_py() -> None:
    latin = RedisConnection(encoding="latin-1")
    command = ("EVALSHA", "é", b"x", 3)
    assert b"".join(_packed(latin, [command])) == b"".join(latin.pack_commands([command]))
    assert b"".join(_packed(latin, [command])) != b"".join(_packed(RedisConnection(), [command]))
    split = ("SCRIPT LOAD", "return 1")
    connection = RedisConnection()
    assert b"".join(_packed(connection, [split])) == b"".join(connection.pack_commands([split]))
    assert b"$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n" in b"".join(_packed(connection, [split]))
