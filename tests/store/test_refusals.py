"""A server refusing writes for a while (out of memory with ``noeviction``)
is waited out: the worker backs off and sends its effects again, never stops,
and every task still runs exactly once."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import anyio
import pytest
import redis
from servers import Server

from docket_core import Docket, ExecutionState, Worker

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends(
        "redis-asyncio", "valkey-asyncio", "glide_valkey-asyncio", "glide_redis-asyncio"
    ),
]

TASKS = 30
RETRY = timedelta(milliseconds=50)
#: longer than three heartbeats and three resends (with their backoff)
REFUSING = 1.5


async def test_a_worker_waits_out_a_store_out_of_memory(
    make_docket: Callable[..., object], server_for: Callable[[], Server | None]
) -> None:
    server = server_for()
    assert server is not None
    docket = await make_docket(heartbeat_interval=RETRY)  # type: ignore[operator]
    assert isinstance(docket, Docket)
    runs: Counter[int] = Counter()

    async def job(n: int) -> int:
        runs[n] += 1
        await anyio.sleep(0.05)
        return n

    docket.register(job)
    executions = [await docket.add(job, key=f"job-{n}")(n) for n in range(TASKS)]
    worker = Worker(
        docket,
        name=f"worker-{uuid.uuid4().hex[:8]}",
        concurrency=4,
        minimum_check_interval=timedelta(milliseconds=10),
        reconnection_delay=RETRY,
        redelivery_timeout=timedelta(seconds=30),
        schedule_automatic_tasks=False,
    )
    admin = redis.Redis(host="127.0.0.1", port=server.port)  # sync: a side connection
    stopped: list[BaseException | None] = []

    async def run() -> None:
        try:
            await worker.run_forever()
            stopped.append(None)
        except BaseException as error:
            stopped.append(error)
            raise

    try:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                while sum(runs.values()) < 5:
                    await anyio.sleep(0.005)
                admin.config_set("maxmemory-policy", "noeviction")
                admin.config_set("maxmemory", 1)
                errors_before = worker.counters["store_errors"]
                await anyio.sleep(REFUSING)
                refused = worker.counters["store_errors"] - errors_before
                admin.config_set("maxmemory", 0)
                assert not stopped, f"the worker stopped: {stopped}"
                while worker.counters["succeeded"] < TASKS:
                    await anyio.sleep(0.01)
                assert not stopped, f"the worker stopped: {stopped}"
                group.cancel_scope.cancel()
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
    assert refused >= 3, "the store never refused the worker's writes"
    assert runs == Counter(range(TASKS))  # each ran exactly once
    for execution in executions:
        stored = await docket.get_execution(execution.key)
        assert stored is not None and stored.state is ExecutionState.COMPLETED
        assert await execution.get_result() == int(execution.key.split("-")[1])
