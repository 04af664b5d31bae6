"""``Docket.batch()`` on every backend, and how the server scripts batch."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import anyio
import pytest
from helpers import acquisition, claim_as

from docket_core import Disposition, Docket, ExecutionState, UsageError, Worker
from docket_core.lua.protocol import Layout, calls_for
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import Cancel, Finish
from docket_core.sansio.inputs import SlotAcquired
from docket_core.sansio.values import ScheduleMode

pytestmark = pytest.mark.anyio


def make_worker(docket: Docket) -> Worker:
    return Worker(
        docket,
        concurrency=50,
        minimum_check_interval=timedelta(milliseconds=5),
        schedule_automatic_tasks=False,
    )


async def double(n: int) -> int:
    return n * 2


async def test_a_batch_adds_every_call_and_they_all_run(docket: Docket) -> None:
    async with docket.batch(chunk=40) as batch:
        executions = [batch.add(double)(n) for n in range(100)]
        # nothing is sent before the block ends
        assert all(e.disposition is Disposition.LOADED for e in executions)
        assert (await docket.snapshot()).future == []
    assert {e.disposition for e in executions} == {Disposition.SCHEDULED}
    assert {e.state for e in executions} == {ExecutionState.QUEUED}
    with anyio.fail_after(20):
        await make_worker(docket).run_until_finished()
    results = [await e.get_result(timeout=timedelta(seconds=5)) for e in executions]
    assert results == [n * 2 for n in range(100)]


async def test_keys_in_a_batch_behave_as_one_call_after_the_other(docket: Docket) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    async with docket.batch() as batch:
        first = batch.add(double, key="same")(1)
        again = batch.add(double, key="same")(2)
        moved = batch.replace(double, when=later, key="moved")(3)
        moved_again = batch.replace(double, when=later + timedelta(hours=1), key="moved")(4)
    assert first.disposition is Disposition.SCHEDULED
    assert again.disposition is Disposition.ALREADY_SCHEDULED
    assert moved.disposition is moved_again.disposition is Disposition.SCHEDULED
    assert moved_again.state is ExecutionState.SCHEDULED
    stored = await docket.get_execution("moved")
    assert stored is not None and stored.args == (4,)
    assert stored.when == later + timedelta(hours=1)
    await docket.cancel("moved")
    with anyio.fail_after(20):
        await make_worker(docket).run_until_finished()
    assert await first.get_result(timeout=timedelta(seconds=5)) == 2


async def test_a_batch_that_raises_sends_nothing(docket: Docket) -> None:
    with pytest.raises(RuntimeError):
        async with docket.batch() as batch:
            batch.add(double, key="never")(1)
            raise RuntimeError("changed my mind")
    assert await docket.get_execution("never") is None
    assert (await docket.snapshot()).future == []


async def test_a_batch_checks_each_call_at_once(docket: Docket) -> None:
    await docket.strike(double, "n", "==", 13)
    async with docket.batch() as batch:
        struck = batch.add(double)(13)
        kept = batch.add(double)(12)
        with pytest.raises(UsageError, match="cannot be pickled"):
            batch.add(double)(threading.Lock())  # type: ignore[arg-type]
    assert struck.disposition is Disposition.STRUCK
    assert kept.disposition is Disposition.SCHEDULED
    assert len((await docket.snapshot()).future) == 1


async def test_future_calls_of_a_batch_run_on_time(docket: Docket) -> None:
    ran: dict[int, float] = {}

    async def stamp(n: int) -> None:
        ran[n] = time.time()

    docket.register(stamp)
    soon = datetime.now(UTC) + timedelta(milliseconds=300)
    async with anyio.create_task_group() as group:
        worker = make_worker(docket)
        group.start_soon(worker.run_forever)
        await anyio.sleep(0.1)  # the worker waits for work when the batch lands
        async with docket.batch() as batch:
            for n in range(5):
                batch.add(stamp, when=soon + timedelta(milliseconds=50 * n))(n)
        with anyio.fail_after(10):
            while len(ran) < 5:
                await anyio.sleep(0.01)
        group.cancel_scope.cancel()
    for n, at in ran.items():
        due = (soon + timedelta(milliseconds=50 * n)).timestamp()
        assert due - 0.001 <= at < due + 0.5


async def test_a_batch_outside_its_block_is_a_clear_error(docket: Docket) -> None:
    batch = docket.batch()
    with pytest.raises(UsageError, match=r"async with docket\.batch"):
        batch.add(double)(1)
    with pytest.raises(UsageError, match="chunk"):
        docket.batch(chunk=0)


# -- the server scripts ------------------------------------------------------------------


def test_consecutive_schedules_and_finishes_share_calls_in_order() -> None:
    now = time.time()

    def add(key: str) -> object:
        return plan_add(
            key=key, function="f", payload=b"", when=now, mode=ScheduleMode.ADD, now=now
        )

    def finish(n: int) -> Finish:
        return Finish(
            delivery_id=f"{n}-0",
            key=f"k{n}",
            generation=1,
            state=ExecutionState.COMPLETED,
            now=now,
            ttl=60,
        )

    cancel = Cancel(key="x", now=now, ttl=60)
    effects = [add("a"), add("b"), finish(1), finish(2), add("c"), cancel, add("d")]
    calls = calls_for(Layout(f"batch-{uuid.uuid4().hex}"), effects)  # type: ignore[arg-type]
    assert [(call.name, covered) for call, covered in calls] == [
        ("schedule", 2),
        ("finish", 2),
        ("schedule", 1),
        ("cancel", 1),
        ("schedule", 1),
    ]
    # each call carries its memo header (empty: a producer does not resend),
    # then its effects' fields, packed into one argument, in order
    (header, packed) = calls[0][0].args[2:]
    assert header == b""
    assert isinstance(packed, bytes) and packed.startswith(b"1:a1:f0:")
    assert b"1:b1:f0:" in packed


SERVER_BACKENDS = [
    "redis-asyncio",
    "valkey-asyncio",
    "glide_valkey-asyncio",
    "glide_valkey-trio",
    "glide_redis-asyncio",
]


@pytest.mark.backends(*SERVER_BACKENDS)
async def test_the_acquisitions_of_one_flush_share_one_call(docket: Docket) -> None:
    """Three deliveries ask for a limit of 2 in one call: two take a slot, the
    third is parked, each told so in order."""
    for n in range(3):
        await docket.add(double, key=f"k{n}")(n)
    now = time.time()
    deliveries = await claim_as(docket, "w", 3, now)
    acquisitions = [
        acquisition(d, f"w/{d.delivery_id}", "batched-limit", 2, now=now) for d in deliveries
    ]
    calls = calls_for(Layout(docket.name), acquisitions)
    assert [(call.name, covered) for call, covered in calls] == [("acquire", 3)]
    outcomes = await docket.adapter.execute(acquisitions)
    assert outcomes == [
        SlotAcquired(delivery_id=deliveries[0].delivery_id, acquired=True),
        SlotAcquired(delivery_id=deliveries[1].delivery_id, acquired=True),
        SlotAcquired(delivery_id=deliveries[2].delivery_id, acquired=False),
    ]
    parked = await docket.get_execution("k2")
    assert parked is not None and parked.state is ExecutionState.SCHEDULED
