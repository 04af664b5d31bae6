"""``Docket.clear`` on every contract backend: it cancels what is scheduled and
queued, leaves running tasks alone, and works in bounded chunks, so a server is
never blocked by one long script.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from helpers import Now, finish, running

from docket_core import Docket, ExecutionState, Worker
from docket_core.lua import base

pytestmark = pytest.mark.anyio


async def test_clear_removes_scheduled_and_queued(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[int] = []

    async def job(n: int) -> None:
        calls.append(n)

    executions = [
        await docket.add(job)(1),
        await docket.add(job)(2),
        await docket.add(job, when=now() + timedelta(milliseconds=20))(3),
    ]
    assert await docket.clear() == 3
    assert (await docket.snapshot()).future == []
    await finish(worker)
    assert calls == []
    for execution in executions:
        stored = await docket.get_execution(execution.key)
        assert stored is not None
        assert stored.state is ExecutionState.CANCELLED
    assert await docket.clear() == 0


async def test_clear_leaves_running_tasks(docket: Docket) -> None:
    # one slot: the queued job stays queued while the blocking task runs
    worker = Worker(docket, concurrency=1, minimum_check_interval=timedelta(milliseconds=5))
    started = anyio.Event()
    release = anyio.Event()

    async def blocking() -> str:
        started.set()
        await release.wait()
        return "finished"

    async def queued_job() -> None:
        raise AssertionError("cleared; must not run")

    async with running(worker):
        held = await docket.add(blocking)()
        await started.wait()
        await docket.add(queued_job)()
        assert await docket.clear() == 1
        release.set()
        assert await held.get_result(timeout=timedelta(seconds=2)) == "finished"


async def _job(n: int) -> None: ...


async def _add(docket: Docket, count: int, *, later: bool) -> None:
    when = datetime.now(UTC) + timedelta(hours=1) if later else None
    async with docket.batch() as batch:
        for n in range(count):
            batch.add(_job, when=when, key=f"{'later' if later else 'now'}-{n}")(n)


async def test_clear_works_in_chunks_and_clears_everything(
    docket: Docket, monkeypatch: pytest.MonkeyPatch
) -> None:
    docket.register(_job)
    await _add(docket, 450, later=True)
    await _add(docket, 250, later=False)
    chunks: list[Any] = []
    adapter: Any = docket.adapter
    if isinstance(adapter, base.ScriptedStore):
        monkeypatch.setattr(base, "CLEAR_CHUNK", "100")
        run_calls = adapter.run_calls

        async def counting(calls: Any) -> Any:
            chunks.extend(c for c in calls if c.name == "clear")
            return await run_calls(calls)

        monkeypatch.setattr(adapter, "run_calls", counting)
    assert await docket.clear() == 700
    if isinstance(adapter, base.ScriptedStore):
        assert len(chunks) >= 7
    snapshot = await docket.snapshot()
    assert snapshot.total_tasks == 0 and snapshot.future == []
    assert await docket.adapter.pending() == 0
