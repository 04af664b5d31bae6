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
from anyio.abc import TaskGroup
from helpers import NoSlotLeft, claim_as, server_keys_left
from servers import Servers

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
from docket_core.sansio.effects import ConfirmSlot, TakeSlot
from docket_core.sansio.inputs import SlotConfirmed, SlotTaken
from docket_memory.shelf import Shelf
from docket_memory.store import MemoryStore

pytestmark = pytest.mark.anyio

FAST = timedelta(milliseconds=5)

MakeDocket = Callable[..., Awaitable[Docket]]


def make_worker(docket: Docket, **options: Any) -> Worker:
    options.setdefault("name", f"worker-{uuid.uuid4().hex[:8]}")
    options.setdefault("minimum_check_interval", FAST)
    options.setdefault("scheduling_resolution", FAST)
    return Worker(docket, **options)


@asynccontextmanager
async def fresh_docket(url: str | None = None) -> AsyncIterator[Docket]:
    name = f"limits-{uuid.uuid4().hex}"
    async with Docket(name=name, url=url or f"memory://{uuid.uuid4().hex}") as docket:
        yield docket


async def drain_together(*dockets: Docket) -> None:
    """Run one worker on each docket, side by side, until all are finished."""
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for docket in dockets:
                group.start_soon(make_worker(docket).run_until_finished)


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


# -- scopes shared by dockets ----------------------------------------------------------


def assert_scope_free(server: Servers | None, *dockets: Docket, scope: str) -> None:
    """Nothing of the scope's limits, and no parked key of the dockets, is left."""
    if server is None:
        for docket in dockets:
            shelf = shelf_of(docket)
            assert not shelf.parked, f"parked keys left behind: {shelf.parked}"
            pool = shelf.pool(scope)
            assert not any(pool.slots.values()), f"slots left behind: {pool.slots}"
            assert not pool.waiters, f"waiters left behind: {pool.waiters}"
            assert not shelf.scoped_parked, f"scoped parked keys left: {shelf.scoped_parked}"
            assert not any(shelf.scoped_waiters.values()), f"left: {shelf.scoped_waiters}"
            assert not any(pool.waiting_dockets.values()), f"left: {pool.waiting_dockets}"
        return
    for name in (scope, *(d.name for d in dockets)):
        left = server_keys_left(server, name)
        assert left == {}, f"slots or waiters left behind: {left}"


async def test_a_scope_shared_by_two_dockets(
    make_docket: MakeDocket, server_for: Callable[[], Servers | None]
) -> None:
    """Dockets naming one scope share its slots: a release in one docket wakes
    the waiters of the other, first in, first out."""
    tracker = Tracker()
    scope = f"billing-{uuid.uuid4().hex[:8]}"

    async def shared(
        customer: int,
        key: str = TaskKey(),
        limit: ConcurrencyLimit = ConcurrencyLimit("customer", 1, scope=scope),
    ) -> None:
        async with tracker.run(customer, key):
            await anyio.sleep(0.03)

    first, second = await make_docket(), await make_docket()
    for docket in (first, second):
        docket.register(shared)
        for i in range(3):
            await docket.add(shared, key=f"{docket.name}-{i}")(customer=7)
    await first.add(shared, key="other-customer")(customer=8)
    await drain_together(first, second)
    assert len(tracker.started) == 7
    assert tracker.peak[7] == 1  # one at a time across both dockets
    for docket in (first, second):
        for i in range(3):
            assert await state_of(docket, f"{docket.name}-{i}") is ExecutionState.COMPLETED
    assert_scope_free(server_for(), first, second, scope=scope)


async def test_a_scope_is_shared_with_the_docket_of_that_name(
    make_docket: MakeDocket, server_for: Callable[[], Servers | None]
) -> None:
    """A limit without a scope is scoped by its docket's name, so a limit of
    another docket naming that docket as its scope shares its slots."""
    tracker = Tracker()
    home = await make_docket()

    async def local(limit: ConcurrencyLimit = ConcurrencyLimit(1)) -> None:
        async with tracker.run("all"):
            await anyio.sleep(0.03)

    async def guest(limit: ConcurrencyLimit = ConcurrencyLimit(1, scope=home.name)) -> None:
        async with tracker.run("all"):
            await anyio.sleep(0.03)

    visitor = await make_docket()
    home.register(local, names=["job"])
    visitor.register(guest, names=["job"])
    for _ in range(3):
        await home.add("job")()
        await visitor.add("job")()
    await drain_together(home, visitor)
    assert len(tracker.started) == 6
    assert tracker.peak["all"] == 1
    assert_scope_free(server_for(), home, visitor, scope=home.name)


async def test_a_stale_slot_of_a_scope_is_taken_over_from_another_docket(
    make_docket: MakeDocket, server_for: Callable[[], Servers | None]
) -> None:
    """A worker of one docket died holding a slot of a shared scope: a waiter of
    another docket is woken once the slot has been stale for the timeout, with
    no worker of the dead worker's docket running."""
    scope = f"exports-{uuid.uuid4().hex[:8]}"
    ran: list[tuple[str, float]] = []

    async def export(limit: ConcurrencyLimit = ConcurrencyLimit(1, scope=scope)) -> None:
        ran.append((docket_name, time.monotonic()))

    docket_name = ""
    crashed, survivor = await make_docket(), await make_docket()
    for docket in (crashed, survivor):
        docket.register(export)
    # a ghost worker of `crashed` claims its task, takes the scope's slot (the
    # chain's first two steps: take it in the scope, confirm it in the docket),
    # and dies
    await crashed.add(export, key="ghost-held")()
    # (stamped before the slot's `now`: it goes stale 0.3 s after that, and
    # the three round trips below may take a while on a loaded machine)
    died_at = time.monotonic()
    now = time.time()
    (delivery,) = await claim_as(crashed, "ghost", 1, now)
    holder = f"{crashed.name}/ghost/{delivery.delivery_id}"
    limit_key = f"{scope}:concurrency:export"
    take = TakeSlot(
        scope=scope,
        limit_key=limit_key,
        holder=holder,
        max_concurrent=1,
        now=now,
        stale_after=0.3,
        delivery_id=delivery.delivery_id,
        docket=crashed.name,
    )
    (taken,) = await crashed.adapter.execute([take])
    assert taken == SlotTaken(delivery_id=delivery.delivery_id, acquired=True)
    confirm = ConfirmSlot(
        worker="ghost",
        delivery_id=delivery.delivery_id,
        key=delivery.message.key,
        generation=delivery.message.generation,
        limit_key=limit_key,
        scope=scope,
        now=now,
    )
    (confirmed,) = await crashed.adapter.execute([confirm])
    assert confirmed == SlotConfirmed(delivery_id=delivery.delivery_id)

    docket_name = survivor.name
    await survivor.add(export, key="waits")()
    options: dict[str, Any] = {"redelivery_timeout": timedelta(milliseconds=300)}
    with anyio.fail_after(10):
        await make_worker(survivor, **options).run_until_finished()
    assert [name for name, _ in ran] == [survivor.name]
    assert ran[0][1] - died_at >= 0.29  # only once the ghost's slot went stale
    assert await state_of(survivor, "waits") is ExecutionState.COMPLETED

    # the crashed docket's own message is redelivered and runs too
    docket_name = crashed.name
    with anyio.fail_after(10):
        await make_worker(crashed, **options).run_until_finished()
    assert [name for name, _ in ran] == [survivor.name, crashed.name]
    assert await state_of(crashed, "ghost-held") is ExecutionState.COMPLETED
    assert_scope_free(server_for(), crashed, survivor, scope=scope)


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
    await drain_together(docket, other)
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
    assert "not found in task arguments" in execution.error
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


class Exclusive:
    """A task of a one-slot limit (``scope``, if given): its run keyed
    "holder" keeps the slot until ``release`` is set."""

    def __init__(self, scope: str | None = None) -> None:
        self.ran: list[str] = []
        self.holding = anyio.Event()
        self.release = anyio.Event()
        limit = ConcurrencyLimit(1, scope=scope)

        async def exclusive(key: str = TaskKey(), limit: ConcurrencyLimit = limit) -> None:
            self.ran.append(key)
            if key == "holder":
                self.holding.set()
                await self.release.wait()

        self.task = exclusive

    async def hold(self, docket: Docket, group: TaskGroup) -> None:
        """Add the "holder" run and start a worker; return once it holds the slot."""
        await docket.add(self.task, key="holder")()
        group.start_soon(make_worker(docket, concurrency=4).run_until_finished)
        await self.holding.wait()


async def cancel_a_parked_waiter(
    docket: Docket, waiters: Docket | None = None, scope: str | None = None
) -> list[str]:
    """A holder runs on ``docket``; "waiter" and "after" park behind it (added
    to ``waiters``, sharing ``scope``, if given); "waiter" is cancelled while
    parked, then the holder ends.  Returns what ran."""
    exclusive = Exclusive(scope)
    waiters = waiters or docket
    for each in (docket,) if waiters is docket else (docket, waiters):
        each.register(exclusive.task)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await exclusive.hold(docket, group)
            await waiters.add(exclusive.task, key="waiter")()
            await waiters.add(exclusive.task, key="after")()
            if waiters is not docket:
                group.start_soon(make_worker(waiters).run_until_finished)
            # added due now they are QUEUED; back to SCHEDULED means parked
            await wait_until_state(waiters, "waiter", ExecutionState.SCHEDULED)
            await wait_until_state(waiters, "after", ExecutionState.SCHEDULED)
            snapshot = await waiters.snapshot()
            assert sorted(e.key for e in snapshot.future) == ["after", "waiter"]
            assert exclusive.ran == ["holder"]
            await waiters.cancel("waiter")
            exclusive.release.set()
    return exclusive.ran


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


async def test_a_cancelled_waiter_of_another_docket_never_runs(
    make_docket: MakeDocket, server_for: Callable[[], Servers | None]
) -> None:
    """A task of one docket holds the scope's slot; two of another docket park
    behind it, one of them is cancelled: it never runs, and nothing is left."""
    scope = f"reports-{uuid.uuid4().hex[:8]}"
    owner, other = await make_docket(), await make_docket()
    assert await cancel_a_parked_waiter(owner, other, scope) == ["holder", "after"]
    assert await state_of(other, "waiter") is ExecutionState.CANCELLED
    assert await state_of(other, "after") is ExecutionState.COMPLETED
    assert_scope_free(server_for(), owner, other, scope=scope)


async def test_clear_cancels_parked_tasks(
    docket: Docket, server_for: Callable[[], Servers | None]
) -> None:
    exclusive = Exclusive()
    docket.register(exclusive.task)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            await exclusive.hold(docket, group)
            for key in ("parked-1", "parked-2"):
                await docket.add(exclusive.task, key=key)()
                await wait_until_state(docket, key, ExecutionState.SCHEDULED)
            assert await docket.clear() == 2
            exclusive.release.set()
    assert exclusive.ran == ["holder"]
    for key in ("parked-1", "parked-2"):
        assert await state_of(docket, key) is ExecutionState.CANCELLED
    assert_scope_free(server_for(), docket, scope=docket.name)


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
        await anyio.sleep(0.3)  # (both must be seen running before either ends)
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
            await anyio.sleep(1.5 if key == "long" else 0.01)
        spans[key] = (started, time.monotonic())

    docket.register(long)
    await docket.add(long, key="long")()
    await docket.add(long, key="short")()
    # (renewals go every 125 ms: a lease lapses only if none gets through for
    # 500 ms; with 200 ms, a loaded CI machine running the cluster lost one)
    options: dict[str, Any] = {"redelivery_timeout": timedelta(milliseconds=500)}
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(make_worker(docket, **options).run_until_finished)
            group.start_soon(make_worker(docket, **options).run_until_finished)
    assert tracker.started == ["long", "short"]  # never twice, never side by side
    assert tracker.peak["all"] == 1
    assert spans["short"][0] >= spans["long"][1]
    assert await state_of(docket, "long") is ExecutionState.COMPLETED
    await assert_no_slot_left(docket, "long", 1)
