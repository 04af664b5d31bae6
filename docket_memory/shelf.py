"""The data of one in-process docket and the primitive moves on it.

Ready messages wait in an ordered dict by delivery id; future ones in a dict
by key with a heap of ``(when, key, sequence, generation)`` beside it: ties
in ``when`` go in key order, as on the servers' sorted sets, and stale heap
entries are skipped lazily; handed-out ones in ``held`` with their
lease time.  Terminal records expire through a second heap.  Concurrency
slots and waiters live in a ``Pool`` per scope, shared by the shelves of one
location, so a release in one docket can wake a task of another.  A key
parked behind a limit of another scope (the scoped chain, ``scoped_chain.py``)
waits on its own shelf instead (``scoped_parked``, its message in ``future``
at its retry time), and its pool only names the shelf as waiting.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict, deque
from typing import Any

import anyio
import attrs
from anyio.streams.memory import MemoryObjectSendStream

from docket_core.adapter import StateEvent, StoreEvent
from docket_core.sansio.admission import Control, ControlKind
from docket_core.sansio.admission_state import State, expiry
from docket_core.sansio.errors import StoreError
from docket_core.sansio.inputs import Outcome
from docket_core.sansio.strikes import StrikeList
from docket_core.sansio.values import (
    DeadLetter,
    Delivery,
    ExecutionRecord,
    ExecutionState,
    ProgressRecord,
    TaskMessage,
    WorkerRecord,
)


def state_event(key: str, state: ExecutionState, **fields: Any) -> StateEvent:
    """The event published when ``key`` enters ``state`` (``fields``: the
    other fields of ``StateEvent``)."""
    return StateEvent(key=key, state=state, **fields)


#: how often (seconds of the effects' ``now``) ended admission states are
#: forgotten, and how long after their end
ADMISSION_SWEEP = 60.0
ADMISSION_GRACE = 60.0


@attrs.define(slots=True, kw_only=True)
class Held:
    """A message handed to a worker and not yet acknowledged."""

    message: TaskMessage
    worker: str
    delivered_at: float
    renewed_at: float
    #: handed out more than once (a lease taken over, a read recovered)
    redelivered: bool = False


@attrs.define(slots=True, eq=False)
class Waiter:
    """A message parked behind a full limit, with the shelf it belongs to."""

    shelf: Shelf
    message: TaskMessage

    @property
    def key(self) -> str:
        return self.message.key


@attrs.define(slots=True, eq=False)
class Pool:
    """The slots and waiters of the limits of one scope."""

    #: limit key -> holder -> when the holder last renewed its slot
    slots: dict[str, dict[str, float]] = attrs.field(factory=dict)
    waiters: dict[str, deque[Waiter]] = attrs.field(factory=dict)
    #: limit key -> when a waiter of it was last woken
    woken: dict[str, float] = attrs.field(factory=dict)
    #: the limits that have slots or waiters -> the time their next stale
    #: slot counts from (``stale_from``): a read looks only at the limits due
    #: by its cutoff (the servers keep ``S:stale`` for the limits with waiters,
    #: and expire slot sets nobody renews; this store drops them as stale)
    watched: dict[str, float] = attrs.field(factory=dict)
    #: ``(time, limit key)`` of ``watched``; an entry a later one replaced
    #: (its time is no longer the limit's) is skipped when it comes up
    watch_heap: list[tuple[float, str]] = attrs.field(factory=list)
    #: limit key -> the dockets with keys parked behind it by the scoped chain
    #: (docket name -> when it first waited; ``S:stale:<limit>``)
    waiting_dockets: dict[str, dict[str, float]] = attrs.field(factory=dict)
    #: docket name -> its shelf, for every docket that waited here (where a
    #: ``WakeParked`` naming it runs)
    shelves: dict[str, Shelf] = attrs.field(factory=dict)
    #: (kind, key) -> an admission control of this scope and its state
    #: (``admission_state``); the control is kept to tell when the state ends
    admission: dict[tuple[ControlKind, str], tuple[Control, State]] = attrs.field(factory=dict)

    def expire_admission(self, now: float) -> None:
        """Forget the admission states that ended a minute before ``now`` (as
        the servers' TTL: a slower clock may still see them)."""
        cutoff = now - ADMISSION_GRACE
        ended = [where for where, (c, st) in self.admission.items() if expiry(c, st) <= cutoff]
        for where in ended:
            del self.admission[where]

    def wake(self, limit_key: str, now: float) -> int:
        """Queue the oldest live waiter of ``limit_key``; returns how many woke."""
        waiting = self.waiters.get(limit_key)
        while waiting:
            woken = waiting.popleft()
            shelf, message = woken.shelf, woken.message
            if shelf.parked.get(message.key) == (self, limit_key):
                del shelf.parked[message.key]
            record = shelf.records.get(message.key)
            if (
                record is None
                or record.generation != message.generation
                or record.state is not ExecutionState.SCHEDULED
            ):
                continue
            if not waiting:
                del self.waiters[limit_key]
                self.woken.pop(limit_key, None)
            else:
                self.woken[limit_key] = now
            self.restale(limit_key)
            shelf.requeue(message, record, now)
            return 1
        self.waiters.pop(limit_key, None)
        self.woken.pop(limit_key, None)
        self.restale(limit_key)
        return 0

    def enlist(self, limit_key: str, docket: str, since: float) -> None:
        """Register ``docket`` as waiting for ``limit_key`` (an entry already
        there keeps its time, as ``ZADD NX``)."""
        self.waiting_dockets.setdefault(limit_key, {}).setdefault(docket, since)

    def next_waiting(self, limit_key: str) -> str | None:
        """Pop the docket that waited longest for ``limit_key`` (``ZPOPMIN``)."""
        waiting = self.waiting_dockets.get(limit_key)
        if not waiting:
            return None
        docket = min(waiting, key=lambda name: (waiting[name], name))
        del waiting[docket]
        if not waiting:
            del self.waiting_dockets[limit_key]
        return docket

    def stale_from(self, limit_key: str) -> float:
        """When the limit's next stale slot counts from: its oldest renewal,
        or, while nobody holds one, when its last waiter was woken."""
        slots = self.slots.get(limit_key)
        if slots:
            return min(slots.values())
        return self.woken.get(limit_key, -math.inf)

    def restale(self, limit_key: str) -> None:
        """Keep ``watched`` current for a limit whose slots or waiters changed
        (a limit left with neither is forgotten)."""
        if not self.slots.get(limit_key) and not self.waiters.get(limit_key):
            self.slots.pop(limit_key, None)
            self.watched.pop(limit_key, None)
            return
        at = self.stale_from(limit_key)
        if self.watched.get(limit_key) == at:
            return
        self.watched[limit_key] = at
        heapq.heappush(self.watch_heap, (at, limit_key))
        if len(self.watch_heap) > 2 * len(self.watched) + 64:  # mostly replaced entries
            self.watch_heap = [(t, key) for key, t in self.watched.items()]
            heapq.heapify(self.watch_heap)

    def drop_stale_slots(self, now: float, stale_after: float) -> None:
        """Free slots whose holders stopped renewing them (their worker died)
        and queue a waiter for each.  A limit nobody holds whose last woken
        waiter never took its slot within ``stale_after`` (it was cancelled,
        say) wakes the next one, since no release will come for it.  Only
        the limits ``watched`` has due by the cutoff are looked at."""
        cutoff = now - stale_after
        heap, watched = self.watch_heap, self.watched
        due: dict[str, None] = {}
        while heap and heap[0][0] <= cutoff:
            at, limit_key = heapq.heappop(heap)
            if watched.get(limit_key) == at:
                due[limit_key] = None
        for limit_key in due:
            slots = self.slots.get(limit_key, {})
            for holder, renewed in list(slots.items()):
                if renewed <= cutoff:
                    del slots[holder]
                    self.wake(limit_key, now)
            if not slots:
                if not self.waiters.get(limit_key):
                    self.slots.pop(limit_key, None)
                elif self.woken.get(limit_key, -math.inf) <= cutoff:
                    self.wake(limit_key, now)
            # its entry came off the heap above: a new one (or none, if the
            # limit has neither slots nor waiters now)
            watched.pop(limit_key, None)
            self.restale(limit_key)


@attrs.define(slots=True, kw_only=True)
class Memo:
    """The outcomes of one origin's requests, kept for its resends."""

    floor: int = 0
    outcomes: dict[int, Outcome] = attrs.field(factory=dict)
    expires: float = 0.0


@attrs.define(slots=True, eq=False)
class Shelf:
    #: the docket's name: the scope of its limits that name none
    name: str = ""
    #: scope -> its pool, shared by every shelf of one location
    pools: dict[str, Pool] = attrs.field(factory=dict)
    records: dict[str, ExecutionRecord] = attrs.field(factory=dict)
    ready: OrderedDict[str, TaskMessage] = attrs.field(factory=OrderedDict)
    #: key -> delivery id of its ready message
    ready_ids: dict[str, str] = attrs.field(factory=dict)
    future: dict[str, TaskMessage] = attrs.field(factory=dict)
    due_heap: list[tuple[float, str, int, int]] = attrs.field(factory=list)
    held: dict[str, Held] = attrs.field(factory=dict)
    #: when the last read that went through ``held`` for stale leases began
    #: that look, and when the look under way (cut short) began (``take``)
    scanned_at: float = -math.inf
    scan_began: float | None = None
    #: key -> the pool and limit it waits behind
    parked: dict[str, tuple[Pool, str]] = attrs.field(factory=dict)
    #: key -> (scope, limit key) of a key parked by the scoped chain: its
    #: message waits in ``future`` at its retry time (``park_scoped``)
    scoped_parked: dict[str, tuple[str, str]] = attrs.field(factory=dict)
    #: (scope, limit key) -> key -> when it parked (``P:waiters:<S>|<limit>``)
    scoped_waiters: dict[tuple[str, str], dict[str, float]] = attrs.field(factory=dict)
    progress: dict[str, ProgressRecord] = attrs.field(factory=dict)
    expiry_heap: list[tuple[float, str, int]] = attrs.field(factory=list)
    workers: dict[str, WorkerRecord] = attrs.field(factory=dict)
    strikes: StrikeList = attrs.field(factory=StrikeList)
    #: malformed entries set aside, oldest first
    dead: list[DeadLetter] = attrs.field(factory=list)
    subscribers: dict[str, set[MemoryObjectSendStream[StoreEvent]]] = attrs.field(factory=dict)
    cancel_listeners: set[MemoryObjectSendStream[tuple[str, int]]] = attrs.field(factory=set)
    waiting: list[anyio.Event] = attrs.field(factory=list)
    ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    #: origin -> the outcomes of its requests (``docket_core.sansio.effects.Request``)
    memos: dict[str, Memo] = attrs.field(factory=dict)
    #: when ``expire`` next forgets the admission states that ended
    admission_sweep: float = 0.0
    #: how many partitions the docket is spread over (``{name}:partitions``)
    partitions: int = 1
    #: the count a change of it left, until its partitions are sealed
    #: (``{name}:leaving``)
    leaving: int | None = None
    #: how many times the count changed (``{name}:epoch``)
    epoch: int = 0
    #: the leases of the changes of the partition count under way, as
    #: ``(count, owner)``, and when they run out (``P:closing``,
    #: ``close.lua``): nobody adds here while one holds
    closing: set[tuple[int, str]] = attrs.field(factory=set)
    closing_until: float = 0.0
    #: ``(count, epoch)``: the count changed to ``count`` (the docket's
    #: ``epoch``th change): only its producers add here (``P:closed``)
    sealed: tuple[int, int] | None = None

    def leases(self, now: float) -> set[tuple[int, str]]:
        """The close leases that hold at ``now`` (the set, emptied once they
        ran out)."""
        if self.closing and self.closing_until <= now:
            self.closing.clear()
        return self.closing

    def refuse_closed(self, count: int, now: float) -> None:
        """Raise as ``refuse_closed`` in the scripts' prelude does, for an
        add by a producer of ``count`` partitions."""
        where = f"{{{self.name}}}"
        leases = self.leases(now)
        if leases:
            to = next(iter(leases))[0]
            raise StoreError(
                f"docket: {where} is closed while the docket changes to {to} "
                f"partitions; open it with partitions={to}"
            )
        if self.sealed is None or self.sealed[0] == count:
            return
        to = self.sealed[0]
        raise StoreError(
            f"docket: {where} is closed: the docket has {to} partitions now; "
            f"open it with partitions={to}"
        )

    def pool(self, scope: str | None = None) -> Pool:
        """The pool of ``scope`` (``None``: this docket's own)."""
        name = self.name if scope is None else scope
        pool = self.pools.get(name)
        if pool is None:
            pool = self.pools[name] = Pool()
        return pool

    @property
    def slots(self) -> dict[str, dict[str, float]]:
        """The slots of this docket's own pool."""
        return self.pool().slots

    @property
    def waiters(self) -> dict[str, deque[Waiter]]:
        """The waiters of this docket's own pool (of any docket sharing it)."""
        return self.pool().waiters

    # -- notification ----------------------------------------------------------

    def notify(self) -> None:
        """Wake every reader waiting for work."""
        if self.waiting:
            waiting, self.waiting = self.waiting, []
            for event in waiting:
                event.set()

    async def changed(self) -> None:
        """Wait until something is queued or scheduled."""
        event = anyio.Event()
        self.waiting.append(event)
        try:
            await event.wait()
        finally:
            if event in self.waiting:
                self.waiting.remove(event)

    def publish_state(self, key: str, state: ExecutionState, **fields: Any) -> None:
        """Publish ``key``'s entering ``state`` (``state_event``), if anyone listens."""
        if key in self.subscribers:
            self.publish(key, state_event(key, state, **fields))

    def publish(self, key: str, event: StoreEvent) -> None:
        listeners = self.subscribers.get(key)
        if listeners:
            for send in list(listeners):
                try:
                    send.send_nowait(event)
                except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    listeners.discard(send)

    # -- queues ----------------------------------------------------------------

    def enqueue(self, message: TaskMessage, now: float) -> ExecutionState:
        """Queue ``message`` if due, else schedule it; returns the new state."""
        if message.when <= now:
            delivery_id = str(next(self.ids))
            self.ready[delivery_id] = message
            self.ready_ids[message.key] = delivery_id
            state = ExecutionState.QUEUED
        else:
            self.future[message.key] = message
            heapq.heappush(
                self.due_heap,
                (message.when, message.key, next(self.ids), message.generation),
            )
            state = ExecutionState.SCHEDULED
        self.notify()
        return state

    def unqueue(self, key: str) -> None:
        """Remove the key's scheduled, queued or parked message, if any."""
        self.future.pop(key, None)
        delivery_id = self.ready_ids.pop(key, None)
        if delivery_id is not None:
            self.ready.pop(delivery_id, None)
        if self.parked:
            self.unpark(key)
        if self.scoped_parked:
            self.unpark_scoped(key)

    def next_due(self) -> float | None:
        heap = self.due_heap
        while heap:
            when, key, _, generation = heap[0]
            message = self.future.get(key)
            if message is not None and message.generation == generation:
                return when
            heapq.heappop(heap)
        return None

    def due_count(self, now: float) -> int:
        """How many scheduled messages are due by ``now`` (not yet queued):
        walks only the heap entries due by then (a heap's children never
        come sooner than their parent), checking each is still current."""
        heap, future = self.due_heap, self.future
        count, stack = 0, [0] if heap else []
        while stack:
            index = stack.pop()
            when, key, _, generation = heap[index]
            if when > now:
                continue
            message = future.get(key)
            if message is not None and message.generation == generation:
                count += 1
            stack.extend(child for child in (2 * index + 1, 2 * index + 2) if child < len(heap))
        return count

    def promote(self, now: float) -> None:
        """Queue every scheduled message whose time has come."""
        heap = self.due_heap
        while heap and heap[0][0] <= now:
            _, key, _, generation = heapq.heappop(heap)
            message = self.future.get(key)
            if message is None or message.generation != generation:
                continue
            del self.future[key]
            if self.scoped_parked:
                self.unpark_scoped(key)  # its retry time came: no longer waiting
            self.enqueue(message, now)
            record = self.records.get(key)
            if record is not None and record.generation == generation:
                self.records[key] = attrs.evolve(record, state=ExecutionState.QUEUED)
                self.publish_state(key, ExecutionState.QUEUED, when=message.when)

    def take(
        self,
        worker: str,
        count: int,
        now: float,
        redelivery_timeout: float,
        *,
        recover: bool = False,
        scan_every: float = 0.0,
    ) -> list[Delivery]:
        """Promote due messages, (with ``recover``) hand back what ``worker``
        holds, take over stale leases (when no read went through them within
        ``scan_every`` seconds, as the servers' read script does), hand out
        queued ones."""
        self.promote(now)
        deliveries: list[Delivery] = []
        if recover:
            for delivery_id, held in self.held.items():
                if held.worker == worker:
                    held.renewed_at = now
                    held.redelivered = True
                    deliveries.append(
                        Delivery(delivery_id=delivery_id, message=held.message, redelivered=True)
                    )
        for pool in self.pools.values():
            if pool.watch_heap:
                pool.drop_stale_slots(now, redelivery_timeout)
        since = now - self.scanned_at
        if self.scan_began is not None or not 0 <= since < scan_every:
            # (a scan counts from when it began; one cut short by ``count``
            # goes on with the next read, as the servers' cursor does)
            began = now if self.scan_began is None else self.scan_began
            self.scan_began = began
            cutoff = now - redelivery_timeout
            for delivery_id, held in self.held.items():
                if len(deliveries) >= count:
                    break
                if held.renewed_at <= cutoff:
                    held.worker = worker
                    held.renewed_at = now
                    held.redelivered = True
                    deliveries.append(
                        Delivery(delivery_id=delivery_id, message=held.message, redelivered=True)
                    )
            else:
                self.scanned_at, self.scan_began = began, None
        ready = self.ready
        while ready and len(deliveries) < count:
            delivery_id, message = ready.popitem(last=False)
            del self.ready_ids[message.key]
            self.held[delivery_id] = Held(
                message=message, worker=worker, delivered_at=now, renewed_at=now
            )
            deliveries.append(Delivery(delivery_id=delivery_id, message=message))
        return deliveries

    # -- records -----------------------------------------------------------------

    def conclude(self, record: ExecutionRecord, now: float, ttl: float) -> None:
        """Store a terminal record for ``ttl`` seconds (0: forget it) and publish it."""
        key = record.key
        if ttl > 0:
            self.records[key] = record
            heapq.heappush(self.expiry_heap, (now + ttl, key, record.generation))
        else:
            self.records.pop(key, None)
        self.publish_state(key, record.state, completed_at=record.completed_at, error=record.error)

    def cancel(
        self,
        record: ExecutionRecord,
        now: float,
        ttl: float,
        state: ExecutionState = ExecutionState.CANCELLED,
        error: str | None = None,
    ) -> int:
        """Conclude ``record`` as ``state`` (cancelled unless told) under a new
        generation, so no copy of its message in flight may start; its
        scheduled, queued or parked message goes too.  Returns the generation."""
        key = record.key
        self.unqueue(key)
        self.progress.pop(key, None)
        generation = next(self.ids)
        ended = attrs.evolve(
            record,
            generation=generation,
            state=state,
            completed_at=now,
            error=error if error is not None else record.error,
            cancel_ttl=None,
        )
        self.conclude(ended, now, ttl)
        return generation

    def expire(self, now: float) -> None:
        if now >= self.admission_sweep:
            # admission states end by themselves (``expiry``): a sweep now and then
            self.admission_sweep = now + ADMISSION_SWEEP
            for pool in self.pools.values():
                if pool.admission:
                    pool.expire_admission(now)
        heap = self.expiry_heap
        while heap and heap[0][0] <= now:
            _, key, generation = heapq.heappop(heap)
            record = self.records.get(key)
            if record is not None and record.generation == generation and record.state.terminal:
                del self.records[key]

    # -- concurrency limits --------------------------------------------------------

    def park(self, pool: Pool, limit_key: str, message: TaskMessage, now: float) -> None:
        """Put a claimed message behind its limit until a slot frees (unless
        it was superseded meanwhile, or already waits there).  One whose key
        was cancelled since its claim never waits: it concludes cancelled."""
        record = self.records.get(message.key)
        if record is None or record.generation != message.generation:
            return
        if record.cancel_ttl is not None:
            self.cancel(record, now, record.cancel_ttl)
            return
        if self.parked.get(message.key) == (pool, limit_key):
            return
        pool.waiters.setdefault(limit_key, deque()).append(Waiter(self, message))
        pool.restale(limit_key)
        self.parked[message.key] = (pool, limit_key)
        self.records[message.key] = attrs.evolve(
            record, state=ExecutionState.SCHEDULED, worker=None, started_at=None
        )
        self.progress.pop(message.key, None)
        self.publish_state(message.key, ExecutionState.SCHEDULED)

    def unpark(self, key: str) -> None:
        parked = self.parked.pop(key, None)
        if parked is None:
            return
        pool, limit_key = parked
        waiting = pool.waiters.get(limit_key)
        if waiting is None:
            return
        kept = deque(w for w in waiting if w.shelf is not self or w.key != key)
        if kept:
            pool.waiters[limit_key] = kept
        else:
            del pool.waiters[limit_key]

    def requeue(self, message: TaskMessage, record: ExecutionRecord, now: float) -> None:
        """Queue a woken waiter's message now."""
        message = attrs.evolve(message, when=min(message.when, now))
        self.enqueue(message, now)
        self.records[message.key] = attrs.evolve(record, state=ExecutionState.QUEUED)
        self.publish_state(message.key, ExecutionState.QUEUED)

    # -- the scoped chain (``docket_core.sansio.effects.Park``, ``WakeParked``) ----

    def park_scoped(
        self, scope: str, limit_key: str, message: TaskMessage, now: float, retry_at: float
    ) -> None:
        """Put a claimed key behind a scoped limit: among its waiters here,
        its message scheduled at ``retry_at`` (its ``when`` unchanged)."""
        key = message.key
        record = self.records[key]
        self.scoped_waiters.setdefault((scope, limit_key), {})[key] = now
        self.scoped_parked[key] = (scope, limit_key)
        self.future[key] = message
        heapq.heappush(self.due_heap, (retry_at, key, next(self.ids), message.generation))
        self.records[key] = attrs.evolve(
            record, state=ExecutionState.SCHEDULED, worker=None, started_at=None
        )
        self.progress.pop(key, None)
        self.publish_state(key, ExecutionState.SCHEDULED)
        self.notify()

    def unpark_scoped(self, key: str) -> None:
        """Clear a key's scoped parking (its message stays where it is)."""
        parked = self.scoped_parked.pop(key, None)
        if parked is None:
            return
        waiting = self.scoped_waiters.get(parked)
        if waiting is not None:
            waiting.pop(key, None)
            if not waiting:
                del self.scoped_waiters[parked]

    def wake_scoped(self, scope: str, limit_key: str, now: float) -> tuple[int, int, float | None]:
        """Queue the oldest live key parked here behind the scoped limit;
        returns (woken, how many still wait, the oldest one's park time)."""
        where = (scope, limit_key)
        waiting = self.scoped_waiters.get(where, {})
        woken = 0
        while waiting and not woken:
            key = min(waiting, key=lambda k: (waiting[k], k))
            del waiting[key]
            record = self.records.get(key)
            message = self.future.get(key)
            if (
                self.scoped_parked.get(key) != where
                or record is None
                or record.state is not ExecutionState.SCHEDULED
                or message is None
            ):
                continue
            del self.scoped_parked[key]
            del self.future[key]
            self.requeue(message, record, now)
            woken = 1
        if not waiting:
            self.scoped_waiters.pop(where, None)
            return woken, 0, None
        return woken, len(waiting), min(waiting.values())
