"""A docket spread over partitions: ``Docket(name, url, partitions=N)``.

``PartitionedStore`` is a ``StorageAdapter`` that routes, and holds no
logic of its own: partition ``i`` is an ordinary store named after its tag's
inner text (``sansio.partitions.partition_tags``: ``orders|0.1``, keys
``{orders|0.1}:...``), so each partition's queue, schedule and records stay
in one hash slot and every guarantee of a store holds per partition.  The
docket-wide things (heartbeats and workers, strikes, the recorded partition
count) stay in ``home``, the ordinary store named ``name``.

- Each partition's store is ``home.sibling(name)``: on ``home``'s client.
- A task key lives in partition ``partition_of(key, N)``; a delivery id
  names its partition, ``"<i>/<entry id>"``.  Effects go to the partition of
  their delivery or key, with the ``i/`` taken off going in and put back on
  the outcomes; a ``Claim`` or ``RenewLeases`` over several partitions is
  split and its outcomes merged.  Steps that run in a scope or in a named
  docket (``Enlist``, a scoped ``ReleaseSlot``, ``WakeParked``) name their
  own namespace, and run on any partition's store.
- Concurrency limits span the partitions: the runtime scopes an unscoped
  limit to the docket's name (``partition_parts.spanning_limits``), so its
  slots live in ``{name}`` and it takes the scoped chain; ``TakeSlot``
  registers the delivery's partition as the waiting docket.
- Reads: ``partition_reads.FairReader``.
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

from .adapter import Depths, ReadResult, StorageAdapter, StoreEvent
from .partition_parts import part_names, settle_layout
from .partition_reads import FairReader
from .sansio.admission import Admit
from .sansio.effects import (
    BuryMalformed,
    Cancel,
    Claim,
    Heartbeat,
    RenewLeases,
    Schedule,
    StoreEffect,
    TakeSlot,
)
from .sansio.errors import UsageError
from .sansio.inputs import Claimed, LeasesRenewed, Outcome
from .sansio.partitions import partition_of, split_delivery_id
from .sansio.strikes import StrikeInstruction, StrikeList
from .sansio.values import (
    DeadLetter,
    ExecutionRecord,
    ProgressRecord,
    StoreSnapshot,
    WorkerRecord,
)
from .serialization import Signing

#: where a piece of an effect goes: a partition, ``HOME``, or ``ANY`` store
HOME, ANY = -1, -2


@attrs.frozen(slots=True)
class _Piece:
    """One effect (or one partition's part of it) on its way to a store."""

    target: int
    effect: StoreEffect
    #: the index of the effect it is (part of)
    origin: int
    #: the partition whose prefix its outcome's delivery ids get back
    partition: int | None


class PartitionedStore:
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
                part = self.home.sibling(name)
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

    def sibling(self, name: str) -> StorageAdapter:
        """An ordinary store of docket ``name`` beside ``home``."""
        return self.home.sibling(name)

    async def record_partitions(self, expected: int, new: int) -> int:
        """The docket's recorded partition count (in ``home``)."""
        return await self.home.record_partitions(expected, new)

    def _spawn(self) -> TaskGroup:
        assert self._group is not None, "the store is not open"
        return self._group

    async def close(self) -> None:
        stack, self._stack, self._reader = self._stack, None, None
        if stack is not None:
            await stack.aclose()
        self.parts = []

    # -- effects ---------------------------------------------------------------------

    async def execute(self, effects: Sequence[StoreEffect]) -> list[Outcome]:
        """Each piece to its store, in as few round trips as order allows.

        Pieces bound for partitions touch disjoint keys, so a run of them goes
        out as one call per partition, side by side.  A piece that touches a
        scope or the home store (a take, an admission, a release, a wake, an
        enlistment, a heartbeat) keeps its place: everything before it has
        been answered before it goes (a finish before the release of its
        slot), and it is answered before anything after it goes."""
        pieces = [piece for index, e in enumerate(effects) for piece in self._route(index, e)]
        in_order = [p.target < 0 or isinstance(p.effect, TakeSlot | Admit) for p in pieces]
        _settle_any(pieces)
        replies: list[Outcome | None] = [None] * len(pieces)
        start = 0
        while start < len(pieces):
            end = start + 1
            if in_order[start]:  # with the next in-order pieces for the same store
                while (
                    end < len(pieces)
                    and in_order[end]
                    and pieces[end].target == pieces[start].target
                ):
                    end += 1
                await self._run(pieces, replies, list(range(start, end)))
            else:
                while end < len(pieces) and not in_order[end]:
                    end += 1
                by_store: dict[int, list[int]] = {}
                for index in range(start, end):
                    by_store.setdefault(pieces[index].target, []).append(index)
                await self._run_side_by_side(pieces, replies, list(by_store.values()))
            start = end
        answered = [reply for reply in replies if reply is not None]
        return _merged(effects, pieces, answered)

    async def _run(
        self, pieces: Sequence[_Piece], replies: list[Outcome | None], indexes: list[int]
    ) -> None:
        """One store call for these pieces (all bound for one store)."""
        store = self._store(pieces[indexes[0]].target)
        outcomes = await store.execute([pieces[index].effect for index in indexes])
        for index, outcome in zip(indexes, outcomes, strict=True):
            replies[index] = outcome

    async def _run_side_by_side(
        self, pieces: Sequence[_Piece], replies: list[Outcome | None], groups: list[list[int]]
    ) -> None:
        """One call per group, concurrently; the first error is raised as it
        is (the core decides what a failed batch means; resends are safe)."""
        if len(groups) == 1:
            await self._run(pieces, replies, groups[0])
            return
        errors: list[Exception] = []

        async def run(indexes: list[int]) -> None:
            try:
                await self._run(pieces, replies, indexes)
            except Exception as error:
                errors.append(error)

        async with anyio.create_task_group() as group:
            for indexes in groups:
                group.start_soon(run, indexes)
        if errors:
            raise errors[0]

    def _store(self, target: int) -> StorageAdapter:
        return self.home if target == HOME else self.parts[target]

    def _split(self, delivery_id: str) -> tuple[int, str]:
        return split_delivery_id(delivery_id, self.partitions)

    def _route(self, index: int, effect: StoreEffect) -> list[_Piece]:
        """The pieces of one effect, each bound for one store."""
        if isinstance(effect, Claim):
            by_part: dict[int, list[Any]] = {}
            for item in effect.items:
                part, entry = self._split(item.delivery_id)
                by_part.setdefault(part, []).append(attrs.evolve(item, delivery_id=entry))
            return [
                _Piece(part, attrs.evolve(effect, items=tuple(items)), index, part)
                for part, items in by_part.items()
            ]
        if isinstance(effect, RenewLeases):
            ids: dict[int, list[str]] = {}
            for delivery_id in effect.delivery_ids:
                part, entry = self._split(delivery_id)
                ids.setdefault(part, []).append(entry)
            if not ids:
                ids[0] = []
            pieces = []
            for n, (part, entries) in enumerate(ids.items()):
                # (the scoped slots, in their own namespaces, ride with the first)
                slots = effect.slots if n == 0 else ()
                renewal = attrs.evolve(effect, delivery_ids=tuple(entries), slots=slots)
                pieces.append(_Piece(part, renewal, index, part))
            return pieces
        if isinstance(effect, Schedule):
            part = partition_of(effect.message.key, self.partitions)
            if effect.acknowledge is not None:
                acknowledged, entry = self._split(effect.acknowledge)
                if acknowledged != part:
                    raise ValueError(f"{effect!r} acknowledges a delivery of another partition")
                effect = attrs.evolve(effect, acknowledge=entry)
            return [_Piece(part, effect, index, part)]
        if isinstance(effect, Cancel):
            return [_Piece(partition_of(effect.key, self.partitions), effect, index, None)]
        if isinstance(effect, Heartbeat):
            # a worker leaving is forgotten as a consumer of every partition too
            extra = range(len(self.parts)) if effect.leaving else ()
            return [_Piece(target, effect, index, None) for target in (HOME, *extra)]
        if isinstance(effect, BuryMalformed):
            part, entry = self._split(effect.entry.delivery_id)
            moved = attrs.evolve(effect, entry=attrs.evolve(effect.entry, delivery_id=entry))
            return [_Piece(part, moved, index, part)]
        named: str | None = getattr(effect, "delivery_id", None)
        if named is not None:
            # Finish, ConfirmSlot, Park, Admit, AcquireSlot; and TakeSlot, whose
            # waiting docket is the delivery's partition (its parked keys live there)
            part, entry = self._split(named)
            changes: dict[str, Any] = {"delivery_id": entry}
            if isinstance(effect, TakeSlot):
                changes["docket"] = self.part_names[part]
            evolved: StoreEffect = attrs.evolve(effect, **changes)  # type: ignore[misc]
            return [_Piece(part, evolved, index, part)]
        # Enlist, ReleaseSlot, WakeParked: their calls name their namespace
        return [_Piece(ANY, effect, index, None)]

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
    ) -> ReadResult:
        assert self._reader is not None, "the store is not open"
        return await self._reader.read(
            worker=worker,
            count=count,
            now=now,
            redelivery_timeout=redelivery_timeout,
            block=block,
            recover=recover,
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
                part, entry = self._split(entry_id)
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


def _settle_any(pieces: list[_Piece]) -> None:
    """Give each piece that may run on any store the store of a neighbour
    (so it rides in its round trip), or partition 0."""
    targets = [p.target for p in pieces]
    for index, piece in enumerate(pieces):
        if piece.target != ANY:
            continue
        before = next((t for t in reversed(targets[:index]) if t >= 0), None)
        after = next((t for t in targets[index + 1 :] if t >= 0), None)
        target = before if before is not None else after if after is not None else 0
        targets[index] = target
        pieces[index] = attrs.evolve(piece, target=target)


def _prefix(outcome: Outcome, partition: int) -> Outcome:
    """``outcome`` with the delivery ids it names in partition ``partition``."""
    if isinstance(outcome, Claimed):
        return Claimed(verdicts=tuple((f"{partition}/{d}", v) for d, v in outcome.verdicts))
    if isinstance(outcome, LeasesRenewed):
        return attrs.evolve(outcome, lost=tuple(f"{partition}/{d}" for d in outcome.lost))
    delivery_id = getattr(outcome, "delivery_id", None)
    if isinstance(delivery_id, str):
        return attrs.evolve(outcome, delivery_id=f"{partition}/{delivery_id}")  # type: ignore[misc]
    return outcome


def _merged(
    effects: Sequence[StoreEffect], pieces: Sequence[_Piece], replies: Sequence[Outcome]
) -> list[Outcome]:
    """One outcome per effect, in order: split claims and renewals merged."""
    gathered: list[list[Outcome]] = [[] for _ in effects]
    for piece, reply in zip(pieces, replies, strict=True):
        outcome = reply if piece.partition is None else _prefix(reply, piece.partition)
        gathered[piece.origin].append(outcome)
    outcomes: list[Outcome] = []
    for effect, parts in zip(effects, gathered, strict=True):
        if len(parts) == 1 or isinstance(effect, Heartbeat):
            outcomes.append(parts[0])
        elif isinstance(effect, Claim):
            verdicts = dict(v for part in parts if isinstance(part, Claimed) for v in part.verdicts)
            outcomes.append(
                Claimed(
                    verdicts=tuple((i.delivery_id, verdicts[i.delivery_id]) for i in effect.items)
                )
            )
        else:
            renewed = [part for part in parts if isinstance(part, LeasesRenewed)]
            outcomes.append(
                LeasesRenewed(
                    lost=tuple(d for part in renewed for d in part.lost),
                    lost_slots=tuple(s for part in renewed for s in part.lost_slots),
                )
            )
    return outcomes


__all__ = ["PartitionedStore"]
