"""A docket spread over partitions: ``Docket(name, url, partitions=N)``.

``PartitionedStore`` is a ``StorageAdapter`` that routes, and holds no
logic of its own: partition ``i`` is an ordinary store named after its tag's
inner text (``sansio.partitions.partition_tags``: ``orders|0.1``, keys
``{orders|0.1}:...``), so each partition's queue, schedule and records stay
in one hash slot and every guarantee of a store holds per partition.  The
docket-wide things (heartbeats and workers, strikes, the recorded partition
count) stay in ``home``, the ordinary store named ``name``.

- Each partition's store is ``home.sibling(name)``: on ``home``'s client.
- Effects: ``sansio.partition_routes.route`` decides where each goes (the
  partition of its delivery id, ``"<i>/<entry id>"``, or of its key; claims
  and renewals split; home and scope steps in order) and ``merged`` puts the
  outcomes together; this adapter sends the rounds.  A heartbeat is followed
  by a look at the recorded partition count: a worker opened with another
  count is refused (``sansio.partitions.layout_changed``), and stops.
- Concurrency limits span the partitions: the runtime scopes an unscoped
  limit to the docket's name (``partition_parts.spanning_limits``), so its
  slots live in ``{name}`` and it takes the scoped chain; ``TakeSlot``
  registers the delivery's partition as the waiting docket.
- Reads: ``partition_reads.FairReader`` (decided by ``sansio.fair_reads``).
- The partition count is recorded in ``home`` (``{name}:partitions``, absent
  means 1; ``StorageAdapter.record_partitions``).  Opening with another
  count, ``partitions=1`` included (``Docket`` checks that one), is refused
  unless the partitions of the recorded one are all empty: tasks are never
  moved, so none is stranded (``partition_parts.settle_layout``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import attrs
from anyio.abc import TaskGroup

from .adapter import ClosingStep, Depths, ReadResult, StorageAdapter, StoreEvent
from .held_calls import HeldCalls
from .lua.base import ScriptedStore
from .partition_parts import finish_leaving, part_names, settle_layout
from .partition_reads import FairReader
from .sansio.effects import StoreEffect
from .sansio.errors import StoreError, UsageError
from .sansio.inputs import Outcome
from .sansio.layout_change import CountRecorded
from .sansio.partition_routes import HOME, Piece, merged, route
from .sansio.partitions import layout_changed, partition_of, split_delivery_id
from .sansio.strikes import StrikeInstruction, StrikeList
from .sansio.values import (
    DeadLetter,
    ExecutionRecord,
    ProgressRecord,
    StoreSnapshot,
    WorkerRecord,
)
from .serialization import Signing


class PartitionedStore(HeldCalls):
    """A ``StorageAdapter`` over ``partitions`` stores and a ``home`` store."""

    def __init__(self, home: StorageAdapter, partitions: int) -> None:
        if partitions < 2:
            raise UsageError("a PartitionedStore spreads a docket over 2 partitions or more")
        self.name = home.name
        self.home = home
        self.partitions = partitions
        #: each partition's store name: its tag without the braces
        self.part_names = part_names(home.name, partitions)
        self.parts: list[StorageAdapter] = []
        self._stack: AsyncExitStack | None = None
        self._group: TaskGroup | None = None
        self._reader: FairReader | None = None
        #: (``StorageAdapter.sends_at_once``): set on opening
        self.sends_at_once = False
        #: (``StorageAdapter.keeps_order``: its pieces go to several stores)
        self.keeps_order = False

    # -- the docket-wide store's settings -------------------------------------------

    @property
    def signing(self) -> Signing | None:
        signing: Signing | None = getattr(self.home, "signing", None)
        return signing

    @signing.setter
    def signing(self, signing: Signing | None) -> None:
        self.home.signing = signing  # type: ignore[attr-defined]

    # -- opening, and the recorded partition count ----------------------------------

    async def open(self) -> None:
        await self.home.open()
        stack = AsyncExitStack()
        try:
            stack.push_async_callback(self.home.close)
            for name in self.part_names:
                part = self.home.sibling(name, self.partitions)
                await part.open()
                stack.push_async_callback(part.close)
                self.parts.append(part)
            await settle_layout(self.home, self.partitions)
            self._group = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(self._group.cancel_scope.cancel)  # (outstanding reads)
        except BaseException:
            self.parts = []
            await stack.aclose()
            raise
        self._stack = stack
        self._reader = FairReader(self.parts, self._spawn)
        # the first round of a batch (where a worker's claim of runs that
        # start with it leads) goes out at once where one client of the
        # home store's that does so sends each round (``execute_apart``);
        # separate stores (memory) go side by side, from tasks of their own
        home = self.home
        self.sends_at_once = (
            isinstance(home, ScriptedStore)
            and home.sends_at_once
            and all(home.runs_apart_with(part) for part in self.parts)
        )
        #: (``HeldCalls.tells_writes``: the home store's client writes)
        self.tells_writes = home.tells_writes if isinstance(home, ScriptedStore) else False

    def sibling(self, name: str, partitions: int = 1) -> StorageAdapter:
        """An ordinary store of docket ``name`` beside ``home``."""
        return self.home.sibling(name, partitions)

    async def record_partitions(
        self, expected: int, new: int, epoch: int | None = None
    ) -> CountRecorded:
        """The docket's recorded partition count (in ``home``)."""
        return await self.home.record_partitions(expected, new, epoch)

    async def forget_leaving(self, old: int, epoch: int | None = None) -> None:
        await self.home.forget_leaving(old, epoch)

    async def close_partition(
        self, op: ClosingStep, count: int, epoch: int, lease: float, now: float, owner: str = ""
    ) -> bool:
        """``home``'s: the one-partition layout (its docket's own namespace)."""
        return await self.home.close_partition(op, count, epoch, lease, now, owner)

    def _spawn(self) -> TaskGroup:
        assert self._group is not None, "the store is not open"
        return self._group

    async def close(self) -> None:
        stack, self._stack, self._reader = self._stack, None, None
        if stack is not None:
            await stack.aclose()
        self.parts = []

    # -- effects ---------------------------------------------------------------------

    async def execute_in_order(self, effects: Sequence[StoreEffect]) -> list[Outcome]:
        return await self.execute(effects)

    async def execute(self, effects: Sequence[StoreEffect]) -> list[Outcome]:
        """Each piece to its store (``sansio.partition_routes.route``): the
        rounds one after the other, the groups of a round side by side."""
        plan = route(effects, self.partitions, self.part_names)
        replies: list[Outcome | None] = [None] * len(plan.pieces)
        for groups in plan.rounds:
            await self._run_side_by_side(plan.pieces, replies, groups)
        if self._reader is not None:
            for worker in plan.leaving:
                self._reader.forget(worker)
        if plan.checks_layout:
            recorded = await self.home.record_partitions(self.partitions, self.partitions)
            problem = layout_changed(self.name, self.partitions, recorded.count)
            if problem is not None:  # (refused: the worker stops, its batch unanswered)
                raise StoreError(problem)
            await finish_leaving(self.home, recorded)  # (a dead change's seal, if owed)
        return merged(effects, plan, replies)  # type: ignore[arg-type]

    def _store(self, target: int) -> StorageAdapter:
        return self.home if target == HOME else self.parts[target]

    async def _run(
        self, pieces: Sequence[Piece], replies: list[Outcome | None], indexes: Sequence[int]
    ) -> None:
        """One store call for these pieces (all bound for one store)."""
        store = self._store(pieces[indexes[0]].target)
        outcomes = await store.execute([pieces[index].effect for index in indexes])
        for index, outcome in zip(indexes, outcomes, strict=True):
            replies[index] = outcome

    async def _run_side_by_side(
        self,
        pieces: Sequence[Piece],
        replies: list[Outcome | None],
        groups: Sequence[Sequence[int]],
    ) -> None:
        """One call per group, concurrently; the first error is raised as it
        is (the core decides what a failed batch means; resends are safe).
        When the home store can send the groups' calls itself (the stores are
        its siblings, ``ScriptedStore.runs_apart_with``), they go through its
        ``execute_apart``: one round trip for the round where the client
        allows, rather than a request per store."""
        if len(groups) == 1:
            await self._run(pieces, replies, groups[0])
            return
        home = self.home
        if isinstance(home, ScriptedStore):
            targets = [self._store(pieces[indexes[0]].target) for indexes in groups]
            stores = [store for store in targets if home.runs_apart_with(store)]
            if len(stores) == len(targets):
                batches = [
                    (store, [pieces[index].effect for index in indexes])
                    for store, indexes in zip(stores, groups, strict=True)
                ]
                outcomes = await home.execute_apart(batches)
                for indexes, answered in zip(groups, outcomes, strict=True):
                    for index, outcome in zip(indexes, answered, strict=True):
                        replies[index] = outcome
                return
        errors: list[Exception] = []

        async def run(indexes: Sequence[int]) -> None:
            try:
                await self._run(pieces, replies, indexes)
            except Exception as error:
                errors.append(error)

        async with anyio.create_task_group() as group:
            for indexes in groups:
                group.start_soon(run, indexes)
        if errors:
            raise errors[0]

    # -- reads -----------------------------------------------------------------------

    async def read(
        self,
        *,
        worker: str,
        count: int,
        now: float,
        redelivery_timeout: float,
        block: float,
        recover: bool = False,
        stale_scan_every: float = 0.0,
    ) -> ReadResult:
        assert self._reader is not None, "the store is not open"
        return await self._reader.read(
            worker=worker,
            count=count,
            now=now,
            redelivery_timeout=redelivery_timeout,
            block=block,
            recover=recover,
            stale_scan_every=stale_scan_every,
        )

    def _of(self, key: str) -> StorageAdapter:
        return self.parts[partition_of(key, self.partitions)]

    async def _each(self, method: str, *args: Any) -> list[Any]:
        """``method(*args)`` on every partition's store, side by side."""
        results: list[Any] = [None] * len(self.parts)

        async def one(index: int) -> None:
            results[index] = await getattr(self.parts[index], method)(*args)

        async with anyio.create_task_group() as group:
            for index in range(len(self.parts)):
                group.start_soon(one, index)
        return results

    async def pending(self) -> int:
        return sum(await self._each("pending"))

    async def depths(self, now: float) -> Depths:
        each: list[Depths] = await self._each("depths", now)
        return Depths(
            queued=sum(d.queued for d in each),
            scheduled=sum(d.scheduled for d in each),
            held=sum(d.held for d in each),
        )

    async def get_record(self, key: str) -> ExecutionRecord | None:
        return await self._of(key).get_record(key)

    async def get_progress(self, key: str) -> ProgressRecord | None:
        return await self._of(key).get_progress(key)

    async def report_progress(
        self,
        key: str,
        *,
        now: float,
        generation: int | None = None,
        current: int | None = None,
        increment: int | None = None,
        total: int | None = None,
        message: str | None = None,
        clear_message: bool = False,
    ) -> ProgressRecord:
        return await self._of(key).report_progress(
            key,
            now=now,
            generation=generation,
            current=current,
            increment=increment,
            total=total,
            message=message,
            clear_message=clear_message,
        )

    def subscribe(self, key: str) -> AbstractAsyncContextManager[AsyncIterator[StoreEvent]]:
        return self._of(key).subscribe(key)

    @asynccontextmanager
    async def cancellations(self) -> AsyncIterator[AsyncIterator[tuple[str, int]]]:
        """Every partition's cancellations, as they come."""
        send, receive = anyio.create_memory_object_stream[tuple[str, int]](max_buffer_size=10_000)
        async with AsyncExitStack() as stack:
            streams = [await stack.enter_async_context(p.cancellations()) for p in self.parts]

            async def pump(stream: AsyncIterator[tuple[str, int]], into: Any) -> None:
                async with into:
                    async for signal in stream:
                        await into.send(signal)

            async with anyio.create_task_group() as group:
                for stream in streams:
                    group.start_soon(pump, stream, send.clone())
                send.close()
                try:
                    async with receive:
                        yield receive
                finally:
                    group.cancel_scope.cancel()

    async def add_strike(self, instruction: StrikeInstruction) -> None:
        await self.home.add_strike(instruction)

    async def strikes(self) -> StrikeList:
        return await self.home.strikes()

    async def snapshot(self, now: float, limit: int = 1000) -> StoreSnapshot:
        each: list[StoreSnapshot] = await self._each("snapshot", now, limit)
        workers = (await self.home.snapshot(now, 1)).workers
        malformed = [
            attrs.evolve(m, delivery_id=f"{index}/{m.delivery_id}")
            for index, snapshot in enumerate(each)
            for m in snapshot.malformed
        ]
        future = sorted((m for s in each for m in s.future), key=lambda m: m.when)
        running = sorted((r for s in each for r in s.running), key=lambda r: r.started)
        return StoreSnapshot(
            taken=now,
            future=tuple(future[:limit]),
            running=tuple(running[:limit]),
            workers=workers,
            future_total=sum(s.future_total for s in each),
            running_total=sum(s.running_total for s in each),
            malformed=tuple(malformed[:limit]),
            dead_letters=sum(s.dead_letters for s in each),
        )

    async def workers(self, now: float, horizon: float) -> list[WorkerRecord]:
        return await self.home.workers(now, horizon)

    async def clear(self, now: float, ttl: float) -> int:
        return sum(await self._each("clear", now, ttl))

    async def dead_letters(self, limit: int = 1000) -> tuple[int, list[DeadLetter]]:
        each: list[tuple[int, list[DeadLetter]]] = await self._each("dead_letters", limit)
        letters = [
            attrs.evolve(
                letter,
                entry_id=f"{index}/{letter.entry_id}",
                original_id=f"{index}/{letter.original_id}",
            )
            for index, (_, listed) in enumerate(each)
            for letter in listed
        ]
        letters.sort(key=lambda letter: letter.dead_at, reverse=True)  # newest first
        return sum(total for total, _ in each), letters[:limit]

    def _by_part(self, entry_ids: Sequence[str]) -> dict[int, list[str]]:
        by_part: dict[int, list[str]] = {}
        for entry_id in entry_ids:
            try:
                part, entry = split_delivery_id(entry_id, self.partitions)
            except ValueError:
                continue  # names no partition: no such letter
            by_part.setdefault(part, []).append(entry)
        return by_part

    async def replay_dead_letters(self, entry_ids: Sequence[str] | None) -> int:
        if entry_ids is None:
            return sum(await self._each("replay_dead_letters", None))
        by_part = self._by_part(entry_ids)
        return sum([await self.parts[p].replay_dead_letters(ids) for p, ids in by_part.items()])

    async def drop_dead_letters(self, entry_ids: Sequence[str] | None) -> int:
        if entry_ids is None:
            return sum(await self._each("drop_dead_letters", None))
        by_part = self._by_part(entry_ids)
        return sum([await self.parts[p].drop_dead_letters(ids) for p, ids in by_part.items()])


__all__ = ["PartitionedStore"]
