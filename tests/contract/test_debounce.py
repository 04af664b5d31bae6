"""``Debounce`` end to end, on every contract backend: after the last
submission of a scope, ``settle`` of quiet, then exactly one run; the other
submissions are dropped (recorded cancelled), across producers and workers.
As a parameter default (one scope for the task), as ``Annotated`` metadata
(one scope per argument value), and with a ``scope`` shared by dockets."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Annotated

import anyio
import pytest
from helpers import loaded, make_worker

from docket_core import Debounce, Docket, ExecutionState, Worker

pytestmark = pytest.mark.anyio

SETTLE = timedelta(milliseconds=300)
MakeDocket = Callable[..., Awaitable[Docket]]


async def drain(*workers: Worker, limit: float = 10.0) -> None:
    with anyio.fail_after(limit):
        async with anyio.create_task_group() as group:
            for worker in workers:
                group.start_soon(worker.run_until_finished)


async def test_a_burst_runs_once_after_it_settles(
    docket: Docket, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[tuple[int, float]] = []

    async def refresh(n: int, debounce: Debounce = Debounce(SETTLE)) -> None:
        runs.append((n, time.time()))

    keys = []
    last = 0.0
    for n in range(5):
        keys.append((await docket.add(refresh)(n)).key)
        last = time.time()
        await anyio.sleep(0.05)
    worker = make_worker(docket)
    with caplog.at_level(logging.DEBUG, logger="docket.worker"):
        await drain(worker)

    assert [n for n, _ in runs] == [0], "the first submission is the one that runs"
    # it ran only once the scope had been quiet for ``settle``
    assert runs[0][1] >= last + SETTLE.total_seconds() - 0.05
    states = [(await loaded(docket, key)).state for key in keys]
    assert states == [ExecutionState.COMPLETED] + [ExecutionState.CANCELLED] * 4
    assert worker.counters["debounced"] >= 4
    assert "blocked by admission control, dropping (debounce (0:00:00.300000) on" in caplog.text


async def test_submissions_during_the_wait_push_the_run_back(docket: Docket) -> None:
    runs: list[float] = []

    async def refresh(debounce: Debounce = Debounce(SETTLE)) -> None:
        runs.append(time.time())

    worker = make_worker(docket)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await docket.add(refresh)()
            group.start_soon(worker.run_until_finished)
            last = time.time()
            # keep it busy past two settles' worth of time; a submission every
            # sixth of a settle, so a late wake-up under load cannot leave a
            # quiet gap of a whole settle between two of them
            for _ in range(12):
                await anyio.sleep(SETTLE.total_seconds() / 6)
                await docket.add(refresh)()
                last = time.time()
    assert len(runs) == 1
    assert runs[0] >= last + SETTLE.total_seconds() - 0.05


async def test_one_winner_across_producers_and_workers(make_docket: MakeDocket) -> None:
    """Two producers submit at once into one docket that three workers
    serve: one run in all."""
    name = f"debounce-{uuid.uuid4().hex}"
    dockets = [await make_docket(name) for _ in range(3)]
    runs: list[str] = []

    async def sync_index(source: str, debounce: Debounce = Debounce(SETTLE)) -> None:
        runs.append(source)

    for docket in dockets:
        docket.register(sync_index)

    async def produce(docket: Docket, source: str) -> None:
        for _ in range(10):
            await docket.add(sync_index)(source)

    workers = [make_worker(docket, name=f"w{i}") for i, docket in enumerate(dockets)]
    with anyio.fail_after(15):
        async with anyio.create_task_group() as group:
            group.start_soon(produce, dockets[0], "a")
            group.start_soon(produce, dockets[1], "b")
        await drain(*workers)
    assert len(runs) == 1
    assert sum(w.counters["debounced"] for w in workers) >= 19


async def test_per_argument_debounce_keeps_one_scope_per_value(docket: Docket) -> None:
    runs: list[tuple[int, str]] = []

    async def recompute(customer: Annotated[int, Debounce(SETTLE)], note: str = "") -> None:
        runs.append((customer, note))

    for note in ("first", "second", "third"):
        await docket.add(recompute)(1, note)
        await docket.add(recompute)(customer=2, note=note)
    await drain(make_worker(docket))
    assert sorted(runs) == [(1, "first"), (2, "first")]


async def test_a_scope_is_shared_by_the_dockets_that_name_it(make_docket: MakeDocket) -> None:
    scope = f"shared-{uuid.uuid4().hex[:8]}"
    runs: list[str] = []

    async def notify(debounce: Debounce = Debounce(SETTLE, scope=scope)) -> None:
        runs.append("ran")

    first, second = await make_docket(), await make_docket()
    for docket in (first, second):
        docket.register(notify)
        await docket.add(notify)()
        await docket.add(notify)()
    await drain(make_worker(first), make_worker(second))
    assert runs == ["ran"]


async def test_after_a_run_a_new_burst_runs_again(docket: Docket) -> None:
    runs: list[int] = []

    async def refresh(n: int, debounce: Debounce = Debounce(SETTLE)) -> None:
        runs.append(n)

    for n in (1, 2):
        await docket.add(refresh)(n)
    await drain(make_worker(docket))
    for n in (3, 4):
        await docket.add(refresh)(n)
    await drain(make_worker(docket))
    assert runs == [1, 3]
