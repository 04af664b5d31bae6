"""Every docket script touches the keys of one hash tag only: the one it is
called with (docs/cluster.md, sections 2 to 4).  A scope shared by dockets
is taken and released in a chain of single-slot steps.

The scripts run here on the session's Valkey cluster, each with a ``#!lua``
first line: a script so marked may touch no key outside the slot of the
keys it declares, not even one of its own node (a script without it may, so
a cross-slot script of today's kind fails only when the other slot lives on
another node).  Any such access fails the call; ``StrictStore`` records it.

The chain's steps are checked against the memory store, the reference: one
scenario of effects (two dockets and a scope, each on its own slot) gives
the same outcomes on both.  A worker scenario then drains two dockets
sharing a scoped limit on the cluster.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta
from typing import Any

import anyio
import attrs
import pytest
from helpers import claim_as, make_worker
from redis import exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster
from servers import Cluster

from docket_core import ConcurrencyLimit, Docket, ExecutionState, TaskKey
from docket_core.lua import SCRIPTS
from docket_core.lua.protocol import Layout, ScriptCall, calls_for, same_slot_groups
from docket_core.sansio.effects import (
    ConfirmSlot,
    Enlist,
    Finish,
    Park,
    ReleaseSlot,
    RenewLeases,
    Request,
    StoreEffect,
    TakeSlot,
    WakeParked,
)
from docket_core.sansio.errors import StoreError
from docket_core.sansio.values import Delivery, HeldSlot
from docket_redis.store import RedisStore

pytestmark = [pytest.mark.anyio, pytest.mark.backends("memory-asyncio")]

#: every script, marked so that the server refuses any key outside its slot
STRICT = {name: "#!lua\n" + source for name, source in SCRIPTS.items()}
CROSS_SLOT = "Script attempted to access"


class StrictStore(RedisStore):
    """A ``RedisStore`` on a cluster client that runs the ``STRICT`` scripts,
    one call a command, in order, and keeps every cross-slot refusal in
    ``refusals``."""

    def __init__(self, client: RedisCluster, *, name: str) -> None:
        super().__init__(client, name=name)
        self.refusals: list[str] = []
        #: how many calls of each script ran
        self.ran: Counter[str] = Counter()

    async def _evalsha(self, calls: Sequence[ScriptCall]) -> list[Any]:
        replies = []
        for call in calls:
            self.ran[call.name] += 1
            try:
                replies.append(
                    await self.client.eval(
                        STRICT[call.name], len(call.keys), *call.keys, *call.args
                    )
                )
            except redis_errors.ResponseError as error:
                if CROSS_SLOT in str(error):
                    self.refusals.append(f"{call.name} in {call.tag}: {error}")
                raise
        return replies

    async def _load_scripts(self) -> None:
        return None


def apart(cluster: Cluster) -> tuple[str, str, str]:
    """Two docket names and a scope whose hash tags live on three nodes."""
    while True:
        names = [f"{what}-{uuid.uuid4().hex[:8]}" for what in ("one", "two", "scope")]
        nodes = {cluster.owner(cluster.key_slot("{" + name + "}")).port for name in names}
        if len(nodes) == 3:
            return names[0], names[1], names[2]


@asynccontextmanager
async def strict_dockets(client: RedisCluster, names: Sequence[str]) -> AsyncIterator[list[Docket]]:
    async with AsyncExitStack() as stack:
        dockets = []
        for name in names:
            store = StrictStore(client, name=name)
            dockets.append(await stack.enter_async_context(Docket(name=name, adapter=store)))
        yield dockets


@asynccontextmanager
async def memory_dockets(names: Sequence[str]) -> AsyncIterator[list[Docket]]:
    location = uuid.uuid4().hex
    async with AsyncExitStack() as stack:
        dockets = []
        for name in names:
            docket = Docket(name=name, url=f"memory://{location}")
            dockets.append(await stack.enter_async_context(docket))
        yield dockets


def refusals(*dockets: Docket) -> list[str]:
    return [r for d in dockets if isinstance(d.adapter, StrictStore) for r in d.adapter.refusals]


# -- the method can fail ----------------------------------------------------------------


async def test_a_script_touching_another_slot_is_refused(
    valkey_cluster: Cluster, redis_cluster: RedisCluster
) -> None:
    """The check itself: a call declaring one docket's keys whose script
    writes a key of the scope (in another slot) is refused and recorded."""
    one, _, scope = apart(valkey_cluster)
    async with strict_dockets(redis_cluster, [one]) as (docket,):
        store = docket.adapter
        assert isinstance(store, StrictStore)
        declared = Layout(one).call("enlist", "L", one, "1.0")
        # the scope's prefix in ARGV[1]: the script derives the scope's keys
        crossing = attrs.evolve(declared, args=("{" + scope + "}", *declared.args[1:]))
        with pytest.raises(StoreError):
            await store.run_calls([crossing])
        assert len(store.refusals) == 1
        assert (await store.run_calls([declared])) == [1]
        assert len(store.refusals) == 1


# -- calls, namespaces and round trips --------------------------------------------------


def test_each_step_is_called_in_its_namespace_and_grouped_in_order() -> None:
    """A flush ending a run: its finish in the docket, the release in the
    scope, then a wake-up in the other docket: three round trips, in that
    order; a renewal holding a scoped slot is split, its first call covering
    the effect."""
    docket = Layout("one")
    finish = Finish(
        delivery_id="1-0", key="a", generation=1, state=ExecutionState.COMPLETED,
        now=1.0, ttl=60.0,
    )  # fmt: skip
    release = ReleaseSlot(limit_key="L", holder="h", now=1.0, scope="s")
    wake = WakeParked(docket="two", scope="s", limit_key="L", now=1.0)
    renew = RenewLeases(
        worker="w", delivery_ids=("1-0",), now=1.0,
        slots=(HeldSlot(limit_key="L", holder="h", scope="s"), HeldSlot(limit_key="M", holder="g")),
    )  # fmt: skip
    calls = calls_for(docket, [finish, release, wake, renew])
    assert [(c.name, c.tag, covered) for c, covered in calls] == [
        ("finish", "{one}", 1),
        ("release", "{s}", 1),
        ("wake", "{two}", 1),
        ("renew", "{one}", 1),
        ("renew_slots", "{s}", 0),
    ]
    assert all(c.keys == (c.tag + ":q", c.tag + ":fence") for c, _ in calls)
    groups = same_slot_groups([c for c, _ in calls])
    assert [[c.name for c in group] for group in groups] == [
        ["finish"],
        ["release"],
        ["wake"],
        ["renew"],
        ["renew_slots"],
    ]


# -- the chain's steps, against the memory store ----------------------------------------


def shape(outcome: Any) -> tuple[Any, ...]:
    """An outcome without its delivery id (each store numbers them its way)."""
    fields = attrs.asdict(outcome, recurse=False)
    fields.pop("delivery_id", None)
    return (type(outcome).__name__, tuple(sorted(fields.items())))


async def noop(n: int = 0) -> None:
    """Never runs here: the scenario drives the stores directly."""


class Scenario:
    """The chain's effects on two dockets sharing ``scope``'s limit of one
    slot, as a worker would send them, and what the stores answered."""

    def __init__(self, first: Docket, second: Docket, scope: str, now: float) -> None:
        self.dockets = {"one": first, "two": second}
        self.scope = scope
        self.limit = f"{scope}:concurrency:noop"
        self.now = now
        self.seq = 0
        self.seen: list[Any] = []
        for docket in (first, second):
            docket.register(noop)

    def request(self, worker: str) -> Request:
        self.seq += 1
        return Request(origin=f"{worker}#o", worker=worker, seq=self.seq, floor=1, remember=60.0)

    async def run(self, docket: str, *effects: StoreEffect) -> list[Any]:
        outcomes = await self.dockets[docket].adapter.execute(list(effects))
        self.seen += [shape(o) for o in outcomes]
        return outcomes

    async def add(self, docket: str, key: str) -> Delivery:
        await self.dockets[docket].add(noop, key=key)()
        (delivery,) = await claim_as(self.dockets[docket], f"w-{docket}", 1, self.now)
        return delivery

    def take(self, docket: str, delivery: Delivery, at: float) -> TakeSlot:
        return TakeSlot(
            scope=self.scope,
            limit_key=self.limit,
            holder=f"h-{delivery.message.key}",
            max_concurrent=1,
            now=self.now + at,
            stale_after=30.0,
            delivery_id=delivery.delivery_id,
            docket=self.dockets[docket].name,
            request=self.request(f"w-{docket}"),
        )

    def park(self, docket: str, delivery: Delivery, at: float) -> Park:
        return Park(
            delivery_id=delivery.delivery_id,
            message=delivery.message,
            limit_key=self.limit,
            scope=self.scope,
            now=self.now + at,
            retry_at=self.now + at + 30.0,
            request=self.request(f"w-{docket}"),
        )

    def wake(self, docket: str, at: float) -> WakeParked:
        name = self.dockets[docket].name
        return WakeParked(
            docket=name, scope=self.scope, limit_key=self.limit, now=self.now + at,
            request=self.request("w-one"),
        )  # fmt: skip

    def release(self, holder: str, at: float, pass_on: bool = False) -> ReleaseSlot:
        return ReleaseSlot(
            limit_key=self.limit, holder=holder, now=self.now + at, scope=self.scope,
            pass_on=pass_on, request=self.request("w-one"),
        )  # fmt: skip

    async def read(self, docket: str, at: float) -> list[str]:
        read = await self.dockets[docket].adapter.read(
            worker=f"w-{docket}", count=10, now=self.now + at, redelivery_timeout=60, block=0
        )
        keys = sorted(d.message.key for d in read.deliveries)
        self.seen.append(("read", docket, keys))
        return keys

    async def counts(self, docket: str, at: float) -> None:
        adapter = self.dockets[docket].adapter
        depths = await adapter.depths(self.now + at)
        self.seen.append(("counts", docket, await adapter.pending(), attrs.astuple(depths)))

    async def play(self) -> list[Any]:
        a, b = await self.add("one", "a"), await self.add("one", "b")
        c = await self.add("two", "c")
        # a takes the slot, b and c find it full: their dockets wait, one first
        await self.run("one", self.take("one", a, 0.0), self.take("one", b, 0.1))
        await self.run("two", self.take("two", c, 0.2))
        confirm = ConfirmSlot(
            worker="w-one", delivery_id=a.delivery_id, key="a", generation=a.message.generation,
            limit_key=self.limit, scope=self.scope, now=self.now + 0.3,
        )  # fmt: skip
        await self.run("one", confirm, self.park("one", b, 0.3))
        await self.run("two", self.park("two", c, 0.4))
        await self.run("one", self.park("one", b, 0.4))  # parked already: stays
        await self.counts("one", 0.5)
        slot = HeldSlot(limit_key=self.limit, holder="h-a", scope=self.scope)
        lost = HeldSlot(limit_key=self.limit, holder="h-gone", scope=self.scope)
        renew = RenewLeases(
            worker="w-one", delivery_ids=(a.delivery_id,), slots=(slot, lost), now=self.now + 1
        )
        await self.run("one", renew)
        # a ends; its release names the docket that waited longest
        finish = Finish(
            delivery_id=a.delivery_id, key="a", generation=a.message.generation,
            state=ExecutionState.COMPLETED, now=self.now + 2, ttl=60.0,
            request=self.request("w-one"),
        )  # fmt: skip
        await self.run("one", finish, self.release("h-a", 2.0))
        await self.run("one", self.wake("one", 2.1))
        assert await self.read("one", 2.2) == ["b"]
        await self.run("one", self.take("one", b, 2.25))  # b holds the slot now
        # the docket woken had nobody left: the wake-up passes on to the next
        await self.run("one", self.release("", 2.3, pass_on=True))
        await self.run("one", self.wake("two", 2.4))
        assert await self.read("two", 2.5) == ["c"]
        # a docket enlisted again with nobody parked: its wake-up finds none
        enlist = Enlist(
            scope=self.scope, limit_key=self.limit, docket=self.dockets["two"].name,
            since=self.now, now=self.now + 3,
        )  # fmt: skip
        await self.run("one", enlist, self.release("", 3.1, pass_on=True))
        await self.run("one", self.wake("two", 3.2), self.release("", 3.3, pass_on=True))
        # a parked key cancelled; another one retried at its retry time
        d, e = await self.add("two", "d"), await self.add("two", "e")
        await self.run("two", self.take("two", d, 4.0), self.take("two", e, 4.0))
        await self.run("two", self.park("two", d, 4.1), self.park("two", e, 4.1))
        await self.counts("two", 4.2)
        await self.dockets["two"].cancel("d")
        self.seen.append(("d", (await self.dockets["two"].get_execution("d")).state))  # type: ignore[union-attr]
        await self.counts("two", 4.3)
        assert await self.read("two", 40.0) == ["e"]
        await self.run("two", self.wake("two", 40.1))  # e retried: nothing waits
        await self.counts("two", 40.2)
        return self.seen


async def test_the_chain_answers_as_the_memory_store(
    valkey_cluster: Cluster, redis_cluster: RedisCluster
) -> None:
    names = apart(valkey_cluster)
    now = time.time()
    async with memory_dockets(names[:2]) as (first, second):
        expected = await Scenario(first, second, names[2], now).play()
    async with strict_dockets(redis_cluster, names[:2]) as (first, second):
        seen = await Scenario(first, second, names[2], now).play()
        assert refusals(first, second) == []
    assert seen == expected


# -- a worker on each of two dockets sharing a scope ------------------------------------


async def test_two_dockets_share_a_scoped_limit_on_a_cluster(
    valkey_cluster: Cluster, redis_cluster: RedisCluster
) -> None:
    """One at a time across both dockets, every task completed, and no
    script touched a key outside its slot."""
    one, two, scope = apart(valkey_cluster)
    running: Counter[str] = Counter()
    peak = 0

    async def shared(
        key: str = TaskKey(), limit: ConcurrencyLimit = ConcurrencyLimit(1, scope=scope)
    ) -> None:
        nonlocal peak
        running["all"] += 1
        peak = max(peak, running["all"])
        await anyio.sleep(0.02)
        running["all"] -= 1

    async with strict_dockets(redis_cluster, [one, two]) as dockets:
        for docket in dockets:
            docket.register(shared)
            for i in range(4):
                await docket.add(shared, key=f"{docket.name}-{i}")()
        options: dict[str, Any] = {"redelivery_timeout": timedelta(seconds=5)}
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                for docket in dockets:
                    group.start_soon(make_worker(docket, **options).run_until_finished)
        assert refusals(*dockets) == []
        assert peak == 1
        ran = sum((d.adapter.ran for d in dockets if isinstance(d.adapter, StrictStore)), Counter())
        assert min(ran[name] for name in ("take", "confirm", "park", "release", "wake")) > 0, ran
        for docket in dockets:
            for i in range(4):
                execution = await docket.get_execution(f"{docket.name}-{i}")
                assert execution is not None and execution.state is ExecutionState.COMPLETED
