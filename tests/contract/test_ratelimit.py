"""``RateLimit`` end to end, on every contract backend: at most ``limit``
starts in any window of ``per``; the excess runs when a place in the window
opens (rescheduled, the same attempt), or with ``drop=True`` is dropped
(recorded cancelled).  As a parameter default, as ``Annotated`` metadata per
argument value, and with a scope shared by dockets."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Annotated

import anyio
import pytest
from helpers import admissions, loaded, make_worker

from docket_core import Docket, ExecutionState, RateLimit, Retry, Worker

pytestmark = pytest.mark.anyio

PER = timedelta(milliseconds=500)
MakeDocket = Callable[..., Awaitable[Docket]]
#: the admissions are compared at the times the store judged them
#: (``admissions``): only float arithmetic separates two of them
SLACK = 1e-6


async def drain(*workers: Worker, limit: float = 10.0) -> None:
    with anyio.fail_after(limit):
        async with anyio.create_task_group() as group:
            for worker in workers:
                group.start_soon(worker.run_until_finished)


def assert_at_most(starts: list[float], limit: int, per: float) -> None:
    """No window of ``per`` holds more than ``limit`` of ``starts``."""
    starts = sorted(starts)
    for first, later in zip(starts, starts[limit:], strict=False):
        assert later - first >= per - SLACK, (limit, per, starts)


async def test_the_excess_waits_for_a_place_in_the_window(
    docket: Docket, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[int] = []

    async def call_api(n: int, limit: RateLimit = RateLimit(2, per=PER)) -> None:
        runs.append(n)

    keys = [(await docket.add(call_api)(n)).key for n in range(5)]
    admitted = admissions(monkeypatch, docket)
    worker = make_worker(docket)
    with caplog.at_level(logging.DEBUG, logger="docket.worker"):
        await drain(worker)
    assert sorted(runs) == list(range(5))
    assert sorted(key for key, _ in admitted) == sorted(keys)
    starts = [at for _, at in admitted]
    assert_at_most(starts, 2, PER.total_seconds())
    assert max(starts) - min(starts) >= 2 * PER.total_seconds() - SLACK
    assert {(await loaded(docket, key)).state for key in keys} == {ExecutionState.COMPLETED}
    assert worker.counters["rate_limited"] >= 3
    assert worker.counters["rescheduled"] == worker.counters["rate_limited"]
    assert "blocked by admission control, rescheduling (rate limit (2/0:00:00.500000) on" in (
        caplog.text
    )


async def test_with_drop_the_excess_never_runs(docket: Docket) -> None:
    runs: list[int] = []

    async def call_api(n: int, limit: RateLimit = RateLimit(2, per=PER, drop=True)) -> None:
        runs.append(n)

    keys = [(await docket.add(call_api)(n)).key for n in range(5)]
    worker = make_worker(docket)
    await drain(worker)
    assert len(runs) == 2
    states = sorted([(await loaded(docket, key)).state.value for key in keys])
    assert states == ["cancelled"] * 3 + ["completed"] * 2
    assert worker.counters["rate_limited"] == 3
    assert worker.counters["rescheduled"] == 0


async def test_the_limit_holds_across_workers(
    make_docket: MakeDocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"ratelimit-{uuid.uuid4().hex}"
    dockets = [await make_docket(name) for _ in range(3)]
    runs: list[int] = []

    async def call_api(n: int, limit: RateLimit = RateLimit(3, per=PER)) -> None:
        runs.append(n)

    for docket in dockets:
        docket.register(call_api)
    keys = [(await dockets[n % 3].add(call_api)(n)).key for n in range(9)]
    admitted = admissions(monkeypatch, *dockets)
    await drain(*(make_worker(d, name=f"w{i}") for i, d in enumerate(dockets)))
    assert sorted(runs) == list(range(9))
    assert sorted(key for key, _ in admitted) == sorted(keys)
    starts = [at for _, at in admitted]
    assert_at_most(starts, 3, PER.total_seconds())


async def test_per_argument_limits_are_independent(
    docket: Docket, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[tuple[str, str]] = []
    keys: dict[str, list[str]] = {}

    async def fetch(host: Annotated[str, RateLimit(1, per=PER)], path: str) -> None:
        runs.append((host, path))

    for path in ("/a", "/b"):
        for host in ("one.example", "two.example"):
            keys.setdefault(host, []).append((await docket.add(fetch)(host, path)).key)
    admitted = admissions(monkeypatch, docket)
    await drain(make_worker(docket))
    assert len(runs) == 4
    at = dict(admitted)
    starts = {host: [at[k] for k in host_keys] for host, host_keys in keys.items()}
    for host_starts in starts.values():
        assert len(host_starts) == 2
        assert_at_most(host_starts, 1, PER.total_seconds())
    # the two hosts did not wait for each other
    assert abs(starts["one.example"][0] - starts["two.example"][0]) < PER.total_seconds() / 2


async def test_a_scope_spans_dockets(make_docket: MakeDocket) -> None:
    scope = f"rate-{uuid.uuid4().hex[:8]}"
    runs: list[str] = []

    async def send(
        n: int, limit: RateLimit = RateLimit(1, per=PER, drop=True, scope=scope)
    ) -> None:
        runs.append("ran")

    first, second = await make_docket(), await make_docket()
    for docket in (first, second):
        docket.register(send)
        await docket.add(send)(1)
    await drain(make_worker(first), make_worker(second))
    assert runs == ["ran"]


async def test_a_rescheduled_run_keeps_its_attempt(docket: Docket) -> None:
    """A rate-limited retry is the same attempt when it finally starts."""
    attempts: list[int] = []

    async def flaky(
        n: int,
        limit: RateLimit = RateLimit(1, per=timedelta(milliseconds=200)),
        retry: Retry = Retry(attempts=3),
    ) -> None:
        attempts.append(retry.attempt)
        if retry.attempt < 2:
            raise ValueError("once more")

    await docket.add(flaky)(1)
    await drain(make_worker(docket))
    assert attempts == [1, 2]
