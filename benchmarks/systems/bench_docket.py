"""docket (this repository) on memory://, redis:// (redis-py) or glide:// (GLIDE).

Defaults: ``Worker(docket, concurrency=C)`` with its 250 ms
``minimum_check_interval`` and ``scheduling_resolution``. Tuned: both 10 ms.
Automatic (perpetual) tasks are off in both, as there are none.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import LIMIT_KEYS, System, main, noop_body, sleep_body, timing_body

from docket_core import ConcurrencyLimit, Docket, Worker


async def noop(t: float) -> None:
    await noop_body(t)


async def sleeper(t: float) -> None:
    await sleep_body(t)


async def timing(t: float) -> None:
    await timing_body(t)


async def limited(
    t: float, customer: int, limit: ConcurrencyLimit = ConcurrencyLimit("customer", 1)
) -> None:
    await sleep_body(t)


TASKS = {"noop": noop, "sleep": sleeper, "timing": timing, "limited": limited}


class DocketSystem(System):
    versions = ("docket", "redis", "valkey-glide", "anyio")

    def __init__(self, url: str, profile: str, concurrency: int) -> None:
        super().__init__(url, profile, concurrency)
        self.server = not url.startswith("memory://")
        name = f"bench-{uuid.uuid4().hex[:8]}"
        if url.startswith("memory://"):
            url = f"memory://{name}"
        self.docket = Docket(name=name, url=url)
        for task in TASKS.values():
            self.docket.register(task)
        self.interval = timedelta(milliseconds=10 if profile == "tuned" else 250)
        self.worker: Worker | None = None
        self.runner: asyncio.Task[None] | None = None

    def settings(self) -> dict[str, Any]:
        ms = self.interval.total_seconds() * 1000
        return {"minimum_check_interval_ms": ms, "scheduling_resolution_ms": ms}

    async def open(self) -> None:
        await self.docket.__aenter__()

    async def close(self) -> None:
        await self.docket.__aexit__(None, None, None)

    async def enqueue(self, kind: str, t: float, key: int = 0) -> None:
        if kind == "limited":
            await self.docket.add(limited)(t, key)
        else:
            await self.docket.add(TASKS[kind])(t)

    async def enqueue_many(self, kind: str, n: int) -> None:
        """``Docket.batch()``: 1,000 calls per round trip."""
        now = time.time()
        async with self.docket.batch() as batch:
            for i in range(n):
                if kind == "limited":
                    batch.add(limited)(now, i % LIMIT_KEYS)
                else:
                    batch.add(TASKS[kind])(now)

    async def schedule(self, due: float) -> None:
        await self.docket.add(timing, when=datetime.fromtimestamp(due, UTC))(due)

    async def start_worker(self) -> None:
        self.worker = Worker(
            self.docket,
            concurrency=self.concurrency,
            minimum_check_interval=self.interval,
            scheduling_resolution=self.interval,
            schedule_automatic_tasks=False,
        )
        await self.worker.__aenter__()
        self.runner = asyncio.create_task(self.worker.run_forever())

    async def stop_worker(self) -> None:
        assert self.runner is not None and self.worker is not None
        self.runner.cancel()
        try:
            await self.runner
        except asyncio.CancelledError:
            pass
        await self.worker.__aexit__(None, None, None)


if __name__ == "__main__":
    main(DocketSystem)
