"""``Cooldown`` end to end, on every contract backend: the first submission
runs, the others within ``window`` of its start are dropped (recorded
cancelled); once the window has passed, the next one runs.  As a parameter
default, as ``Annotated`` metadata per argument value, with a shared
``scope``, and side by side with a concurrency limit."""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Annotated

import anyio
import pytest
from helpers import admissions, loaded, make_worker

from docket_core import ConcurrencyLimit, Cooldown, Docket, ExecutionState, Worker

pytestmark = pytest.mark.anyio

WINDOW = timedelta(milliseconds=600)
MakeDocket = Callable[..., Awaitable[Docket]]


async def drain(*workers: Worker, limit: float = 10.0) -> None:
    with anyio.fail_after(limit):
        async with anyio.create_task_group() as group:
            for worker in workers:
                group.start_soon(worker.run_until_finished)


async def test_the_first_runs_and_the_rest_of_the_window_is_dropped(
    docket: Docket, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[int] = []

    async def alert(n: int, cooldown: Cooldown = Cooldown(WINDOW)) -> None:
        runs.append(n)

    keys = [(await docket.add(alert)(n)).key for n in range(4)]
    worker = make_worker(docket)
    with caplog.at_level(logging.DEBUG, logger="docket.worker"):
        await drain(worker)
    assert runs == [0]
    states = [(await loaded(docket, key)).state for key in keys]
    assert states == [ExecutionState.COMPLETED] + [ExecutionState.CANCELLED] * 3
    assert worker.counters["cooled_down"] == 3
    assert worker.counters["rescheduled"] == 0
    assert "blocked by admission control, dropping (cooldown (0:00:00.600000) on" in caplog.text


async def test_after_the_window_the_next_submission_runs(
    docket: Docket, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[str] = []
    keys: list[str] = []

    async def alert(cooldown: Cooldown = Cooldown(WINDOW)) -> None:
        runs.append("ran")

    admitted = admissions(monkeypatch, docket)
    worker = make_worker(docket)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_forever)
            deadline = time.time() + 3 * WINDOW.total_seconds()
            while time.time() < deadline:
                keys.append((await docket.add(alert)()).key)
                await anyio.sleep(WINDOW.total_seconds() / 6)
            group.cancel_scope.cancel()
    # the times the store judged them: a body under load may start well after
    starts = sorted(at for _, at in admitted)
    assert 2 <= len(starts) <= 4
    assert {key for key, _ in admitted} <= set(keys)
    assert len(runs) >= len(starts) - 1  # (the last admitted may not have begun)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= WINDOW.total_seconds() - 1e-6 for gap in gaps), gaps


async def test_per_argument_cooldowns_are_independent(docket: Docket) -> None:
    runs: list[str] = []

    async def email(address: Annotated[str, Cooldown(WINDOW)], subject: str) -> None:
        runs.append(f"{address}:{subject}")

    for subject in ("a", "b"):
        for address in ("x@example.com", "y@example.com"):
            await docket.add(email)(address, subject)
    await drain(make_worker(docket))
    assert sorted(runs) == ["x@example.com:a", "y@example.com:a"]


async def test_a_scope_spans_dockets(make_docket: MakeDocket) -> None:
    scope = f"cool-{uuid.uuid4().hex[:8]}"
    runs: list[str] = []

    # (a long window costs nothing here: the second docket's worker, started
    # after the first one finished, must still find it open on a loaded machine)
    async def ping(cooldown: Cooldown = Cooldown(timedelta(seconds=10), scope=scope)) -> None:
        runs.append("ran")

    first, second = await make_docket(), await make_docket()
    for docket in (first, second):
        docket.register(ping)
    await first.add(ping)()
    await drain(make_worker(first))
    await second.add(ping)()
    await drain(make_worker(second))
    assert runs == ["ran"]


async def test_a_cooldown_and_a_concurrency_limit_together(docket: Docket) -> None:
    """Admission first, then the slot: the dropped never take a slot, and
    the limit is free again at the end."""
    runs: list[int] = []

    async def job(
        n: int,
        cooldown: Cooldown = Cooldown(WINDOW),
        limit: ConcurrencyLimit = ConcurrencyLimit(max_concurrent=1),
    ) -> None:
        runs.append(n)
        await anyio.sleep(0.05)

    for n in range(3):
        await docket.add(job)(n)
    await drain(make_worker(docket, concurrency=3))
    await anyio.sleep(WINDOW.total_seconds())
    await docket.add(job)(9)
    await drain(make_worker(docket))
    assert runs == [0, 9]
