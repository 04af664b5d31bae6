"""arq (redis-py; a ZSET polled every ``poll_delay``).

Worker in-process (``Worker.main()``, what ``arq`` runs). Defaults:
``poll_delay=0.5`` s, ``max_jobs=C``. Tuned: ``poll_delay=0.01`` s.
No batch enqueue API, no per-key concurrency limit.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from _common import System, Unsupported, main, noop_body, sleep_body, timing_body
from arq import create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.worker import Worker, func


async def noop(ctx: Any, t: float) -> None:
    await noop_body(t)


async def sleeper(ctx: Any, t: float) -> None:
    await sleep_body(t)


async def timing(ctx: Any, t: float) -> None:
    await timing_body(t)


class ArqSystem(System):
    versions = ("arq", "redis")

    def __init__(
        self, url: str, profile: str, concurrency: int, options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(url, profile, concurrency, options)
        self.settings_ = RedisSettings.from_dsn(url)
        self.poll_delay = 0.01 if profile == "tuned" else 0.5
        self.pool: ArqRedis | None = None
        self.worker: Worker | None = None
        self.runner: asyncio.Task[None] | None = None

    def settings(self) -> dict[str, Any]:
        return {"poll_delay_s": self.poll_delay}

    async def open(self) -> None:
        self.pool = await create_pool(self.settings_)

    async def close(self) -> None:
        assert self.pool is not None
        await self.pool.aclose()

    async def enqueue(self, kind: str, t: float, key: int = 0) -> None:
        if kind == "limited":
            raise Unsupported("no per-key concurrency limit")
        assert self.pool is not None
        await self.pool.enqueue_job(kind, t)

    async def schedule(self, due: float) -> None:
        assert self.pool is not None
        await self.pool.enqueue_job("timing", due, _defer_until=datetime.fromtimestamp(due, UTC))

    async def start_worker(self) -> None:
        self.worker = Worker(
            functions=[
                func(noop, name="noop"),
                func(sleeper, name="sleep"),
                func(timing, name="timing"),
            ],
            redis_pool=self.pool,
            max_jobs=self.concurrency,
            poll_delay=self.poll_delay,
            handle_signals=False,
        )
        self.runner = asyncio.create_task(self.worker.main())

    async def stop_worker(self) -> None:
        assert self.runner is not None
        self.runner.cancel()
        try:
            await self.runner
        except BaseException:
            pass


if __name__ == "__main__":
    main(ArqSystem)
