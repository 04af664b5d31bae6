"""One liveness rule: a worker is live for ``heartbeat_interval *
missed_heartbeats`` after its last heartbeat, in ``Docket.workers()`` and in
``Docket.snapshot()`` alike."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest

from docket_core import Docket
from docket_core.sansio.decisions import is_live, liveness_window
from docket_core.sansio.effects import Heartbeat

pytestmark = pytest.mark.anyio


def test_the_window_is_missed_heartbeats_intervals() -> None:
    assert liveness_window(2.0, 5) == 10.0
    assert liveness_window(0.5, 1) == 0.5


@pytest.mark.parametrize(
    ("last_seen", "live"), [(100.0, True), (90.5, True), (90.0, False), (80.0, False)]
)
def test_a_worker_is_live_strictly_inside_the_window(last_seen: float, live: bool) -> None:
    assert is_live(last_seen, now=100.0, window=10.0) is live


@pytest.mark.parametrize(("missed", "expected"), [(3, {"fresh"}), (5, {"fresh", "older"})])
async def test_workers_and_snapshot_use_the_same_window(missed: int, expected: set[str]) -> None:
    name = f"liveness-{uuid.uuid4().hex}"
    async with Docket(
        name=name,
        url=f"memory://{name}",
        heartbeat_interval=timedelta(seconds=1),
        missed_heartbeats=missed,
    ) as docket:
        now = time.time()
        beats = [
            Heartbeat(worker="fresh", tasks=("t",), now=now - 1.5),
            Heartbeat(worker="older", tasks=("t",), now=now - 4.0),
            Heartbeat(worker="gone", tasks=("t",), now=now - 60.0),
        ]
        await docket.adapter.execute(beats)
        assert {w.name for w in await docket.workers()} == expected
        assert {w.name for w in (await docket.snapshot()).workers} == expected
        assert {w.name for w in await docket.task_workers("t")} == expected
