"""The stream and its consumer group (or the wake-up stream and its own)
vanish under a running worker (a FLUSHALL, a restart without persistence, a
failover to a replica that had not received them): the worker recreates what
it needs and goes on."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import anyio
import pytest
import redis
from servers import Server, redis_server_binary, valkey_server_binary

from docket_core import Docket, ExecutionState, StoreUnavailable, Worker

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends("redis-asyncio", "glide_valkey-asyncio", "glide_redis-asyncio"),
]


def recreation_warnings(caplog: pytest.LogCaptureFixture, docket: Docket) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
        and "recreated" in r.getMessage()
        and docket.name in r.getMessage()
    ]


async def test_a_worker_goes_on_after_its_stream_vanishes(
    docket: Docket, server_for: Callable[[], Server | None], caplog: pytest.LogCaptureFixture
) -> None:
    server = server_for()
    assert server is not None
    ran: list[int] = []

    async def job(n: int) -> None:
        ran.append(n)

    docket.register(job)
    worker = Worker(
        docket,
        name=f"worker-{uuid.uuid4().hex[:8]}",
        minimum_check_interval=timedelta(milliseconds=10),
        reconnection_delay=timedelta(milliseconds=50),
    )
    client = redis.Redis(host="127.0.0.1", port=server.port)  # sync: a side connection
    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(worker.run_forever)
                await docket.add(job, key="before")(1)
                while ran != [1]:
                    await anyio.sleep(0.01)
                # the stream goes, and its consumer group with it
                assert client.delete("{" + docket.name + "}:q") == 1
                for n in range(2, 6):
                    await docket.add(job, key=f"after-{n}")(n)
                while sorted(ran) != [1, 2, 3, 4, 5]:
                    await anyio.sleep(0.01)
                group.cancel_scope.cancel()
    finally:
        client.close()
    for n in range(2, 6):
        execution = await docket.get_execution(f"after-{n}")
        assert execution is not None and execution.state is ExecutionState.COMPLETED
    assert worker.counters.get("succeeded", 0) == 5
    # the worker says what it recreated, once, naming the docket
    assert len(recreation_warnings(caplog, docket)) == 1


async def test_a_run_in_flight_when_the_stream_vanishes_still_ends(
    docket: Docket, server_for: Callable[[], Server | None]
) -> None:
    """Its finish meets no consumer group (NOGROUP) until a read recreates
    it; the worker sends it again instead of stopping."""
    server = server_for()
    assert server is not None
    started = anyio.Event()

    async def slow() -> str:
        started.set()
        await anyio.sleep(0.3)
        return "done"

    docket.register(slow)
    worker = Worker(
        docket,
        name=f"worker-{uuid.uuid4().hex[:8]}",
        minimum_check_interval=timedelta(milliseconds=10),
        reconnection_delay=timedelta(milliseconds=50),
    )
    client = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(worker.run_forever)
                execution = await docket.add(slow, key="during")()
                await started.wait()
                client.delete("{" + docket.name + "}:q")
                assert await execution.get_result() == "done"
                group.cancel_scope.cancel()
    finally:
        client.close()
    assert worker.counters.get("succeeded", 0) == 1


async def test_a_worker_goes_on_after_a_restart_without_persistence(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server restarts empty under a running worker (its scripts, stream,
    group and records all gone): the worker logs that it recreated the
    stream and group, and runs what is added afterwards."""
    store = backend.rsplit("-", 1)[0]
    binary = redis_server_binary() if store.endswith("redis") else valkey_server_binary()
    if binary is None:
        pytest.skip(f"no server binary for {backend}")
    server = Server(binary).start()
    scheme = "glide" if store.startswith("glide") else "redis"
    url = f"{scheme}://127.0.0.1:{server.port}/0"
    ran: list[int] = []

    async def job(n: int) -> None:
        ran.append(n)

    async def add(docket: Docket, n: int) -> None:
        # a producer retries while its connections come back
        while True:
            try:
                await docket.add(job, key=f"job-{n}")(n)
                return
            except StoreUnavailable:
                await anyio.sleep(0.05)

    try:
        async with Docket(name=f"restart-{uuid.uuid4().hex}", url=url) as docket:
            docket.register(job)
            worker = Worker(
                docket,
                name=f"worker-{uuid.uuid4().hex[:8]}",
                minimum_check_interval=timedelta(milliseconds=10),
                reconnection_delay=timedelta(milliseconds=50),
            )
            with anyio.fail_after(30):
                async with anyio.create_task_group() as group:
                    group.start_soon(worker.run_forever)
                    await add(docket, 1)
                    while ran != [1]:
                        await anyio.sleep(0.01)
                    assert recreation_warnings(caplog, docket) == []  # a new docket
                    server.restart()
                    for n in range(2, 6):
                        await add(docket, n)
                    while sorted(ran) != [1, 2, 3, 4, 5]:
                        await anyio.sleep(0.01)
                    group.cancel_scope.cancel()
            assert recreation_warnings(caplog, docket), "the worker did not say so"
    finally:
        server.cleanup()


def groups(client: redis.Redis, stream: str) -> list[bytes]:
    """The names of the stream's consumer groups (none without the stream)."""
    try:
        return [group["name"] for group in client.xinfo_groups(stream)]
    except redis.ResponseError:
        return []


@pytest.mark.parametrize("how", ["deleted", "group destroyed"])
async def test_a_blocked_worker_is_still_woken_after_its_wake_stream_vanishes(
    docket: Docket, server_for: Callable[[], Server | None], how: str
) -> None:
    """The wake-up stream (``{name}:wake``) goes, or loses its consumer
    group, while the worker blocks on it: the worker makes it again and a
    message scheduled sooner than everything still wakes it at once."""
    server = server_for()
    assert server is not None
    ran: list[float] = []

    async def job() -> None:
        ran.append(time.monotonic())

    docket.register(job)
    # reads block for 3 s: only a wake-up can start the job well before that
    worker = Worker(
        docket,
        name=f"worker-{uuid.uuid4().hex[:8]}",
        minimum_check_interval=timedelta(seconds=3),
        reconnection_delay=timedelta(milliseconds=50),
    )
    wake = "{" + docket.name + "}:wake"
    client = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(worker.run_forever)
                await docket.add(job, when=datetime.now(UTC) + timedelta(hours=1))()
                while not client.exists(wake):
                    await anyio.sleep(0.01)
                await anyio.sleep(0.2)  # the worker blocks
                if how == "deleted":
                    assert client.delete(wake) == 1
                else:
                    assert client.xgroup_destroy(wake, "docket-workers") == 1
                # the worker reads again, makes the group again, and blocks again
                while groups(client, wake) != [b"docket-workers"]:
                    await anyio.sleep(0.01)
                await anyio.sleep(0.2)
                added = time.monotonic()
                await docket.add(job, when=datetime.now(UTC) + timedelta(seconds=0.2))()
                while not ran:
                    await anyio.sleep(0.01)
                group.cancel_scope.cancel()
    finally:
        client.close()
    assert ran[0] - added < 1.5, f"the job started {ran[0] - added:.2f} s after it was added"
