"""``StorageAdapter.sends_at_once`` is honest: where an adapter says so, its
``execute`` has put the call on the wire (or, in memory, carried it out) by
the time its coroutine first yields.  A worker starts a fresh delivery's run
beside its claim only on such a store (``WorkerConfig.start_early``), so a
run cannot make a change (a cancel of its own key) that reaches the store
ahead of its claim."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from backends import CLUSTER_BACKENDS, SERVER_BACKENDS
from helpers import keys_in_each_partition, resume
from servers import Cluster, SentinelSet, Server, Servers, command

from docket_core import Docket
from docket_core.lua.protocol import Layout
from docket_core.partition_parts import part_names
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import Heartbeat
from docket_core.sansio.partitions import partition_of
from docket_core.sansio.values import ScheduleMode

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends(
        "memory-asyncio",
        *(b for b in SERVER_BACKENDS + CLUSTER_BACKENDS if b.endswith("asyncio")),
    ),
]


def _port_of(servers: Servers, name: str) -> int:
    if isinstance(servers, Cluster):
        return servers.owner(servers.key_slot(Layout(name).prefix)).port
    if isinstance(servers, SentinelSet):
        return servers.primary().port
    assert isinstance(servers, Server)
    return servers.port


def _stored_within(port: int, key: str, seconds: float) -> bool:
    """Whether the server holds ``key`` within ``seconds`` (asked over a
    blocking socket: the event loop does not turn meanwhile)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if command(port, "EXISTS", key) == 1:
            return True
        time.sleep(0.005)
    return False


def _add(key: str) -> Any:
    now = time.time()
    return plan_add(key=key, function="f", payload=b"p", when=now, mode=ScheduleMode.ADD, now=now)


async def test_a_store_that_sends_at_once_has_sent_before_it_first_yields(
    docket: Docket, server_for: Callable[[], Servers | None], backend: str
) -> None:
    adapter = docket.adapter
    if backend.startswith("redis_cluster"):
        # (a cluster pipeline writes from tasks of its own, a loop turn later)
        assert adapter.sends_at_once is False
        return
    assert adapter.sends_at_once is True
    key = f"k-{uuid.uuid4().hex}"
    await adapter.execute([_add(key)])  # (connected, its scripts loaded)
    call = adapter.execute([_add(f"{key}-2")])
    try:
        yielded = call.send(None)
    except StopIteration:  # (carried out without yielding: memory)
        assert server_for() is None
        assert (await docket.get_execution(f"{key}-2")) is not None
        return
    servers = server_for()
    assert servers is not None
    port = _port_of(servers, adapter.name)
    stored = _stored_within(port, Layout(adapter.name).run_key(f"{key}-2"), 2.0)
    (outcome,) = await resume(call, yielded)
    assert stored, "the add had not reached the server when execute first yielded"
    assert getattr(outcome, "accepted", None) is True


async def test_a_partitioned_docket_sends_a_batchs_first_round_at_once(
    make_docket: Callable[..., Any], server_for: Callable[[], Servers | None], backend: str
) -> None:
    """A worker's claim of runs that start with it leads its batch (the
    core puts it first): a partitioned store sends the first round, the
    pieces for several partitions, before it yields (one client's pipeline)."""
    docket = await make_docket(partitions=3)
    adapter = docket.adapter
    if backend.startswith(("memory", "redis_cluster")):
        # (memory partitions are stores apart, side by side from tasks of
        # their own; redis-py's cluster pipeline writes a loop turn later)
        assert adapter.sends_at_once is False
        return
    assert adapter.sends_at_once is True
    keys = keys_in_each_partition(3)
    await adapter.execute([_add(f"{keys[0]}-warm")])  # (connected, scripts loaded)
    beat = Heartbeat(worker="w", tasks=(), now=time.time())
    call = adapter.execute([_add(keys[0]), _add(keys[1]), _add(keys[2]), beat])
    yielded = call.send(None)
    servers = server_for()
    assert servers is not None
    stored = [
        _stored_within(_port_of(servers, name), Layout(name).run_key(key), 2.0)
        for key in keys
        for name in [part_names(docket.name, 3)[partition_of(key, 3)]]
    ]
    outcomes = await resume(call, yielded)
    assert stored == [True, True, True], "a partition's add had not left when execute yielded"
    assert len(outcomes) == 4
