"""How a partitioned docket's store sends one batch of effects: the pieces
bound for different partitions go side by side, a piece that touches the
home store (or a scope) waits for everything before it, and a failure in one
partition reaches the caller as the store error it is."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from helpers import keys_in_each_partition

from docket_core import Docket
from docket_core.adapter import ReadResult
from docket_core.partitioned import PartitionedStore
from docket_core.sansio.effects import Cancel, Heartbeat, StoreEffect
from docket_core.sansio.errors import StoreUnavailable
from docket_core.sansio.values import Delivery, TaskMessage

pytestmark = [pytest.mark.anyio, pytest.mark.backends("memory-asyncio", "redis-asyncio")]


def traced(store: Any, method: str, name: str, log: list[Any], delay: float) -> None:
    """Log the start and end of each ``store.method`` call, held ``delay``."""
    original = getattr(store, method)

    async def call(batch: Sequence[Any]) -> list[Any]:
        log.append(("start", name, time.monotonic(), len(batch)))
        await anyio.sleep(delay)
        replies: list[Any] = await original(batch)
        log.append(("end", name, time.monotonic(), len(batch)))
        return replies

    setattr(store, method, call)


def cancels_and_a_heartbeat() -> list[StoreEffect]:
    now = time.time()
    cancels: list[StoreEffect] = [
        Cancel(key=key, now=now, ttl=60.0) for key in keys_in_each_partition(3)
    ]
    return [*cancels, Heartbeat(worker="w", tasks=(), now=now)]


@pytest.mark.backends("memory-asyncio")
async def test_partitions_go_side_by_side_and_the_home_store_waits(
    make_docket: Any,
) -> None:
    docket: Docket = await make_docket(partitions=3)
    store = docket.adapter
    assert isinstance(store, PartitionedStore)
    log: list[tuple[str, str, float, int]] = []
    for index, part in enumerate(store.parts):
        traced(part, "execute", f"p{index}", log, 0.4)
    traced(store.home, "execute", "home", log, 0.0)
    started = time.monotonic()
    outcomes = await store.execute(cancels_and_a_heartbeat())
    elapsed = time.monotonic() - started
    assert len(outcomes) == 4
    # three partitions of 0.4 s each, side by side: well under the 1.2 s of
    # one after another (with room for a loaded machine)
    assert elapsed < 1.0, log
    starts = {name: at for kind, name, at, _ in log if kind == "start"}
    ends = {name: at for kind, name, at, _ in log if kind == "end"}
    assert max(starts[f"p{i}"] for i in range(3)) < min(ends[f"p{i}"] for i in range(3))
    # the heartbeat went only once every partition had answered
    assert starts["home"] >= max(ends[f"p{i}"] for i in range(3))


@pytest.mark.backends("redis-asyncio")
async def test_partitions_share_one_round_trip_and_the_home_store_waits(
    make_docket: Any,
) -> None:
    """On one client, the partitions' pieces of a round go in one call of
    the client (``ScriptedStore.execute_apart``), the home store's after it."""
    docket: Docket = await make_docket(partitions=3)
    store = docket.adapter
    assert isinstance(store, PartitionedStore)
    log: list[tuple[str, str, float, int]] = []
    traced(store.home, "run_calls_apart", "apart", log, 0.0)
    traced(store.home, "run_calls", "home", log, 0.0)
    outcomes = await store.execute(cancels_and_a_heartbeat())
    assert len(outcomes) == 4
    assert [(kind, name, calls) for kind, name, _, calls in log] == [
        ("start", "apart", 3),  # (a cancel in each partition)
        ("end", "apart", 3),
        ("start", "home", 1),  # (the heartbeat)
        ("end", "home", 1),
        ("start", "home", 1),  # (with it, the check of the recorded count)
        ("end", "home", 1),
    ]


async def test_a_partition_that_fails_raises_its_store_error(
    make_docket: Any, backend: str
) -> None:
    docket: Docket = await make_docket(partitions=3)
    store = docket.adapter
    assert isinstance(store, PartitionedStore)

    async def unavailable(batch: Sequence[Any]) -> list[Any]:
        raise StoreUnavailable("partition 1 is gone")

    if backend.startswith("memory"):
        store.parts[1].execute = unavailable  # type: ignore[method-assign]
    else:  # (the partitions' calls go through the home store's client)
        store.home.run_calls_apart = unavailable  # type: ignore[attr-defined]
    now = time.time()
    cancels = [Cancel(key=key, now=now, ttl=60.0) for key in keys_in_each_partition(3)]
    with pytest.raises(StoreUnavailable, match="partition 1 is gone"):
        await store.execute(cancels)


async def test_what_a_blocking_read_brought_late_goes_to_its_own_worker(
    make_docket: Any,
) -> None:
    docket: Docket = await make_docket(partitions=3)
    store = docket.adapter
    assert isinstance(store, PartitionedStore)
    message = TaskMessage(key="k", function="f", payload=b"", when=0.0)

    def reader(partition: int) -> Any:
        async def read(*, worker: str, block: float, **_: Any) -> ReadResult:
            if block > 0 and worker == "a" and partition == 0:
                await anyio.sleep(0.05)  # (after the caller stopped waiting)
                delivery = Delivery(delivery_id="7-0", message=message)
                return ReadResult(deliveries=(delivery,), next_due=None)
            await anyio.sleep(block)
            return ReadResult(deliveries=(), next_due=None)

        return read

    for partition, part in enumerate(store.parts):
        part.read = reader(partition)  # type: ignore[method-assign]
    options: dict[str, Any] = {"count": 5, "now": time.time(), "redelivery_timeout": 60.0}
    assert (await store.read(worker="a", block=0.01, **options)).deliveries == ()
    await anyio.sleep(0.3)  # (well past the late read's 0.05 s, even when loaded)
    # b's read leaves it alone (a's consumer holds it: b could not claim it)
    assert (await store.read(worker="b", block=0.0, **options)).deliveries == ()
    result = await store.read(worker="a", block=0.0, **options)
    assert [d.delivery_id for d in result.deliveries] == ["0/7-0"]
