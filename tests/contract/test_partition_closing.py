"""A change of a docket's partition count closes the old layout to new
tasks (``sansio.layout_change``, ``close.lua``), on every backend:
a producer still open with the old count gets a clear error instead of
adding a task no worker of the new count reads; a change that dies half way
heals (its lease runs out, or the next opener of the recorded count, or a
partitioned worker at its heartbeat, finishes it); a refused change leaves
the old layout open."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import attrs
import pytest

from docket_core import Docket
from docket_core.lua.base import ScriptedStore
from docket_core.partition_parts import part_names
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import Heartbeat, Request
from docket_core.sansio.errors import StoreError, UsageError
from docket_core.sansio.layout_change import CountRecorded
from docket_core.sansio.partitions import partition_of
from docket_core.sansio.values import ScheduleMode

pytestmark = pytest.mark.anyio

MakeDocket = Callable[..., Awaitable[Docket]]


def later() -> datetime:
    return datetime.now(UTC) + timedelta(minutes=10)


async def task() -> None: ...


def sharing(old: int, new: int) -> str:
    """A docket name whose layouts of ``old`` and ``new`` partitions share
    one (both of 2 and 3 and more do, for about one name in two)."""
    while True:
        name = f"closing-{uuid.uuid4().hex}"
        if set(part_names(name, old)) & set(part_names(name, new)):
            return name


@pytest.mark.parametrize(("old", "new"), [(1, 3), (3, 1), (3, 2)])
async def test_a_producer_of_the_old_count_is_refused_after_a_change(
    make_docket: MakeDocket, docket_url: str, old: int, new: int
) -> None:
    name = sharing(old, new) if old > 1 and new > 1 else f"closing-{uuid.uuid4().hex}"
    producer = await make_docket(name, partitions=old)
    producer.register(task)
    await producer.add(task, when=later(), key="before")()
    await producer.clear()
    changed = await make_docket(name, partitions=new)
    changed.register(task)
    # refused everywhere: in a partition only the old layout has (no worker
    # of the new count reads it), and in one both share (the new count's
    # lookups by key look for the key elsewhere)
    old_names = (name,) if old == 1 else part_names(name, old)
    new_names = (name,) if new == 1 else part_names(name, new)
    in_shared = 0
    for n in range(24):
        key = f"k-{n}"
        in_shared += old_names[partition_of(key, old)] in new_names
        match = f"has {new} partitions now; open it with partitions={new}"
        with pytest.raises(StoreError, match=match):
            await producer.add(task, when=later(), key=key)()
    assert (in_shared > 0) == (old > 1 and new > 1)
    for n in range(24):  # (the new count adds to every partition, shared or not)
        await changed.add(task, when=later(), key=f"after-{n}")()
        assert await changed.get_execution(f"after-{n}") is not None
    assert await changed.adapter.pending() == 24
    await changed.clear()
    # changed back: the old layout takes tasks again, the new one is closed
    back = await make_docket(name, partitions=old)
    back.register(task)
    for n in range(12):
        await producer.add(task, when=later(), key=f"again-{n}")()
        assert await back.get_execution(f"again-{n}") is not None
    assert await back.adapter.pending() == 12
    with pytest.raises(StoreError, match=f"has {old} partitions now"):
        await changed.add(task, when=later(), key="late")()


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
    # (a lease long enough for the refused add's first round trip on a slow,
    # loaded machine: at 0.3 s it once ran out before the add arrived)
    assert await store.close_partition("close", 3, 0, 1.5, time.time())
    with pytest.raises(StoreError, match="is closed while the docket changes to 3 partitions"):
        await producer.add(task, when=later(), key="refused")()
    await anyio.sleep(1.7)
    await producer.add(task, when=later(), key="taken")()
    assert await store.pending() == 1
    # a change that comes back after its lease ran out finds the task in,
    # and seals it all the same (no more come in)
    assert not await store.close_partition("seal", 3, 1, 30.0, time.time())
    with pytest.raises(StoreError, match="has 3 partitions now"):
        await producer.add(task, when=later(), key="refused")()


async def test_the_next_opener_of_the_recorded_count_removes_a_left_seal(
    make_docket: MakeDocket, docket_url: str
) -> None:
    name = f"closing-{uuid.uuid4().hex}"
    producer = await make_docket(name)
    producer.register(task)
    store = producer.adapter
    # a change to 3 (its epoch: the one recorded now) was undone since, and
    # nobody opened this layout again after it
    assert await store.close_partition("seal", 3, 0, 30.0, time.time())
    with pytest.raises(StoreError, match="has 3 partitions now"):
        await producer.add(task, when=later(), key="refused")()
    with pytest.raises(StoreError, match="has 3 partitions now"):
        await store.replay_dead_letters(None)
    assert not await store.close_partition("undo", 3, 0, 30.0, time.time())  # (not a lease)
    async with Docket(name=name, url=docket_url):
        pass
    await producer.add(task, when=later(), key="taken")()
    assert await store.pending() == 1
    # (the seal is 1's now: no other left to give to 1)
    assert not await store.close_partition("unseal", 1, 0, 30.0, time.time())


async def test_an_opener_keeps_the_seal_of_a_change_after_its_look(
    make_docket: MakeDocket, docket_url: str
) -> None:
    """A seal from a change later than the count an opener read stays: that
    change went away from the opener's layout after the opener looked."""
    name = f"closing-{uuid.uuid4().hex}"
    producer = await make_docket(name)
    producer.register(task)
    store = producer.adapter
    assert await store.close_partition("seal", 3, 1, 30.0, time.time())  # (epoch 1 > 0)
    async with Docket(name=name, url=docket_url):
        pass
    with pytest.raises(StoreError, match="has 3 partitions now"):
        await producer.add(task, when=later(), key="refused")()
    assert await store.close_partition("seal", 2, 1, 30.0, time.time())  # (sealed already)
    assert await store.close_partition("close", 2, 0, 30.0, time.time())
    with pytest.raises(StoreError, match="while the docket changes to 2 partitions"):
        await producer.add(task, when=later(), key="refused")()
    assert await store.close_partition("undo", 2, 0, 30.0, time.time())
    with pytest.raises(StoreError, match="has 3 partitions now"):  # (the seal stays)
        await producer.add(task, when=later(), key="refused")()
    assert await store.close_partition("unseal", 1, 1, 30.0, time.time())
    await producer.add(task, when=later(), key="taken")()


async def test_closing_refuses_a_partition_that_holds_a_task(make_docket: MakeDocket) -> None:
    producer = await make_docket()
    producer.register(task)
    store = producer.adapter
    await producer.add(task, when=later(), key="waiting")()
    assert not await store.close_partition("close", 3, 0, 30.0, time.time())
    await producer.add(task, when=later(), key="more")()  # (nothing written)
    assert await store.close_partition("seal", 3, 1, 30.0, time.time()) is False


async def test_the_close_script_checks_its_inputs(make_docket: MakeDocket) -> None:
    store = (await make_docket()).adapter
    with pytest.raises((ValueError, StoreError)):
        await store.close_partition("shut", 3, 0, 30.0, time.time())  # type: ignore[arg-type]
    if not isinstance(store, ScriptedStore):
        return  # (the memory store has no script)
    for bad in (
        ("shut", "3", "0", "10"),
        ("close", "x", "0", "10"),
        ("close", "3", "0", "0"),
        ("seal", "", "0", "10"),
        ("seal", "3", "y", "10"),
        ("open", "3", "0", "10"),
    ):
        with pytest.raises(StoreError, match="close takes close, undo, seal or unseal"):
            await store.run_calls([store.layout.call("close", *bad)])
    assert await store.close_partition("unseal", 0, 0, 1.0, time.time()) is False
    for count in ("", "x"):  # (an add names its producer's partition count)
        call = store.layout.remembered_call("schedule", None, b"", count)
        with pytest.raises(StoreError, match="an add names the partition count"):
            await store.run_calls([call])


def two_only() -> tuple[str, str]:
    """A docket name whose 2-partition layout has a partition 3's has not
    (2's and 3's may share both of 2's), and a key of that partition."""
    while True:
        name = f"closing-{uuid.uuid4().hex}"
        three = set(part_names(name, 3))
        for key in (f"k-{n}" for n in range(100)):
            if part_names(name, 2)[partition_of(key, 2)] not in three:
                return name, key


async def died_after_its_compare_and_set(
    make_docket: MakeDocket, name: str
) -> tuple[Docket, Docket]:
    """A docket of 3 (``three``, its store opened), then one opened with 2
    (``two``: the count changed to 2), then a change back to 3 that died
    right after recording 3: 2's partitions still open, its seal owed."""
    three = await make_docket(name, partitions=3)
    two = await make_docket(name, partitions=2)
    for docket in (three, two):
        docket.register(task)
    recorded = await three.adapter.record_partitions(2, 3)
    assert recorded.count == 2 and recorded.leaving is None
    assert (await three.adapter.record_partitions(3, 3)).leaving == 2
    return three, two


async def test_the_next_opener_seals_what_a_change_that_died_after_recording_left(
    make_docket: MakeDocket, docket_url: str
) -> None:
    name, key = two_only()
    three, two = await died_after_its_compare_and_set(make_docket, name)
    async with Docket(name=name, url=docket_url, partitions=3):
        pass
    with pytest.raises(StoreError, match="has 3 partitions now"):
        await two.add(task, when=later(), key=key)()
    recorded = await three.adapter.record_partitions(3, 3)
    assert recorded.count == 3 and recorded.leaving is None
    # the seals the change to 2 left on 3's layout are gone: it takes tasks
    for n in range(12):
        await three.add(task, when=later(), key=f"three-{n}")()


@pytest.mark.parametrize("strays", [False, True])
async def test_a_partitioned_worker_seals_at_its_heartbeat_what_a_dead_change_left(
    make_docket: MakeDocket, caplog: pytest.LogCaptureFixture, strays: bool
) -> None:
    name, key = two_only()
    three, two = await died_after_its_compare_and_set(make_docket, name)
    if strays:  # (added while nothing kept it out: reported, not lost silently)
        await two.add(task, when=later(), key=key)()
    store = three.adapter
    await store.execute([Heartbeat(worker="w", tasks=(), now=time.time())])
    recorded = await store.record_partitions(3, 3)
    assert recorded.count == 3 and recorded.leaving is None
    reported = [r.getMessage() for r in caplog.records if "took a task" in r.getMessage()]
    if strays:
        assert len(reported) == 1 and "changed to 3; open it with partitions=2" in reported[0]
        return
    assert reported == []
    with pytest.raises(StoreError, match="has 3 partitions now"):
        await two.add(task, when=later(), key=key)()
    for n in range(12):
        await three.add(task, when=later(), key=f"three-{n}")()


async def test_a_compare_and_set_and_a_forget_name_the_epoch_they_read(
    make_docket: MakeDocket,
) -> None:
    """A change records its count only at the epoch it read (a count that
    went away and came back is not the one it closed), and forgets a
    leaving count only at its own change's epoch."""
    store = (await make_docket()).adapter
    assert await store.record_partitions(1, 2, 0) == CountRecorded(count=1, epoch=0)
    assert await store.record_partitions(2, 2) == CountRecorded(count=2, leaving=1, epoch=1)
    await store.forget_leaving(1, 0)  # (a late forget, of epoch 0: kept)
    assert (await store.record_partitions(2, 2)).leaving == 1
    await store.forget_leaving(1, 1)
    assert (await store.record_partitions(2, 2)).leaving is None
    await store.record_partitions(2, 1, 1)
    await store.forget_leaving(2, 2)
    # 1 again, at epoch 2: a change that read 1 at epoch 0 records nothing
    assert await store.record_partitions(1, 3, 0) == CountRecorded(count=1, epoch=2)
    assert await store.record_partitions(1, 1) == CountRecorded(count=1, epoch=2)
    if isinstance(store, ScriptedStore):  # (the script checks the epoch it is given)
        for bad in (("record", "1", "3", "x"), ("forget", "1", "-1")):
            with pytest.raises(StoreError, match="layout takes record"):
                await store.run_calls([store.layout.call("layout", *bad)])


async def test_a_resend_of_a_stored_add_is_answered_after_its_partition_closed(
    make_docket: MakeDocket,
) -> None:
    """An add whose reply was lost is answered with its first outcome when
    it comes again, though a change closed its partition meanwhile (the
    memory store and the scripts alike); a new add is refused."""
    store = (await make_docket()).adapter
    now = time.time()
    origin = f"p#{uuid.uuid4().hex}"

    def add(key: str, seq: int) -> Any:
        planned = plan_add(
            key=key, function="f", payload=b"", when=now + 600, mode=ScheduleMode.ADD, now=now
        )
        request = Request(origin=origin, worker="", seq=seq, floor=1, remember=600.0)
        return attrs.evolve(planned, request=request)

    (first,) = await store.execute([add("k", 1)])
    # (it holds the task: a seal says so, and seals all the same)
    assert not await store.close_partition("seal", 3, 1, 30.0, time.time())
    assert await store.execute([attrs.evolve(add("k", 1), now=now + 1)]) == [first]
    with pytest.raises(StoreError, match="has 3 partitions now"):
        await store.execute([add("other", 2)])
