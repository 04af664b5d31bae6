"""The contract suite: what every backend must do alike.

Every test here that takes ``docket``, ``make_docket`` or ``docket_url`` runs
on every backend of ``backends.CONTRACT_BACKENDS`` (the root ``conftest.py``
parametrizes it): memory under asyncio and trio, redis-py on a private
redis-server and valkey-server, GLIDE on both servers, also under trio.  A
test or module that runs on fewer says so with ``@pytest.mark.backends(...)``
(grep ``backends(`` here: a check of the memory shelf's internals, a server
killed under a worker, and tests of the runtime that one in-process store and
one server cover).  The few tests here that take none of these fixtures are
plain unit tests kept next to their topic; async ones run on memory under
asyncio and trio.

The fixtures below serve only this directory: ``worker`` (a fast-polling
Worker on ``docket``), ``now``, and ``assert_no_slot_left`` (every slot of a
concurrency limit is free again).

Tests that only make sense on a real server are in ``tests/store/``, the
command line in ``tests/cli/``, the pure core in ``tests/core/``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from helpers import NoSlotLeft, make_worker, server_keys_left
from servers import Server

from docket_core import ConcurrencyLimit, Docket, Worker

#: long enough that no slot goes stale (and is taken over) during a test
NEVER_STALE = timedelta(minutes=1)


@pytest.fixture
def now() -> Callable[[], datetime]:
    def _now() -> datetime:
        return datetime.now(UTC)

    return _now


@pytest.fixture
async def worker(docket: Docket) -> AsyncIterator[Worker]:
    async with Worker(
        docket,
        name=f"worker-{uuid.uuid4().hex[:8]}",
        minimum_check_interval=timedelta(milliseconds=5),
        scheduling_resolution=timedelta(milliseconds=5),
    ) as entered:
        yield entered


@pytest.fixture
def assert_no_slot_left(
    make_docket: Callable[..., Awaitable[Docket]], server_for: Callable[[], Server | None]
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
        worker = make_worker(
            prober,
            name=f"worker-{uuid.uuid4().hex[:8]}",
            concurrency=max_concurrent + 1,
            redelivery_timeout=NEVER_STALE,
        )
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
