"""``Docket(name, url, partitions=N)`` on every backend: tasks spread over the
partitions by key, workers drain them all, every call by key finds its
partition, a concurrency limit spans them, the docket-wide views add them
up, and a docket holding tasks keeps its partition count."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
from helpers import finish, make_worker, running
from servers import Cluster, Servers, command

from docket_core import (
    ConcurrencyLimit,
    Cooldown,
    Debounce,
    Docket,
    ExecutionState,
    RateLimit,
    Worker,
)
from docket_core.lua.base import ScriptedStore
from docket_core.partitioned import PartitionedStore
from docket_core.sansio.effects import Heartbeat
from docket_core.sansio.errors import StoreError, UsageError
from docket_core.sansio.layout_change import CountRecorded
from docket_core.sansio.partitions import partition_of

pytestmark = pytest.mark.anyio

MakeDocket = Callable[..., Awaitable[Docket]]

#: keys that land in all three partitions of a 3-partition docket
KEYS = [f"k{n}" for n in range(30)]


def later(seconds: float = 600.0) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def test_one_partition_is_the_plain_adapter(make_docket: MakeDocket) -> None:
    docket = await make_docket()
    assert not isinstance(docket.adapter, PartitionedStore)
    with pytest.raises(UsageError):
        Docket(name="x", url="memory://", partitions=0)


async def test_tasks_spread_over_partitions_and_all_run(make_docket: MakeDocket) -> None:
    docket = await make_docket(partitions=3)
    assert isinstance(docket.adapter, PartitionedStore)
    assert {partition_of(key, 3) for key in KEYS} == {0, 1, 2}
    ran: list[str] = []

    async def task(value: str) -> str:
        ran.append(value)
        return value.upper()

    docket.register(task)
    for key in KEYS:
        await docket.add(task, key=key)(key)
    assert await docket.adapter.pending() == len(KEYS)
    await finish(make_worker(docket, concurrency=4), limit=20)
    assert sorted(ran) == sorted(KEYS)
    for key in KEYS[:6]:
        execution = await docket.get_execution(key)
        assert execution is not None and execution.state is ExecutionState.COMPLETED
        assert await execution.get_result() == key.upper()
    assert await docket.adapter.pending() == 0


async def test_calls_by_key_find_their_partition(make_docket: MakeDocket) -> None:
    docket = await make_docket(partitions=3)

    async def task(value: int) -> int:
        return value * 2

    docket.register(task)
    keys = KEYS[:6]
    for key in keys:
        await docket.add(task, when=later(), key=key)(1)
    for key in keys:  # replace: the new message supersedes the scheduled one
        await docket.replace(task, when=later(1200), key=key)(21)
    snapshot = await docket.snapshot()
    assert snapshot.total_tasks == len(keys)
    await docket.cancel(keys[0])
    cancelled = await docket.get_execution(keys[0])
    assert cancelled is not None and cancelled.state is ExecutionState.CANCELLED
    for key in keys[1:]:
        await docket.replace(task, datetime.now(UTC), key)(21)  # due now
    await finish(make_worker(docket), limit=10)
    for key in keys[1:]:
        execution = await docket.get_execution(key)
        assert execution is not None and execution.state is ExecutionState.COMPLETED
        assert await execution.get_result() == 42
    assert await docket.adapter.pending() == 0


async def test_a_concurrency_limit_spans_the_partitions(make_docket: MakeDocket) -> None:
    docket = await make_docket(partitions=3)
    active, peak, done = 0, 0, 0

    async def limited(
        value: int, limit: ConcurrencyLimit = ConcurrencyLimit(max_concurrent=2)
    ) -> None:
        nonlocal active, peak, done
        active += 1
        peak = max(peak, active)
        await anyio.sleep(0.05)  # (long enough for two runs to overlap when loaded)
        active -= 1
        done += 1

    docket.register(limited)
    for key in KEYS[:12]:
        await docket.add(limited, key=key)(1)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for _ in range(2):
                group.start_soon(make_worker(docket, concurrency=5).run_until_finished)
    assert done == 12
    assert peak == 2, f"peak {peak}: the limit must hold across partitions"


async def test_a_rate_limit_and_a_cooldown_span_the_partitions(make_docket: MakeDocket) -> None:
    """Unscoped controls count the docket's tasks, not each partition's: with
    keys in all three partitions, one start a window and the rest dropped."""
    docket = await make_docket(partitions=3)
    rated: list[str] = []
    cooled: list[str] = []

    async def rated_task(
        value: str, limit: RateLimit = RateLimit(1, per=timedelta(seconds=60), drop=True)
    ) -> None:
        rated.append(value)

    async def cooled_task(value: str, cooldown: Cooldown = Cooldown(timedelta(seconds=60))) -> None:
        cooled.append(value)

    docket.register(rated_task)
    docket.register(cooled_task)
    keys = KEYS[:9]
    assert {partition_of(key, 3) for key in keys} == {0, 1, 2}
    for key in keys:
        await docket.add(rated_task, key=f"r-{key}")(key)
        await docket.add(cooled_task, key=f"c-{key}")(key)
    assert {partition_of(f"{prefix}-{key}", 3) for key in keys for prefix in "rc"} == {0, 1, 2}
    await finish(make_worker(docket, concurrency=4), limit=20)
    assert len(rated) == 1, f"{rated}: the rate limit must hold across partitions"
    assert len(cooled) == 1, f"{cooled}: the cooldown must hold across partitions"


async def test_a_debounce_spans_the_partitions(make_docket: MakeDocket) -> None:
    """A burst whose keys land in all three partitions runs once, as on one."""
    docket = await make_docket(partitions=3)
    runs: list[str] = []

    async def refresh(
        value: str, debounce: Debounce = Debounce(timedelta(milliseconds=300))
    ) -> None:
        runs.append(value)

    docket.register(refresh)
    keys = KEYS[:6]
    assert {partition_of(key, 3) for key in keys} == {0, 1, 2}
    for key in keys:
        await docket.add(refresh, key=key)(key)
    await finish(make_worker(docket, concurrency=4), limit=20)
    assert len(runs) == 1, f"{runs}: the debounce must hold across partitions"
    states = [(await docket.get_execution(key)) for key in keys]
    assert sorted(str(s.state) for s in states if s is not None) == sorted(
        [str(ExecutionState.COMPLETED)] + [str(ExecutionState.CANCELLED)] * 5
    )


async def test_snapshot_clear_and_strikes_across_partitions(make_docket: MakeDocket) -> None:
    docket = await make_docket(partitions=3)
    ran: list[int] = []

    async def task(value: int) -> None:
        ran.append(value)

    docket.register(task)
    for n, key in enumerate(KEYS[:9]):
        await docket.add(task, when=later(600 + n), key=key)(n)
    snapshot = await docket.snapshot(limit=5)
    assert snapshot.total_tasks == 9
    whens = [execution.when for execution in snapshot.future]
    assert len(whens) == 5 and whens == sorted(whens)
    assert await docket.clear() == 9
    assert (await docket.snapshot()).total_tasks == 0

    await docket.strike(task)
    second = await make_docket(docket.name, partitions=3)  # strikes are docket-wide
    second.register(task)
    await second.wait_for_strikes_loaded()
    for n, key in enumerate(KEYS[9:15]):
        await second.add(task, key=key)(n)
    await finish(make_worker(second), limit=10)
    assert ran == []
    await second.restore(task)
    for n, key in enumerate(KEYS[15:21]):
        await second.add(task, key=key)(n)
    await finish(make_worker(second), limit=10)
    assert sorted(ran) == list(range(6))


async def test_a_docket_holding_tasks_keeps_its_partition_count(
    make_docket: MakeDocket, docket_url: str
) -> None:
    name = f"layout-{uuid.uuid4().hex}"
    docket = await make_docket(name, partitions=3)

    async def task() -> None: ...

    docket.register(task)
    await docket.add(task, when=later(), key="waiting")()
    with pytest.raises(UsageError, match="holds tasks in 3 partitions: open it with partitions=3"):
        async with Docket(name=name, url=docket_url, partitions=2):
            pass
    async with Docket(name=name, url=docket_url, partitions=3) as same:
        assert await same.adapter.pending() == 1
    await docket.clear()
    async with Docket(name=name, url=docket_url, partitions=2) as changed:  # empty: allowed
        await changed.add(task, when=later(), key="waiting")()
    with pytest.raises(UsageError, match="holds tasks in 2 partitions"):
        async with Docket(name=name, url=docket_url, partitions=3):
            pass

    plain = await make_docket(f"plain-{uuid.uuid4().hex}")  # one partition, today's layout
    plain.register(task)
    await plain.add(task, when=later(), key="waiting")()
    with pytest.raises(UsageError, match="holds tasks in 1 partitions"):
        async with Docket(name=plain.name, url=docket_url, partitions=3):
            pass


async def test_an_idle_worker_picks_up_at_once(make_docket: MakeDocket) -> None:
    docket = await make_docket(partitions=3)
    finished: dict[str, float] = {}

    async def task(key: str) -> None:
        finished[key] = time.monotonic()

    docket.register(task)
    worker: Worker = make_worker(docket, minimum_check_interval=timedelta(seconds=2))
    keys = [next(k for k in KEYS if partition_of(k, 3) == part) for part in (2, 0, 1)]
    async with running(worker, limit=20):
        await anyio.sleep(0.3)  # idle: a blocking read out on every partition
        for key in keys:
            added = time.monotonic()
            await docket.add(task, key=key)(key)
            with anyio.fail_after(2):
                while key not in finished:
                    await anyio.sleep(0.01)
            assert finished[key] - added < 1.0, f"{key} waited {finished[key] - added:.2f} s"


@pytest.mark.backends("redis_cluster-asyncio", "glide_cluster-asyncio")
async def test_partitions_spread_over_the_cluster_nodes(
    make_docket: MakeDocket, server_for: Callable[[], Servers | None]
) -> None:
    cluster = server_for()
    assert isinstance(cluster, Cluster)
    docket = await make_docket(partitions=3)

    async def task() -> None: ...

    docket.register(task)
    for key in KEYS:
        await docket.add(task, when=later(), key=key)()
    holding: dict[int, int] = {}
    for port in cluster.data_ports():
        keys: Any = command(port, "KEYS", f"{{{docket.name}|*")
        if keys:
            holding[port] = len(keys)
    assert len(holding) == 3, f"partition keys per node: {holding}"
    assert command(cluster.data_ports()[0], "DBSIZE") >= 0


async def test_one_partition_is_refused_while_the_recorded_ones_hold_tasks(
    make_docket: MakeDocket, docket_url: str
) -> None:
    name = f"layout-{uuid.uuid4().hex}"
    docket = await make_docket(name, partitions=3)

    async def task() -> None: ...

    docket.register(task)
    await docket.add(task, when=later(), key="waiting")()
    # a producer with the wrong count would add tasks no partitioned worker reads
    with pytest.raises(UsageError, match="holds tasks in 3 partitions: open it with partitions=3"):
        async with Docket(name=name, url=docket_url):
            pass
    assert (await docket.adapter.record_partitions(3, 3)).count == 3  # (left as it was)
    await docket.clear()
    async with Docket(name=name, url=docket_url) as plain:  # drained: allowed
        assert await plain.adapter.record_partitions(1, 1) == at(1)
        plain.register(task)
        await plain.add(task, when=later(), key="waiting")()
    with pytest.raises(UsageError, match="holds tasks in 1 partitions"):
        async with Docket(name=name, url=docket_url, partitions=3):
            pass


def at(count: int, leaving: int | None = None, epoch: int | None = None) -> Any:
    """A ``CountRecorded`` of ``count`` and ``leaving``, of any epoch unless given."""

    class Matches:
        def __eq__(self, other: object) -> bool:
            return (
                isinstance(other, CountRecorded)
                and (other.count, other.leaving) == (count, leaving)
                and (epoch is None or other.epoch == epoch)
            )

        def __repr__(self) -> str:
            return f"at({count}, {leaving}, {epoch})"

    return Matches()


async def test_record_partitions_compares_and_sets(make_docket: MakeDocket) -> None:
    docket = await make_docket()
    store = docket.adapter
    assert await store.record_partitions(1, 1) == at(1)  # absent: 1
    assert await store.record_partitions(2, 5) == at(1)  # not 2: unchanged
    assert await store.record_partitions(1, 4) == at(1, epoch=0)  # recorded, 1 leaving
    assert await store.record_partitions(4, 4) == at(4, 1, epoch=1)
    assert await store.record_partitions(4, 2) == at(4, 1)  # a seal owed: unchanged
    await store.forget_leaving(3)  # (not the leaving count: kept)
    assert await store.record_partitions(4, 4) == at(4, 1)
    await store.forget_leaving(1)
    assert await store.record_partitions(4, 4) == at(4)
    assert await store.record_partitions(1, 3) == at(4)  # not 1: unchanged
    assert await store.record_partitions(4, 1) == at(4)  # back to 1 (the key goes)
    assert await store.record_partitions(1, 1) == at(1, 4, epoch=2)
    await store.forget_leaving(4)
    assert await store.record_partitions(1, 1) == at(1)
    with pytest.raises(ValueError):
        await store.record_partitions(0, 1)
    with pytest.raises(ValueError):
        await store.forget_leaving(0)
    if isinstance(store, ScriptedStore):  # the script checks before it writes
        for args in [("record", "1", "0"), ("forget", "x"), ("move", "1", "2"), ("record", "2")]:
            with pytest.raises(StoreError, match="layout takes record"):
                await store.run_calls([store.layout.call("layout", *args)])
        assert await store.record_partitions(1, 1) == at(1)


async def test_a_worker_stops_when_the_recorded_count_changes(make_docket: MakeDocket) -> None:
    docket = await make_docket(partitions=3, heartbeat_interval=timedelta(milliseconds=20))
    store = docket.adapter
    assert isinstance(store, PartitionedStore)
    worker = make_worker(docket, reconnection_delay=timedelta(milliseconds=20))
    beats = 0
    original = store.home.execute

    async def counted(effects: Any) -> Any:
        nonlocal beats
        beats += sum(isinstance(e, Heartbeat) for e in effects)
        return await original(effects)

    store.home.execute = counted  # type: ignore[method-assign]

    async def change() -> None:
        with anyio.fail_after(10):
            while beats < 3:  # (heartbeats with the recorded count: it runs on)
                await anyio.sleep(0.01)
        # drained, the docket was opened with 2 partitions elsewhere
        assert await store.record_partitions(3, 2) == at(3)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(change)
            with pytest.RaisesGroup(
                pytest.RaisesExc(StoreError, match="recorded with 2 partitions now, not the 3"),
                flatten_subgroups=True,
            ):
                await worker.run_forever()


async def test_a_sibling_shares_the_connection(make_docket: MakeDocket, docket_url: str) -> None:
    docket = await make_docket()

    async def task() -> None: ...

    docket.register(task)
    store = docket.adapter
    name = f"sibling-{uuid.uuid4().hex}"
    sibling = store.sibling(name)
    assert sibling.name == name and not isinstance(sibling, PartitionedStore)
    # an ordinary store of its docket: a Docket runs on it, and opens and closes it
    async with Docket(name=name, adapter=sibling) as beside:
        beside.register(task)
        await beside.add(task, when=later(), key="beside")()
        assert await sibling.record_partitions(1, 2) == at(1)  # its own count, apart
        assert await store.record_partitions(1, 1) == at(1)
        await sibling.forget_leaving(1)
        assert await sibling.record_partitions(2, 1) == at(2)
        await sibling.forget_leaving(2)
    async with Docket(name=name, url=docket_url) as same:  # the same place
        assert await same.adapter.pending() == 1
        assert await same.get_execution("beside") is not None
    # closing the sibling left the client it shares open
    await docket.add(task, when=later(), key="home")()
    assert await store.pending() == 1
    assert await store.record_partitions(1, 1) == at(1)
    again = store.sibling(name)
    await again.open()
    try:
        assert await again.pending() == 1
    finally:
        await again.close()
    assert await store.pending() == 1
