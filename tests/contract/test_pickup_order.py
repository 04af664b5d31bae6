"""An idle worker starts the task it picked up before it reads again: the
claim goes out at once and the next read waits for the start, so the read
never competes with the claim's round trip (issue 15, pickup)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest

from docket_core import Docket, Worker

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends("memory-asyncio", "redis-asyncio", "glide_valkey-asyncio"),
]


async def test_a_picked_up_task_starts_before_the_next_read(
    docket: Docket, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[str] = []

    async def job(i: int) -> None:
        log.append("task")

    docket.register(job)
    original = docket.adapter.read

    async def read(**options: Any) -> Any:
        log.append("read begins")
        result = await original(**options)
        if result.deliveries:
            log.append("read delivered")
        return result

    monkeypatch.setattr(docket.adapter, "read", read)
    async with Worker(
        docket,
        minimum_check_interval=timedelta(seconds=1),
        schedule_automatic_tasks=False,
        handle_signals=False,
    ) as worker:
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_forever)
            await anyio.sleep(0.3)
            for i in range(5):
                await docket.add(job)(i)
                with anyio.fail_after(5):
                    while log.count("task") <= i:
                        await anyio.sleep(0.005)
                await anyio.sleep(0.05)
            group.cancel_scope.cancel()
    pickups = [at for at, event in enumerate(log) if event == "read delivered"]
    assert len(pickups) >= 5, log
    for at in pickups:
        assert log[at + 1] == "task", f"the next read began before the task started: {log}"
