"""pydocket (PyPI `pydocket`, import `docket`) on redis://. Batch: ``add_many``.

Tuned also passes ``?max_connections=1000`` in the URL: redis-py 8 caps its pool at
100 connections, which a worker at concurrency 100 exhausts.

Defaults: ``Worker(docket, concurrency=C)`` with its 250 ms
``minimum_check_interval`` and ``scheduling_resolution``. Tuned: both 10 ms.
Automatic (perpetual) tasks are off in both, as there are none.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import System, main, noop_body, sleep_body, timing_body, tracker
from docket import ConcurrencyLimit, Docket, Worker


async def noop(t: float) -> None:
    await noop_body(t)


async def sleeper(t: float) -> None:
    await sleep_body(t)


async def timing(t: float) -> None:
    await timing_body(t)


def limited_task(per_key: int) -> Callable[[float, int], Awaitable[None]]:
    """The sleep task, at most ``per_key`` at once per ``customer`` value."""

    async def limited(
        t: float,
        customer: int,
        limit: ConcurrencyLimit = ConcurrencyLimit("customer", max_concurrent=per_key),
    ) -> None:
        await sleep_body(t)

    return limited


class _Exhausted(logging.Handler):
    """pydocket logs and retries every 5 s when its pool runs dry; stop the run."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and "Too many connections" in str(record.exc_info[1]):
            tracker.fail("redis-py pool exhausted: MaxConnectionsError: Too many connections")


logging.getLogger("docket").addHandler(_Exhausted())


class PydocketSystem(System):
    versions = ("pydocket", "redis")

    def __init__(
        self, url: str, profile: str, concurrency: int, options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(url, profile, concurrency, options)
        self.server = not url.startswith("memory://")
        name = f"bench-{uuid.uuid4().hex[:8]}"
        if url.startswith("memory://"):
            url = f"memory://{name}"
        if profile == "tuned" and url.startswith("redis://"):
            # redis-py >= 7 caps a pool at 100 connections; a worker at concurrency
            # 100 needs more (see the README), so the tuned run raises the cap.
            url += "?max_connections=1000"
        self.docket = Docket(name=name, url=url)
        self.tasks: dict[str, Callable[..., Awaitable[None]]] = {
            "noop": noop,
            "sleep": sleeper,
            "timing": timing,
            "limited": limited_task(self.limit_per_key),
        }
        for task in self.tasks.values():
            self.docket.register(task)
        self.interval = timedelta(milliseconds=10 if profile == "tuned" else 250)
        self.worker: Worker | None = None
        self.runner: asyncio.Task[None] | None = None

    def settings(self) -> dict[str, Any]:
        ms = self.interval.total_seconds() * 1000
        extra = {"max_connections": 1000} if self.profile == "tuned" else {}
        return {"minimum_check_interval_ms": ms, "scheduling_resolution_ms": ms, **extra}

    async def open(self) -> None:
        await self.docket.__aenter__()

    async def close(self) -> None:
        await self.docket.__aexit__(None, None, None)

    async def enqueue(self, kind: str, t: float, key: int = 0) -> None:
        if kind == "limited":
            await self.docket.add(self.tasks[kind])(t, key)
        else:
            await self.docket.add(self.tasks[kind])(t)

    async def enqueue_many(self, kind: str, n: int) -> None:
        import time

        now = time.time()
        task = self.tasks[kind]
        if kind == "limited":
            calls = (self.docket.call(task)(now, i % self.limit_keys) for i in range(n))
        else:
            calls = (self.docket.call(task)(now) for _ in range(n))
        await self.docket.add_many(calls)  # pipelined, 1,000 per round trip

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
    main(PydocketSystem)
