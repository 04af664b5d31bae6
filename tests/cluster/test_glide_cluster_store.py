"""Dockets on a Valkey cluster through GLIDE's ``GlideClusterClient``
(``glide+cluster://``): URL forms, two dockets on different nodes, results,
events and cancellation, scripts flushed mid-use, and a drain while the
docket's slot moves to another node.

Scoped limits and controls span slots and are not expected to work on a
cluster yet: nothing here uses them.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from glide import (
    AllPrimaries,
    ClosingError,
    GlideClusterClient,
    GlideClusterClientConfiguration,
    RequestError,
)
from glide import ConnectionError as GlideConnectionError
from glide import TimeoutError as GlideTimeoutError
from helpers import make_worker, running
from servers import Cluster, Server, command

from docket_core import (
    Docket,
    ExecutionCancelled,
    ExecutionState,
    StoreError,
    StoreUnavailable,
    UsageError,
    Worker,
)
from docket_core.adapter import adapter_for_url
from docket_core.lua import SCRIPTS
from docket_core.lua.protocol import Layout
from docket_core.sansio.effects import Cancel
from docket_core.sansio.inputs import Cancelled
from docket_glide import GlideStore, configuration_from_url
from docket_glide.store import _store_error

pytestmark = [pytest.mark.anyio, pytest.mark.backends("memory-asyncio")]


# -- URLs ------------------------------------------------------------------------------


def test_a_cluster_url_names_every_seed() -> None:
    configuration = configuration_from_url("glide+cluster://h1:7001,h2:7002,[::1]:7003,h4")
    assert isinstance(configuration, GlideClusterClientConfiguration)
    assert [(a.host, a.port) for a in configuration.addresses] == [
        ("h1", 7001),
        ("h2", 7002),
        ("::1", 7003),
        ("h4", 6379),
    ]
    assert not configuration.use_tls
    assert configuration.credentials is None
    assert configuration.request_timeout == 10_000
    assert configuration.advanced_config is None
    # the database 0 may be named; extra settings pass through
    tuned = configuration_from_url("glide+cluster://h1:7001/0", inflight_requests_limit=8)
    assert isinstance(tuned, GlideClusterClientConfiguration)
    assert tuned.inflight_requests_limit == 8


def test_a_cluster_url_carries_user_and_password() -> None:
    configuration = configuration_from_url("glide+cluster://alice:s%40cret@h1:7001,h2:7002")
    assert configuration.credentials is not None
    assert configuration.credentials.username == "alice"
    assert configuration.credentials.password == "s@cret"
    only_password = configuration_from_url("glide+cluster://:pw@h1:7001")
    assert only_password.credentials is not None
    assert only_password.credentials.username is None
    assert only_password.credentials.password == "pw"


def test_a_tls_cluster_url_takes_the_tls_options(tmp_path: Any) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nca.pem\n")
    configuration = configuration_from_url(f"glides+cluster://h1:7001,h2:7002?tls_ca_certs={ca}")
    assert isinstance(configuration, GlideClusterClientConfiguration)
    assert configuration.use_tls
    advanced = configuration.advanced_config
    assert advanced is not None and advanced.tls_config is not None
    assert advanced.tls_config.root_pem_cacerts is not None
    assert b"ca.pem" in advanced.tls_config.root_pem_cacerts
    insecure = configuration_from_url("glides+cluster://h1:7001?ssl_cert_reqs=none")
    assert insecure.advanced_config is not None and insecure.advanced_config.tls_config
    assert insecure.advanced_config.tls_config.use_insecure_tls


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("glide+cluster://h1:7001,h2:7002/1", r"a cluster has only database 0, not '1'"),
        ("glide+cluster://h1:7001/3?x", r"only database 0"),
        ("glide+cluster://", r"names at least one node"),
        ("glide+cluster://h1:port", r"not a usable port"),
        ("glide+cluster://h1:7001?tls_ca_certs=x", r"TLS options need a glides\+cluster:// URL"),
        ("glides+cluster://h1:7001?nope=1", r"unknown option\(s\) in the GLIDE URL: 'nope'"),
    ],
)
def test_an_unusable_cluster_url_is_refused(url: str, error: str) -> None:
    with pytest.raises(UsageError, match=error):
        configuration_from_url(url)


def test_the_cluster_schemes_pick_the_glide_store() -> None:
    for scheme in ("glide+cluster", "glides+cluster", "GLIDE+CLUSTER"):
        adapter = adapter_for_url(f"{scheme}://h1:7001,h2:7002", "d")
        assert isinstance(adapter, GlideStore) and adapter.cluster
    assert not GlideStore.from_url("glide://h:6379/0", name="d").cluster


async def test_a_configuration_takes_a_client_of_its_kind(
    glide_cluster: GlideClusterClient,
) -> None:
    standalone = configuration_from_url("glide://h1:7001/0")
    with pytest.raises(UsageError, match="takes a GlideClient, not a GlideClusterClient"):
        GlideStore(standalone, name="d", client=glide_cluster)


def test_cluster_errors_are_unavailable_others_refusals() -> None:
    for unavailable in (
        RequestError("An error was signalled by the server: - TryAgain: Multiple keys request"),
        RequestError("MOVED 3999 127.0.0.1:6381"),
        RequestError("ASK 3999 127.0.0.1:6381"),
        RequestError("CLUSTERDOWN The cluster is down"),
        RequestError("ERR Script attempted to access a non local key in a cluster node"),
        GlideTimeoutError("Request timed out"),
        GlideConnectionError("connection refused"),
        ClosingError("the client closed"),
    ):
        assert isinstance(_store_error(unavailable, "x"), StoreUnavailable), unavailable
    refused = _store_error(RequestError("ERR unknown command 'FOO'"), "x")
    assert isinstance(refused, StoreError) and not isinstance(refused, StoreUnavailable)


# -- dockets on the cluster --------------------------------------------------------------


def name_on(cluster: Cluster, node: Server, prefix: str = "cluster") -> str:
    """A fresh docket name whose slot ``node`` serves."""
    while True:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        if cluster.owner(cluster.key_slot("{" + name + "}")) is node:
            return name


def keys_of(node: Server, name: str) -> list[bytes]:
    keys: list[bytes] = command(node.port, "KEYS", "{" + name + "}*")
    return keys


@asynccontextmanager
async def cluster_docket(cluster: Cluster, name: str) -> AsyncIterator[Docket]:
    async with Docket(name=name, url=cluster.url("glide+cluster")) as docket:
        assert isinstance(docket.adapter, GlideStore) and docket.adapter.cluster
        yield docket


@pytest.mark.backends("memory-asyncio", "memory-trio")
async def test_two_dockets_on_two_nodes_drain_their_tasks(valkey_cluster: Cluster) -> None:
    first_node, second_node = valkey_cluster.nodes[0], valkey_cluster.nodes[1]
    names = [name_on(valkey_cluster, first_node), name_on(valkey_cluster, second_node)]
    done: dict[str, list[int]] = {name: [] for name in names}
    async with cluster_docket(valkey_cluster, names[0]) as one:
        async with cluster_docket(valkey_cluster, names[1]) as two:
            for docket in (one, two):

                async def record(n: int, docket_name: str = docket.name) -> None:
                    done[docket_name].append(n)

                await docket.add_many([docket.call(record)(n) for n in range(20)])
                await docket.add(record, key=f"single-{docket.name}")(100)
                assert await docket.adapter.pending() == 21
            for docket in (one, two):
                await make_worker(docket).run_until_finished()
                assert sorted(done[docket.name]) == [*range(20), 100]
                assert await docket.adapter.pending() == 0
    # each docket's keys live on its own node, and only there
    for name, node in zip(names, (first_node, second_node), strict=True):
        assert any(key.endswith(b":run:single-" + name.encode()) for key in keys_of(node, name))
        for other in valkey_cluster.nodes:
            if other is not node:
                assert keys_of(other, name) == []


async def test_results_events_and_cancellation(valkey_cluster: Cluster) -> None:
    name = name_on(valkey_cluster, valkey_cluster.nodes[2])
    started = anyio.Event()

    async def add(a: int, b: int) -> int:
        return a + b

    async def endless() -> None:
        started.set()
        await anyio.sleep_forever()

    async def never() -> None:
        raise AssertionError("cancelled before it ran")

    async with cluster_docket(valkey_cluster, name) as docket:
        worker = make_worker(docket)
        later = await docket.add(never, when=datetime.now(UTC) + timedelta(seconds=30))()
        async with running(worker, limit=20):
            # a result, and the events that led to it
            execution = await docket.add(add, key="sum")(2, 3)
            assert await execution.get_result(timeout=timedelta(seconds=10)) == 5
            states: list[str] = []
            watched = await docket.add(
                add, key="watched", when=datetime.now(UTC) + timedelta(seconds=0.5)
            )(1, 1)
            with anyio.fail_after(10):
                async for event in watched.subscribe():
                    if event.get("type") == "state":
                        states.append(event["state"])
                    if event.get("state") == "completed":
                        break
            assert states[0] == "scheduled" and states[-1] == "completed"
            # a waiting get_result ends with the cancel of a scheduled task
            async with anyio.create_task_group() as group:

                async def cancel_soon() -> None:
                    await anyio.sleep(0.1)
                    await docket.cancel(later.key)

                group.start_soon(cancel_soon)
                with pytest.raises(ExecutionCancelled):
                    await later.get_result(timeout=timedelta(seconds=10))
            # a running task is interrupted (the cancel signal reaches the worker)
            endless_run = await docket.add(endless, key="endless")()
            with anyio.fail_after(10):
                await started.wait()
            await docket.cancel("endless")
            with pytest.raises(ExecutionCancelled):
                await endless_run.get_result(timeout=timedelta(seconds=10))
            with anyio.fail_after(10):
                while (await docket.snapshot()).running:
                    await anyio.sleep(0.05)
        assert (await docket.get_execution("sum")).state is ExecutionState.COMPLETED  # type: ignore[union-attr]
        assert (await docket.get_execution(later.key)).state is ExecutionState.CANCELLED  # type: ignore[union-attr]


async def test_scripts_flushed_on_every_primary_mid_use_are_loaded_again(
    valkey_cluster: Cluster, glide_cluster: GlideClusterClient
) -> None:
    """A pipeline of scripts (``add_many``) and single scripts after
    ``SCRIPT FLUSH`` on every primary: the store loads them on every primary
    and sends again."""
    name = name_on(valkey_cluster, valkey_cluster.nodes[0])
    done: list[int] = []

    async def record(n: int) -> None:
        done.append(n)

    async with cluster_docket(valkey_cluster, name) as docket:
        worker = make_worker(docket)
        async with running(worker, limit=30):
            for round_ in range(3):
                await glide_cluster.custom_command(["SCRIPT", "FLUSH"], route=AllPrimaries())
                base = round_ * 100
                await docket.add_many([docket.call(record)(base + n) for n in range(10)])
                await glide_cluster.custom_command(["SCRIPT", "FLUSH"], route=AllPrimaries())
                await docket.add(record)(base + 50)
                with anyio.fail_after(10):
                    while len(done) < 11 * (round_ + 1):
                        await anyio.sleep(0.02)
        assert sorted(done) == sorted(base + n for base in (0, 100, 200) for n in [*range(10), 50])
        assert await docket.adapter.pending() == 0


async def test_a_pipeline_of_scripts_after_a_flush_loads_them_on_every_primary(
    valkey_cluster: Cluster, glide_cluster: GlideClusterClient
) -> None:
    """Two effects that are two script calls go out as one pipeline, where
    GLIDE does not reload a flushed script: the store loads every script on
    every primary and sends the pipeline again."""
    name = name_on(valkey_cluster, valkey_cluster.nodes[0])

    async def job() -> None:
        raise AssertionError("cancelled before it ran")

    async with cluster_docket(valkey_cluster, name) as docket:
        later = datetime.now(UTC) + timedelta(minutes=1)
        for key in ("a", "b"):
            await docket.add(job, when=later, key=key)()
        await glide_cluster.custom_command(["SCRIPT", "FLUSH"], route=AllPrimaries())
        now = time.time()
        outcomes = await docket.adapter.execute(
            [Cancel(key="a", now=now, ttl=600), Cancel(key="b", now=now, ttl=600)]
        )
        assert [type(outcome) for outcome in outcomes] == [Cancelled, Cancelled]
        for key in ("a", "b"):
            execution = await docket.get_execution(key)
            assert execution is not None and execution.state is ExecutionState.CANCELLED
    shas = [hashlib.sha1(source.encode()).hexdigest() for source in SCRIPTS.values()]
    for node in valkey_cluster.nodes:
        assert command(node.port, "SCRIPT", "EXISTS", *shas) == [1] * len(shas), node.port


async def test_one_round_of_calls_may_span_nodes(valkey_cluster: Cluster) -> None:
    """Calls for dockets on two nodes in one ``run_calls``: each answered,
    in the order sent."""
    names = [name_on(valkey_cluster, node) for node in valkey_cluster.nodes[:2]]

    async def job() -> None: ...

    async with cluster_docket(valkey_cluster, names[0]) as one:
        async with cluster_docket(valkey_cluster, names[1]) as two:
            later = datetime.now(UTC) + timedelta(minutes=1)
            await one.add(job, when=later)()
            for _ in range(2):
                await two.add(job, when=later)()
            store = one.adapter
            assert isinstance(store, GlideStore)
            pending = [Layout(name).call("inspect", "pending", "0") for name in names]
            replies = await store.run_calls([pending[0], pending[1], pending[1], pending[0]])
            assert [int(reply) for reply in replies] == [1, 2, 2, 1]
            await one.clear()
            await two.clear()


async def test_an_application_cluster_client_serves_the_docket(
    valkey_cluster: Cluster,
    glide_cluster_configuration: GlideClusterClientConfiguration,
    glide_cluster: GlideClusterClient,
) -> None:
    name = name_on(valkey_cluster, valkey_cluster.nodes[1])
    store = GlideStore(glide_cluster_configuration, name=name, client=glide_cluster)

    async def value() -> str:
        return "ok"

    async with Docket(name=name, adapter=store) as docket:
        execution = await docket.add(value)()
        await make_worker(docket).run_until_finished()
        assert await execution.get_result(timeout=timedelta(seconds=5)) == "ok"
    assert await glide_cluster.ping() == b"PONG"  # the application's client stays open


# -- a slot moved under a draining worker -------------------------------------------------

RESHARD_TASKS = 300


@pytest.mark.backends("memory-asyncio", "memory-trio")
async def test_a_drain_survives_its_slot_moving_to_another_node(valkey_cluster: Cluster) -> None:
    source = valkey_cluster.nodes[0]
    name = name_on(valkey_cluster, source, "reshard")
    slot = valkey_cluster.key_slot("{" + name + "}")
    target = next(node for node in valkey_cluster.nodes if node is not source)
    assert valkey_cluster.owner(slot) is source
    done: list[int] = []
    at_move: list[int] = []

    async def work(n: int) -> None:
        await anyio.sleep(0.01)
        done.append(n)

    async with cluster_docket(valkey_cluster, name) as docket:
        soon = datetime.now(UTC) + timedelta(seconds=1)
        calls = [
            docket.call(work, when=soon if n % 3 == 0 else None, key=f"task-{n}")(n)
            for n in range(RESHARD_TASKS)
        ]
        await docket.add_many(calls)
        worker: Worker = make_worker(docket, concurrency=4)
        moved = 0
        with anyio.fail_after(120):
            async with anyio.create_task_group() as group:
                group.start_soon(worker.run_until_finished)
                while len(done) < 20:
                    await anyio.sleep(0.01)
                at_move.append(len(done))

                def move() -> int:
                    return valkey_cluster.migrate_slot(slot, target, batch=5, pause=0.01)

                moved = await anyio.to_thread.run_sync(move)
                at_move.append(len(done))
        assert valkey_cluster.owner(slot) is target
        assert moved > RESHARD_TASKS  # the records and streams moved, a few at a time
        assert at_move[0] < RESHARD_TASKS and at_move[1] > at_move[0], at_move
        assert sorted(done) == list(range(RESHARD_TASKS))  # each once
        assert await docket.adapter.pending() == 0
        snapshot = await docket.snapshot()
        assert snapshot.total_tasks == 0 and snapshot.dead_letters == 0
        for n in range(0, RESHARD_TASKS, 7):
            execution = await docket.get_execution(f"task-{n}")
            assert execution is not None and execution.state is ExecutionState.COMPLETED
    assert command(source.port, "CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert keys_of(source, name) == []
    assert keys_of(target, name) != []
