"""Putting calls on a docket, on every contract backend: ``add`` (now, later,
in the past, by registered name, typed), idempotent keys, ``replace``, default
keys, and arguments that cannot be pickled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import anyio
import pytest
from helpers import Now, finish, key, running

from docket_core import Disposition, Docket, Execution, ExecutionState, UsageError, Worker

pytestmark = pytest.mark.anyio


# -- add ------------------------------------------------------------------------------


async def test_add_now_runs_the_call(docket: Docket, worker: Worker) -> None:
    calls: list[tuple[int, str]] = []

    async def record(a: int, b: str = "x") -> None:
        calls.append((a, b))

    execution = await docket.add(record)(1, b="two")
    assert execution.disposition is Disposition.SCHEDULED
    assert execution.state is ExecutionState.QUEUED
    assert execution.function_name == "record"
    assert execution.args == (1,)
    assert execution.kwargs == {"b": "two"}
    assert calls == []

    await finish(worker)

    assert calls == [(1, "two")]
    done = await docket.get_execution(execution.key)
    assert done is not None
    assert done.state is ExecutionState.COMPLETED


async def test_add_with_when_runs_no_earlier_and_soon_after(
    docket: Docket, worker: Worker, now: Now
) -> None:
    ran_at: list[float] = []
    ran = anyio.Event()

    async def later() -> None:
        ran_at.append(time.time())
        ran.set()

    when = now() + timedelta(milliseconds=200)
    execution = await docket.add(later, when=when)()
    assert execution.state is ExecutionState.SCHEDULED
    assert execution.when == when

    async with running(worker):
        await ran.wait()

    assert len(ran_at) == 1
    assert ran_at[0] >= when.timestamp()
    # (a server may end a short blocking read only on its 10 Hz timer, and a
    # loaded machine adds its own delay)
    assert ran_at[0] - when.timestamp() < 0.5


async def test_add_with_when_in_the_past_is_queued(
    docket: Docket, worker: Worker, now: Now
) -> None:
    calls: list[int] = []

    async def job() -> None:
        calls.append(1)

    execution = await docket.add(job, when=now() - timedelta(hours=1))()
    assert execution.state is ExecutionState.QUEUED
    await finish(worker)
    assert calls == [1]


async def test_add_by_registered_name(docket: Docket, worker: Worker) -> None:
    calls: list[int] = []

    async def named(n: int) -> None:
        calls.append(n)

    docket.register(named, names=["named", "alias"])
    first = await docket.add("named")(1)
    second = await docket.add("alias")(2)
    assert first.function_name == "named"
    assert second.function_name == "alias"

    await finish(worker)
    assert sorted(calls) == [1, 2]


async def test_add_unknown_name_raises_key_error(docket: Docket) -> None:
    with pytest.raises(KeyError, match="nope"):
        docket.add("nope")
    assert (await docket.snapshot()).future == []


async def test_add_is_typed_with_paramspec(docket: Docket, worker: Worker) -> None:
    seen: list[str] = []

    async def typed(count: int, label: str, *, loud: bool = False) -> str:
        text = label * count
        seen.append(text.upper() if loud else text)
        return text

    execution: Execution = await docket.add(typed)(2, "ab", loud=True)
    await finish(worker)
    assert seen == ["ABAB"]
    assert await execution.get_result() == "abab"


# -- idempotent keys ------------------------------------------------------------------


async def test_key_while_scheduled_first_when_and_args_win(
    docket: Docket, worker: Worker, now: Now
) -> None:
    calls: list[int] = []

    async def once(n: int) -> None:
        calls.append(n)

    k = key()
    first_when = now() + timedelta(milliseconds=50)
    first = await docket.add(once, when=first_when, key=k)(1)
    second = await docket.add(once, when=now() + timedelta(seconds=30), key=k)(2)
    assert first.disposition is Disposition.SCHEDULED
    assert second.disposition is Disposition.ALREADY_SCHEDULED
    assert second.state is ExecutionState.SCHEDULED

    stored = await docket.get_execution(k)
    assert stored is not None
    assert stored.when == first_when
    assert stored.args == (1,)

    await finish(worker)
    assert calls == [1]


async def test_key_while_queued(docket: Docket, worker: Worker) -> None:
    calls: list[int] = []

    async def once(n: int) -> None:
        calls.append(n)

    k = key()
    first = await docket.add(once, key=k)(1)
    second = await docket.add(once, key=k)(2)
    assert first.disposition is Disposition.SCHEDULED
    assert second.disposition is Disposition.ALREADY_SCHEDULED
    assert second.state is ExecutionState.QUEUED

    await finish(worker)
    assert calls == [1]


async def test_key_while_running_then_again_after_completion(
    docket: Docket, worker: Worker
) -> None:
    calls: list[int] = []
    started = anyio.Event()
    release = anyio.Event()

    async def blocking(n: int) -> None:
        calls.append(n)
        started.set()
        await release.wait()

    k = key()
    async with running(worker):
        first = await docket.add(blocking, key=k)(1)
        await started.wait()
        again = await docket.add(blocking, key=k)(2)
        assert again.disposition is Disposition.ALREADY_SCHEDULED
        assert again.state is ExecutionState.RUNNING
        release.set()
        await first.get_result(timeout=timedelta(seconds=2))
        assert calls == [1]

        third = await docket.add(blocking, key=k)(3)
        assert third.disposition is Disposition.SCHEDULED
        await third.get_result(timeout=timedelta(seconds=2))
    assert calls == [1, 3]


async def test_default_keys_are_time_ordered_uuid7(docket: Docket) -> None:
    import uuid as uuid_module

    async def job() -> None:
        pass

    first = await docket.add(job)()
    await anyio.sleep(0.002)
    second = await docket.add(job)()
    parsed = uuid_module.UUID(first.key)
    assert parsed.version == 7 and parsed.variant == uuid_module.RFC_4122
    assert str(parsed) == first.key  # (the canonical spelling)
    assert first.key < second.key


# -- replace --------------------------------------------------------------------------


async def test_replace_a_future_execution(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[str] = []

    async def job(value: str) -> None:
        calls.append(value)

    k = key()
    await docket.add(job, when=now() + timedelta(seconds=30), key=k)("old")
    replacement = await docket.replace(job, now(), k)("new")
    assert replacement.disposition is Disposition.SCHEDULED
    assert replacement.state is ExecutionState.QUEUED
    assert len((await docket.snapshot()).future) == 1

    await finish(worker)
    assert calls == ["new"]


async def test_replace_a_queued_execution(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[str] = []

    async def job(value: str) -> None:
        calls.append(value)

    k = key()
    await docket.add(job, key=k)("old")
    await docket.replace(job, now() + timedelta(milliseconds=30), k)("new")
    snapshot = await docket.snapshot()
    assert [e.args for e in snapshot.future] == [("new",)]

    await finish(worker)
    assert calls == ["new"]


# -- arguments that cannot be pickled -------------------------------------------------


def _generator() -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(
    "argument",
    [
        pytest.param(lambda: [threading.Lock()], id="lock"),
        pytest.param(lambda: _generator(), id="generator"),
        pytest.param(lambda: {"nested": (lambda x: x, threading.Lock())}, id="lambda-with-lock"),
    ],
)
async def test_unpicklable_argument_raises_usage_error(
    docket: Docket, argument: Callable[[], Any]
) -> None:
    async def job(value: Any) -> None:
        pass

    k = key()
    with pytest.raises(UsageError, match="pickled"):
        await docket.add(job, key=k)(argument())
    with pytest.raises(UsageError):
        await docket.add(job, key=k)(value=argument())
    with pytest.raises(UsageError):
        await docket.replace(job, datetime.now().astimezone(), k)(argument())
    assert (await docket.snapshot()).future == []
    assert await docket.get_execution(k) is None
    # the key is still free
    assert (await docket.add(job, key=k)(1)).disposition is Disposition.SCHEDULED
