"""The session's Valkey cluster works through both clients, and a slot moves.

Smoke tests of the test servers themselves (``valkey_cluster``), through
redis-py's asyncio ``RedisCluster`` and GLIDE's ``GlideClusterClient``: keys
on every primary, pub/sub (plain and sharded), and ``Cluster.migrate_slot``,
the helper that moves a docket's slot under a running worker.  Two tests pin
the servers' behaviour that docs/cluster.md builds on: a script declaring a
key that never exists (a fence) never runs while its slot is half moved
(TRYAGAIN), and a script without one writes, then fails, on a half-moved slot.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest
import redis
from glide import GlideClusterClient, GlideClusterClientConfiguration, PubSubMsg
from redis.asyncio.cluster import RedisCluster
from servers import CLUSTER_SLOTS, Cluster, ReplyError, Server, command, commands

pytestmark = [pytest.mark.anyio, pytest.mark.backends("memory-asyncio")]


def keys_on_every_node(cluster: Cluster, prefix: str, each: int = 3) -> dict[int, list[str]]:
    """Node port -> ``each`` keys starting with ``prefix`` that it serves."""
    keys: dict[int, list[str]] = {node.port: [] for node in cluster.nodes}
    n = 0
    while any(len(found) < each for found in keys.values()):
        key = f"{prefix}:{n}"
        found = keys[cluster.owner(cluster.key_slot(key)).port]
        if len(found) < each:
            found.append(key)
        n += 1
    return keys


def another_node(cluster: Cluster, slot: int) -> Server:
    owner = cluster.owner(slot)
    return next(node for node in cluster.nodes if node is not owner)


def test_redis_py_has_asyncio_cluster_pubsub() -> None:
    """The ``redis`` extra needs redis-py >= 8.0 (asyncio ``RedisCluster.pubsub``)."""
    major = int(redis.__version__.split(".")[0])
    assert major >= 8, redis.__version__
    assert callable(getattr(RedisCluster, "pubsub", None))


async def test_three_primaries_share_the_slots(valkey_cluster: Cluster) -> None:
    for node in valkey_cluster.nodes:
        assert command(node.port, "CLUSTER", "INFO").startswith(b"cluster_state:ok")
    served = valkey_cluster.slots_served()
    assert sum(served.values()) == CLUSTER_SLOTS
    # a third each, give or take the few slots other tests moved
    assert all(abs(count - CLUSTER_SLOTS / 3) < 100 for count in served.values()), served


async def test_redis_py_sets_and_gets_on_every_primary(
    valkey_cluster: Cluster, redis_cluster: RedisCluster
) -> None:
    keys = keys_on_every_node(valkey_cluster, f"smoke-{uuid.uuid4().hex}")
    for port, names in keys.items():
        for name in names:
            await redis_cluster.set(name, f"{port}")
    for port, names in keys.items():
        for name in names:
            assert await redis_cluster.get(name) == f"{port}".encode()
            # the key sits on the node that serves its slot, and only there
            assert command(port, "GET", name) == f"{port}".encode()


@pytest.mark.backends("memory-asyncio", "memory-trio")
async def test_glide_sets_and_gets_on_every_primary(
    valkey_cluster: Cluster, glide_cluster: GlideClusterClient
) -> None:
    keys = keys_on_every_node(valkey_cluster, f"smoke-{uuid.uuid4().hex}")
    for port, names in keys.items():
        for name in names:
            assert await glide_cluster.set(name, f"{port}") == "OK"
    for port, names in keys.items():
        for name in names:
            assert await glide_cluster.get(name) == f"{port}".encode()
            assert command(port, "GET", name) == f"{port}".encode()


async def _message(pubsub: Any, kind: str) -> dict[str, Any]:
    """The next message of ``kind`` (``subscribe``, ``message``, ``ssubscribe``,
    ``smessage``): sharded kinds come from the shard's connection."""
    read = pubsub.get_sharded_message if kind in ("ssubscribe", "smessage") else pubsub.get_message
    with anyio.fail_after(10):
        while True:
            message: dict[str, Any] | None = await read(timeout=1.0)
            if message is not None and message["type"] == kind:
                return message
            await anyio.sleep(0.01)  # (a read with nothing subscribed returns at once)


async def test_redis_py_cluster_pubsub(redis_cluster: RedisCluster) -> None:
    channel = f"{{smoke-{uuid.uuid4().hex}}}:events"
    pubsub = redis_cluster.pubsub()
    try:
        await pubsub.subscribe(channel)
        assert (await _message(pubsub, "subscribe"))["channel"] == channel.encode()
        assert await redis_cluster.publish(channel, b"plain") >= 1
        assert (await _message(pubsub, "message"))["data"] == b"plain"
        # sharded: the channel lives on the node of its slot, like a key
        await pubsub.ssubscribe(channel)
        assert (await _message(pubsub, "ssubscribe"))["channel"] == channel.encode()
        assert await redis_cluster.execute_command("SPUBLISH", channel, b"sharded") == 1
        assert (await _message(pubsub, "smessage"))["data"] == b"sharded"
    finally:
        await pubsub.aclose()


@pytest.mark.backends("memory-asyncio", "memory-trio")
async def test_glide_cluster_pubsub(
    glide_cluster_configuration: GlideClusterClientConfiguration,
    glide_cluster: GlideClusterClient,
) -> None:
    channel = f"{{smoke-{uuid.uuid4().hex}}}:events"
    listener = await GlideClusterClient.create(glide_cluster_configuration)
    try:
        await listener.subscribe({channel}, timeout_ms=10_000)
        await listener.ssubscribe({channel}, timeout_ms=10_000)
        assert await glide_cluster.publish("plain", channel) >= 1
        assert await glide_cluster.publish("sharded", channel, sharded=True) == 1
        received: list[PubSubMsg] = []
        with anyio.fail_after(10):
            while len(received) < 2:
                received.append(await listener.get_pubsub_message())
        assert sorted(m.message for m in received) == [b"plain", b"sharded"]
        assert {m.channel for m in received} == {channel.encode()}
    finally:
        await listener.close()


async def test_migrate_slot_moves_a_dockets_keys_while_clients_read(
    valkey_cluster: Cluster, redis_cluster: RedisCluster, glide_cluster: GlideClusterClient
) -> None:
    """A stream with its consumer group and a pending entry, and many small
    keys, move one at a time while both clients keep reading them."""
    tag = f"{{smoke-{uuid.uuid4().hex}}}"
    slot = valkey_cluster.key_slot(tag)
    source, target = valkey_cluster.owner(slot), another_node(valkey_cluster, slot)
    await redis_cluster.xgroup_create(f"{tag}:q", "workers", id="0", mkstream=True)
    entry = await redis_cluster.xadd(f"{tag}:q", {"k": "task"})
    await redis_cluster.xreadgroup("workers", "w1", {f"{tag}:q": ">"}, count=1)
    for n in range(40):
        await redis_cluster.set(f"{tag}:run:{n}", n)

    reads: list[tuple[int, Any, Any]] = []
    done = anyio.Event()

    async def keep_reading() -> None:
        n = 0
        while not done.is_set():
            key = f"{tag}:run:{n % 40}"
            reads.append((n % 40, await redis_cluster.get(key), await glide_cluster.get(key)))
            n += 1
            await anyio.sleep(0)

    async with anyio.create_task_group() as group:
        group.start_soon(keep_reading)
        moved = await anyio.to_thread.run_sync(
            lambda: valkey_cluster.migrate_slot(slot, target, batch=1, pause=0.005)
        )
        done.set()

    assert moved == 41
    assert valkey_cluster.owner(slot) is target
    assert command(source.port, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert command(target.port, "CLUSTER", "COUNTKEYSINSLOT", slot) == 41
    # every read mid-move found its key, on whichever node held it then
    assert len(reads) > 40
    assert all(r == g == str(n).encode() for n, r, g in reads)
    # the consumer group and its pending entry moved with the stream
    pending = await redis_cluster.xpending(f"{tag}:q", "workers")
    assert (pending["pending"], pending["min"]) == (1, entry)
    assert await glide_cluster.get(f"{tag}:run:7") == b"7"
    assert valkey_cluster.migrate_slot(slot, target) == 0  # already there


FENCED = "redis.call('SET', KEYS[1], 'written'); return redis.call('GET', KEYS[1] .. ':more')"
UNFENCED = "redis.call('SET', KEYS[1], 'written'); return redis.call('INCR', KEYS[1] .. ':n')"


def _half_moved(cluster: Cluster, tag: str) -> tuple[Server, Server, int]:
    """A slot marked migrating from its owner to another node, one of its two
    keys moved: the state ``migrate_slot`` passes through."""
    slot = cluster.key_slot(tag)
    source, target = cluster.owner(slot), another_node(cluster, slot)
    command(source.port, "SET", f"{tag}:stays", "old")
    command(source.port, "SET", f"{tag}:moves", "old")
    ids = cluster.node_ids()
    command(target.port, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source.port])
    command(source.port, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target.port])
    command(source.port, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", f"{tag}:moves")
    return source, target, slot


def _finish_move(cluster: Cluster, slot: int, target: Server) -> None:
    """Move what is left, as ``migrate_slot`` does from its first batch."""
    assert cluster.migrate_slot(slot, target) >= 0
    assert cluster.owner(slot) is target


async def test_a_fenced_script_never_runs_on_a_half_moved_slot(valkey_cluster: Cluster) -> None:
    """Declaring a key that never exists (the fence) next to one that does
    makes the server answer TRYAGAIN, on the source and on the target alike,
    for as long as the slot moves: the script runs before or after, whole."""
    tag = f"{{fence-{uuid.uuid4().hex}}}"
    source, target, slot = _half_moved(valkey_cluster, tag)
    fence = f"{tag}:fence"
    try:
        # on the source: some declared keys here, the fence missing
        with pytest.raises(ReplyError, match=r"^TRYAGAIN"):
            command(source.port, "EVAL", FENCED, 2, f"{tag}:stays", fence)
        # none of them here: ASK, and the target (asked) has not all of them either
        with pytest.raises(ReplyError, match=r"^ASK"):
            command(source.port, "EVAL", FENCED, 2, f"{tag}:moves", fence)
        _, asked = commands(target.port, ["ASKING"], ["EVAL", FENCED, 2, f"{tag}:moves", fence])
        assert isinstance(asked, ReplyError) and str(asked).startswith("TRYAGAIN"), asked
        assert command(source.port, "GET", f"{tag}:stays") == b"old"  # nothing ran
        assert commands(target.port, ["ASKING"], ["GET", f"{tag}:moves"])[1] == b"old"
    finally:
        _finish_move(valkey_cluster, slot, target)
    assert command(target.port, "EVAL", FENCED, 2, f"{tag}:stays", fence) is None
    assert command(target.port, "GET", f"{tag}:stays") == b"written"


async def test_an_unfenced_script_writes_then_fails_on_a_half_moved_slot(
    valkey_cluster: Cluster,
) -> None:
    """Without a fence, a script whose declared key is still on the source
    runs there, writes, and fails at its first key the source lacks: half a
    script's effects (why every docket script declares the fence)."""
    tag = f"{{unfenced-{uuid.uuid4().hex}}}"
    source, target, slot = _half_moved(valkey_cluster, tag)
    try:
        with pytest.raises(ReplyError, match="non local key"):
            command(source.port, "EVAL", UNFENCED, 1, f"{tag}:stays")
        assert command(source.port, "GET", f"{tag}:stays") == b"written"
    finally:
        _finish_move(valkey_cluster, slot, target)
