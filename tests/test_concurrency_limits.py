"""Concurrency limits end to end: ``Docket`` + ``Worker`` on every backend of the
contract suite.  Every test ends by checking that no slot is left behind: the
limit's full capacity is free again (``max_concurrent`` fresh runs on it start
side by side at once, long before any stale slot could be taken over), and on
the servers that the limit's slot and wait keys are gone."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Annotated, Any

import anyio
import pytest
import redis
from servers import Server

from docket_core import (
    ConcurrencyLimit,
    CurrentWorker,
    Docket,
    ExecutionState,
    Retry,
    TaskKey,
    Timeout,
    Worker,
)
from docket_memory.shelf import Shelf
from docket_memory.store import MemoryStore

pytestmark = pytest.mark.anyio

FAST = timedelta(milliseconds=5)
#: long enough that no slot goes stale (and is taken over) during a test
NEVER_STALE = timedelta(minutes=1)

MakeDocket = Callable[..., Awaitable[Docket]]
NoSlotLeft = Callable[..., Awaitable[None]]


def make_worker(docket: Docket, **options: Any) -> Worker:
    options.setdefault("name", f"worker-{uuid.uuid4().hex[:8]}")
    options.setdefault("minimum_check_interval", FAST)
    options.setdefault("scheduling_resolution", FAST)
    return Worker(docket, **options)


def server_keys_left(server: Server, name: str) -> dict[str, int]:
    """The docket's slot and wait keys on the server that still hold members."""
    client = redis.Redis(host="127.0.0.1", port=server.port)  # sync: works under trio too
    try:
        prefix = "{" + name + "}:"
        left: dict[str, int] = {}
        for raw in client.scan_iter(match=prefix + "slots:*", count=1000):
            left[raw.decode()] = int(client.zcard(raw))
        for raw in client.scan_iter(match=prefix + "wait:*", count=1000):
            left[raw.decode()] = int(client.llen(raw))
        waiting = int(client.scard(prefix + "waiting"))
        if waiting:
            left[prefix + "waiting"] = waiting
        return {key: n for key, n in left.items() if n}
    finally:
        client.close()


@pytest.fixture
def assert_no_slot_left(
    make_docket: MakeDocket, server_for: Callable[[], Server | None]
) -> NoSlotLeft:
    """``await assert_no_slot_left(docket, task, max_concurrent, **argument)``:
    the limit of ``task`` (for ``argument``, if it is per argument) has all its
    slots free, and (on servers) nothing of any limit is left in the docket."""

    async def check(docket: Docket, task: str, max_concurrent: int = 1, **argument: Any) -> None:
        server = server_for()
        if server is not None:
            left = server_keys_left(server, docket.name)
            assert left == {}, f"slots or waiters left behind: {left}"

        # fresh runs on the very same limit key: the task's name, registered by
        # a second Docket on the same docket, with the same limit
        assert len(argument) <= 1
        limit = ConcurrencyLimit(*argument, max_concurrent=max_concurrent)
        running = peak = 0
        all_in = anyio.Event()

        async def probe(limit: ConcurrencyLimit = limit, **kwargs: Any) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            if running == max_concurrent:
                all_in.set()
            try:
                with anyio.move_on_after(1):
                    await all_in.wait()
            finally:
                running -= 1

        prober = await make_docket(docket.name)
        prober.register(probe, names=[task])
        for _ in range(max_concurrent):
            await prober.add(task, key=f"probe-{uuid.uuid4().hex}")(**argument)
        worker = make_worker(prober, concurrency=max_concurrent + 1, redelivery_timeout=NEVER_STALE)
        with anyio.move_on_after(max_concurrent + 1):
            await worker.run_until_finished()
        assert peak == max_concurrent, (
            f"a slot of {task} {argument or ''} is still held: only {peak} of "
            f"{max_concurrent} fresh runs ran at once"
        )
        if server is not None:
            left = server_keys_left(server, docket.name)
            assert left == {}, f"the probe left slots or waiters behind: {left}"

    return check


@asynccontextmanager
async def fresh_docket(url: str | None = None) -> AsyncIterator[Docket]:
    name = f"limits-{uuid.uuid4().hex}"
    async with Docket(name=name, url=url or f"memory://{uuid.uuid4().hex}") as docket:
        yield docket


def shelf_of(docket: Docket) -> Shelf:
    adapter = docket.adapter
    assert isinstance(adapter, MemoryStore)
    return adapter.shelf


def assert_no_slots(docket: Docket) -> None:
    """Memory internals: no slot and no parked waiter is left on the shelf."""
    shelf = shelf_of(docket)
    assert shelf.slots == {}, f"slots left behind: {shelf.slots}"
    assert not any(shelf.waiters.values()), f"waiters left behind: {shelf.waiters}"


async def state_of(docket: Docket, key: str) -> ExecutionState | None:
    execution = await docket.get_execution(key)
    return None if execution is None else execution.state


async def wait_until_state(docket: Docket, key: str, *states: ExecutionState) -> None:
    with anyio.fail_after(3):
        while await state_of(docket, key) not in states:
            await anyio.sleep(0.005)


class Tracker:
    """Counts what runs at once, per group and overall, and the start order."""

    def __init__(self) -> None:
        self.running: Counter[Any] = Counter()
        self.peak: Counter[Any] = Counter()
        self.total = 0
        self.peak_total = 0
        self.started: list[Any] = []

    @asynccontextmanager
    async def run(self, group: Any, tag: Any = None) -> AsyncIterator[None]:
        self.started.append(group if tag is None else tag)
        self.running[group] += 1
        self.total += 1
        self.peak[group] = max(self.peak[group], self.running[group])
        self.peak_total = max(self.peak_total, self.total)
        try:
            yield
        finally:
            self.running[group] -= 1
            self.total -= 1


# -- the three forms -------------------------------------------------------------------


async def test_a_per_argument_limit(docket: Docket, assert_no_slot_left: NoSlotLeft) -> None:
    tracker = Tracker()

    async def charge(
        customer: int,
        limit: ConcurrencyLimit = ConcurrencyLimit("customer", max_concurrent=2),
    ) -> None:
        async with tracker.run(customer):
            await anyio.sleep(0.03)

    docket.register(charge)
    for i in range(10):
        await docket.add(charge)(customer=i % 2)
    with anyio.fail_after(10):
        await make_worker(docket, concurrency=10).run_until_finished()
    assert len(tracker.started) == 10
    assert tracker.peak == {0: 2, 1: 2}
    assert tracker.peak_total > 2
    await assert_no_slot_left(docket, "charge", 2, customer=0)
    await assert_no_slot_left(docket, "charge", 2, customer=1)


async def test_a_task_wide_limit(docket: Docket, assert_no_slot_left: NoSlotLeft) -> None:
    tracker = Tracker()

    async def report(n: int, limit: ConcurrencyLimit = ConcurrencyLimit(max_concurrent=3)) -> None:
        async with tracker.run("all"):
            await anyio.sleep(0.03)

    docket.register(report)
    for i in range(9):
        await docket.add(report)(i)
    with anyio.fail_after(10):
        await make_worker(docket, concurrency=10).run_until_finished()
    assert len(tracker.started) == 9
    assert tracker.peak["all"] == 3
    await assert_no_slot_left(docket, "report", 3)


async def test_the_annotated_form(docket: Docket, assert_no_slot_left: NoSlotLeft) -> None:
    tracker = Tracker()

    async def sync_account(account: Annotated[str, ConcurrencyLimit(2)], n: int) -> None:
        async with tracker.run(account):
            await anyio.sleep(0.03)

    docket.register(sync_account)
    for i in range(8):
        await docket.add(sync_account)("a" if i % 2 else "b", i)
    with anyio.fail_after(10):
        await make_worker(docket, concurrency=10).run_until_finished()
    assert len(tracker.started) == 8
    assert tracker.peak == {"a": 2, "b": 2}
    assert tracker.peak_total > 2
    await assert_no_slot_left(docket, "sync_account", 2, account="a")
    await assert_no_slot_left(docket, "sync_account", 2, account="b")


# Kept as it was: memory only, by its own Dockets, documenting a known gap.
@pytest.mark.xfail(
    strict=True,
    reason=(
        "known gap, every backend: slots and waiters live under the docket's own "
        "namespace (the memory Shelf of one docket name; the {name} hash tag on servers), "
        "so a ConcurrencyLimit scope shared by two dockets limits each one separately"
    ),
)
async def test_a_scope_shared_by_two_dockets() -> None:
    tracker = Tracker()

    async def shared(
        customer: int,
        limit: ConcurrencyLimit = ConcurrencyLimit("customer", 1, scope="billing"),
    ) -> None:
        async with tracker.run(customer):
            await anyio.sleep(0.03)

    url = f"memory://{uuid.uuid4().hex}"
    async with fresh_docket(url) as first, fresh_docket(url) as second:
        for docket in (first, second):
            docket.register(shared)
            for _ in range(3):
                await docket.add(shared)(customer=7)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(make_worker(first).run_until_finished)
                group.start_soon(make_worker(second).run_until_finished)
        assert len(tracker.started) == 6
        assert tracker.peak[7] == 1
        assert_no_slots(first)
        assert_no_slots(second)


async def test_a_limit_holds_across_two_workers(
    docket: Docket, assert_no_slot_left: NoSlotLeft
) -> None:
    tracker = Tracker()
    ran_on: set[str] = set()

    async def work(
        n: int,
        worker: Worker = CurrentWorker(),
        limit: ConcurrencyLimit = ConcurrencyLimit(max_concurrent=2),
    ) -> None:
        ran_on.add(worker.name)
        async with tracker.run("all"):
            await anyio.sleep(0.03)

    docket.register(work)
    for i in range(10):
        await docket.add(work)(i)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(make_worker(docket, name="one").run_until_finished)
            group.start_soon(make_worker(docket, name="two").run_until_finished)
    assert len(tracker.started) == 10
    assert tracker.peak["all"] == 2
    assert ran_on <= {"one", "two"}
    await assert_no_slot_left(docket, "work", 2)


async def test_a_limit_holds_across_two_dockets_of_one_name(
    docket: Docket, make_docket: MakeDocket, assert_no_slot_left: NoSlotLeft
) -> None:
    """Two Docket objects on the same docket share its limits."""
    other = await make_docket(docket.name)
    tracker = Tracker()

    async def twin(n: int, limit: ConcurrencyLimit = ConcurrencyLimit(1)) -> None:
        async with tracker.run("all"):
            await anyio.sleep(0.02)

    for side in (docket, other):
        side.register(twin)
        for i in range(3):
            await side.add(twin)(i)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(make_worker(docket).run_until_finished)
            group.start_soon(make_worker(other).run_until_finished)
    assert len(tracker.started) == 6
    assert tracker.peak["all"] == 1
    await assert_no_slot_left(docket, "twin", 1)


async def test_a_missing_argument_fails_the_execution_and_the_worker_goes_on(
    docket: Docket, assert_no_slot_left: NoSlotLeft
) -> None:
    ran: list[str] = []

    async def loose(
        limit: ConcurrencyLimit = ConcurrencyLimit("customer", 1), **kwargs: Any
    ) -> None:
        ran.append("loose")

    async def fine() -> None:
        ran.append("fine")

    docket.register(loose)
    docket.register(fine)
    await docket.add(loose, key="loose")(other=1)
    await docket.add(fine, key="fine")()
    with anyio.fail_after(10):
        await make_worker(docket).run_until_finished()
    assert ran == ["fine"]
    execution = await docket.get_execution("loose")
    assert execution is not None
    assert execution.state is ExecutionState.FAILED
    assert execution.error is not None and "customer" in execution.error
    assert "no such argument" in execution.error
    assert await state_of(docket, "fine") is ExecutionState.COMPLETED
    await assert_no_slot_left(docket, "loose", 1, customer=1)


# -- waiting ---------------------------------------------------------------------------


async def test_waiting_tasks_start_first_in_first_out(
    docket: Docket, assert_no_slot_left: NoSlotLeft
) -> None:
    tracker = Tracker()

    async def serial(key: str = TaskKey(), limit: ConcurrencyLimit = ConcurrencyLimit(1)) -> None:
        async with tracker.run("all", key):
            await anyio.sleep(0.01)

    docket.register(serial)
    for key in "abcd":
        await docket.add(serial, key=key)()
    with anyio.fail_after(10):
        await make_worker(docket, concurrency=4).run_until_finished()
    assert tracker.started == ["a", "b", "c", "d"]
    assert tracker.peak["all"] == 1
    await assert_no_slot_left(docket, "serial", 1)


async def cancel_a_parked_waiter(docket: Docket) -> list[str]:
    """A holder runs; "waiter" and "after" park behind it; "waiter" is cancelled
    while parked, then the holder ends.  Returns what ran."""
    ran: list[str] = []
    holding = anyio.Event()
    release = anyio.Event()

    async def exclusive(
        key: str = TaskKey(), limit: ConcurrencyLimit = ConcurrencyLimit(1)
    ) -> None:
        ran.append(key)
        if key == "holder":
            holding.set()
            await release.wait()

    docket.register(exclusive)
    await docket.add(exclusive, key="holder")()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(make_worker(docket, concurrency=4).run_until_finished)
            await holding.wait()
            await docket.add(exclusive, key="waiter")()
            await docket.add(exclusive, key="after")()
            # added due now they are QUEUED; back to SCHEDULED means parked
            await wait_until_state(docket, "waiter", ExecutionState.SCHEDULED)
            await wait_until_state(docket, "after", ExecutionState.SCHEDULED)
            assert ran == ["holder"]
            await docket.cancel("waiter")
            release.set()
    return ran


async def test_a_cancelled_waiting_task_never_runs(
    docket: Docket, assert_no_slot_left: NoSlotLeft
) -> None:
    ran = await cancel_a_parked_waiter(docket)
    assert ran == ["holder", "after"]
    assert await state_of(docket, "waiter") is ExecutionState.CANCELLED
    assert await state_of(docket, "after") is ExecutionState.COMPLETED
    await assert_no_slot_left(docket, "exclusive", 1)


# Memory internals, because a cancelled waiter left on a wait list is invisible
# through the API (it is skipped when woken) yet would pile up on the shelf; on
# the servers assert_no_slot_left checks the wait lists themselves.
@pytest.mark.backends("memory-asyncio", "memory-trio")
async def test_a_cancelled_waiter_leaves_nothing_on_the_memory_shelf(docket: Docket) -> None:
    assert await cancel_a_parked_waiter(docket) == ["holder", "after"]
    assert_no_slots(docket)


# -- slots are released whatever happens -----------------------------------------------


async def test_the_slot_is_released_on_success_and_on_failure(
    docket: Docket, assert_no_slot_left: NoSlotLeft
) -> None:
    ran: list[str] = []

    async def ok(key: str = TaskKey(), limit: ConcurrencyLimit = ConcurrencyLimit(1)) -> str:
        ran.append(key)
        return "ok"

    async def boom(key: str = TaskKey(), limit: ConcurrencyLimit = ConcurrencyLimit(1)) -> None:
        ran.append(key)
        raise RuntimeError("boom")

    docket.register(ok)
    docket.register(boom)
    # each limit has one slot: a second run on it starts only if the first let go
    await docket.add(ok, key="ok")()
    await docket.add(ok, key="ok-again")()
    await docket.add(boom, key="boom")()
    await docket.add(boom, key="boom-again")()
    with anyio.fail_after(10):  # far below the 5-minute takeover of a stale slot
        await make_worker(docket).run_until_finished()
    assert sorted(ran) == ["boom", "boom-again", "ok", "ok-again"]
    assert await state_of(docket, "ok") is ExecutionState.COMPLETED
    assert await state_of(docket, "ok-again") is ExecutionState.COMPLETED
    assert await state_of(docket, "boom") is ExecutionState.FAILED
    assert await state_of(docket, "boom-again") is ExecutionState.FAILED
    await assert_no_slot_left(docket, "ok", 1)
    await assert_no_slot_left(docket, "boom", 1)


async def test_the_slot_is_released_on_timeout(
    docket: Docket, assert_no_slot_left: NoSlotLeft
) -> None:
    ran: list[str] = []

    async def slow(
        key: str = TaskKey(),
        limit: ConcurrencyLimit = ConcurrencyLimit(1),
        timeout: Timeout = Timeout(timedelta(milliseconds=50)),
    ) -> None:
        ran.append(key)
        if key == "slow":
            await anyio.sleep(10)

    docket.register(slow)
    await docket.add(slow, key="slow")()
    await docket.add(slow, key="next")()
    with anyio.fail_after(5):
        await make_worker(docket).run_until_finished()
    execution = await docket.get_execution("slow")
    assert execution is not None and execution.state is ExecutionState.FAILED
    assert execution.error is not None and "TimeoutError" in execution.error
    assert ran == ["slow", "next"]
    assert await state_of(docket, "next") is ExecutionState.COMPLETED
    await assert_no_slot_left(docket, "slow", 1)


async def test_the_slot_is_released_when_the_running_holder_is_cancelled(
    docket: Docket, assert_no_slot_left: NoSlotLeft
) -> None:
    ran: list[str] = []
    holding = anyio.Event()

    async def held(key: str = TaskKey(), limit: ConcurrencyLimit = ConcurrencyLimit(1)) -> None:
        ran.append(key)
        if key == "holder":
            holding.set()
            await anyio.sleep(10)

    docket.register(held)
    await docket.add(held, key="holder")()
    await docket.add(held, key="next")()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(make_worker(docket).run_until_finished)
            # RUNNING is recorded at the claim, a moment before the body starts:
            # wait for the body, so the cancel stops a run that holds its slot
            await holding.wait()
            await docket.cancel("holder")
    assert await state_of(docket, "holder") is ExecutionState.CANCELLED
    assert await state_of(docket, "next") is ExecutionState.COMPLETED
    assert ran == ["holder", "next"]
    await assert_no_slot_left(docket, "held", 1)


async def test_the_slot_is_released_when_the_worker_shuts_down(
    docket: Docket, assert_no_slot_left: NoSlotLeft
) -> None:
    started: list[str] = []
    finished: list[str] = []

    async def draining(key: str = TaskKey(), limit: ConcurrencyLimit = ConcurrencyLimit(2)) -> None:
        started.append(key)
        await anyio.sleep(0.1)
        finished.append(key)

    docket.register(draining)
    await docket.add(draining, key="one")()
    await docket.add(draining, key="two")()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(make_worker(docket).run_forever)
            while len(started) < 2:  # bodies, not just claims (RUNNING)
                await anyio.sleep(0.005)
            assert finished == []  # both hold a slot of the limit at once
            group.cancel_scope.cancel()  # the worker drains what runs, then leaves
    assert sorted(finished) == ["one", "two"]
    assert await state_of(docket, "one") is ExecutionState.COMPLETED
    assert await state_of(docket, "two") is ExecutionState.COMPLETED
    await assert_no_slot_left(docket, "draining", 2)


async def test_a_limited_task_keeps_its_limit_on_its_retries(
    docket: Docket, assert_no_slot_left: NoSlotLeft
) -> None:
    tracker = Tracker()
    attempts: Counter[str] = Counter()

    async def flaky(
        key: str = TaskKey(),
        limit: ConcurrencyLimit = ConcurrencyLimit(1),
        retry: Retry = Retry(attempts=3, delay=timedelta(milliseconds=10)),
    ) -> None:
        attempts[key] += 1
        async with tracker.run("all", (key, retry.attempt)):
            await anyio.sleep(0.02)
            if key == "flaky" and retry.attempt < 3:
                raise RuntimeError(f"attempt {retry.attempt}")

    docket.register(flaky)
    await docket.add(flaky, key="flaky")()
    for i in range(3):
        await docket.add(flaky, key=f"other-{i}")()
    with anyio.fail_after(10):
        await make_worker(docket, concurrency=8).run_until_finished()
    assert attempts["flaky"] == 3
    assert tracker.peak["all"] == 1
    assert [tag for tag in tracker.started if tag[0] == "flaky"] == [
        ("flaky", 1),
        ("flaky", 2),
        ("flaky", 3),
    ]
    assert await state_of(docket, "flaky") is ExecutionState.COMPLETED
    await assert_no_slot_left(docket, "flaky", 1)


async def test_a_long_task_keeps_its_slot_past_the_redelivery_timeout(
    docket: Docket, assert_no_slot_left: NoSlotLeft
) -> None:
    tracker = Tracker()
    spans: dict[str, tuple[float, float]] = {}

    async def long(key: str = TaskKey(), limit: ConcurrencyLimit = ConcurrencyLimit(1)) -> None:
        started = time.monotonic()
        async with tracker.run("all", key):
            await anyio.sleep(0.6 if key == "long" else 0.01)
        spans[key] = (started, time.monotonic())

    docket.register(long)
    await docket.add(long, key="long")()
    await docket.add(long, key="short")()
    options: dict[str, Any] = {"redelivery_timeout": timedelta(milliseconds=200)}
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(make_worker(docket, **options).run_until_finished)
            group.start_soon(make_worker(docket, **options).run_until_finished)
    assert tracker.started == ["long", "short"]  # never twice, never side by side
    assert tracker.peak["all"] == 1
    assert spans["short"][0] >= spans["long"][1]
    assert await state_of(docket, "long") is ExecutionState.COMPLETED
    await assert_no_slot_left(docket, "long", 1)
