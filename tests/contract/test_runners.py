"""The worker's runner tasks (``docket_core.running.Runner``): runs reuse a
few long-lived tasks instead of one task per delivery, and reusing them
changes nothing a run can see: a cancelled or timed-out run does not reach
the next one, and context variables do not leak from one run to the next."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import importlib.util
import uuid
import weakref
from datetime import timedelta

import anyio
import pytest
from helpers import finish, loaded, make_worker

from docket_core import Docket, ExecutionState, Timeout, Worker
from docket_core.running import YOUNG_THRESHOLD, frozen_heap, loop_options
from docket_core.sansio.errors import UsageError

pytestmark = pytest.mark.anyio

#: the loops ``where`` found itself on
LOOPS_SEEN: list[str] = []


async def where() -> None:
    try:
        LOOPS_SEEN.append(type(asyncio.get_running_loop()).__module__.split(".")[0])
    except RuntimeError:
        LOOPS_SEEN.append("trio")


#: the collection ``Worker.run_sync`` registers (``tasks=[f"{__name__}:LOOP_TASKS"]``)
LOOP_TASKS = [where]

#: what a task leaves set (and never resets) for the next run to find
BOUND: contextvars.ContextVar[str] = contextvars.ContextVar("bound")


async def test_runs_reuse_a_few_runner_tasks(docket: Docket) -> None:
    tasks: set[int] = set()

    async def noted() -> None:
        tasks.add(anyio.get_current_task().id)
        await anyio.sleep(0)

    for _ in range(60):
        await docket.add(noted)()
    worker = make_worker(docket, concurrency=4)
    await finish(worker, 5.0)
    assert worker.counters["succeeded"] == 60
    assert 1 <= len(tasks) <= 4


async def test_short_runs_handed_over_together_follow_one_another_in_one_runner_task(
    docket: Docket,
) -> None:
    # a read hands over a batch of starts at once: a run that never waits is
    # followed by the next one in the same runner task, with no wake-up
    tasks: list[int] = []

    async def short() -> None:
        tasks.append(anyio.get_current_task().id)

    for _ in range(40):
        await docket.add(short)()
    worker = make_worker(docket, concurrency=40)
    await finish(worker, 5.0)
    assert worker.counters["succeeded"] == 40
    assert len(tasks) == 40
    # (one runner task a start would give 40; the batch may come in a few reads)
    assert len(set(tasks)) <= 4


async def test_runs_that_wait_each_get_a_runner_task_of_their_own(docket: Docket) -> None:
    # the chain of hand-overs: each run that waits lets another runner task
    # take the next start, so all of them run at once
    started: list[int] = []
    everyone = anyio.Event()

    async def waits() -> None:
        started.append(anyio.get_current_task().id)
        if len(started) == 30:
            everyone.set()
        await everyone.wait()

    for _ in range(30):
        await docket.add(waits)()
    worker = make_worker(docket, concurrency=30)
    await finish(worker, 5.0)
    assert worker.counters["succeeded"] == 30
    assert len(set(started)) == 30


async def test_a_context_variable_a_run_leaves_set_does_not_reach_the_next_run(
    docket: Docket,
) -> None:
    seen: list[str] = []

    async def binds(value: str) -> None:
        seen.append(BOUND.get("unset"))
        BOUND.set(value)  # and never reset, as a task binding log context would

    for value in ("first", "second", "third"):
        await docket.add(binds)(value)
    await finish(make_worker(docket, concurrency=1))
    assert seen == ["unset", "unset", "unset"]


async def test_the_run_after_a_cancelled_one_is_not_cancelled(docket: Docket) -> None:
    started = anyio.Event()
    after: list[str] = []

    async def endless() -> None:
        started.set()
        await anyio.sleep(60)

    async def next_one() -> None:
        await anyio.sleep(0.01)  # a checkpoint a stale cancellation would hit
        after.append("ran")

    await docket.add(endless, key="endless")()
    await docket.add(next_one, key="next", when=None)()
    worker = make_worker(docket, concurrency=1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_until_finished)
            await started.wait()
            await docket.cancel("endless")
    assert (await loaded(docket, "endless")).state is ExecutionState.CANCELLED
    assert (await loaded(docket, "next")).state is ExecutionState.COMPLETED
    assert after == ["ran"]


async def test_a_run_that_swallows_its_cancellation_does_not_pass_it_on(
    docket: Docket,
) -> None:
    started = anyio.Event()
    after: list[str] = []

    async def stubborn() -> str:
        started.set()
        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            return "swallowed"
        return "slept"

    async def next_one() -> None:
        await anyio.sleep(0.01)
        after.append("ran")

    await docket.add(stubborn, key="stubborn")()
    worker = make_worker(docket, concurrency=1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_until_finished)
            await started.wait()
            await docket.cancel("stubborn")
            await docket.add(next_one, key="next")()
    assert (await loaded(docket, "next")).state is ExecutionState.COMPLETED
    assert after == ["ran"]


async def test_timed_out_runs_leave_the_runs_after_them_alone(docket: Docket) -> None:
    finished: list[int] = []

    async def slow(timeout: Timeout = Timeout(timedelta(milliseconds=30))) -> None:
        await anyio.sleep(60)

    async def quick(n: int) -> None:
        await anyio.sleep(0.05)  # longer than the timeout before it
        finished.append(n)

    for n in range(3):
        await docket.add(slow, key=f"slow-{n}")()
        await docket.add(quick, key=f"quick-{n}")(n)
    worker = make_worker(docket, concurrency=1)
    await finish(worker, 5.0)
    assert sorted(finished) == [0, 1, 2]
    for n in range(3):
        assert (await loaded(docket, f"slow-{n}")).state is ExecutionState.FAILED
        assert (await loaded(docket, f"quick-{n}")).state is ExecutionState.COMPLETED


# -- the event loop a worker runs on ---------------------------------------------------


@pytest.mark.parametrize(
    ("loop", "expected"), [("asyncio", "asyncio"), ("uvloop", "uvloop"), ("trio", "trio")]
)
def test_run_sync_runs_the_worker_on_the_loop_it_names(loop: str, expected: str) -> None:
    name = f"loops-{uuid.uuid4().hex}"
    url = f"memory://{name}"

    async def enqueue() -> None:
        async with Docket(name=name, url=url) as docket:
            docket.register(where)
            await docket.add(where)()

    anyio.run(enqueue)
    LOOPS_SEEN.clear()
    arguments = {
        "docket_name": name,
        "url": url,
        "until_finished": True,
        "tasks": [f"{__name__}:LOOP_TASKS"],
        "schedule_automatic_tasks": False,
        "handle_signals": False,
    }
    if loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        # without the extra, asking for uvloop says how to get it
        with pytest.raises(UsageError, match=r"docket\[uvloop\]"):
            Worker.run_sync(loop=loop, **arguments)
        assert LOOPS_SEEN == []
        return
    Worker.run_sync(loop=loop, **arguments)
    assert LOOPS_SEEN == [expected]


@pytest.mark.backends("memory-asyncio")
@pytest.mark.parametrize("freeze", [True, False])
async def test_freeze_gc_keeps_the_heap_out_of_collections_while_the_worker_runs(
    docket: Docket, freeze: bool
) -> None:
    """``Worker(freeze_gc=True)`` freezes what was there when it started
    (a run sees ``gc.get_freeze_count() > 0``) and collects young objects
    less often (``YOUNG_THRESHOLD``), and gives both back when it stops;
    without it, nothing is frozen and the thresholds stay."""
    frozen: list[int] = []
    thresholds: list[tuple[int, int, int]] = []

    async def counted() -> None:
        frozen.append(gc.get_freeze_count())
        thresholds.append(gc.get_threshold())

    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0 and before[0] < YOUNG_THRESHOLD
    for _ in range(3):
        await docket.add(counted)()
    await finish(make_worker(docket, freeze_gc=freeze), 5.0)
    assert len(frozen) == 3
    if freeze:
        assert min(frozen) > 1000  # (the modules' objects, at least)
        assert set(thresholds) == {(YOUNG_THRESHOLD, *before[1:])}
    else:
        assert frozen == [0, 0, 0]
        assert set(thresholds) == {before}
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_overlapping_frozen_heaps_put_the_threshold_back_when_the_last_ends() -> None:
    """Two workers of one process, the first to start stopping first: the
    young threshold stays raised until the second stops."""
    before = gc.get_threshold()
    first, second = frozen_heap(True), frozen_heap(True)
    first.__enter__()
    second.__enter__()
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    first.__exit__(None, None, None)
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    second.__exit__(None, None, None)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


class _Cycle:
    """An object that refers to itself: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_a_frozen_heap_collects_the_young_garbage_without_walking_the_old() -> None:
    """A worker's start frees the young garbage before it freezes the heap
    (a cycle dropped just before is not kept for the worker's life), and
    collects only the young generations: a full collection walks the whole
    heap, tens of ms before the first task of a worker starts."""
    generations: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    gc.collect()  # (no collection of the old generation due while this runs)
    cycle = _Cycle()
    dropped = weakref.ref(cycle)
    del cycle
    gc.callbacks.append(seen)
    try:
        with frozen_heap(True):
            assert dropped() is None
    finally:
        gc.callbacks.remove(seen)
    assert generations and max(generations) < 2


def test_a_frozen_heap_leaves_automatic_collection_off_when_it_was() -> None:
    before = gc.get_threshold()
    gc.set_threshold(0)
    try:
        with frozen_heap(True):
            assert gc.get_threshold()[0] == 0
        assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)


def test_an_unknown_loop_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="asyncio, uvloop, trio"):
        loop_options("tokio")
