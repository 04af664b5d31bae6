"""``Cron`` end to end, on every contract backend.  cronsim takes an optional
seconds field first, so ``* * * * * *`` (every second) lets a test see many
instants: automatic cron tasks start with the worker, each run is scheduled
for an instant of the expression, the next run follows whether the run
succeeded or failed, and no instant runs twice, even with several workers.
Keywords, 5-field expressions and time zones are checked where a worker
seeds them (at their next instant); ``tests/core/test_cron_rules.py`` walks the
daylight saving changes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import anyio
import pytest
from helpers import loaded, make_worker

from docket_core import Cron, CurrentExecution, Docket, Execution, ExecutionState, Worker

pytestmark = pytest.mark.anyio

EVERY_SECOND = "* * * * * *"
MakeDocket = Callable[..., Awaitable[Docket]]


async def run_for(seconds: float, *workers: Worker) -> None:
    with anyio.fail_after(seconds + 10):
        async with anyio.create_task_group() as group:
            for worker in workers:
                group.start_soon(worker.run_forever)
            await anyio.sleep(seconds)
            group.cancel_scope.cancel()


def whole_seconds(instants: list[float]) -> bool:
    return all(abs(i - round(i)) < 1e-6 for i in instants)


async def test_an_automatic_cron_task_starts_with_the_worker(docket: Docket) -> None:
    instants: list[float] = []

    async def tick(
        cron: Cron = Cron(EVERY_SECOND), execution: Execution = CurrentExecution()
    ) -> None:
        instants.append(execution.when.timestamp())

    docket.register(tick)
    await run_for(2.6, make_worker(docket))
    assert len(instants) >= 2
    assert whole_seconds(instants)
    assert len(set(instants)) == len(instants), "an instant ran twice"


async def test_the_next_run_follows_a_failure(docket: Docket) -> None:
    instants: list[float] = []

    async def broken(
        cron: Cron = Cron(EVERY_SECOND), execution: Execution = CurrentExecution()
    ) -> None:
        instants.append(execution.when.timestamp())
        raise RuntimeError("every time")

    docket.register(broken)
    await run_for(2.6, make_worker(docket))
    assert len(instants) >= 2
    assert len(set(instants)) == len(instants)
    record = await loaded(docket, "broken")
    assert record.state in (ExecutionState.SCHEDULED, ExecutionState.QUEUED)


async def test_no_instant_runs_twice_with_several_workers(make_docket: MakeDocket) -> None:
    name = f"cron-{uuid.uuid4().hex}"
    dockets = [await make_docket(name) for _ in range(3)]
    instants: list[float] = []

    async def tick(
        cron: Cron = Cron(EVERY_SECOND), execution: Execution = CurrentExecution()
    ) -> None:
        instants.append(execution.when.timestamp())
        await anyio.sleep(0.2)

    for docket in dockets:
        docket.register(tick)
    await run_for(3.2, *(make_worker(d, name=f"w{i}") for i, d in enumerate(dockets)))
    assert len(instants) >= 2
    assert len(set(instants)) == len(instants), sorted(instants)
    assert whole_seconds(instants)


async def test_a_manual_cron_task_is_not_seeded_and_perpetuates_once_added(
    docket: Docket,
) -> None:
    instants: list[float] = []

    async def report(
        cron: Cron = Cron(EVERY_SECOND, automatic=False),
        execution: Execution = CurrentExecution(),
    ) -> None:
        instants.append(execution.when.timestamp())

    docket.register(report)
    await run_for(1.2, make_worker(docket))
    assert instants == []
    await docket.add(report, key="report")()
    await run_for(2.3, make_worker(docket))
    assert len(instants) >= 2
    # the first run was the one added for now; the next ones are instants
    assert whole_seconds(instants[1:])


@pytest.mark.parametrize(
    ("expression", "tz", "local"),
    [
        ("@hourly", UTC, (None, 0)),
        ("@daily", UTC, (0, 0)),
        ("15 12 * * *", ZoneInfo("America/New_York"), (12, 15)),
        ("0 9 * * 1-5", ZoneInfo("Europe/Berlin"), (9, 0)),
    ],
)
async def test_a_worker_seeds_a_cron_task_at_its_next_instant(
    docket: Docket, expression: str, tz: ZoneInfo, local: tuple[int | None, int]
) -> None:
    async def scheduled(cron: Cron = Cron(expression, tz=tz)) -> None:
        raise AssertionError("not due during the test")

    docket.register(scheduled)
    before = datetime.now(UTC)
    await run_for(0.3, make_worker(docket))
    execution = await loaded(docket, "scheduled")
    assert execution.state is ExecutionState.SCHEDULED
    when = execution.when.astimezone(tz)
    hour, minute = local
    assert (when.minute, when.second) == (minute, 0)
    if hour is not None:
        assert when.hour == hour
    assert before < execution.when <= before + timedelta(days=4)
    assert execution.when == Cron(expression, tz=tz).next_time()


async def test_reseeding_leaves_a_live_chain_alone(docket: Docket) -> None:
    async def daily(cron: Cron = Cron("@daily")) -> None:
        raise AssertionError("not due during the test")

    docket.register(daily)
    await run_for(0.2, make_worker(docket))
    first = await loaded(docket, "daily")
    await run_for(0.2, make_worker(docket))
    again = await loaded(docket, "daily")
    assert again.when == first.when
    assert again.generation == first.generation
    assert time.time() < first.when.timestamp()
