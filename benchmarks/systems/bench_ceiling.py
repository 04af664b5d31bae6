"""The ceiling: a bare redis-py stream cycle, with none of a task system's work.

Enqueue: one ``XADD`` per task (batched: pipelined, 1,000 per round trip).
Drain: ``XREADGROUP COUNT 100`` in a loop, "run" each entry (a no-op call), then
one ``XACK`` for the whole read. The concurrency knob does not apply; the sleep
workload runs the reads' entries concurrently (up to 100 at once). No scheduling,
no per-key limit.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as redis
from _common import System, Unsupported, main, noop_body, sleep_body, timing_body

STREAM, GROUP = "ceiling", "workers"
BODIES = {"noop": noop_body, "sleep": sleep_body, "timing": timing_body}


class CeilingSystem(System):
    versions = ("redis",)

    def __init__(
        self, url: str, profile: str, concurrency: int, options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(url, profile, concurrency, options)
        self.client = redis.Redis.from_url(url)
        self.runner: asyncio.Task[None] | None = None

    async def open(self) -> None:
        await self.client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)

    async def close(self) -> None:
        await self.client.aclose()

    async def enqueue(self, kind: str, t: float, key: int = 0) -> None:
        if kind == "limited":
            raise Unsupported("no per-key concurrency limit")
        await self.client.xadd(STREAM, {"k": kind, "t": repr(t)})

    async def enqueue_many(self, kind: str, n: int) -> None:
        import time

        if kind == "limited":
            raise Unsupported("no per-key concurrency limit")
        t = repr(time.time())
        for start in range(0, n, 1000):
            async with self.client.pipeline(transaction=False) as pipe:
                for _ in range(start, min(n, start + 1000)):
                    pipe.xadd(STREAM, {"k": kind, "t": t})
                await pipe.execute()

    async def schedule(self, due: float) -> None:
        raise Unsupported("a bare stream has no scheduling")

    async def loop(self) -> None:
        reader = redis.Redis.from_url(self.url)
        while True:
            reply = await reader.xreadgroup(GROUP, "c", {STREAM: ">"}, count=100, block=1000)
            if not reply:
                continue
            entries = reply[0][1]
            await asyncio.gather(*(BODIES[f[b"k"].decode()](float(f[b"t"])) for _, f in entries))
            await reader.xack(STREAM, GROUP, *[i for i, _ in entries])

    async def start_worker(self) -> None:
        self.runner = asyncio.create_task(self.loop())

    async def stop_worker(self) -> None:
        assert self.runner is not None
        self.runner.cancel()

    def settings(self) -> dict[str, Any]:
        return {"xreadgroup_count": 100}


if __name__ == "__main__":
    main(CeilingSystem)
