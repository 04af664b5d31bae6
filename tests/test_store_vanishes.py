"""The stream and its consumer group vanish under a running worker (a
FLUSHALL, a restart without persistence, a failover to a replica that had not
received them): the worker recreates what it needs and goes on."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest
import redis
from servers import Server

from docket_core import Docket, ExecutionState, Worker

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends("redis-asyncio", "glide_valkey-asyncio", "glide_redis-asyncio"),
]


async def test_a_worker_goes_on_after_its_stream_vanishes(
    docket: Docket, server_for: Callable[[], Server | None]
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
