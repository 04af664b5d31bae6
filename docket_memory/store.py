"""The in-process store: the reference implementation of the storage algebra.

Every effect is carried out in one synchronous step, so each is atomic by
construction; the only awaits are the waits for work and for events.  Dockets
with the same ``memory://`` URL and name in one process share one ``Shelf``.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import attrs
from anyio.streams.memory import MemoryObjectSendStream

from docket_core.adapter import ClosingStep, Depths, ProgressEvent, ReadResult, StoreEvent
from docket_core.held_calls import HeldCalls
from docket_core.lua.entries import parse_entry
from docket_core.sansio.admission import Admit, Admitted, Verdict
from docket_core.sansio.decisions import is_live
from docket_core.sansio.effects import (
    AcquireSlot,
    BuryMalformed,
    Cancel,
    Claim,
    Finish,
    Heartbeat,
    RenewLeases,
    Request,
    Schedule,
    StoreEffect,
    TakeSlot,
)
from docket_core.sansio.errors import UsageError
from docket_core.sansio.inputs import (
    Buried,
    Cancelled,
    Claimed,
    ClaimVerdict,
    Finished,
    HeartbeatSent,
    LeasesRenewed,
    Outcome,
    Scheduled,
    SlotTaken,
)
from docket_core.sansio.layout_change import CountRecorded
from docket_core.sansio.local_slots import SlotStep
from docket_core.sansio.partitions import entry_of
from docket_core.sansio.strikes import StrikeInstruction, StrikeList
from docket_core.sansio.values import (
    LIVE_STATES,
    DeadLetter,
    Delivery,
    ExecutionRecord,
    ExecutionState,
    ProgressRecord,
    RunningRecord,
    ScheduleMode,
    StoreSnapshot,
    TaskMessage,
    WorkerRecord,
)

from . import scoped_chain, slots
from .shelf import Memo, Pool, Shelf

_SHELVES: dict[tuple[str, str], Shelf] = {}
#: location -> scope -> pool: the concurrency limits the dockets of a location share
_POOLS: dict[str, dict[str, Pool]] = {}


def shelf_for(location: str, name: str) -> Shelf:
    """The shared state of ``memory://location`` for docket ``name``."""
    shelf = _SHELVES.get((location, name))
    if shelf is None:
        pools = _POOLS.setdefault(location, {})
        shelf = _SHELVES[(location, name)] = Shelf(name=name, pools=pools)
    return shelf


#: a close lease's owner, as close.lua takes it
_OWNER = re.compile(r"[A-Za-z0-9-]*")


class MemoryStore(HeldCalls):
    """A ``StorageAdapter`` over an in-process ``Shelf``."""

    def __init__(
        self, *, name: str, location: str = "", shelf: Shelf | None = None, partitions: int = 1
    ) -> None:
        self.name = name
        #: the count of the layout this store is a partition of, which its
        #: adds name (``StorageAdapter.sibling``)
        self.partitions = partitions
        #: the ``memory://`` location its siblings share
        self.location = location
        self.shelf = shelf if shelf is not None else shelf_for(location, name)

    @classmethod
    def from_url(cls, url: str, *, name: str) -> MemoryStore:
        if not url.startswith("memory://"):
            raise UsageError(f"not a memory:// URL: {url!r}")
        return cls(name=name, location=url[len("memory://") :])

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def sibling(self, name: str, partitions: int = 1) -> MemoryStore:
        """Docket ``name`` in this store's location (a store built around a
        shelf of its own: the location it was given, ``""`` by default)."""
        return MemoryStore(name=name, location=self.location, partitions=partitions)

    async def record_partitions(
        self, expected: int, new: int, epoch: int | None = None
    ) -> CountRecorded:
        if expected < 1 or new < 1 or (epoch is not None and epoch < 0):
            raise ValueError(f"partition counts are at least 1, not {expected} and {new}")
        shelf = self.shelf
        recorded = CountRecorded(count=shelf.partitions, leaving=shelf.leaving, epoch=shelf.epoch)
        now_at = epoch is None or epoch == shelf.epoch
        if recorded.count == expected and recorded.leaving is None and expected != new and now_at:
            shelf.partitions, shelf.leaving = new, expected
            shelf.epoch += 1
        return recorded

    async def forget_leaving(self, old: int, epoch: int | None = None) -> None:
        if old < 1 or (epoch is not None and epoch < 0):
            raise ValueError(f"partition counts are at least 1, not {old}")
        if self.shelf.leaving == old and (epoch is None or epoch == self.shelf.epoch):
            self.shelf.leaving = None

    async def close_partition(
        self, op: ClosingStep, count: int, epoch: int, lease: float, now: float, owner: str = ""
    ) -> bool:
        if (
            op not in ("close", "undo", "seal", "unseal")
            or count < 0
            or epoch < 0
            or not _OWNER.fullmatch(owner)
        ):
            raise ValueError(f"not a closing step: {op!r} with count {count}, epoch {epoch}")
        shelf = self.shelf
        leases, mine = shelf.leases(now), (count, owner)
        if op == "close":
            if await self.pending():
                return False
            leases.add(mine)
            shelf.closing_until = now + lease
            return True
        if op == "undo":
            if mine not in leases:
                return False
            leases.discard(mine)
            return True
        sealed = shelf.sealed
        if op == "seal":
            if sealed is not None and sealed[1] >= epoch:
                return True
            held = mine in leases
            shelf.sealed = (count, epoch)
            leases.clear()
            return held or not await self.pending()
        if sealed is not None and sealed[0] != count and sealed[1] <= epoch:
            shelf.sealed = (count, epoch)
            return True
        return False

    # -- effects -------------------------------------------------------------

    #: when false, resends act again (for tests that show why they must not)
    remember_outcomes = True

    #: (``StorageAdapter.sends_at_once``: effects are carried out at once)
    sends_at_once = True
    #: (``StorageAdapter.keeps_order``: carried out at once, a worker's
    #: batches have nothing to overlap)
    keeps_order = False

    async def execute_in_order(self, effects: Sequence[StoreEffect]) -> list[Outcome]:
        return await self.execute(effects)

    async def execute(self, effects: Sequence[StoreEffect]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for effect in effects:
            request: Request | None = getattr(effect, "request", None)
            if request is None or not self.remember_outcomes:
                outcomes.append(self._carry_out(effect))
                continue
            now: float = getattr(effect, "now")  # noqa: B009 (every remembered effect has one)
            memo = self._memo(request, now)
            first = memo.outcomes.get(request.seq)
            if first is not None:
                outcomes.append(self._replay(effect, first, now))
                continue
            outcome = self._carry_out(effect)
            memo.outcomes[request.seq] = outcome
            outcomes.append(outcome)
        self.shelf.expire(max((getattr(e, "now", 0.0) for e in effects), default=0.0))
        return outcomes

    def _memo(self, request: Request, now: float) -> Memo:
        """The origin's memo, pruned below its floor and kept ``remember`` on."""
        memos = self.shelf.memos
        memo = memos.get(request.origin)
        if memo is None or memo.expires <= now:
            memo = memos[request.origin] = Memo(floor=request.floor)
        if request.floor > memo.floor:
            for seq in [s for s in memo.outcomes if s < request.floor]:
                del memo.outcomes[seq]
            memo.floor = request.floor
        memo.expires = now + request.remember
        return memo

    def _replay(self, effect: StoreEffect, first: Outcome, now: float) -> Outcome:
        """The first outcome of a resent effect, checked against what time may
        have changed since: a claimed delivery another worker holds now is
        lost; an acquired slot is renewed to ``now``, or lost if taken over."""
        shelf = self.shelf
        if isinstance(effect, Claim) and isinstance(first, Claimed):
            verdicts = []
            for delivery_id, verdict in first.verdicts:
                held = shelf.held.get(delivery_id)
                if verdict is ClaimVerdict.CLAIMED:
                    if held is None or held.worker != effect.worker:
                        verdict = ClaimVerdict.LOST
                    else:
                        held.renewed_at = now
                verdicts.append((delivery_id, verdict))
            return Claimed(verdicts=tuple(verdicts))
        if (
            isinstance(effect, Admit)
            and isinstance(first, Admitted)
            and first.verdict is Verdict.ADMIT
            and effect.settles
            and not self._sender_holds(effect.request, effect.delivery_id)
        ):
            return Admitted(delivery_id=effect.delivery_id, verdict=Verdict.LOST)
        if isinstance(effect, AcquireSlot | SlotStep):
            return slots.replay(self, effect, first, now)
        if isinstance(effect, TakeSlot) and isinstance(first, SlotTaken):
            return scoped_chain.replay_take(shelf, effect, first)
        return first

    def _carry_out(self, effect: StoreEffect) -> Outcome:
        step = scoped_chain.STEPS.get(type(effect))
        if step is not None:
            return step(self.shelf, effect)
        handler = slots.HANDLERS.get(type(effect))
        if handler is not None:
            return handler(self, effect)
        name = _HANDLERS.get(type(effect))
        if name is None:
            raise TypeError(f"the memory store cannot carry out {effect!r}")
        outcome: Outcome = getattr(self, name)(effect)
        return outcome

    def _heartbeat(self, effect: Heartbeat) -> HeartbeatSent:
        workers = self.shelf.workers
        if effect.leaving:
            workers.pop(effect.worker, None)
        else:
            workers[effect.worker] = WorkerRecord(
                name=effect.worker, last_seen=effect.now, tasks=frozenset(effect.tasks)
            )
        return HeartbeatSent()

    def _schedule(self, effect: Schedule) -> Scheduled:
        shelf = self.shelf
        shelf.refuse_closed(self.partitions, effect.now)
        message = effect.message
        key = message.key
        if effect.acknowledge is not None:
            if not self._holds(effect.request, effect.acknowledge):
                return Scheduled(key=key, accepted=False, generation=-1, state=None)
            shelf.held.pop(effect.acknowledge, None)
        record = shelf.records.get(key)
        if effect.expect_generation is not None and (
            record is None or record.generation != effect.expect_generation
        ):
            return Scheduled(key=key, accepted=False, generation=-1, state=None)
        if (
            effect.expect_generation is not None
            and record is not None
            and record.cancel_ttl is not None
        ):
            # nothing follows a run whose key was cancelled while it ran
            ended = effect.ended or ExecutionState.CANCELLED
            shelf.cancel(record, effect.now, record.cancel_ttl, ended, effect.ended_error)
            return Scheduled(key=key, accepted=False, generation=-1, state=None)
        if (
            effect.mode is ScheduleMode.ADD
            and record is not None
            and record.state in LIVE_STATES
            and record.cancel_ttl is None
        ):
            return Scheduled(
                key=key, accepted=False, generation=record.generation, state=record.state
            )
        if effect.ended is not None:
            shelf.publish_state(
                key, effect.ended, completed_at=effect.now, error=effect.ended_error
            )
        shelf.unqueue(key)
        # generations come from one docket-wide counter, so they are never
        # reused, even after a record was deleted (execution_ttl=0) or expired
        generation = next(shelf.ids)
        message = attrs.evolve(message, generation=generation)
        state = shelf.enqueue(message, effect.now)
        shelf.records[key] = ExecutionRecord(
            key=key,
            function=message.function,
            payload=message.payload,
            when=message.when,
            attempt=message.attempt,
            generation=generation,
            state=state,
        )
        shelf.progress.pop(key, None)
        shelf.publish_state(key, state, when=message.when)
        return Scheduled(key=key, accepted=True, generation=generation, state=state)

    def _claim(self, effect: Claim) -> Claimed:
        shelf = self.shelf
        verdicts: list[tuple[str, ClaimVerdict]] = []
        for item in effect.items:
            entry = entry_of(item.delivery_id)  # (a partition's Claim keeps its prefixes)
            record = shelf.records.get(item.key)
            held = shelf.held.get(entry)
            if held is None or held.worker != effect.worker:
                verdicts.append((item.delivery_id, ClaimVerdict.LOST))
                continue
            if record is not None and record.state is ExecutionState.CANCELLED:
                verdict = ClaimVerdict.CANCELLED
            elif record is None or record.generation != item.generation or record.state.terminal:
                verdict = ClaimVerdict.SUPERSEDED
            elif record.cancel_ttl is not None:
                # cancelled while it ran, and its worker never recorded the end
                verdict = ClaimVerdict.CANCELLED
                shelf.cancel(record, effect.now, record.cancel_ttl)
            else:
                verdict = ClaimVerdict.CLAIMED
            if verdict is not ClaimVerdict.CLAIMED:
                shelf.held.pop(entry, None)
            else:
                assert record is not None
                if effect.renew:
                    held.renewed_at = effect.now
                shelf.records[item.key] = attrs.evolve(
                    record,
                    state=ExecutionState.RUNNING,
                    worker=effect.worker,
                    started_at=effect.now,
                )
                if held.redelivered:  # (progress 0 of 100 until a report: ``get_progress``)
                    shelf.progress.pop(item.key, None)
                # (else its run may have started with the claim, and reported)
                shelf.publish_state(
                    item.key, ExecutionState.RUNNING, worker=effect.worker, started_at=effect.now
                )
            verdicts.append((item.delivery_id, verdict))
        return Claimed(verdicts=tuple(verdicts))

    def _holds(self, request: Request | None, delivery_id: str) -> bool:
        """Whether no other worker than the sender of a worker's effect holds
        the delivery now (a producer's effects, without a request, concern none)."""
        if request is None:
            return True
        held = self.shelf.held.get(delivery_id)
        return held is None or held.worker == request.worker

    def _sender_holds(self, request: Request | None, delivery_id: str) -> bool:
        """Whether the sender of a worker's effect holds the delivery now: not
        another worker, nor none (a send the store has forgotten since, say,
        parked and acknowledged it)."""
        if request is None:
            return True
        held = self.shelf.held.get(delivery_id)
        return held is not None and held.worker == request.worker

    def _finish(self, effect: Finish) -> Finished:
        shelf = self.shelf
        entry = entry_of(effect.delivery_id)  # (a partition's Finish keeps its prefix)
        if not self._holds(effect.request, entry):
            return Finished(delivery_id=effect.delivery_id, recorded=False)
        shelf.held.pop(entry, None)
        record = shelf.records.get(effect.key)
        if record is None or record.generation != effect.generation:
            return Finished(delivery_id=effect.delivery_id, recorded=False)
        shelf.progress.pop(effect.key, None)
        shelf.conclude(
            attrs.evolve(
                record,
                state=effect.state,
                completed_at=effect.now,
                error=effect.error,
                result=effect.result,
                cancel_ttl=None,
            ),
            effect.now,
            effect.ttl,
        )
        return Finished(delivery_id=effect.delivery_id, recorded=True)

    def _bury(self, effect: BuryMalformed) -> Buried:
        shelf = self.shelf
        entry = effect.entry
        held = shelf.held.get(entry.delivery_id)
        if held is None or held.worker != effect.worker:
            return Buried(delivery_id=entry.delivery_id, moved=False)
        del shelf.held[entry.delivery_id]
        letter = DeadLetter(
            entry_id=str(next(shelf.ids)),
            original_id=entry.delivery_id,
            reason=entry.reason,
            dead_at=effect.now,
            key=entry.key,
            fields=entry.fields,
        )
        shelf.dead.append(letter)
        del shelf.dead[:-DEAD_LETTER_LIMIT]
        record = shelf.records.get(entry.key) if entry.key is not None else None
        # a running record belongs to whoever claimed it: a copy never fails it
        if record is None or record.state not in _WAITING or record.generation != entry.generation:
            return Buried(delivery_id=entry.delivery_id, moved=True)
        shelf.unqueue(record.key)
        shelf.progress.pop(record.key, None)
        failed = attrs.evolve(
            record, state=ExecutionState.FAILED, completed_at=effect.now, error=entry.reason
        )
        shelf.conclude(failed, effect.now, effect.ttl)
        return Buried(delivery_id=entry.delivery_id, moved=True, failed_key=True)

    def _cancel(self, effect: Cancel) -> Cancelled:
        shelf = self.shelf
        key = effect.key
        record = shelf.records.get(key)
        if record is None or record.state.terminal:
            return Cancelled(key=key, previous=record.state if record else None)
        if record.state is not ExecutionState.RUNNING:
            spared = shelf.cancel(record, effect.now, effect.ttl)
        else:
            # the run records its own end; only its follow-ups are called off
            spared = record.generation + 1
            if record.cancel_ttl is None:
                shelf.records[key] = attrs.evolve(record, cancel_ttl=effect.ttl)
        for send in list(shelf.cancel_listeners):
            send.send_nowait((key, spared))
        return Cancelled(key=key, previous=record.state)

    def _renew(self, effect: RenewLeases) -> LeasesRenewed:
        shelf = self.shelf
        lost: list[str] = []
        lost_slots: list[str] = []
        for delivery_id in effect.delivery_ids:
            held = shelf.held.get(delivery_id)
            if held is None or held.worker != effect.worker:
                lost.append(delivery_id)
            else:
                held.renewed_at = effect.now
        for slot in effect.slots:
            pool = shelf.pool(slot.scope)
            slots = pool.slots.get(slot.limit_key)
            if slots is not None and slot.holder in slots:
                slots[slot.holder] = effect.now
                pool.restale(slot.limit_key)
            else:
                lost_slots.append(slot.holder)
        return LeasesRenewed(lost=tuple(lost), lost_slots=tuple(lost_slots))

    # -- reads ---------------------------------------------------------------

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
        shelf = self.shelf
        deliveries = shelf.take(
            worker, count, now, redelivery_timeout, recover=recover, scan_every=stale_scan_every
        )
        next_due = shelf.next_due()
        if not deliveries and block > 0:
            # never wait past the soonest due time
            wait = block if next_due is None else min(block, max(next_due - now, 0.0))
            with anyio.move_on_after(wait):
                await shelf.changed()
        return ReadResult(deliveries=tuple(deliveries), next_due=next_due, fresh=not recover)

    async def pending(self) -> int:
        shelf = self.shelf
        return len(shelf.ready) + len(shelf.future) + len(shelf.held) + len(shelf.parked)

    async def depths(self, now: float) -> Depths:
        shelf = self.shelf
        due = shelf.due_count(now)
        return Depths(
            queued=len(shelf.ready) + due,
            scheduled=len(shelf.future) - due + len(shelf.parked),
            held=len(shelf.held),
        )

    async def get_record(self, key: str) -> ExecutionRecord | None:
        return self.shelf.records.get(key)

    async def get_progress(self, key: str) -> ProgressRecord | None:
        # a running key's progress is made by its first report: until then
        # it reads as 0 of 100 (as inspect.lua's 'progress' does)
        progress = self.shelf.progress.get(key)
        if progress is None:
            record = self.shelf.records.get(key)
            if record is not None and record.state is ExecutionState.RUNNING:
                return ProgressRecord()
        return progress

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
        shelf = self.shelf
        progress = shelf.progress.get(key) or ProgressRecord()
        record = shelf.records.get(key)
        if generation is not None and (record is None or record.generation != generation):
            return progress
        changes: dict[str, Any] = {"updated_at": now}
        if current is not None:
            changes["current"] = current
        if increment is not None:
            changes["current"] = changes.get("current", progress.current) + increment
        if total is not None:
            changes["total"] = total
        if clear_message or message == "":
            changes["message"] = None
        elif message is not None:
            changes["message"] = message
        progress = attrs.evolve(progress, **changes)
        shelf.progress[key] = progress
        if key in shelf.subscribers:
            event = ProgressEvent(
                key=key,
                current=progress.current,
                total=progress.total,
                message=progress.message,
                updated_at=progress.updated_at,
            )
            shelf.publish(key, event)
        return progress

    @asynccontextmanager
    async def subscribe(self, key: str) -> AsyncIterator[AsyncIterator[StoreEvent]]:
        send, receive = anyio.create_memory_object_stream[StoreEvent](max_buffer_size=1000)
        listeners = self.shelf.subscribers.setdefault(key, set())
        listeners.add(send)
        try:
            async with receive:
                yield receive
        finally:
            listeners.discard(send)
            if not listeners:
                self.shelf.subscribers.pop(key, None)
            send.close()

    @asynccontextmanager
    async def cancellations(self) -> AsyncIterator[AsyncIterator[tuple[str, int]]]:
        send: MemoryObjectSendStream[tuple[str, int]]
        send, receive = anyio.create_memory_object_stream[tuple[str, int]](max_buffer_size=10_000)
        self.shelf.cancel_listeners.add(send)
        try:
            async with receive:
                yield receive
        finally:
            self.shelf.cancel_listeners.discard(send)
            send.close()

    async def add_strike(self, instruction: StrikeInstruction) -> None:
        self.shelf.strikes.apply(instruction)

    async def strikes(self) -> StrikeList:
        return self.shelf.strikes

    async def snapshot(self, now: float, limit: int = 1000) -> StoreSnapshot:
        shelf = self.shelf
        future: list[TaskMessage] = list(shelf.ready.values())
        future.extend(shelf.future.values())
        for pool in shelf.pools.values():
            for waiting in pool.waiters.values():
                future.extend(w.message for w in waiting if w.shelf is shelf)
        future.sort(key=lambda m: m.when)
        running = [
            RunningRecord(message=h.message, worker=h.worker, started=h.delivered_at)
            for h in shelf.held.values()
        ]
        return StoreSnapshot(
            taken=now,
            future=tuple(future[:limit]),
            running=tuple(running[:limit]),
            workers=tuple(shelf.workers.values()),
            future_total=len(future),
            running_total=len(running),
            dead_letters=len(shelf.dead),
        )

    async def workers(self, now: float, horizon: float) -> list[WorkerRecord]:
        return [w for w in self.shelf.workers.values() if is_live(w.last_seen, now, horizon)]

    async def clear(self, now: float, ttl: float) -> int:
        shelf = self.shelf
        keys = [m.key for m in shelf.ready.values()] + list(shelf.future) + list(shelf.parked)
        for key in keys:
            record = shelf.records.get(key)
            if record is not None and not record.state.terminal:
                shelf.cancel(record, now, ttl)
        return len(keys)

    async def dead_letters(self, limit: int = 1000) -> tuple[int, list[DeadLetter]]:
        dead = self.shelf.dead
        return len(dead), list(reversed(dead[-limit:])) if limit > 0 else []

    async def replay_dead_letters(self, entry_ids: Sequence[str] | None) -> int:
        """As the servers do: the key of a letter that reads as a message is
        queued again when the bury failed it (same generation) or it has no
        record; one that still does not read, or whose key moved on, goes
        back and is set aside again (it stays here)."""
        shelf = self.shelf
        shelf.refuse_closed(self.partitions, time.time())
        wanted = None if entry_ids is None else set(entry_ids)
        letters = [d for d in shelf.dead if wanted is None or d.entry_id in wanted]
        for letter in letters:
            flat = [part for field in letter.fields for part in field]
            parsed = parse_entry(letter.original_id, flat)
            if not isinstance(parsed, Delivery):
                continue
            shelf.dead.remove(letter)
            message = parsed.message
            record = shelf.records.get(message.key)
            if record is not None and not (
                record.state is ExecutionState.FAILED and record.generation == message.generation
            ):
                continue  # superseded: its claim would drop it
            state = shelf.enqueue(message, message.when)  # due: queued at once
            shelf.records[message.key] = ExecutionRecord(
                key=message.key,
                function=message.function,
                payload=message.payload,
                when=message.when,
                attempt=message.attempt,
                generation=message.generation,
                state=state,
            )
            shelf.publish_state(message.key, state, when=message.when)
        return len(letters)

    async def drop_dead_letters(self, entry_ids: Sequence[str] | None) -> int:
        shelf = self.shelf
        before = len(shelf.dead)
        if entry_ids is None:
            shelf.dead.clear()
        else:
            wanted = set(entry_ids)
            shelf.dead[:] = [d for d in shelf.dead if d.entry_id not in wanted]
        return before - len(shelf.dead)


#: the states in which a malformed copy of a key's message fails the key
_WAITING = frozenset({ExecutionState.QUEUED, ExecutionState.SCHEDULED})

#: how many dead letters a docket keeps (the newest), as the servers do
DEAD_LETTER_LIMIT = 10_000

#: effect type -> the name of the method that carries it out
_HANDLERS: dict[type[StoreEffect], str] = {
    Finish: "_finish",
    Claim: "_claim",
    Schedule: "_schedule",
    RenewLeases: "_renew",
    Cancel: "_cancel",
    Heartbeat: "_heartbeat",
    BuryMalformed: "_bury",
}
