"""SAQ (Redis lists + BLMOVE, scheduled jobs in a ZSET).

Worker in-process (``Worker.start()``, what ``saq`` runs). Defaults:
``Worker(queue, concurrency=C)`` (its ``schedule`` timer polls the ZSET every 1 s).
Tuned: ``?max_connections=1000`` only. The schedule timer cannot go below 1 s:
saq passes the timer value as the ``SETEX`` lock of its schedule script, so
``timers={"schedule": 0.01}`` fails every call ("invalid expire time") and never
schedules anything, and the 1 s lock caps scheduling at once a second anyway.
``scheduled`` is documented as epoch seconds (an int); a float is passed so that
50 ms ahead means something.
No batch enqueue API (``Queue.batch()`` only groups aborts); per-key
``group_key`` is Postgres-only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from _common import System, Unsupported, main, noop_body, sleep_body, timing_body
from saq import Queue, Worker


async def noop(ctx: Any, *, t: float) -> None:
    await noop_body(t)


async def sleep(ctx: Any, *, t: float) -> None:
    await sleep_body(t)


async def timing(ctx: Any, *, t: float) -> None:
    await timing_body(t)


class SaqSystem(System):
    versions = ("saq", "redis", "hiredis")

    def __init__(
        self, url: str, profile: str, concurrency: int, options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(url, profile, concurrency, options)
        if profile == "tuned":
            # redis-py >= 7 caps a pool at 100 connections; C blocking dequeues
            # plus the producer need more.
            url += "?max_connections=1000"
        self.queue = Queue.from_url(url)
        self.timers: dict[str, Any] = {}  # the 1 s schedule timer is its minimum
        self.worker: Worker | None = None
        self.runner: asyncio.Task[None] | None = None

    def settings(self) -> dict[str, Any]:
        if self.profile == "tuned":
            return {"timers": "default (schedule: 1 s, its minimum)", "max_connections": 1000}
        return {"timers": "default (schedule: 1 s)"}

    async def open(self) -> None:
        await self.queue.connect()

    async def close(self) -> None:
        await self.queue.disconnect()

    async def enqueue(self, kind: str, t: float, key: int = 0) -> None:
        if kind == "limited":
            raise Unsupported("group_key (one job per group) is Postgres-only")
        await self.queue.enqueue(kind, t=t)

    async def schedule(self, due: float) -> None:
        await self.queue.enqueue("timing", t=due, scheduled=due)

    async def start_worker(self) -> None:
        self.worker = Worker(
            self.queue,
            functions=[noop, sleep, timing],
            concurrency=self.concurrency,
            timers=self.timers or None,  # type: ignore[arg-type]
        )
        self.runner = asyncio.create_task(self.worker.start())

    async def stop_worker(self) -> None:
        assert self.worker is not None
        await self.worker.stop()


if __name__ == "__main__":
    main(SaqSystem)
