"""Small helpers shared by the end-to-end tests (any directory)."""

from __future__ import annotations

import types
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import anyio
import pytest
import redis
from servers import Servers

from docket_core import Docket, Execution, Worker
from docket_core.sansio.admission import Admit, Admitted, Verdict
from docket_core.sansio.effects import AcquireSlot, Claim, ClaimItem, StoreEffect
from docket_core.sansio.inputs import Claimed, ClaimVerdict, Outcome
from docket_core.sansio.partitions import partition_of
from docket_core.sansio.values import Delivery

Now = Callable[[], datetime]

#: ``await assert_no_slot_left(docket, task, max_concurrent, **argument)``
#: (the fixture of tests/contract/conftest.py)
NoSlotLeft = Callable[..., Awaitable[None]]

FAST = timedelta(milliseconds=5)


def make_worker(docket: Docket, **options: Any) -> Worker:
    """A worker that checks for work every few milliseconds."""
    options.setdefault("minimum_check_interval", FAST)
    options.setdefault("scheduling_resolution", FAST)
    return Worker(docket, **options)


@asynccontextmanager
async def running(worker: Worker, limit: float = 5.0) -> AsyncIterator[None]:
    """Run ``worker`` in the background for the duration of the block."""
    with anyio.fail_after(limit):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_forever)
            try:
                yield
            finally:
                group.cancel_scope.cancel()


async def finish(worker: Worker, limit: float = 2.0) -> None:
    """Run ``worker`` until nothing is left, failing after ``limit`` seconds."""
    with anyio.fail_after(limit):
        await worker.run_until_finished()


def key() -> str:
    """A fresh task key."""
    return f"key-{uuid.uuid4().hex}"


async def loaded(docket: Docket, key: str) -> Execution:
    """The stored execution of ``key``, which must exist."""
    execution = await docket.get_execution(key)
    assert execution is not None
    return execution


def admissions(monkeypatch: pytest.MonkeyPatch, *dockets: Docket) -> list[tuple[str, float]]:
    """``(key, now)`` of every start the dockets' stores admitted from here on
    (an ``Admit`` in the docket's own namespace answered ``ADMIT``, not a
    repeat), in the order the answers came: the times rate limits and
    cooldowns promise about.  A task body's own clock, or the claim's, can
    be well before or after its admission under load."""
    seen: list[tuple[str, float]] = []
    for docket in dockets:
        adapter = docket.adapter
        for name in ("execute", "execute_in_order"):
            original = getattr(adapter, name)

            async def watched(
                effects: Sequence[StoreEffect], _original: Any = original
            ) -> list[Outcome]:
                outcomes: list[Outcome] = await _original(effects)
                for effect, outcome in zip(effects, outcomes, strict=True):
                    if (
                        isinstance(effect, Admit)
                        and effect.settles
                        and isinstance(outcome, Admitted)
                        and outcome.verdict is Verdict.ADMIT
                        and not outcome.repeat
                    ):
                        seen.append((effect.message.key, effect.now))
                return outcomes

            monkeypatch.setattr(adapter, name, watched)
    return seen


async def claim_as(docket: Docket, worker: str, count: int, now: float) -> list[Delivery]:
    """Read up to ``count`` deliveries as ``worker`` and claim them, as a worker
    that may then die holding them; returns them sorted by key."""
    taken = await docket.adapter.read(
        worker=worker, count=count, now=now, redelivery_timeout=60, block=0
    )
    deliveries = sorted(taken.deliveries, key=lambda d: d.message.key)
    items = tuple(
        ClaimItem(delivery_id=d.delivery_id, key=d.message.key, generation=d.message.generation)
        for d in deliveries
    )
    (claimed,) = await docket.adapter.execute([Claim(worker=worker, items=items, now=now)])
    assert isinstance(claimed, Claimed)
    assert {v for _, v in claimed.verdicts} == {ClaimVerdict.CLAIMED}
    return deliveries


def acquisition(
    delivery: Delivery, holder: str, limit_key: str, max_concurrent: int, **options: Any
) -> AcquireSlot:
    """The ``AcquireSlot`` a worker asks for a claimed delivery."""
    options.setdefault("now", delivery.message.when)
    options.setdefault("stale_after", 60.0)
    return AcquireSlot(
        limit_key=limit_key,
        holder=holder,
        max_concurrent=max_concurrent,
        delivery_id=delivery.delivery_id,
        message=delivery.message,
        **options,
    )


def server_keys_left(server: Servers, name: str) -> dict[str, int]:
    """The docket's slot and wait keys that still hold members, on every node
    that holds data (a cluster's every primary, a sentinel set's primary)."""
    left: dict[str, int] = {}
    for port in server.data_ports():
        client = redis.Redis(host="127.0.0.1", port=port)  # sync: works under trio too
        try:
            prefix = "{" + name + "}:"
            for raw in client.scan_iter(match=prefix + "slots:*", count=1000):
                left[raw.decode()] = left.get(raw.decode(), 0) + int(client.zcard(raw))
            # waiters parked behind a limit (``wait:*`` unscoped, ``waiters:*``
            # scoped) and dockets registered as waiting on a scoped limit
            for pattern in ("wait:*", "waiters:*", "stale:*"):
                for raw in client.scan_iter(match=prefix + pattern, count=1000):
                    left[raw.decode()] = left.get(raw.decode(), 0) + _members(client, raw)
            for key in (prefix + "parked", prefix + "stale"):
                left[key] = left.get(key, 0) + _members(client, key.encode())
        finally:
            client.close()
    return {key: n for key, n in left.items() if n}


def _members(client: redis.Redis, key: bytes) -> int:
    """How many members ``key`` holds, whatever its type (0 when absent, or
    when it lives on another node of a cluster: MOVED)."""
    try:
        kind = client.type(key)
    except redis.ResponseError:
        return 0
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    counts = {"list": client.llen, "set": client.scard, "zset": client.zcard, "hash": client.hlen}
    count = counts.get(kind)
    return 0 if count is None else int(count(key))


def keys_in_each_partition(n: int) -> list[str]:
    """A key for each of ``n`` partitions, partition 0 first."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < n:
        found.setdefault(partition_of(f"key-{i}", n), f"key-{i}")
        i += 1
    return [found[p] for p in range(n)]


def resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Coroutine[Any, Any, Any]:
    """The rest of ``coro``, stepped once by hand (which yielded ``yielded``),
    as an awaitable the running task drives on."""

    @types.coroutine
    def rest() -> Generator[Any, Any, Any]:
        value = yielded
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as error:  # (handed on into the coroutine)
                try:
                    value = coro.throw(error)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value

    return rest()  # type: ignore[no-any-return]
