"""The calls a worker holds behind its pickup's claim (``held_calls``) go
once the claim is written, on redis-py too, whose call may yield before it
writes: one that finds no connection at hand takes one from the pool and
connects it (a sentinel's pool asks for the primary first).  Released at
that first yield instead, a held call went out on a connection at hand,
ahead of the claim: a run's replace of its own key replaced the message it
was handed, not a running key."""

from __future__ import annotations

import time
import uuid
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from docket_core import Docket
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.values import ScheduleMode
from docket_redis import RedisStore

pytestmark = [pytest.mark.anyio, pytest.mark.backends("redis-asyncio")]


def _add(key: str) -> Any:
    now = time.time()
    return plan_add(key=key, function="f", payload=b"p", when=now, mode=ScheduleMode.ADD, now=now)


@pytest.mark.parametrize("in_order", [False, True], ids=["own-connection", "line"])
async def test_held_calls_go_once_the_passed_call_is_written(
    docket: Docket, monkeypatch: pytest.MonkeyPatch, in_order: bool
) -> None:
    store = docket.adapter
    assert isinstance(store, RedisStore) and store.tells_writes
    await store.execute([_add(f"warm-{uuid.uuid4().hex}")])
    original = RedisStore._run_calls
    connecting: list[bool] = []

    async def connecting_first(self: RedisStore, calls: Any, *args: Any, **kwargs: Any) -> Any:
        if not connecting:  # (the passed call: it yields before it writes)
            connecting.append(True)
            await anyio.sleep(0.02)
        return await original(self, calls, *args, **kwargs)

    monkeypatch.setattr(RedisStore, "_run_calls", connecting_first)
    key = f"k-{uuid.uuid4().hex}"
    outcomes: dict[str, Any] = {}

    async def held() -> None:
        (outcomes["held"],) = await store.execute([_add(key)])

    store.hold_calls()
    async with anyio.create_task_group() as group:
        group.start_soon(held)
        for _ in range(5):  # (the held call waits at the gate)
            await anyio.lowlevel.checkpoint()
        assert "held" not in outcomes
        store.pass_next_call()
        call = store.execute_in_order if in_order else store.execute
        (outcomes["passed"],) = await call([_add(key)])
    assert outcomes["passed"].accepted is True
    assert outcomes["held"].accepted is False
