"""``Docket.batch()`` on every contract backend, and pydocket 0.27's batch API
(``Docket.call``, ``add_many``, ``replace_many``) built on it.

How the scripts batch effects is tested where it happens: the script calls in
``tests/core/test_lua_protocol.py``, their replies on a server in
``tests/store/test_server_backends.py``."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import anyio
import pytest

from docket_core import Disposition, Docket, ExecutionState, TaskCall, UsageError, Worker

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


# -- pydocket 0.27's batch API: Docket.call, add_many, replace_many ------------------


async def test_call_builds_a_task_call_and_settles_when_and_key(docket: Docket) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    call = docket.call(double, when=later, key="k")(21)
    assert isinstance(call, TaskCall)
    assert (call.function, call.args, call.kwargs, call.key, call.when) == (
        double,
        (21,),
        {},
        "k",
        later,
    )
    assert call.function_name is None
    assert docket.tasks["double"] is double  # registered, as add would
    named = docket.call("double")(n=1)
    assert named.function is double and named.function_name == "double"
    assert named.kwargs == {"n": 1}
    # as in pydocket, the key and time are settled once per docket.call(...)
    specify = docket.call(double)
    one, two = specify(1), specify(2)
    assert one.key == two.key and one.when == two.when
    assert docket.call(double)(1).key != one.key
    assert (await docket.snapshot()).future == []  # nothing is sent


async def test_add_many_adds_each_call_in_order(docket: Docket) -> None:
    await docket.strike(double, "n", "==", 13)
    later = datetime.now(UTC) + timedelta(hours=1)
    calls = [docket.call(double, key=f"k{n}")(n) for n in range(5)]
    calls += [
        docket.call(double, key="k0")(100),  # the key is taken: nothing changes
        docket.call("double", when=later)(13),  # struck
        docket.call("double", when=later, key="later")(7),
    ]
    executions = await docket.add_many(calls, chunk_size=2)
    assert [e.key for e in executions] == [c.key for c in calls]
    assert [e.disposition for e in executions] == [
        *[Disposition.SCHEDULED] * 5,
        Disposition.ALREADY_SCHEDULED,
        Disposition.STRUCK,
        Disposition.SCHEDULED,
    ]
    assert executions[-1].when == later and executions[-1].function_name == "double"
    stored = await docket.get_execution("k0")
    assert stored is not None and stored.args == (0,)
    await docket.cancel("later")
    with anyio.fail_after(20):
        await make_worker(docket).run_until_finished()
    assert [await e.get_result(timeout=timedelta(seconds=5)) for e in executions[:5]] == [
        0,
        2,
        4,
        6,
        8,
    ]
    assert await docket.add_many([]) == []


async def test_replace_many_replaces_each_key(docket: Docket) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    await docket.add(double, when=later, key="a")(1)
    executions = await docket.replace_many(
        [
            docket.call(double, when=later + timedelta(hours=1), key="a")(2),
            docket.call(double, when=later, key="b")(3),
        ],
        chunk_size=None,
    )
    assert [e.disposition for e in executions] == [Disposition.SCHEDULED] * 2
    stored = await docket.get_execution("a")
    assert stored is not None and stored.args == (2,)
    assert stored.when == later + timedelta(hours=1)
    assert len((await docket.snapshot()).future) == 2


async def test_batch_api_refuses_what_pydocket_refuses(docket: Docket) -> None:
    with pytest.raises(ValueError, match=r"^chunk_size must be at least 1, got 0$"):
        await docket.add_many([docket.call(double)(1)], chunk_size=0)
    with pytest.raises(ValueError, match=r"^chunk_size must be at least 1, got -1$"):
        await docket.replace_many([], chunk_size=-1)
    with pytest.raises(KeyError, match=r"Task 'nope' is not registered"):
        docket.call("nope")
    async with docket.batch() as batch:
        with pytest.raises(KeyError, match=r"Task 'nope' is not registered"):
            batch.add("nope")
    assert (await docket.snapshot()).future == []
