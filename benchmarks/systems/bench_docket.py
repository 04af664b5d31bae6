"""docket (this repository) on memory://, redis:// (redis-py) or glide:// (GLIDE).

Defaults: ``Worker(docket, concurrency=C)`` with its 250 ms
``minimum_check_interval`` and ``scheduling_resolution``. Tuned: both 10 ms,
and ``freeze_gc=True`` (what ``docket worker`` does).
Automatic (perpetual) tasks are off in both, as there are none.

``options["logs"] == "info"`` turns on the worker's per-task INFO lines as
``docket worker --logging-format plain`` does (``configure_logging``: one handler
on the root logger, the CLI's plain format), written to a temporary file; the
result then says how many lines were written (``log_lines``). The event loop
(``options["loop"]``) is the harness's business.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import System, main, noop_body, sleep_body, timing_body

from docket_core import ConcurrencyLimit, Docket, Worker
from docket_core.cli.logs import LogFormat, LogLevel, configure_logging


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
        limit: ConcurrencyLimit = ConcurrencyLimit("customer", per_key),
    ) -> None:
        await sleep_body(t)

    return limited


class DocketSystem(System):
    versions = ("docket", "redis", "valkey-glide", "anyio")

    def __init__(
        self, url: str, profile: str, concurrency: int, options: dict[str, Any] | None = None
    ) -> None:
        super().__init__(url, profile, concurrency, options)
        self.server = not url.startswith("memory://")
        name = f"bench-{uuid.uuid4().hex[:8]}"
        if url.startswith("memory://"):
            url = f"memory://{name}"
        self.docket = Docket(name=name, url=url)
        self.tasks: dict[str, Callable[..., Awaitable[None]]] = {
            "noop": noop,
            "sleep": sleeper,
            "timing": timing,
            "limited": limited_task(self.limit_per_key),
        }
        for task in self.tasks.values():
            self.docket.register(task)
        self.logs = self.options.get("logs") == "info"
        self.log_dir: tempfile.TemporaryDirectory[str] | None = None
        self.log_handler: logging.Handler | None = None
        self.tuned = profile == "tuned"
        self.interval = timedelta(milliseconds=10 if self.tuned else 250)
        self.worker: Worker | None = None
        self.runner: asyncio.Task[None] | None = None

    def settings(self) -> dict[str, Any]:
        ms = self.interval.total_seconds() * 1000
        extra: dict[str, Any] = {"logs": "INFO, plain format, to a file"} if self.logs else {}
        if self.tuned:
            extra["freeze_gc"] = True
        return {"minimum_check_interval_ms": ms, "scheduling_resolution_ms": ms, **extra}

    async def open(self) -> None:
        if self.logs:
            self.log_dir = tempfile.TemporaryDirectory(prefix="docket-bench-logs-")
            handler = configure_logging(LogLevel.INFO, LogFormat.PLAIN)
            assert isinstance(handler, logging.StreamHandler)
            handler.setStream(open(self.log_path(), "w", encoding="utf-8"))
            self.log_handler = handler
        await self.docket.__aenter__()

    def log_path(self) -> str:
        assert self.log_dir is not None
        return os.path.join(self.log_dir.name, "worker.log")

    def report(self) -> dict[str, Any]:
        if self.log_handler is None:
            return {}
        self.log_handler.flush()
        with open(self.log_path(), "rb") as written:
            return {"log_lines": sum(1 for _ in written)}

    async def close(self) -> None:
        await self.docket.__aexit__(None, None, None)
        if self.log_handler is not None:
            logging.getLogger().removeHandler(self.log_handler)
            self.log_handler.close()
        if self.log_dir is not None:
            self.log_dir.cleanup()

    async def enqueue(self, kind: str, t: float, key: int = 0) -> None:
        if kind == "limited":
            await self.docket.add(self.tasks[kind])(t, key)
        else:
            await self.docket.add(self.tasks[kind])(t)

    async def enqueue_many(self, kind: str, n: int) -> None:
        """``Docket.batch()``: 1,000 calls per round trip."""
        now = time.time()
        async with self.docket.batch() as batch:
            for i in range(n):
                if kind == "limited":
                    batch.add(self.tasks[kind])(now, i % self.limit_keys)
                else:
                    batch.add(self.tasks[kind])(now)

    async def schedule(self, due: float) -> None:
        await self.docket.add(timing, when=datetime.fromtimestamp(due, UTC))(due)

    async def start_worker(self) -> None:
        self.worker = Worker(
            self.docket,
            concurrency=self.concurrency,
            minimum_check_interval=self.interval,
            scheduling_resolution=self.interval,
            schedule_automatic_tasks=False,
            freeze_gc=self.tuned,
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
