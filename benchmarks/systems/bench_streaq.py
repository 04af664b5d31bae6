"""streaq (coredis; Redis Streams + a Redis Functions library).

A producer ``Worker`` and a consuming ``Worker`` (``run_async()``, what
``streaq run`` runs) share one process and one queue. Defaults:
``Worker(concurrency=C)`` (prefetch = C). streaq has no documented knob that
matters here (its delayed-task loop polls every 0.5 s, hard-coded), so it runs
at its defaults only. Batch: ``enqueue_many``. No per-key concurrency limit.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from _common import System, Unsupported, main, noop_body, sleep_body, timing_body
from streaq import Worker


def make_worker(url: str, concurrency: int) -> tuple[Worker[Any], dict[str, Any]]:
    worker: Worker[Any] = Worker(redis_url=url, concurrency=concurrency, handle_signals=False)

    @worker.task(name="noop")
    async def noop(t: float) -> None:
        await noop_body(t)

    @worker.task(name="sleep")
    async def sleeper(t: float) -> None:
        await sleep_body(t)

    @worker.task(name="timing")
    async def timing(t: float) -> None:
        await timing_body(t)

    return worker, {"noop": noop, "sleep": sleeper, "timing": timing}


class StreaqSystem(System):
    versions = ("streaq", "coredis", "anyio")

    def __init__(
        self, url: str, profile: str, concurrency: int, options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(url, profile, concurrency, options)
        self.producer, self.tasks = make_worker(url, concurrency)
        self.consumer, _ = make_worker(url, concurrency)
        self.runner: asyncio.Task[None] | None = None

    def settings(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "prefetch": "default (= concurrency)"}

    async def open(self) -> None:
        self.context = self.producer.__asynccontextmanager__()
        await self.context.__aenter__()

    async def close(self) -> None:
        # The client's context must be left from the task that entered it, and the
        # harness closes from a helper task; the process exits right after anyway.
        pass

    async def enqueue(self, kind: str, t: float, key: int = 0) -> None:
        if kind == "limited":
            raise Unsupported("no per-key concurrency limit")
        await self.tasks[kind].enqueue(t)

    async def enqueue_many(self, kind: str, n: int) -> None:
        import time

        if kind == "limited":
            raise Unsupported("no per-key concurrency limit")
        now = time.time()
        await self.producer.enqueue_many([self.tasks[kind].enqueue(now) for _ in range(n)])

    async def schedule(self, due: float) -> None:
        import time

        delay = timedelta(seconds=max(0.0, due - time.time()))
        await self.tasks["timing"].enqueue(due).start(delay=delay)

    async def start_worker(self) -> None:
        self.runner = asyncio.create_task(self.consumer.run_async())

    async def stop_worker(self) -> None:
        assert self.runner is not None
        self.runner.cancel()
        try:
            await self.runner
        except BaseException:
            pass


if __name__ == "__main__":
    main(StreaqSystem)
