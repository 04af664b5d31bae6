"""``Docket.snapshot``, ``workers`` and ``task_workers`` on every contract
backend: future and running executions and live workers; and the truth about
a big docket: true totals from counts, a page of entries, and whether the page
shows them all.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest
from helpers import Now, running

from docket_core import Docket, Worker

pytestmark = pytest.mark.anyio


# -- snapshot and workers -------------------------------------------------------------


async def test_snapshot_future_running_and_workers(
    docket: Docket, worker: Worker, now: Now
) -> None:
    started = anyio.Event()
    release = anyio.Event()

    async def blocking(tag: str) -> None:
        started.set()
        await release.wait()

    async def later(n: int) -> None:
        pass

    empty = await docket.snapshot()
    assert (empty.future, empty.running, empty.workers, empty.total_tasks) == ([], [], [], 0)

    when = now() + timedelta(seconds=30)
    future = await docket.add(later, when=when, key="later-key")(7)
    snapshot = await docket.snapshot()
    assert [(e.key, e.function_name, e.args, e.when) for e in snapshot.future] == [
        ("later-key", "later", (7,), when)
    ]
    assert snapshot.total_tasks == 1

    async with running(worker):
        held = await docket.add(blocking, key="blocking-key")("t")
        await started.wait()
        snapshot = await docket.snapshot()
        assert [e.key for e in snapshot.future] == [future.key]
        assert len(snapshot.running) == 1
        run = snapshot.running[0]
        assert run.key == held.key
        assert run.function_name == "blocking"
        assert run.worker == worker.name
        assert run.execution.args == ("t",)
        assert run.started <= now()
        assert snapshot.total_tasks == 2
        assert [w.name for w in snapshot.workers] == [worker.name]
        assert {"blocking", "later"} <= snapshot.workers[0].tasks
        release.set()
        await held.get_result(timeout=timedelta(seconds=2))

    snapshot = await docket.snapshot()
    assert snapshot.running == []
    assert snapshot.workers == []
    assert [e.key for e in snapshot.future] == [future.key]


async def test_workers_and_task_workers(docket: Docket, worker: Worker) -> None:
    async def some_task() -> None:
        pass

    docket.register(some_task)
    assert await docket.workers() == []
    started = anyio.Event()

    async def ping() -> None:
        started.set()

    async with running(worker):
        await docket.add(ping)()
        await started.wait()
        workers = await docket.workers()
        assert [w.name for w in workers] == [worker.name]
        assert {"some_task", "ping", "trace", "fail", "sleep"} <= workers[0].tasks
        assert workers[0].last_seen <= datetime.now(workers[0].last_seen.tzinfo)
        assert [w.name for w in await docket.task_workers("some_task")] == [worker.name]
        assert await docket.task_workers("not_a_task") == []
    assert await docket.workers() == []


# -- a big docket ---------------------------------------------------------------------


async def _job(n: int) -> None: ...


async def _add(docket: Docket, count: int, *, later: bool) -> None:
    when = datetime.now(UTC) + timedelta(hours=1) if later else None
    async with docket.batch() as batch:
        for n in range(count):
            batch.add(_job, when=when, key=f"{'later' if later else 'now'}-{n}")(n)


async def test_a_snapshot_counts_every_task_and_shows_a_page(docket: Docket) -> None:
    docket.register(_job)
    await _add(docket, 1500, later=True)
    await _add(docket, 700, later=False)
    snapshot = await docket.snapshot(limit=100)
    assert snapshot.total_tasks == 2200
    assert snapshot.future_total == 2200 and snapshot.running_total == 0
    assert len(snapshot.future) <= 200 and not snapshot.complete
    assert len({e.key for e in snapshot.future}) == len(snapshot.future)
    whole = await docket.snapshot(limit=5000)
    assert whole.complete and len(whole.future) == 2200
