"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import anyio

from docket_core import Docket, Execution, Worker

Now = Callable[[], datetime]

FAST = timedelta(milliseconds=5)


def make_worker(docket: Docket, **options: Any) -> Worker:
    """A worker that checks for work every few milliseconds."""
    options.setdefault("minimum_check_interval", FAST)
    options.setdefault("scheduling_resolution", FAST)
    return Worker(docket, **options)


@asynccontextmanager
async def running(worker: Worker, limit: float = 5.0) -> AsyncIterator[None]:
    """Run ``worker`` in the background for the duration of the block."""
    with anyio.fail_after(limit):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_forever)
            try:
                yield
            finally:
                group.cancel_scope.cancel()


async def finish(worker: Worker, limit: float = 2.0) -> None:
    """Run ``worker`` until nothing is left, failing after ``limit`` seconds."""
    with anyio.fail_after(limit):
        await worker.run_until_finished()


def key() -> str:
    """A fresh task key."""
    return f"key-{uuid.uuid4().hex}"


async def loaded(docket: Docket, key: str) -> Execution:
    """The stored execution of ``key``, which must exist."""
    execution = await docket.get_execution(key)
    assert execution is not None
    return execution
