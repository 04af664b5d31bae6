"""taskiq + taskiq-redis ``RedisStreamBroker`` (acknowledged stream delivery).

The worker is taskiq's ``Receiver`` (what ``taskiq worker`` runs), in-process.
Defaults: ``RedisStreamBroker(url)`` (xread_count=100, xread_block=2 s) and
``Receiver(max_async_tasks=C)`` with ``max_prefetch=0`` (the CLI's default).
Tuned: ``max_prefetch=C`` and ``xread_count=C``, as in streaq's benchmark of taskiq.
No batch enqueue; no delayed tasks without a separate scheduler process.
"""

from __future__ import annotations

import asyncio
from typing import Any

from _common import System, Unsupported, main, noop_body, sleep_body, timing_body
from taskiq.receiver import Receiver
from taskiq_redis import RedisStreamBroker


class TaskiqSystem(System):
    versions = ("taskiq", "taskiq-redis", "redis")

    def __init__(
        self, url: str, profile: str, concurrency: int, options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(url, profile, concurrency, options)
        kwargs: dict[str, Any] = {}
        self.prefetch = 0
        if profile == "tuned":
            kwargs["xread_count"] = concurrency
            self.prefetch = concurrency
        self.broker = RedisStreamBroker(url, **kwargs)
        self.kwargs = kwargs

        @self.broker.task(task_name="noop")
        async def noop(t: float) -> None:
            await noop_body(t)

        @self.broker.task(task_name="sleep")
        async def sleeper(t: float) -> None:
            await sleep_body(t)

        @self.broker.task(task_name="timing")
        async def timing(t: float) -> None:
            await timing_body(t)

        self.tasks = {"noop": noop, "sleep": sleeper, "timing": timing}
        self.finish = asyncio.Event()
        self.runner: asyncio.Task[None] | None = None

    def settings(self) -> dict[str, Any]:
        return {"max_prefetch": self.prefetch, **self.kwargs}

    async def open(self) -> None:
        self.broker.is_worker_process = True
        await self.broker.startup()  # creates the consumer group

    async def close(self) -> None:
        await self.broker.shutdown()

    async def enqueue(self, kind: str, t: float, key: int = 0) -> None:
        if kind == "limited":
            raise Unsupported("no per-key concurrency limit (only --max-async-tasks per worker)")
        await self.tasks[kind].kiq(t)

    async def schedule(self, due: float) -> None:
        raise Unsupported("delays need a separate scheduler process; the broker has none")

    async def start_worker(self) -> None:
        receiver = Receiver(
            self.broker,
            max_async_tasks=self.concurrency,
            max_prefetch=self.prefetch,
            run_startup=False,
        )
        self.runner = asyncio.create_task(receiver.listen(self.finish))

    async def stop_worker(self) -> None:
        assert self.runner is not None
        self.finish.set()
        self.runner.cancel()
        try:
            await self.runner
        except BaseException:
            pass


if __name__ == "__main__":
    main(TaskiqSystem)
