"""End to end, on every backend: a worker whose store reply is lost after the
store ran the batch sends it again, and the task still runs once.

The fault is injected around the real adapter: its ``execute`` runs the batch
on the store (a real server, for the server backends), then raises
``StoreUnavailable`` as a killed connection would, so the reply never reaches
the worker.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import anyio
import pytest
from helpers import NoSlotLeft

from docket_core import ConcurrencyLimit, Docket, ExecutionState, Worker
from docket_core.sansio.effects import StoreEffect
from docket_core.sansio.errors import StoreUnavailable
from docket_core.sansio.inputs import Outcome, SlotAcquired
from docket_core.sansio.local_slots import HOLD_FOR, TAKE_PARKED, SlotStepped

pytestmark = pytest.mark.anyio


def lose_replies(docket: Docket, lose: Callable[[Sequence[Outcome]], bool]) -> list[int]:
    """Make the docket's adapter drop the reply of every batch ``lose``
    picks, after the store ran it; returns the list of dropped batch sizes."""
    adapter = docket.adapter
    dropped: list[int] = []

    def losing(original: Callable[..., Any]) -> Callable[..., Any]:
        async def execute(effects: Sequence[StoreEffect]) -> list[Outcome]:
            outcomes: list[Outcome] = await original(effects)
            if lose(outcomes):
                dropped.append(len(effects))
                raise StoreUnavailable("the reply was lost (injected)")
            return outcomes

        return execute

    # (a worker sends through ``execute_in_order`` where the store keeps order)
    adapter.execute = losing(adapter.execute)  # type: ignore[method-assign]
    adapter.execute_in_order = losing(adapter.execute_in_order)  # type: ignore[method-assign]
    return dropped


async def drain_with_a_lost_parking_reply(docket: Docket) -> tuple[list[str], list[int]]:
    """Key a holds the slot of a limit of 1 for ``HOLD_FOR`` and 300 ms; key b
    waits in the worker for a's slot, then (waited ``HOLD_FOR``) parks behind
    it, and the reply saying so is lost; a's release wakes b before b's
    acquisition is sent again (the retry delay is longer than a's rest)."""
    ran: list[str] = []

    async def job(
        name: str,
        customer: int,
        limit: ConcurrencyLimit = ConcurrencyLimit("customer", max_concurrent=1),
    ) -> None:
        ran.append(name)
        await anyio.sleep(HOLD_FOR + 0.3 if name == "a" else 0.01)

    docket.register(job)
    parked_once: list[bool] = []

    def lose(outcomes: Sequence[Outcome]) -> bool:
        parks = any(
            (isinstance(o, SlotAcquired) and not o.acquired)
            or (isinstance(o, SlotStepped) and TAKE_PARKED in o.takes)
            for o in outcomes
        )
        if parks and not parked_once:
            parked_once.append(True)
            return True
        return False

    dropped = lose_replies(docket, lose)
    await docket.add(job, key="a")("a", 7)
    await docket.add(job, key="b")("b", 7)
    worker = Worker(
        docket,
        name=f"worker-{uuid.uuid4().hex[:8]}",
        concurrency=4,
        minimum_check_interval=timedelta(milliseconds=5),
        reconnection_delay=timedelta(milliseconds=600),
        redelivery_timeout=timedelta(seconds=30),
    )
    with anyio.fail_after(20):
        async with worker:
            await worker.run_until_finished()
    return ran, dropped


async def test_a_lost_parking_reply_runs_the_task_once(
    docket: Docket, assert_no_slot_left: NoSlotLeft
) -> None:
    ran, dropped = await drain_with_a_lost_parking_reply(docket)
    assert dropped, "the fault was never injected"
    assert sorted(ran) == ["a", "b"]
    for key in ("a", "b"):
        execution = await docket.get_execution(key)
        assert execution is not None and execution.state is ExecutionState.COMPLETED
    assert await docket.adapter.pending() == 0
    await assert_no_slot_left(docket, "job", 1, customer=7)
