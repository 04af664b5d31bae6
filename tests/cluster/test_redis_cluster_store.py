"""Dockets through redis-py on a Valkey cluster and on a sentinel-managed primary.

The URL forms (``redis+cluster://``, ``rediss+cluster://``,
``redis+sentinel://``) and, through the public API (``Docket``, ``Worker``),
what must work on them: adding and draining on dockets that live on
different nodes, results, events and cancellation (pub/sub through a cluster
node), scripts flushed from every node, a docket's slot moved to another node
mid-drain, and a sentinel failover mid-drain (every add that returned ends
completed: ``WAIT`` turns a write the old primary kept into a lost reply).
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from helpers import make_worker, running
from redis.asyncio.cluster import RedisCluster
from servers import Cluster, SentinelSet, Server, command, info

from docket_core import (
    Docket,
    ExecutionCancelled,
    ExecutionState,
    StoreError,
    StoreUnavailable,
    UsageError,
)
from docket_core.lua import SCRIPTS
from docket_core.lua.protocol import Layout, ScriptCall
from docket_redis import RedisStore

pytestmark = [pytest.mark.anyio, pytest.mark.backends("memory-asyncio")]


def docket_name_on(cluster: Cluster, node: Server, prefix: str = "cluster") -> str:
    """A fresh docket name whose slot ``node`` serves."""
    while True:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        if cluster.owner(cluster.key_slot("{" + name + "}")) is node:
            return name


def another_node(cluster: Cluster, slot: int) -> Server:
    owner = cluster.owner(slot)
    return next(node for node in cluster.nodes if node is not owner)


def slot_of(cluster: Cluster, name: str) -> int:
    return cluster.key_slot("{" + name + "}")


async def states_of(docket: Docket, keys: list[str]) -> dict[str, ExecutionState | None]:
    states: dict[str, ExecutionState | None] = {}
    for key in keys:
        execution = await docket.get_execution(key)
        states[key] = None if execution is None else execution.state
    return states


# -- the URL forms ---------------------------------------------------------------------


def test_a_cluster_url_names_every_seed_and_the_credentials() -> None:
    store = RedisStore.from_url(
        "redis+cluster://alice:s%40cret@10.0.0.1:7000,10.0.0.2:7001,[::1]:7002,seed.example"
        "?socket_connect_timeout=2",
        name="d",
    )
    client = store.client
    assert isinstance(client, RedisCluster)
    seeds = sorted(node.name for node in client.nodes_manager.startup_nodes.values())
    assert seeds == ["10.0.0.1:7000", "10.0.0.2:7001", "::1:7002", "seed.example:6379"]
    options = client.connection_kwargs
    assert (options["username"], options["password"]) == ("alice", "s@cret")
    assert options["socket_timeout"] is None  # blocking reads
    assert options["socket_connect_timeout"] == 2.0
    assert options["decode_responses"] is False


def test_a_tls_cluster_url_takes_the_tls_options() -> None:
    store = RedisStore.from_url("rediss+cluster://h1:7000/0?tls_insecure=true", name="d")
    assert isinstance(store.client, RedisCluster)
    options = store.client.connection_kwargs
    assert options["connection_class"].__name__ == "SSLConnection"
    assert (options["ssl_cert_reqs"], options["ssl_check_hostname"]) == ("none", False)


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("redis+cluster://h1:7000,h2:7001/1", "only database 0"),
        ("redis+cluster://h1:7000?db=3", "only database 0"),
        ("redis+cluster://h1:7000/zero", "at most a database number"),
        ("redis+cluster://h1:7000,h2:port", "not a port"),
        ("redis+cluster://h1:7000,,h2:7001", "a host is missing"),
        ("redis+cluster://h1:7000?ssl_cert_reqs=none", "TLS options need rediss+cluster://"),
        ("redis+cluster://h1:7000?wait_replicas=1", "unknown option(s)"),
        ("redis+sentinel://s1:26379", "names the service"),
        ("redis+sentinel://s1:26379/docket/x", "not a database number"),
        ("redis+sentinel://s1:26379/docket/0?wait_replicas=-1", "whole number"),
    ],
)
def test_a_bad_cluster_or_sentinel_url_is_a_usage_error(url: str, complaint: str) -> None:
    with pytest.raises(UsageError, match=re.escape(complaint)):
        Docket(name="d", url=url)


def test_a_sentinel_url_names_the_service_the_database_and_the_wait() -> None:
    store = RedisStore.from_url(
        "redis+sentinel://:data-secret@s1:26380,s2/orders/2"
        "?sentinel_password=sentinel-secret&wait_replicas=2&wait_timeout_ms=250",
        name="d",
    )
    client: Any = store.client
    pool = client.connection_pool
    assert pool.service_name == "orders"
    assert pool.connection_kwargs["db"] == 2
    assert pool.connection_kwargs["password"] == "data-secret"
    assert pool.connection_kwargs["socket_timeout"] is None
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [26380, 26379]
    assert all(
        s.connection_pool.connection_kwargs["password"] == "sentinel-secret" for s in sentinels
    )
    assert (store.wait_replicas, store.wait_timeout_ms) == (2, 250)
    default = RedisStore.from_url("redis+sentinel://s1/orders", name="d")
    assert (default.wait_replicas, default.wait_timeout_ms) == (1, 1000)
    client = default.client
    assert client.connection_pool.connection_kwargs["db"] == 0


# -- a cluster ---------------------------------------------------------------------------


@asynccontextmanager
async def cluster_docket(cluster: Cluster, name: str) -> AsyncIterator[Docket]:
    async with Docket(name=name, url=cluster.url()) as docket:
        yield docket


async def test_dockets_on_different_nodes_add_and_drain(valkey_cluster: Cluster) -> None:
    first, second = valkey_cluster.nodes[0], valkey_cluster.nodes[1]
    names = [docket_name_on(valkey_cluster, first), docket_name_on(valkey_cluster, second)]
    ran: dict[str, list[int]] = {name: [] for name in names}

    async def step(docket_name: str, n: int) -> int:
        ran[docket_name].append(n)
        return n * n

    for name in names:
        async with cluster_docket(valkey_cluster, name) as docket:
            docket.register(step)
            executions = await docket.add_many(
                [docket.call(step)(name, n) for n in range(40)], chunk_size=15
            )
            executions.append(await docket.add(step)(name, 40))
            async with make_worker(docket, concurrency=5) as worker:
                with anyio.fail_after(20):
                    await worker.run_until_finished()
            assert sorted(ran[name]) == list(range(41))
            assert await executions[7].get_result(timeout=timedelta(seconds=2)) == 49
            assert (await docket.snapshot()).total_tasks == 0
    # each docket's keys sit on its own node, and no WAIT went to any node
    for name, node in zip(names, (first, second), strict=True):
        slot = slot_of(valkey_cluster, name)
        assert command(node.port, "CLUSTER", "COUNTKEYSINSLOT", slot) > 0
        assert command(node.port, "EXISTS", "{" + name + "}:q") == 1
    for node in valkey_cluster.nodes:
        assert "cmdstat_wait" not in info(node.port, "commandstats")


async def test_results_events_and_cancellation_on_a_cluster(valkey_cluster: Cluster) -> None:
    name = docket_name_on(valkey_cluster, valkey_cluster.nodes[2], prefix="events")
    started = anyio.Event()
    proceed = anyio.Event()

    async def answer() -> str:
        await proceed.wait()
        return "forty-two"

    async def endless() -> None:
        started.set()
        await anyio.sleep(60)

    async with cluster_docket(valkey_cluster, name) as docket:
        docket.register(answer)
        docket.register(endless)
        await docket.add(answer, when=datetime.now(UTC) + timedelta(minutes=5), key="later")()
        await docket.cancel("later")  # scheduled, then cancelled before any worker
        execution = await docket.add(answer)()
        states: list[str] = []
        subscribed = anyio.Event()

        async def watch() -> None:
            async for event in execution.subscribe():
                subscribed.set()
                if event["type"] == "state":
                    states.append(event["state"])
                    if event["state"] == "completed":
                        return

        worker = make_worker(docket)
        async with running(worker, limit=20):
            async with anyio.create_task_group() as group:
                group.start_soon(watch)
                await subscribed.wait()
                proceed.set()
            assert await execution.get_result(timeout=timedelta(seconds=5)) == "forty-two"
            # a running task stops on the cancellation, published through the cluster
            stopped = await docket.add(endless, key="endless")()
            with anyio.fail_after(5):
                await started.wait()
            cancelled_at = time.monotonic()
            await docket.cancel("endless")
            with pytest.raises(ExecutionCancelled):
                await stopped.get_result(timeout=timedelta(seconds=5))
            assert time.monotonic() - cancelled_at < 2
        assert states[-2:] == ["running", "completed"]
        assert (await states_of(docket, ["later", "endless"])) == {
            "later": ExecutionState.CANCELLED,
            "endless": ExecutionState.CANCELLED,
        }


async def test_scripts_flushed_from_every_node_are_loaded_again(valkey_cluster: Cluster) -> None:
    name = docket_name_on(valkey_cluster, valkey_cluster.nodes[0], prefix="noscript")
    done: list[int] = []

    async def step(n: int) -> None:
        done.append(n)

    async with cluster_docket(valkey_cluster, name) as docket:
        docket.register(step)
        await docket.add(step)(0)  # the scripts are loaded on every primary
        for node in valkey_cluster.nodes:
            assert command(node.port, "SCRIPT", "FLUSH") == b"OK"
        await docket.add_many([docket.call(step)(n) for n in range(1, 30)], chunk_size=10)
        async with make_worker(docket, concurrency=8) as worker:
            with anyio.fail_after(20):
                await worker.run_until_finished()
        assert sorted(done) == list(range(30))
        assert worker.counters["store_errors"] == 0


async def test_a_batch_goes_to_each_slot_in_order_and_survives_a_script_flush(
    valkey_cluster: Cluster,
) -> None:
    """The store primitive under the core's batches: consecutive calls of one
    slot share a pipeline, calls of another slot go in their own round trip,
    and a NOSCRIPT inside a pipeline loads the scripts on every primary."""
    here = docket_name_on(valkey_cluster, valkey_cluster.nodes[0], prefix="batch")
    there = docket_name_on(valkey_cluster, valkey_cluster.nodes[1], prefix="batch")
    store = RedisStore.from_url(valkey_cluster.url(), name=here)
    await store.open()
    try:

        def pending(name: str) -> ScriptCall:
            return Layout(name).call("inspect", "pending", "0")

        calls = [pending(here), pending(here), pending(there), pending(here)]
        assert await store.run_calls(calls) == [0, 0, 0, 0]
        for node in valkey_cluster.nodes:
            assert command(node.port, "SCRIPT", "FLUSH") == b"OK"
        assert await store.run_calls(calls) == [0, 0, 0, 0]
        sha = hashlib.sha1(SCRIPTS["inspect"].encode()).hexdigest()
        for node in valkey_cluster.nodes:  # loaded again on every primary
            assert command(node.port, "SCRIPT", "EXISTS", sha) == [1]
    finally:
        await store.close()


async def test_a_docket_drains_while_its_slot_moves_to_another_node(
    valkey_cluster: Cluster,
) -> None:
    """About 300 tasks, a worker draining them, and mid-drain every key of the
    docket migrated, five at a time, to another node: every task completes,
    nothing is left pending, and nothing is left on the source."""
    source = valkey_cluster.nodes[1]
    name = docket_name_on(valkey_cluster, source, prefix="reshard")
    slot = slot_of(valkey_cluster, name)
    target = another_node(valkey_cluster, slot)
    total = 300
    done: list[int] = []
    moving: dict[str, int] = {}

    async def step(n: int) -> None:
        await anyio.sleep(0.01)
        done.append(n)

    async with cluster_docket(valkey_cluster, name) as docket:
        docket.register(step)
        executions = await docket.add_many(
            [docket.call(step)(n) for n in range(total)], chunk_size=50
        )
        keys = [execution.key for execution in executions]
        worker = make_worker(docket, concurrency=4, redelivery_timeout=timedelta(seconds=5))

        async def move_mid_drain() -> None:
            with anyio.fail_after(30):
                while len(done) < 20:
                    await anyio.sleep(0.005)
            moving["done_before"] = len(done)
            moving["keys"] = await anyio.to_thread.run_sync(
                lambda: valkey_cluster.migrate_slot(slot, target, batch=5, pause=0.01)
            )
            moving["done_after"] = len(done)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                group.start_soon(move_mid_drain)
                async with worker:
                    await worker.run_until_finished()

        assert moving["done_before"] < total  # the move began mid-drain
        assert moving["keys"] > total  # every record moved, with the streams
        assert sorted(set(done)) == list(range(total))
        assert (await docket.snapshot()).total_tasks == 0
        states = await states_of(docket, keys)
        assert set(states.values()) == {ExecutionState.COMPLETED}
    assert valkey_cluster.owner(slot) is target
    assert command(source.port, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert command(target.port, "EXISTS", "{" + name + "}:q") == 1


# -- a sentinel-managed primary -----------------------------------------------------------


def settle(sentinel_set: SentinelSet) -> None:
    """Turn an old primary still a master into a replica of the primary (it
    drops what only it held), and wait until the whole set is healthy."""
    primary = sentinel_set.primary()
    for node in sentinel_set.data_nodes:
        if node is not primary and info(node.port, "replication").get("role") == "master":
            command(node.port, "REPLICAOF", "127.0.0.1", primary.port)
    sentinel_set.wait_healthy()


@pytest.fixture
def healthy_sentinel_set(sentinel_set: SentinelSet) -> Iterator[SentinelSet]:
    """The session's sentinel set, healthy again after the test."""
    yield sentinel_set
    settle(sentinel_set)


async def test_a_docket_adds_and_drains_on_a_sentinel_primary(
    healthy_sentinel_set: SentinelSet,
) -> None:
    ran: list[int] = []

    async def step(n: int) -> int:
        ran.append(n)
        return n + 1

    name = f"sentinel-{uuid.uuid4().hex[:8]}"
    async with Docket(name=name, url=healthy_sentinel_set.url()) as docket:
        docket.register(step)
        executions = await docket.add_many([docket.call(step)(n) for n in range(20)])
        async with make_worker(docket, concurrency=4) as worker:
            with anyio.fail_after(20):
                await worker.run_until_finished()
        assert sorted(ran) == list(range(20))
        assert await executions[3].get_result(timeout=timedelta(seconds=2)) == 4
    primary = healthy_sentinel_set.primary()
    (replica,) = [node for node in healthy_sentinel_set.data_nodes if node is not primary]
    # every write waited for the replica: it holds the records
    assert int(info(primary.port, "commandstats")["cmdstat_wait"].split(",")[0][6:]) > 0
    key = "{" + name + "}:run:" + executions[0].key
    assert command(replica.port, "HGET", key, "state") == b"completed"


async def test_a_write_fewer_replicas_acknowledge_is_a_lost_reply(
    healthy_sentinel_set: SentinelSet,
) -> None:
    async def step() -> None:
        pass

    url = healthy_sentinel_set.url() + "?wait_replicas=2&wait_timeout_ms=50"
    async with Docket(name=f"sentinel-{uuid.uuid4().hex[:8]}", url=url) as docket:
        docket.register(step)
        with pytest.raises(StoreUnavailable, match="reached only 1 replicas"):
            await docket.add(step)()
    # wait_replicas=0: no WAIT at all
    url = healthy_sentinel_set.url() + "?wait_replicas=0"
    async with Docket(name=f"sentinel-{uuid.uuid4().hex[:8]}", url=url) as docket:
        docket.register(step)
        await docket.add(step)()


async def test_every_add_that_returned_completes_across_a_failover(
    healthy_sentinel_set: SentinelSet,
) -> None:
    """A producer adds, a worker drains, and meanwhile the sentinels fail the
    primary over, leaving the old one a master for seconds (what it takes is
    lost when it is turned replica).  An add that returned had reached a
    replica: it completes, at least once, on the new primary."""
    sentinels = healthy_sentinel_set
    ran: list[int] = []

    async def step(n: int) -> None:
        ran.append(n)

    returned: dict[int, str] = {}
    refused = 0
    url = sentinels.url() + "?wait_timeout_ms=300"
    async with Docket(name=f"failover-{uuid.uuid4().hex[:8]}", url=url) as docket:
        docket.register(step)
        worker = make_worker(docket, concurrency=4, redelivery_timeout=timedelta(seconds=3))
        failed_over = anyio.Event()

        async def produce() -> None:
            nonlocal refused
            n = 0
            after = 0  # adds that returned after the failover
            while not failed_over.is_set() or after < 20:
                try:
                    execution = await docket.add(step)(n)
                except StoreError:
                    refused += 1
                else:
                    returned[n] = execution.key
                    after += failed_over.is_set()
                n += 1
                await anyio.sleep(0.01)

        async def fail_over() -> None:
            with anyio.fail_after(5):
                while len(ran) < 10:
                    await anyio.sleep(0.01)
            await anyio.to_thread.run_sync(lambda: sentinels.failover(convert_old_primary=False))
            failed_over.set()

        with anyio.fail_after(90):
            async with running(worker, limit=90):
                async with anyio.create_task_group() as group:
                    group.start_soon(produce)
                    group.start_soon(fail_over)
                # what only the old primary held vanishes now (if anything)
                await anyio.to_thread.run_sync(settle, sentinels)
                # a new client (it asks the sentinels) sees the records on the primary
                async with Docket(name=docket.name, url=sentinels.url()) as observer:
                    keys = list(returned.values())
                    while set((await states_of(observer, keys)).values()) != {
                        ExecutionState.COMPLETED
                    }:
                        await anyio.sleep(0.1)
    assert set(returned) <= set(ran)
    assert refused > 0  # writes the old primary kept were refused (WAIT answered 0)
