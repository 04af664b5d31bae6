"""``get_result`` beside another listener of the same ``Execution``: the
other listener may apply the execution's end while ``get_result`` is still
loading the record, and the result must still be loaded and returned."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import anyio
import pytest
from helpers import running

from docket_core import Docket, ExecutionState, Worker

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends("memory-asyncio", "memory-trio", "redis-asyncio", "glide_valkey-asyncio"),
]


async def test_an_end_applied_by_another_listener_still_yields_the_result(
    docket: Docket, worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = anyio.Event()

    async def compute() -> str:
        await release.wait()
        return "the result"

    execution = await docket.add(compute)()
    seen_end = anyio.Event()
    adapter = docket.adapter
    original = adapter.get_progress

    async def late_progress(key: str) -> Any:
        # get_result's first look: the record it read said "not ended"; hold
        # its progress read until the watcher below has applied the end
        if not seen_end.is_set():
            release.set()
            await seen_end.wait()
        return await original(key)

    watching = anyio.Event()

    async def watch() -> None:
        async for event in execution.subscribe():
            watching.set()  # past the watcher's own first reads
            if event.get("state") in (ExecutionState.COMPLETED, "completed"):
                seen_end.set()
                return

    async with running(worker), anyio.create_task_group() as group:
        group.start_soon(watch)
        with anyio.fail_after(10):
            await watching.wait()
            monkeypatch.setattr(adapter, "get_progress", late_progress)
            assert await execution.get_result(timeout=timedelta(seconds=10)) == "the result"
