"""A change of a docket's partition count closes the old layout to new
tasks (``partition_parts.settle_layout``, ``close.lua``), on every backend:
a producer still open with the old count gets a clear error instead of
adding a task no worker of the new count reads; a change that dies half way
heals (its lease runs out, or the next opener of the recorded count removes
its seals); a refused change leaves the old layout open."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import anyio
import pytest

from docket_core import Docket
from docket_core.lua.base import ScriptedStore
from docket_core.partition_parts import part_names
from docket_core.sansio.errors import StoreError, UsageError
from docket_core.sansio.partitions import partition_of

pytestmark = pytest.mark.anyio

MakeDocket = Callable[..., Awaitable[Docket]]


def later() -> datetime:
    return datetime.now(UTC) + timedelta(minutes=10)


async def task() -> None: ...


@pytest.mark.parametrize(("old", "new"), [(1, 3), (3, 1), (3, 2)])
async def test_a_producer_of_the_old_count_is_refused_after_a_change(
    make_docket: MakeDocket, docket_url: str, old: int, new: int
) -> None:
    name = f"closing-{uuid.uuid4().hex}"
    producer = await make_docket(name, partitions=old)
    producer.register(task)
    await producer.add(task, when=later(), key="before")()
    await producer.clear()
    async with Docket(name=name, url=docket_url, partitions=new) as changed:
        changed.register(task)
        # a key of a partition only the old layout has is refused; one that
        # both layouts share stays open (the new workers read it)
        old_names = (name,) if old == 1 else part_names(name, old)
        new_names = (name,) if new == 1 else part_names(name, new)
        accepted = refused = 0
        for n in range(24):
            key = f"k-{n}"
            if old_names[partition_of(key, old)] in new_names:
                await producer.add(task, when=later(), key=key)()
                accepted += 1
                continue
            match = f"has {new} partitions now; open it with partitions={new}"
            with pytest.raises(StoreError, match=match):
                await producer.add(task, when=later(), key=key)()
            refused += 1
        assert refused > 0
        assert (accepted > 0) == bool(set(old_names) & set(new_names))
        await changed.add(task, when=later(), key="after")()
        assert await changed.adapter.pending() == accepted + 1
        await changed.clear()
    # changed back: the old layout takes tasks again, the new one is closed
    async with Docket(name=name, url=docket_url, partitions=old) as back:
        back.register(task)
        await producer.add(task, when=later(), key="again")()
        assert await back.adapter.pending() == 1
        assert await back.get_execution("again") is not None


async def test_a_refused_change_leaves_the_old_layout_open(
    make_docket: MakeDocket, docket_url: str
) -> None:
    name = f"closing-{uuid.uuid4().hex}"
    producer = await make_docket(name)
    producer.register(task)
    await producer.add(task, when=later(), key="waiting")()
    with pytest.raises(UsageError, match="holds tasks in 1 partitions"):
        async with Docket(name=name, url=docket_url, partitions=3):
            pass
    await producer.add(task, when=later(), key="more")()  # (no lease left behind)
    assert await producer.adapter.pending() == 2


async def test_a_change_that_died_after_closing_heals_when_its_lease_runs_out(
    make_docket: MakeDocket,
) -> None:
    producer = await make_docket()
    producer.register(task)
    store = producer.adapter
    assert await store.close_partition("close", 3, 0.3, time.time())
    with pytest.raises(StoreError, match="is closed while the docket changes to 3 partitions"):
        await producer.add(task, when=later(), key="refused")()
    await anyio.sleep(0.45)
    await producer.add(task, when=later(), key="taken")()
    assert await store.pending() == 1
    # a change that comes back after its lease ran out finds the task in
    assert not await store.close_partition("seal", 3, 30.0, time.time())
    await producer.add(task, when=later(), key="still")()  # (not sealed)


async def test_the_next_opener_of_the_recorded_count_removes_a_left_seal(
    make_docket: MakeDocket, docket_url: str
) -> None:
    name = f"closing-{uuid.uuid4().hex}"
    producer = await make_docket(name)
    producer.register(task)
    store = producer.adapter
    # a change to 3 that died after its compare-and-set was undone (here: the
    # count is still 1) but before it opened this layout again
    assert await store.close_partition("seal", 3, 30.0, time.time())
    with pytest.raises(StoreError, match="has 3 partitions now"):
        await producer.add(task, when=later(), key="refused")()
    with pytest.raises(StoreError, match="has 3 partitions now"):
        await store.replay_dead_letters(None)
    assert not await store.close_partition("open", 3, 30.0, time.time())  # (not a lease)
    async with Docket(name=name, url=docket_url):
        pass
    await producer.add(task, when=later(), key="taken")()
    assert await store.pending() == 1
    assert not await store.close_partition("open", None, 30.0, time.time())  # (none left)


async def test_closing_refuses_a_partition_that_holds_a_task(make_docket: MakeDocket) -> None:
    producer = await make_docket()
    producer.register(task)
    store = producer.adapter
    await producer.add(task, when=later(), key="waiting")()
    assert not await store.close_partition("close", 3, 30.0, time.time())
    await producer.add(task, when=later(), key="more")()  # (nothing written)
    assert await store.close_partition("seal", 3, 30.0, time.time()) is False


async def test_the_close_script_checks_its_inputs(make_docket: MakeDocket) -> None:
    store = (await make_docket()).adapter
    with pytest.raises((ValueError, StoreError)):
        await store.close_partition("close", None, 30.0, time.time())
    if not isinstance(store, ScriptedStore):
        return  # (the memory store has no script)
    for bad in (("shut", "3", "10"), ("close", "x", "10"), ("close", "3", "0"), ("seal", "", "10")):
        with pytest.raises(StoreError, match="close takes close, seal or open"):
            await store.run_calls([store.layout.call("close", *bad)])
    assert await store.close_partition("open", None, 1.0, time.time()) is False
