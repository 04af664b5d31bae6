"""``Docket.cancel`` on every contract backend: a scheduled, queued or running
execution, a waiting ``get_result``, an unknown key, and a cancelled key added
again.

A running key is only marked by its cancel (as pydocket 0.27 leaves it to the
worker to record the end): its run records how it really ended (completed if
it swallowed the cancellation and returned), nothing follows it (no retry, no
next perpetual run), and a copy of it handed out again after its worker died
concludes it cancelled instead of running.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

import anyio
import attrs
import pytest
from helpers import Now, acquisition, claim_as, finish, key, running

from docket_core import (
    Disposition,
    Docket,
    ExecutionCancelled,
    ExecutionState,
    Perpetual,
    Retry,
    Worker,
)
from docket_core.sansio.effects import (
    Cancel,
    Claim,
    ClaimItem,
    Finish,
    ReleaseSlot,
    Request,
    Schedule,
)
from docket_core.sansio.inputs import (
    Cancelled,
    CancelRequested,
    Claimed,
    ClaimVerdict,
    Finished,
    Input,
    ReadDone,
    Scheduled,
    SlotAcquired,
    SlotReleased,
)
from docket_core.sansio.values import Delivery, ScheduleMode
from docket_core.sansio.worker import WorkerMachine

pytestmark = pytest.mark.anyio

#: how long the records these tests write are kept
TTL = 600.0


async def test_cancel_a_scheduled_execution(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[int] = []

    async def job() -> None:
        calls.append(1)

    k = key()
    execution = await docket.add(job, when=now() + timedelta(milliseconds=30), key=k)()
    await docket.cancel(k)
    stored = await docket.get_execution(k)
    assert stored is not None
    assert stored.state is ExecutionState.CANCELLED
    assert (await docket.snapshot()).future == []

    await finish(worker)
    assert calls == []
    with pytest.raises(ExecutionCancelled):
        await execution.get_result(timeout=timedelta(seconds=1))


async def test_cancel_a_queued_execution(docket: Docket, worker: Worker) -> None:
    calls: list[int] = []

    async def job() -> None:
        calls.append(1)

    k = key()
    await docket.add(job, key=k)()
    await docket.cancel(k)
    assert (await docket.snapshot()).future == []

    await finish(worker)
    assert calls == []
    stored = await docket.get_execution(k)
    assert stored is not None
    assert stored.state is ExecutionState.CANCELLED


async def test_cancel_wakes_a_waiting_get_result(docket: Docket, now: Now) -> None:
    async def job() -> None:
        raise AssertionError("never runs")

    k = key()
    execution = await docket.add(job, when=now() + timedelta(seconds=30), key=k)()
    with anyio.fail_after(2):
        async with anyio.create_task_group() as group:

            async def cancel_soon() -> None:
                await anyio.sleep(0.02)
                await docket.cancel(k)

            group.start_soon(cancel_soon)
            with pytest.raises(ExecutionCancelled):
                await execution.get_result()


async def test_cancel_a_running_execution(docket: Docket, worker: Worker) -> None:
    starts: list[int] = []
    interrupted: list[bool] = []
    started = anyio.Event()

    async def endless() -> None:
        starts.append(1)
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            interrupted.append(True)
            raise

    k = key()
    events: list[dict[str, Any]] = []
    cancelled_seen = anyio.Event()

    async with running(worker):
        execution = await docket.add(endless, key=k)()
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                async for event in execution.subscribe():
                    events.append(event)
                    if event.get("state") == "cancelled":
                        cancelled_seen.set()
                        return

            group.start_soon(watch)
            await started.wait()
            await docket.cancel(k)
            with pytest.raises(ExecutionCancelled):
                await execution.get_result(timeout=timedelta(seconds=2))
            await cancelled_seen.wait()

        stored = await docket.get_execution(k)
        assert stored is not None
        assert stored.state is ExecutionState.CANCELLED
        # give the worker a few polls to (wrongly) run it again
        await anyio.sleep(0.1)

    assert starts == [1]
    assert interrupted == [True]
    stored = await docket.get_execution(k)
    assert stored is not None
    assert stored.state is ExecutionState.CANCELLED
    assert any(e.get("state") == "cancelled" for e in events)


async def test_a_run_stopped_in_the_round_it_starts_never_begins(
    docket: Docket,
    worker: Worker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker hears a cancel of a key after reading its delivery and
    before its run begins, so the run's start and its stop come in one round
    of effects (as when a run held back with its claim goes out together
    with a cancel of it): the run ends cancelled without its function
    running, where the stop used to find no run yet and be dropped; and,
    as it never began, it logs no start line (nor an end line)."""
    ran: list[int] = []

    async def quick() -> None:
        ran.append(1)

    k = key()
    receive = WorkerMachine.receive

    def hear_a_cancel_with_the_read(machine: WorkerMachine, event: Input) -> None:
        receive(machine, event)
        if isinstance(event, ReadDone) and any(
            arrival.delivery.message.key == k for arrival in event.arrivals
        ):
            receive(machine, CancelRequested(key=k, now=event.now))

    monkeypatch.setattr(WorkerMachine, "receive", hear_a_cancel_with_the_read)
    await docket.add(quick, key=k)()
    with caplog.at_level(logging.INFO, logger="docket.worker"):
        await finish(worker)
    assert ran == []
    assert worker.counters["cancelled"] == 1
    assert [r.getMessage() for r in caplog.records if k in r.getMessage()] == []
    stored = await docket.get_execution(k)
    assert stored is not None and stored.state is ExecutionState.CANCELLED


async def test_cancel_unknown_key_is_harmless(docket: Docket) -> None:
    await docket.cancel("no-such-key")
    assert await docket.get_execution("no-such-key") is None


async def test_a_cancelled_key_can_be_added_again(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[int] = []

    async def job(n: int) -> None:
        calls.append(n)

    k = key()
    await docket.add(job, when=now() + timedelta(seconds=30), key=k)(1)
    await docket.cancel(k)
    again = await docket.add(job, key=k)(2)
    assert again.disposition is Disposition.SCHEDULED
    await finish(worker)
    assert calls == [2]


# -- a running key: the run records its own end, and nothing follows it ------------------


def request(seq: int) -> Request:
    return Request(origin=f"w1#{key()}", worker="w1", seq=seq, floor=1, remember=600.0)


async def noop() -> None:
    """Never runs here: these tests drive the store directly."""


async def claimed(docket: Docket, count: int = 1) -> list[Delivery]:
    """Add ``count`` keys and claim them as worker w1 (which may then die)."""
    docket.register(noop)
    for _ in range(count):
        await docket.add(noop, key=key())()
    return await claim_as(docket, "w1", count, time.time())


def finishing(delivery: Delivery, state: ExecutionState, **options: Any) -> Finish:
    message = delivery.message
    return Finish(
        delivery_id=delivery.delivery_id,
        key=message.key,
        generation=message.generation,
        state=state,
        now=time.time(),
        ttl=TTL,
        **options,
    )


async def test_cancelling_a_running_key_marks_it_until_its_run_ends(docket: Docket) -> None:
    (delivery,) = await claimed(docket)
    k = delivery.message.key
    cancel = Cancel(key=k, now=time.time(), ttl=TTL)
    assert await docket.adapter.execute([cancel]) == [
        Cancelled(key=k, previous=ExecutionState.RUNNING)
    ]
    marked = await docket.adapter.get_record(k)
    assert marked is not None
    assert (marked.state, marked.generation) == (
        ExecutionState.RUNNING,
        delivery.message.generation,
    )
    assert marked.cancel_ttl == TTL
    # a second cancel changes nothing more
    assert await docket.adapter.execute([attrs.evolve(cancel, now=time.time())]) == [
        Cancelled(key=k, previous=ExecutionState.RUNNING)
    ]
    assert await docket.adapter.get_record(k) == marked

    done = finishing(delivery, ExecutionState.COMPLETED, result=b"kept")
    assert await docket.adapter.execute([done]) == [
        Finished(delivery_id=delivery.delivery_id, recorded=True)
    ]
    ended = await docket.adapter.get_record(k)
    assert ended is not None
    assert (ended.state, ended.result, ended.cancel_ttl) == (
        ExecutionState.COMPLETED,
        b"kept",
        None,
    )


async def test_a_resent_cancel_of_a_running_key_answers_its_first_outcome(docket: Docket) -> None:
    (delivery,) = await claimed(docket)
    k = delivery.message.key
    cancel = Cancel(key=k, now=time.time(), ttl=TTL, request=request(1))
    first = await docket.adapter.execute([cancel])
    assert first == [Cancelled(key=k, previous=ExecutionState.RUNNING)]
    await docket.adapter.execute([finishing(delivery, ExecutionState.COMPLETED)])

    assert await docket.adapter.execute([attrs.evolve(cancel, now=time.time())]) == first
    record = await docket.adapter.get_record(k)
    assert record is not None and record.state is ExecutionState.COMPLETED
    assert await docket.adapter.execute([Cancel(key=k, now=time.time(), ttl=TTL)]) == [
        Cancelled(key=k, previous=ExecutionState.COMPLETED)
    ]


@pytest.mark.parametrize(
    ("ended", "error", "recorded"),
    [
        (None, None, ExecutionState.CANCELLED),  # a retry
        (ExecutionState.COMPLETED, None, ExecutionState.COMPLETED),  # a perpetual's next run
        (ExecutionState.FAILED, "ValueError: late", ExecutionState.FAILED),
    ],
)
async def test_nothing_follows_a_run_whose_key_was_cancelled(
    docket: Docket, ended: ExecutionState | None, error: str | None, recorded: ExecutionState
) -> None:
    """The worker did not hear of the cancel (or heard late) and sends the
    run's follow-up: the store stores nothing and concludes the record."""
    (delivery,) = await claimed(docket)
    message = delivery.message
    await docket.adapter.execute([Cancel(key=message.key, now=time.time(), ttl=TTL)])
    follow_up = Schedule(
        message=attrs.evolve(message, when=time.time(), attempt=message.attempt + 1),
        mode=ScheduleMode.REPLACE,
        now=time.time(),
        acknowledge=delivery.delivery_id,
        expect_generation=message.generation,
        ended=ended,
        ended_error=error,
    )
    assert await docket.adapter.execute([follow_up]) == [
        Scheduled(key=message.key, accepted=False, generation=-1, state=None)
    ]
    record = await docket.adapter.get_record(message.key)
    assert record is not None
    assert (record.state, record.error, record.cancel_ttl) == (recorded, error, None)
    assert record.generation != message.generation
    assert await docket.adapter.pending() == 0


async def test_a_cancelled_runs_copy_handed_out_again_does_not_run(docket: Docket) -> None:
    """Its worker died before recording the run's end: the copy another
    worker reads concludes the key cancelled, and a waiting get_result ends."""
    (delivery,) = await claimed(docket)
    k = delivery.message.key
    await docket.adapter.execute([Cancel(key=k, now=time.time(), ttl=TTL)])
    execution = await docket.get_execution(k)
    assert execution is not None
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:

            async def wait() -> None:
                with pytest.raises(ExecutionCancelled):
                    await execution.get_result()

            group.start_soon(wait)
            await anyio.sleep(0.1)  # past the lease below
            taken = await docket.adapter.read(
                worker="w2", count=1, now=time.time(), redelivery_timeout=0.05, block=0
            )
            (copy,) = taken.deliveries
            assert copy.redelivered and copy.message.generation == delivery.message.generation
            item = ClaimItem(
                delivery_id=copy.delivery_id, key=k, generation=copy.message.generation
            )
            assert await docket.adapter.execute(
                [Claim(worker="w2", items=(item,), now=time.time())]
            ) == [Claimed(verdicts=((copy.delivery_id, ClaimVerdict.CANCELLED),))]
    record = await docket.adapter.get_record(k)
    assert record is not None and record.state is ExecutionState.CANCELLED
    assert record.cancel_ttl is None
    # the dead worker's end, should it come after all, changes nothing
    (late,) = await docket.adapter.execute([finishing(delivery, ExecutionState.COMPLETED)])
    assert late == Finished(delivery_id=delivery.delivery_id, recorded=False)
    assert await docket.adapter.pending() == 0


async def test_a_cancelled_run_that_waits_for_its_limit_concludes_cancelled(
    docket: Docket,
) -> None:
    first, second = await claimed(docket, 2)
    now = time.time()
    (held,) = await docket.adapter.execute([acquisition(first, "w1/a", "L", 1, now=now)])
    assert held == SlotAcquired(delivery_id=first.delivery_id, acquired=True)
    await docket.adapter.execute([Cancel(key=second.message.key, now=now, ttl=TTL)])
    (parked,) = await docket.adapter.execute([acquisition(second, "w1/b", "L", 1, now=now)])
    assert parked == SlotAcquired(delivery_id=second.delivery_id, acquired=False)
    record = await docket.adapter.get_record(second.message.key)
    assert record is not None and record.state is ExecutionState.CANCELLED
    (released,) = await docket.adapter.execute([ReleaseSlot(limit_key="L", holder="w1/a", now=now)])
    assert released == SlotReleased(limit_key="L", woken=0)
    assert await docket.adapter.pending() == 1  # the first's delivery, still held


async def test_a_running_key_is_free_again_once_cancelled(docket: Docket) -> None:
    """As in pydocket: the key can be added again at once; the cancelled
    run's end then changes nothing."""
    (delivery,) = await claimed(docket)
    k = delivery.message.key
    await docket.cancel(k)
    again = await docket.add(noop, key=k)()
    assert again.disposition is Disposition.SCHEDULED
    (late,) = await docket.adapter.execute([finishing(delivery, ExecutionState.COMPLETED)])
    assert late == Finished(delivery_id=delivery.delivery_id, recorded=False)
    record = await docket.adapter.get_record(k)
    assert record is not None and record.state is ExecutionState.QUEUED


# -- through a worker ------------------------------------------------------------------


async def cancel_when_started(docket: Docket, worker: Worker, k: str, started: anyio.Event) -> None:
    async with running(worker):
        with anyio.fail_after(2):
            await started.wait()
        await docket.cancel(k)
        ends = ("succeeded", "failed", "cancelled")
        with anyio.fail_after(2):
            while not sum(worker.counters[end] for end in ends):
                await anyio.sleep(0.01)
        await anyio.sleep(0.1)  # a few polls to (wrongly) run a follow-up


async def test_a_retried_task_that_fails_after_swallowing_its_cancel_is_not_retried(
    docket: Docket, worker: Worker
) -> None:
    runs: list[int] = []
    started = anyio.Event()

    async def stubborn(retry: Retry = Retry(attempts=3)) -> None:
        runs.append(1)
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            pass
        raise ValueError("failed after its cancel")

    k = key()
    execution = await docket.add(stubborn, key=k)()
    await cancel_when_started(docket, worker, k, started)
    assert runs == [1]
    with pytest.raises(ValueError, match="failed after its cancel"):
        await execution.get_result(timeout=timedelta(seconds=1))
    assert (await docket.snapshot()).future == []


async def test_a_perpetual_task_that_swallows_its_cancel_is_not_perpetuated(
    docket: Docket, worker: Worker
) -> None:
    runs: list[int] = []
    started = anyio.Event()

    async def stubborn(perpetual: Perpetual = Perpetual(every=timedelta(milliseconds=10))) -> str:
        runs.append(1)
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            pass
        return "stopped"

    k = key()
    execution = await docket.add(stubborn, key=k)()
    await cancel_when_started(docket, worker, k, started)
    assert runs == [1]
    assert (await docket.snapshot()).future == []
    stored = await docket.get_execution(k)
    assert stored is not None and stored.state is ExecutionState.COMPLETED
    await execution.get_result(timeout=timedelta(seconds=1))


async def test_a_get_result_waiting_on_a_task_that_swallows_its_cancel_gets_its_result(
    docket: Docket, worker: Worker
) -> None:
    started = anyio.Event()

    async def stubborn() -> str:
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            pass
        return "finished anyway"

    k = key()
    execution = await docket.add(stubborn, key=k)()
    results: list[str] = []
    async with running(worker):
        async with anyio.create_task_group() as group:

            async def wait() -> None:
                results.append(await execution.get_result(timeout=timedelta(seconds=3)))

            group.start_soon(wait)
            with anyio.fail_after(2):
                await started.wait()
            await docket.cancel(k)
    assert results == ["finished anyway"]
