"""End-to-end tests of the Worker runtime, on every contract backend (conftest's
``docket`` and ``make_docket`` fixtures): redelivery and leases, cancellation,
messages that cannot run, counters, heartbeats and SIGTERM draining."""

from __future__ import annotations

import signal
import sys
import textwrap
import time
import types
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from helpers import loaded, make_worker

from docket_core import (
    CurrentExecution,
    Docket,
    Execution,
    ExecutionCancelled,
    ExecutionState,
    Perpetual,
    Retry,
)
from docket_core.sansio.effects import Schedule
from docket_core.sansio.flight import Count
from docket_core.sansio.values import ScheduleMode, TaskMessage

pytestmark = pytest.mark.anyio


# -- redelivery and leases ------------------------------------------------------------


async def test_a_message_held_by_a_crashed_worker_is_redelivered(docket: Docket) -> None:
    runs: list[tuple[float, bool]] = []

    async def survivor(execution: Execution = CurrentExecution()) -> str:
        runs.append((time.monotonic(), execution.redelivered))
        return "recovered"

    execution = await docket.add(survivor)()
    # (stamped before the read that starts the lease, not after the round
    # trips that follow it: those may take a while on a loaded machine)
    taken_at = time.monotonic()
    taken = await docket.adapter.read(
        worker="ghost", count=1, now=time.time(), redelivery_timeout=0.2, block=0
    )
    assert [d.message.key for d in taken.deliveries] == [execution.key]
    assert (await loaded(docket, execution.key)).state is ExecutionState.QUEUED

    worker = make_worker(docket, redelivery_timeout=timedelta(milliseconds=200))
    with anyio.fail_after(2):
        await worker.run_until_finished()
    assert len(runs) == 1
    ran_at, redelivered = runs[0]
    assert ran_at - taken_at >= 0.19
    assert redelivered is True
    assert worker.counters["redelivered"] == 1
    assert await execution.get_result(timeout=timedelta(seconds=1)) == "recovered"


async def test_a_long_task_keeps_its_lease(docket: Docket) -> None:
    runs: list[str] = []

    async def long_one(execution: Execution = CurrentExecution()) -> None:
        runs.append(execution.worker or "?")
        await anyio.sleep(1.2)  # (more than twice the lease)

    execution = await docket.add(long_one)()
    # (renewals go every lease / 4, and a worker stops a run itself once none
    # got through for 3/4 of a lease: with 100 ms, a stall of 75 ms on a loaded
    # machine loses the run)
    lease = timedelta(milliseconds=500)
    first = make_worker(docket, name="first", redelivery_timeout=lease)
    second = make_worker(docket, name="second", redelivery_timeout=lease)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(first.run_until_finished)
            group.start_soon(second.run_until_finished)
    assert len(runs) == 1
    assert first.counters["redelivered"] + second.counters["redelivered"] == 0
    assert first.counters["lease_lost"] + second.counters["lease_lost"] == 0
    assert (await loaded(docket, execution.key)).state is ExecutionState.COMPLETED


# -- cancellation ------------------------------------------------------------------------


async def test_cancelling_a_running_task_stops_it_promptly(docket: Docket) -> None:
    started = anyio.Event()
    finished: list[bool] = []

    async def sleepy(
        retry: Retry = Retry(attempts=3),
        perpetual: Perpetual = Perpetual(every=timedelta(milliseconds=5)),
    ) -> None:
        started.set()
        await anyio.sleep(5)
        finished.append(True)

    execution = await docket.add(sleepy, key="sleepy")()
    worker = make_worker(docket)
    with anyio.fail_after(2):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_until_finished)
            await started.wait()
            cancelled_at = time.monotonic()
            await docket.cancel("sleepy")
        stopped_at = time.monotonic()
    assert stopped_at - cancelled_at < 0.5
    assert finished == []
    assert worker.counters["started"] == 1  # neither retried nor perpetuated
    assert (await loaded(docket, "sleepy")).state is ExecutionState.CANCELLED
    with pytest.raises(ExecutionCancelled):
        await execution.get_result(timeout=timedelta(seconds=1))


async def test_cancelling_a_sync_task_lets_it_finish_and_records_its_end(
    docket: Docket,
) -> None:
    """A thread cannot be interrupted: the run ends when the function returns,
    and its real end is recorded (as pydocket records a run that outlives its
    cancellation)."""

    def blocking() -> None:
        time.sleep(0.2)

    execution = await docket.add(blocking, key="blocking")()
    worker = make_worker(docket)
    with anyio.fail_after(2):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_until_finished)
            while (await loaded(docket, "blocking")).state is not ExecutionState.RUNNING:
                await anyio.sleep(0.005)
            await docket.cancel("blocking")
    assert (await loaded(docket, execution.key)).state is ExecutionState.COMPLETED


# -- messages that cannot run ----------------------------------------------------------


async def test_an_unknown_task_fails_and_the_worker_goes_on(
    docket: Docket, make_docket: Callable[..., Awaitable[Docket]]
) -> None:
    async def mystery_task() -> None:
        raise AssertionError("never runs here")

    unknown = await docket.add(mystery_task)()
    # a second Docket object on the same docket, as another process would have
    other = await make_docket(name=docket.name)
    assert "mystery_task" not in other.tasks
    ran: list[str] = []

    async def known(x: str) -> str:
        ran.append(x)
        return x

    after = await other.add(known)("still working")
    worker = make_worker(other)
    with anyio.fail_after(2):
        await worker.run_until_finished()
    assert ran == ["still working"]
    assert await after.get_result(timeout=timedelta(seconds=1)) == "still working"
    failed = await loaded(docket, unknown.key)
    assert failed.state is ExecutionState.FAILED
    assert failed.error is not None and "mystery_task" in failed.error
    assert worker.counters["failed"] == 1
    assert worker.counters["succeeded"] == 1


async def test_an_unknown_task_goes_to_the_fallback_task(
    docket: Docket, make_docket: Callable[..., Awaitable[Docket]]
) -> None:
    async def renamed_task(customer: int, *, note: str) -> None:
        raise AssertionError("never runs here")

    unknown = await docket.add(renamed_task)(7, note="hi")
    other = await make_docket(name=docket.name)
    seen: list[tuple[str, tuple[object, ...], dict[str, object]]] = []

    async def fallback(
        *args: object, execution: Execution = CurrentExecution(), **kwargs: object
    ) -> str:
        seen.append((execution.function_name, args, kwargs))
        return "handled"

    worker = make_worker(other, fallback_task=fallback)
    with anyio.fail_after(2):
        await worker.run_until_finished()
    assert seen == [("renamed_task", (7,), {"note": "hi"})]
    handled = await loaded(docket, unknown.key)
    assert handled.state is ExecutionState.COMPLETED
    assert await unknown.get_result(timeout=timedelta(seconds=1)) == "handled"


async def test_a_garbage_payload_fails_with_the_unpickling_reason(docket: Docket) -> None:
    key = f"garbage-{uuid.uuid4().hex}"
    message = TaskMessage(key=key, function="trace", payload=b"garbage", when=time.time())
    await docket.adapter.execute(
        [Schedule(message=message, mode=ScheduleMode.ADD, now=time.time())]
    )
    worker = make_worker(docket)
    with anyio.fail_after(2):
        await worker.run_until_finished()
    failed = await loaded(docket, key)
    assert failed.state is ExecutionState.FAILED
    assert failed.error is not None and "unpickled" in failed.error
    assert worker.counters["started"] == 0
    with pytest.raises(Exception, match="unpickled"):
        await failed.get_result(timeout=timedelta(seconds=1))


async def test_arguments_needing_a_missing_module_fail(docket: Docket) -> None:
    module_name = f"vanishing_{uuid.uuid4().hex}"
    module = types.ModuleType(module_name)
    exec("class Thing:\n    pass\n", module.__dict__)
    module.Thing.__module__ = module_name
    sys.modules[module_name] = module
    try:
        ran: list[Any] = []

        async def needs_thing(thing: Any) -> None:
            ran.append(thing)

        execution = await docket.add(needs_thing)(module.Thing())
    finally:
        del sys.modules[module_name]
    worker = make_worker(docket)
    with anyio.fail_after(2):
        await worker.run_until_finished()
    assert ran == []
    failed = await loaded(docket, execution.key)
    assert failed.state is ExecutionState.FAILED
    assert failed.error is not None
    assert "unpickled" in failed.error and module_name in failed.error


# -- counters and heartbeats ------------------------------------------------------------


async def test_counters_reflect_outcomes(docket: Docket) -> None:
    async def fine() -> None:
        pass

    async def broken() -> None:
        raise RuntimeError("broken")

    async def retried(retry: Retry = Retry(attempts=2)) -> None:
        if retry.attempt == 1:
            raise RuntimeError("once")

    for _ in range(3):
        await docket.add(fine)()
    await docket.add(broken)()
    await docket.add(retried)()
    worker = make_worker(docket)
    assert worker.counters == {}
    with anyio.fail_after(2):
        await worker.run_until_finished()
    counters = worker.counters
    assert counters["delivered"] == 6
    assert counters["started"] == 6
    assert counters["succeeded"] == 4
    assert counters["failed"] == 1
    assert counters["retried"] == 1
    # plain names, as printed and read by instrumentation (``Count`` values)
    assert all(type(name) is str for name in counters)
    assert set(counters) <= {count.value for count in Count}


async def test_heartbeats_list_the_worker_while_it_runs(docket: Docket) -> None:
    async def chore() -> None:
        pass

    docket.register(chore)
    worker = make_worker(docket, name=f"hb-{uuid.uuid4().hex}")
    assert worker.name not in [w.name for w in await docket.workers()]
    with anyio.fail_after(2):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_forever)
            while not await docket.workers():
                await anyio.sleep(0.005)
            (info,) = await docket.workers()
            assert info.name == worker.name
            assert {"chore", "trace"} <= info.tasks
            assert [w.name for w in await docket.task_workers("chore")] == [worker.name]
            group.cancel_scope.cancel()
    assert await docket.workers() == []


# -- SIGTERM ----------------------------------------------------------------------------

# The worker process: argv is the anyio backend, the docket URL, the docket's name and
# whether it adds the task itself.  A memory:// docket lives in one process, so on
# memory the subprocess adds its own task; on a server the test process adds it, as
# another process would, and the subprocess only runs its worker.
SIGTERM_SCRIPT = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    import anyio
    from docket_core import Docket, Worker

    async def slow() -> None:
        print("started", flush=True)
        await anyio.sleep(0.3)
        print("done", flush=True)

    async def main(url: str, name: str, add: bool) -> None:
        async with Docket(name=name, url=url) as docket:
            docket.register(slow)
            if add:
                await docket.add(slow, key="slow")()
            worker = Worker(
                docket,
                minimum_check_interval=timedelta(milliseconds=5),
                scheduling_resolution=timedelta(milliseconds=5),
            )
            print("ready", flush=True)
            await worker.run_forever()
            print("stopped", dict(worker.counters), flush=True)

    anyio.run(main, sys.argv[2], sys.argv[3], sys.argv[4] == "add", backend=sys.argv[1])
    """
)


async def test_sigterm_drains_running_tasks(
    anyio_backend: str, docket_url: str, make_docket: Callable[..., Awaitable[Docket]]
) -> None:
    on_memory = docket_url.startswith("memory://")
    name = f"sigterm-{uuid.uuid4().hex}"
    docket = None if on_memory else await make_docket(name=name)

    async def slow() -> None:  # the name the subprocess registered; never runs here
        raise AssertionError("runs in the worker process")

    with anyio.fail_after(10):
        async with await anyio.open_process(
            [
                sys.executable,
                "-c",
                SIGTERM_SCRIPT,
                anyio_backend,
                docket_url,
                name,
                "add" if on_memory else "wait",
            ]
        ) as process:
            assert process.stdout is not None
            output = ""
            async for chunk in process.stdout:
                output += chunk.decode()
                if "ready" in output:
                    break
            if docket is not None:
                await docket.add(slow, key="slow")()
            if "started" not in output:
                async for chunk in process.stdout:
                    output += chunk.decode()
                    if "started" in output:
                        break
            assert "started" in output, output
            process.send_signal(signal.SIGTERM)
            async for chunk in process.stdout:
                output += chunk.decode()
            code = await process.wait()
    assert "done" in output, output
    assert "stopped" in output
    assert code == 0
    if docket is not None:
        execution = await loaded(docket, "slow")
        assert execution.state is ExecutionState.COMPLETED
        assert await docket.workers() == []


async def test_a_read_never_waits_past_the_soonest_due_time(docket: Docket) -> None:
    """The worker computes how long to block before a read; when that read
    finds a message due sooner, the adapter must wake up for it, not sit out
    the whole block (here 5 s against a message due in 50 ms)."""

    async def job() -> None:
        pass

    await docket.add(job, when=datetime.now(UTC) + timedelta(milliseconds=50))()
    adapter = docket.adapter
    started = time.monotonic()
    with anyio.fail_after(10):
        result = await adapter.read(
            worker="reader", count=10, now=time.time(), redelivery_timeout=60.0, block=5.0
        )
        while not result.deliveries:
            result = await adapter.read(
                worker="reader", count=10, now=time.time(), redelivery_timeout=60.0, block=5.0
            )
    assert time.monotonic() - started < 1.0
    assert [d.message.function for d in result.deliveries] == ["job"]
