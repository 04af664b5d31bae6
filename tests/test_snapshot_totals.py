"""``snapshot`` tells the truth about a big docket: true totals from counts,
a page of entries, and whether the page shows them all; ``clear`` works in
bounded chunks, so the server is never blocked by one long script."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from docket_core import Docket
from docket_core.lua import base

pytestmark = pytest.mark.anyio


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
