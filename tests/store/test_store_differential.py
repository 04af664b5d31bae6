"""Differential test: the memory store and the Redis store answer alike.

A hypothesis ``RuleBasedStateMachine`` sends the same effect batches to a
``MemoryStore`` (the reference implementation) and to a ``RedisStore`` on the
session's private redis-server, and after every step compares the outcomes,
the record and progress of every key, ``pending()`` and what each read hands
out.  Time is a virtual ``now`` both stores receive.

What differs legitimately between the stores, and is mapped rather than
compared:

- delivery ids (each store names its own): the machine keeps its own handle
  for every delivery and a per-store map from handle to delivery id;
- generation numbers: both stores draw them from one docket-wide counter,
  but the memory store's counter also numbers its delivery ids and its heap
  entries, so the numbers differ.  What the contract guarantees is that a
  generation is new (never reused) and that equal generations mean the same
  execution: the machine pairs each new generation of one store with the new
  generation of the other (``_pair``), and a pairing that breaks is a
  difference.

Redelivery is kept out of reach (``REDELIVERY`` never runs out: the Redis
stream measures idleness on the server's real clock), and so are record
expiry (TTLs far beyond the virtual time an example spans: the memory store
expires on the virtual clock, Redis on the real one) and publish/subscribe.

Every difference the machine ever found is fixed, so it compares everything,
``depths()`` included (at ``now`` and later, so the scheduled messages due by
then count as queued).  ``DOCKET_DIFFERENTIAL_KNOWN=name,...`` switches the
exclusion of a fixed difference (``KNOWN`` below) back on by name, to look
past one while hunting another.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from docket_core.sansio.admission import (
    Admit,
    Admitted,
    Control,
    CooldownPolicy,
    DebouncePolicy,
    RateLimitPolicy,
    Verdict,
)
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import (
    AcquireSlot,
    BuryMalformed,
    Cancel,
    Claim,
    ClaimItem,
    Finish,
    HeldSlot,
    ReleaseSlot,
    RenewLeases,
    Request,
    Schedule,
    StoreEffect,
)
from docket_core.sansio.inputs import (
    Buried,
    Cancelled,
    Claimed,
    ClaimVerdict,
    Finished,
    LeasesRenewed,
    Outcome,
    Scheduled,
    SlotAcquired,
    SlotReleased,
)
from docket_core.sansio.values import ExecutionState, MalformedEntry, ScheduleMode, TaskMessage
from docket_memory import store as memory_module
from docket_memory.store import MemoryStore
from docket_redis import RedisStore

KEYS = ("a", "b", "c", "d")
#: the admission controls a claimed delivery may be judged against
ADMISSIONS: tuple[tuple[Control, ...], ...] = (
    (DebouncePolicy(key="d", settle=5.0),),
    (CooldownPolicy(key="c", window=7.0),),
    (RateLimitPolicy(key="r", limit=1, per=10.0),),
    (DebouncePolicy(key="d", settle=5.0), RateLimitPolicy(key="rd", limit=1, per=6.0, drop=True)),
)
WORKERS = ("w1", "w2")
LIMITS = {"L1": 1, "L2": 2}
#: never runs out within an example (see the module docstring)
REDELIVERY = 100_000.0
#: slots do go stale within an example: takeovers are part of the model
STALE_AFTER = 10.0
#: records outlive every example (memory expires them on the virtual clock,
#: Redis on the real one)
TTL = 100_000.0
#: outcomes are remembered far longer than an example's virtual time
REMEMBER = 10_000.0
START = 1_000.0
MEMORY, REDIS = 0, 1
STORES = (MEMORY, REDIS)

#: Differences the machine found.  Fixed since, so no longer excluded (their
#: exclusions stay, to be switched on by name): "stray-progress",
#: "progress-reply-time", "unqueued-delivery",
#: "progress-current-and-increment", "progress-message-and-clear",
#: "due-ties".  Fixed by moving the wake-up entries out of the queue stream
#: (to ``P:wake``), their exclusions gone with them: "wake-entries" and
#: "wake-read".
#:
#: - "stray-progress": progress reported for a key that has no record (a
#:   stray report) survives a later add of the key on Redis
#:   (``schedule.lua`` deletes the progress hash only when a record existed);
#:   the memory store drops it with every accepted schedule.  Excluded by
#:   reporting progress only for keys that have a record.
#: - "progress-reply-time": ``report_progress`` with a generation that is no
#:   longer the key's returns the progress unchanged on memory, but Redis's
#:   reply carries ``updated_at=now`` (``protocol.parse_progress_reply``
#:   stamps every reply with ``now``; the script does not return
#:   ``updated``).  Excluded by comparing that reply without ``updated_at``
#:   (the stored progress is still compared in full after every step).
#: - "wake-entries": Redis's ``pending()`` counted the stream's wake entries
#:   (``schedule.lua`` added one to the queue stream when a new soonest
#:   message was scheduled, the next read acknowledged it) as messages.
#: - "wake-read": a Redis read counted the wake entries it met against
#:   ``count``, so a read of 1 that met a leftover wake entry (its scheduled
#:   message cancelled, say) handed out nothing although a message was
#:   queued; the memory store handed it out.
#: - "unqueued-delivery": a delivered but not yet claimed message keeps its
#:   record's ``sid`` on Redis (only ``claim.lua`` clears it), so a cancel or
#:   a replace then ``XDEL``s the delivered entry.  It is still held by the
#:   worker, but Redis's ``pending()`` no longer counts it, and the next
#:   read (``XAUTOCLAIM``) or renewal (``XCLAIM``) silently drops it from the
#:   group's pending list, after which its claim answers ``lost`` on Redis
#:   but ``cancelled``/``superseded`` on memory (which still counts it as
#:   held until then).  Excluded by adding such deliveries (found after
#:   every step: ``find_unqueued``) to Redis's count, taking Redis's
#:   ``lost`` for memory's verdict in their claims, and not renewing them.
#: - "progress-current-and-increment": ``report_progress(current=c,
#:   increment=i)``: memory sets ``old current + i`` (the increment overrides
#:   ``current``), Redis sets ``c + i``.  Excluded by never passing both.
#: - "due-ties": messages due at the same ``when`` are queued in insertion
#:   order on memory (its due heap breaks ties by a sequence number), in key
#:   order on Redis (a sorted set breaks score ties by member), so a read of
#:   fewer than all of them hands out different keys.  Excluded by giving
#:   each key its own fraction of a second in every future ``when``.
#: - "progress-message-and-clear": ``report_progress(message=m,
#:   clear_message=True)``: memory keeps ``m``, Redis clears it.  Excluded
#:   by never passing both.
KNOWN: frozenset[str] = frozenset(
    name for name in os.environ.get("DOCKET_DIFFERENTIAL_KNOWN", "").split(",") if name
)

URL: str | None = None


def due(now: float, delay: float, key: str) -> float:
    """The ``when`` of a message of ``key`` ``delay`` seconds from ``now``."""
    if delay > 0 and "due-ties" in KNOWN:
        return now + delay + KEYS.index(key) / 10
    return now + delay


def run(loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, Any]) -> Any:
    return loop.run_until_complete(coroutine)


def ends_a_run(**more: st.SearchStrategy[Any]) -> Callable[[Callable[..., None]], Any]:
    """A rule that ends a claimed run (with a precondition: there is one),
    drawing ``data``, the ``state`` it ends in, its ``result``, ``more``
    and whether its reply is dropped (``drop``)."""

    def decorate(function: Callable[..., None]) -> Any:
        return precondition(lambda self: any(h.held and h.claimed for h in self.free_handles()))(
            rule(
                data=st.data(),
                state=st.sampled_from([ExecutionState.COMPLETED, ExecutionState.FAILED]),
                result=st.none() | st.sampled_from([b"r1", b"r2"]),
                **more,
                drop=st.sampled_from([False, False, True]),
            )(function)
        )

    return decorate


@attrs.define
class Handle:
    """One delivery, as the machine knows it (the same in both stores)."""

    name: str
    worker: str
    key: str
    generation: int  # canonical
    ids: tuple[str, str]  # per store
    messages: tuple[TaskMessage, TaskMessage]  # per store
    held: bool = True
    claimed: bool = False
    acquire_tried: bool = False
    slot: tuple[str, str] | None = None  # (limit, holder)
    #: part of a batch whose reply was dropped: nothing may act on it but the resend
    locked: bool = False
    #: its key was cancelled or replaced before it was claimed
    unqueued: bool = False


@attrs.define
class Sent:
    """A batch of one worker (one origin) that carried requests."""

    spec: list[tuple[Any, ...]]
    effects: tuple[list[StoreEffect], list[StoreEffect]]
    #: the canonical first outcomes (per store, they must agree)
    first: list[Any]
    dropped: bool


class StoreDifferential(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert URL is not None
        self.loop = asyncio.new_event_loop()
        self.name = f"diff-{uuid.uuid4().hex}"
        self.location = uuid.uuid4().hex
        self.stores: tuple[Any, Any] = (
            MemoryStore(name=self.name, location=self.location),
            RedisStore.from_url(URL, name=self.name),
        )
        run(self.loop, self.stores[REDIS].open())
        self.now = START
        #: per store: store generation -> canonical, and back
        self.canon: tuple[dict[int, int], dict[int, int]] = ({}, {})
        self.store_gen: tuple[dict[int, int], dict[int, int]] = ({}, {})
        self.next_canon = 1
        self.handles: dict[str, Handle] = {}
        self.by_id: tuple[dict[str, str], dict[str, str]] = ({}, {})
        self.next_handle = 1
        self.next_seq = dict.fromkeys(WORKERS, 1)
        self.last: dict[str, Sent] = {}
        #: every handle ever marked ``unqueued`` (see "unqueued-delivery")
        self.unqueued_names: set[str] = set()

    def teardown(self) -> None:
        try:
            run(self.loop, self.stores[REDIS].close())
        finally:
            self.loop.close()
            memory_module._SHELVES.pop((self.location, self.name), None)
            memory_module._POOLS.pop(self.location, None)

    # -- helpers --------------------------------------------------------------

    def both(self, method: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        return tuple(  # type: ignore[return-value]
            run(self.loop, getattr(self.stores[s], method)(*args, **kwargs)) for s in STORES
        )

    def _pair(self, gm: int, gr: int) -> tuple[Any, Any]:
        """Canonical generations of a pair of store generations: both new, a
        new pair; both known, their canonical numbers (which must agree)."""
        if gm == -1 or gr == -1:
            return gm if gm == -1 else self._look(MEMORY, gm), gr if gr == -1 else self._look(
                REDIS, gr
            )
        known = (gm in self.canon[MEMORY], gr in self.canon[REDIS])
        if known == (False, False):
            c = self.next_canon
            self.next_canon += 1
            self.canon[MEMORY][gm], self.canon[REDIS][gr] = c, c
            self.store_gen[MEMORY][c], self.store_gen[REDIS][c] = gm, gr
        return self._look(MEMORY, gm), self._look(REDIS, gr)

    def _look(self, s: int, g: int) -> Any:
        return self.canon[s].get(g, f"unpaired-{'mr'[s]}{g}")

    def _handle_of(self, s: int, delivery_id: str) -> str:
        return self.by_id[s].get(delivery_id, f"unknown-{'mr'[s]}{delivery_id}")

    def request(self, worker: str, count: int) -> list[Request]:
        """The next ``count`` requests of ``worker``: every earlier outcome was
        used (a worker with a dropped reply sends nothing but its resend), so
        the floor is the first of them."""
        first = self.next_seq[worker]
        self.next_seq[worker] += count
        # ``Request.worker`` (the consumer the origin reads as) is newer
        # than some versions of the contract: pass it where it exists
        extra = {"worker": worker} if "worker" in attrs.fields_dict(Request) else {}
        return [
            Request(
                origin=f"{worker}#{self.name}",
                seq=first + i,
                floor=first,
                remember=REMEMBER,
                **extra,
            )
            for i in range(count)
        ]

    def find_unqueued(self) -> None:
        """Mark the deliveries held but not claimed whose stream entry Redis
        deleted (see "unqueued-delivery" in ``KNOWN``)."""
        store = self.stores[REDIS]
        for h in self.handles.values():
            if h.held and not h.claimed and not h.locked and not h.unqueued:
                entry_id = h.ids[REDIS]
                if not run(self.loop, store.client.xrange(store.layout.stream, entry_id, entry_id)):
                    h.unqueued = True
                    self.unqueued_names.add(h.name)

    def blocked(self, worker: str) -> bool:
        sent = self.last.get(worker)
        return sent is not None and sent.dropped

    def free_handles(self, worker: str | None = None) -> list[Handle]:
        return [
            h
            for h in self.handles.values()
            if not h.locked
            and (worker is None or h.worker == worker)
            and not self.blocked(h.worker)
        ]

    def finish_of(
        self,
        handle: Handle,
        s: int,
        state: ExecutionState,
        result: bytes | None,
        request: Request | None = None,
    ) -> Finish:
        """The ``Finish`` of ``handle``'s run for store ``s``."""
        return Finish(
            delivery_id=handle.ids[s],
            key=handle.key,
            generation=handle.messages[s].generation,
            state=state,
            now=self.now,
            ttl=TTL,
            error="ValueError: boom" if state is ExecutionState.FAILED else None,
            result=result,
            request=request,
        )

    # -- outcomes ---------------------------------------------------------------

    def canonical(self, outcomes: tuple[list[Outcome], list[Outcome]]) -> list[Any]:
        """Both stores' outcomes in canonical form; they must be equal."""
        assert len(outcomes[MEMORY]) == len(outcomes[REDIS])
        out: tuple[list[Any], list[Any]] = ([], [])
        for om, orr in zip(*outcomes, strict=True):
            if isinstance(om, Scheduled) and isinstance(orr, Scheduled):
                cm, cr = self._pair(om.generation, orr.generation)
                out[MEMORY].append(attrs.evolve(om, generation=cm))
                out[REDIS].append(attrs.evolve(orr, generation=cr))
                continue
            for s, o in ((MEMORY, om), (REDIS, orr)):
                out[s].append(self._canonical_one(s, o))
        if "unqueued-delivery" in KNOWN:
            for i, (om, orr) in enumerate(zip(*out, strict=True)):
                if isinstance(om, tuple) and om[0] == "claim" and isinstance(orr, tuple):
                    out[REDIS][i] = (
                        "claim",
                        tuple(
                            (name, vm)
                            if vr is ClaimVerdict.LOST
                            and vm in (ClaimVerdict.CANCELLED, ClaimVerdict.SUPERSEDED)
                            and name in self.unqueued_names
                            else (name, vr)
                            for (name, vm), (_, vr) in zip(om[1], orr[1], strict=True)
                        ),
                    )
        assert out[MEMORY] == out[REDIS], (
            f"outcomes differ:\n  memory: {out[MEMORY]}\n  redis:  {out[REDIS]}"
        )
        return out[MEMORY]

    def _canonical_one(self, s: int, o: Outcome) -> Any:
        if isinstance(o, Scheduled):
            return attrs.evolve(
                o, generation=o.generation if o.generation == -1 else self._look(s, o.generation)
            )
        if isinstance(o, Claimed):
            return ("claim", tuple((self._handle_of(s, d), v) for d, v in o.verdicts))
        if isinstance(o, Finished):
            return ("finish", self._handle_of(s, o.delivery_id), o.recorded)
        if isinstance(o, Buried):
            return ("buried", self._handle_of(s, o.delivery_id), o.moved, o.failed_key)
        if isinstance(o, SlotAcquired):
            return ("slot", self._handle_of(s, o.delivery_id), o.acquired, o.lost)
        if isinstance(o, Admitted):
            return ("admitted", self._handle_of(s, o.delivery_id), o.verdict, o.at, o.blocked_by)
        if isinstance(o, LeasesRenewed):
            return ("renewed", tuple(self._handle_of(s, d) for d in o.lost), o.lost_slots)
        if isinstance(o, (Cancelled, SlotReleased)):
            return o
        return o

    def execute(self, build: Any) -> list[Any]:
        """Build the batch for each store (``build(store) -> effects``), run it
        on both, return the canonical outcomes (checked equal)."""
        effects = (build(MEMORY), build(REDIS))
        outcomes = (
            run(self.loop, self.stores[MEMORY].execute(effects[MEMORY])),
            run(self.loop, self.stores[REDIS].execute(effects[REDIS])),
        )
        return self.canonical(outcomes)

    def send(self, worker: str, spec: list[tuple[Any, ...]], build: Any, drop: bool) -> None:
        """A worker's batch with requests: run it; use the outcomes, or (a
        dropped reply) lock what it touched until it is resent."""
        effects = (build(MEMORY), build(REDIS))
        outcomes = (
            run(self.loop, self.stores[MEMORY].execute(effects[MEMORY])),
            run(self.loop, self.stores[REDIS].execute(effects[REDIS])),
        )
        first = self.canonical(outcomes)
        self.last[worker] = Sent(spec=spec, effects=effects, first=first, dropped=drop)
        if drop:
            for item in spec:
                for handle in item[1]:
                    handle.locked = True
            return
        self.apply(spec, first)

    def apply(self, spec: list[tuple[Any, ...]], outcomes: list[Any]) -> None:
        """What the worker learns from the (first) outcomes of its batch."""
        for (kind, handles, *rest), outcome in zip(spec, outcomes, strict=True):
            for handle in handles:
                handle.locked = False
            if kind == "claim":
                for handle, (_, verdict) in zip(handles, outcome[1], strict=True):
                    if verdict is ClaimVerdict.CLAIMED:
                        handle.claimed = True
                    else:
                        handle.held = False
            elif kind == "acquire":
                (handle,) = handles
                acquired, lost = outcome[2], outcome[3]
                if acquired:
                    handle.slot = (rest[0], rest[1])
                elif not lost:
                    handle.held = False  # parked: acknowledged
            elif kind == "release":
                (handle,) = handles
                handle.slot = None
            elif kind == "admit":
                (handle,) = handles
                if outcome[2] is not Verdict.ADMIT:
                    handle.held = False  # settled (dropped or rescheduled), or another's
            elif kind in ("finish", "follow-up", "bury"):
                (handle,) = handles
                handle.held = False
        self.forget()

    def forget(self) -> None:
        for name in [
            n for n, h in self.handles.items() if not h.held and h.slot is None and not h.locked
        ]:
            del self.handles[name]

    # -- rules: producers ---------------------------------------------------------

    @rule(
        keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=2),
        mode=st.sampled_from(ScheduleMode),
        delay=st.sampled_from([0.0, 0.0, 1.0, 5.0, 15.0]),
        payload=st.sampled_from([b"x", b"y"]),
    )
    def add(self, keys: list[str], mode: ScheduleMode, delay: float, payload: bytes) -> None:
        self.execute(
            lambda s: [
                plan_add(
                    key=key,
                    function="task",
                    payload=payload,
                    when=due(self.now, delay, key),
                    mode=mode,
                    now=self.now,
                )
                for key in keys
            ]
        )

    @rule(delta=st.sampled_from([1.0, 5.0, 10.0, 20.0, 31.0]))
    def tick(self, delta: float) -> None:
        self.now += delta

    @rule(
        data=st.data(),
        key=st.sampled_from(KEYS),
        current=st.none() | st.integers(0, 5),
        increment=st.none() | st.integers(1, 3),
        total=st.none() | st.sampled_from([10, 100]),
        message=st.none() | st.sampled_from(["m1", "m2"]),
        clear_message=st.booleans(),
    )
    def progress(
        self,
        data: st.DataObject,
        key: str,
        current: int | None,
        increment: int | None,
        total: int | None,
        message: str | None,
        clear_message: bool,
    ) -> None:
        if "stray-progress" in KNOWN and self.both("get_record", key) == (None, None):
            return
        if "progress-current-and-increment" in KNOWN and current is not None:
            increment = None
        if "progress-message-and-clear" in KNOWN and message is not None:
            clear_message = False
        generation = data.draw(st.none() | st.sampled_from(sorted(self.store_gen[MEMORY]) or [0]))
        replies = tuple(
            run(
                self.loop,
                self.stores[s].report_progress(
                    key,
                    now=self.now,
                    generation=None
                    if generation is None
                    else self.store_gen[s].get(generation, -5),
                    current=current,
                    increment=increment,
                    total=total,
                    message=message,
                    clear_message=clear_message,
                ),
            )
            for s in STORES
        )
        if "progress-reply-time" in KNOWN:
            replies = tuple(attrs.evolve(r, updated_at=None) for r in replies)  # type: ignore[assignment]
        assert replies[MEMORY] == replies[REDIS], f"report_progress replies differ: {replies}"

    # -- rules: workers -----------------------------------------------------------

    @rule(
        worker=st.sampled_from(WORKERS),
        count=st.integers(1, 3),
        claim=st.booleans(),
        limit=st.none() | st.sampled_from(["L1", "L1", "L2"]),
        drop=st.sampled_from([False, False, True]),
        controls=st.none() | st.sampled_from(ADMISSIONS),
    )
    def read(
        self,
        worker: str,
        count: int,
        claim: bool,
        limit: str | None,
        drop: bool,
        controls: tuple[Control, ...] | None,
    ) -> None:
        """A read and, as a worker goes on, a claim of what it brought, the
        admission of each claimed delivery (when its task has controls) and
        the acquisition of a slot for each one admitted."""
        taken = self._read(worker, count)
        if not (claim and taken) or self.blocked(worker):
            return
        self._claim(worker, taken, drop)
        claimed = [h for h in taken if h.held and h.claimed and not h.locked]
        if controls is not None and claimed:
            self._admit(worker, claimed, controls, drop)
            claimed = [h for h in claimed if h.held and not h.locked]
        if limit is not None and claimed:
            self._acquire(worker, claimed, limit, drop)

    def _read(self, worker: str, count: int) -> list[Handle]:
        options = dict(worker=worker, now=self.now, redelivery_timeout=REDELIVERY, block=0)
        results = self.both("read", count=count, **options)
        seen: tuple[list[Any], list[Any]] = ([], [])
        for s in STORES:
            for d in results[s].deliveries:
                m = d.message
                seen[s].append(
                    (
                        m.key,
                        self._look(s, m.generation),
                        m.function,
                        m.payload,
                        m.when,
                        m.attempt,
                        d.redelivered,
                    )
                )
        assert sorted(seen[MEMORY]) == sorted(seen[REDIS]), (
            f"reads differ:\n  memory: {seen[MEMORY]}\n  redis:  {seen[REDIS]}"
        )
        assert results[MEMORY].next_due == results[REDIS].next_due, (
            f"next_due differs: {results[MEMORY].next_due} != {results[REDIS].next_due}"
        )
        taken = []
        redis_by = {
            (d.message.key, self._look(REDIS, d.message.generation)): d
            for d in results[REDIS].deliveries
        }
        for dm in results[MEMORY].deliveries:
            generation = self._look(MEMORY, dm.message.generation)
            dr = redis_by[(dm.message.key, generation)]
            name = f"d{self.next_handle}"
            self.next_handle += 1
            self.handles[name] = Handle(
                name=name,
                worker=worker,
                key=dm.message.key,
                generation=generation,
                ids=(dm.delivery_id, dr.delivery_id),
                messages=(dm.message, dr.message),
            )
            self.by_id[MEMORY][dm.delivery_id] = name
            self.by_id[REDIS][dr.delivery_id] = name
            taken.append(self.handles[name])
        return taken

    @precondition(lambda self: any(h.held and not h.claimed for h in self.free_handles()))
    @rule(data=st.data(), drop=st.sampled_from([False, False, True]))
    def claim(self, data: st.DataObject, drop: bool) -> None:
        workers = sorted({h.worker for h in self.free_handles() if h.held and not h.claimed})
        worker = data.draw(st.sampled_from(workers))
        candidates = [h for h in self.free_handles(worker) if h.held and not h.claimed]
        chosen = data.draw(
            st.lists(st.sampled_from(candidates), min_size=1, unique_by=lambda h: h.name)
        )
        self._claim(worker, chosen, drop)

    def _claim(self, worker: str, chosen: list[Handle], drop: bool) -> None:
        (request,) = self.request(worker, 1)
        self.send(
            worker,
            [("claim", chosen)],
            lambda s: [
                Claim(
                    worker=worker,
                    items=tuple(
                        ClaimItem(
                            delivery_id=h.ids[s], key=h.key, generation=h.messages[s].generation
                        )
                        for h in chosen
                    ),
                    now=self.now,
                    request=request,
                )
            ],
            drop,
        )

    @precondition(
        lambda self: any(h.held and h.claimed and not h.acquire_tried for h in self.free_handles())
    )
    @rule(
        data=st.data(),
        limit=st.sampled_from(["L1", "L1", "L2"]),
        drop=st.sampled_from([False, False, True]),
    )
    def acquire(self, data: st.DataObject, limit: str, drop: bool) -> None:
        candidates = [
            h for h in self.free_handles() if h.held and h.claimed and not h.acquire_tried
        ]
        if not candidates:
            return
        handle = data.draw(st.sampled_from(candidates))
        self._acquire(handle.worker, [handle], limit, drop)

    def _acquire(self, worker: str, handles: list[Handle], limit: str, drop: bool) -> None:
        """One batch of acquisitions of ``limit``, one per handle."""
        requests = self.request(worker, len(handles))
        holders = [f"{h.worker}/{h.name}" for h in handles]
        for handle in handles:
            handle.acquire_tried = True
        self.send(
            worker,
            [("acquire", [h], limit, holder) for h, holder in zip(handles, holders, strict=True)],
            lambda s: [
                AcquireSlot(
                    limit_key=limit,
                    holder=holder,
                    max_concurrent=LIMITS[limit],
                    now=self.now,
                    stale_after=STALE_AFTER,
                    delivery_id=handle.ids[s],
                    message=handle.messages[s],
                    request=request,
                )
                for handle, holder, request in zip(handles, holders, requests, strict=True)
            ],
            drop,
        )

    @precondition(
        lambda self: any(h.held and h.claimed and not h.acquire_tried for h in self.free_handles())
    )
    @rule(
        data=st.data(),
        controls=st.sampled_from(ADMISSIONS),
        drop=st.sampled_from([False, False, True]),
    )
    def admit(self, data: st.DataObject, controls: tuple[Control, ...], drop: bool) -> None:
        """Judge a claimed delivery against admission controls (``admit.lua``
        and the memory algebra), a blocked one settled in the same step."""
        candidates = [
            h for h in self.free_handles() if h.held and h.claimed and not h.acquire_tried
        ]
        if not candidates:
            return
        handle = data.draw(st.sampled_from(candidates))
        self._admit(handle.worker, [handle], controls, drop)

    def _admit(
        self, worker: str, handles: list[Handle], controls: tuple[Control, ...], drop: bool
    ) -> None:
        """One batch of admissions, one per handle (one script call)."""
        requests = self.request(worker, len(handles))
        for handle in handles:
            handle.acquire_tried = True
        self.send(
            worker,
            [("admit", [h]) for h in handles],
            lambda s: [
                Admit(
                    delivery_id=handle.ids[s],
                    message=handle.messages[s],
                    controls=controls,
                    now=self.now,
                    stale_after=STALE_AFTER,
                    ttl=TTL,
                    request=request,
                )
                for handle, request in zip(handles, requests, strict=True)
            ],
            drop,
        )

    @precondition(lambda self: any(h.slot is not None for h in self.free_handles()))
    @rule(data=st.data(), drop=st.sampled_from([False, False, True]))
    def release(self, data: st.DataObject, drop: bool) -> None:
        candidates = [h for h in self.free_handles() if h.slot is not None]
        if not candidates:
            return
        handle = data.draw(st.sampled_from(candidates))
        assert handle.slot is not None
        limit, holder = handle.slot
        (request,) = self.request(handle.worker, 1)
        self.send(
            handle.worker,
            [("release", [handle])],
            lambda s: [ReleaseSlot(limit_key=limit, holder=holder, now=self.now, request=request)],
            drop,
        )

    @ends_a_run(and_release=st.booleans())
    def finish(
        self,
        data: st.DataObject,
        state: ExecutionState,
        result: bytes | None,
        and_release: bool,
        drop: bool,
    ) -> None:
        candidates = [h for h in self.free_handles() if h.held and h.claimed]
        if not candidates:
            return
        handle = data.draw(st.sampled_from(candidates))
        slot = handle.slot if and_release else None
        requests = self.request(handle.worker, 2 if slot else 1)
        spec: list[tuple[Any, ...]] = [("finish", [handle])]
        if slot:
            spec.append(("release", [handle]))

        def build(s: int) -> list[StoreEffect]:
            effects: list[StoreEffect] = [
                self.finish_of(handle, s, state, result, request=requests[0])
            ]
            if slot:
                effects.append(
                    ReleaseSlot(
                        limit_key=slot[0], holder=slot[1], now=self.now, request=requests[1]
                    )
                )
            return effects

        self.send(handle.worker, spec, build, drop)

    @precondition(lambda self: any(h.held for h in self.free_handles()))
    @rule(data=st.data(), drop=st.sampled_from([False, False, True]))
    def bury(self, data: st.DataObject, drop: bool) -> None:
        """Set a delivery aside as malformed (the stores cannot tell it is
        not): to the dead letters, failing its key while it is current."""
        candidates = [h for h in self.free_handles() if h.held]
        if not candidates:
            return
        handle = data.draw(st.sampled_from(candidates))
        (request,) = self.request(handle.worker, 1)
        self.send(
            handle.worker,
            [("bury", [handle])],
            lambda s: [
                BuryMalformed(
                    worker=handle.worker,
                    entry=MalformedEntry(
                        delivery_id=handle.ids[s],
                        reason="malformed on purpose",
                        key=handle.key,
                        generation=handle.messages[s].generation,
                    ),
                    now=self.now,
                    ttl=TTL,
                    request=request,
                )
            ],
            drop,
        )

    @precondition(lambda self: any(h.held and h.claimed for h in self.free_handles()))
    @rule(
        data=st.data(),
        delay=st.sampled_from([0.0, 1.0, 10.0]),
        ended=st.sampled_from([None, ExecutionState.COMPLETED, ExecutionState.FAILED]),
        drop=st.sampled_from([False, False, True]),
    )
    def follow_up(
        self, data: st.DataObject, delay: float, ended: ExecutionState | None, drop: bool
    ) -> None:
        """A retry (no ``ended``) or the next run of a perpetual task (with
        how this one ended): replace the message the delivery came from,
        acknowledging it in the same step.  After a cancel of the running
        key, nothing is stored and the record concludes."""
        error = "ValueError: boom" if ended is ExecutionState.FAILED else None
        candidates = [h for h in self.free_handles() if h.held and h.claimed]
        if not candidates:
            return
        handle = data.draw(st.sampled_from(candidates))
        (request,) = self.request(handle.worker, 1)
        self.send(
            handle.worker,
            [("follow-up", [handle])],
            lambda s: [
                Schedule(
                    message=attrs.evolve(
                        handle.messages[s],
                        when=due(self.now, delay, handle.key),
                        attempt=handle.messages[s].attempt + 1,
                    ),
                    mode=ScheduleMode.REPLACE,
                    now=self.now,
                    acknowledge=handle.ids[s],
                    expect_generation=handle.messages[s].generation,
                    ended=ended,
                    ended_error=error,
                    request=request,
                )
            ],
            drop,
        )

    @rule(
        key=st.sampled_from(KEYS),
        worker=st.sampled_from((None, *WORKERS)),
        drop=st.sampled_from([False, False, True]),
    )
    def cancel(self, key: str, worker: str | None, drop: bool) -> None:
        """A producer's cancel (no request), or one a worker sends."""
        if worker is not None and self.blocked(worker):
            return
        if worker is None:
            self.execute(lambda s: [Cancel(key=key, now=self.now, ttl=TTL)])
            return
        (request,) = self.request(worker, 1)
        self.send(
            worker,
            [("cancel", [])],
            lambda s: [Cancel(key=key, now=self.now, ttl=TTL, request=request)],
            drop,
        )

    @precondition(lambda self: any(h.held and h.claimed for h in self.free_handles()))
    @rule(data=st.data())
    def cancel_running(self, data: st.DataObject) -> None:
        """A producer's cancel of a key a claimed delivery runs: the record
        is only marked, and what the run sends next meets the mark."""
        candidates = [h for h in self.free_handles() if h.held and h.claimed]
        if not candidates:
            return
        handle = data.draw(st.sampled_from(candidates))
        self.execute(lambda s: [Cancel(key=handle.key, now=self.now, ttl=TTL)])

    @rule(worker=st.sampled_from(WORKERS))
    def renew(self, worker: str) -> None:
        mine = [h for h in self.free_handles(worker)]
        held = [
            h
            for h in mine
            if h.held and not (h.unqueued and not h.claimed and "unqueued-delivery" in KNOWN)
        ]
        slotted = [h for h in mine if h.slot is not None]
        (outcome,) = self.execute(
            lambda s: [
                RenewLeases(
                    worker=worker,
                    delivery_ids=tuple(h.ids[s] for h in held),
                    slots=tuple(HeldSlot(limit_key=h.slot[0], holder=h.slot[1]) for h in slotted),  # type: ignore[index]
                    now=self.now,
                )
            ]
        )
        _, lost, lost_slots = outcome
        for h in held:
            if h.name in lost:
                h.held = False
        for h in slotted:
            if h.slot is not None and h.slot[1] in lost_slots:
                h.slot = None
        self.forget()

    @precondition(lambda self: bool(self.last))
    @rule(data=st.data(), later=st.sampled_from([0.0, 1.0, 5.0]))
    def resend(self, data: st.DataObject, later: float) -> None:
        """Send a worker's last batch again (same requests, a later now): a
        dropped reply's batch, or a duplicate of one whose reply arrived."""
        worker = data.draw(st.sampled_from(sorted(self.last)))
        sent = self.last[worker]
        self.now += later
        again = self.execute(
            lambda s: [attrs.evolve(e, now=self.now) for e in sent.effects[s]]  # type: ignore[misc]
        )
        for item, first, now in zip(sent.spec, sent.first, again, strict=True):
            self.check_replay(item, first, now)
        if sent.dropped:
            sent.dropped = False
            sent.first = again
            self.apply(sent.spec, again)
        else:
            # a duplicate: only the replay exceptions tell the worker something
            for item, now in zip(sent.spec, again, strict=True):
                self.heed_replay(item, now)
            self.forget()

    def check_replay(self, item: tuple[Any, ...], first: Any, now: Any) -> None:
        """A resent effect answers its first outcome, or one of the
        documented replay exceptions."""
        kind, handles, *_rest = item
        if kind == "claim":
            for handle, (_, v1), (_, v2) in zip(handles, first[1], now[1], strict=True):
                if v1 is ClaimVerdict.CLAIMED and v2 is ClaimVerdict.LOST:
                    assert not handle.held, (
                        f"a replayed claim of {handle.name}, still held, answered lost"
                    )
                else:
                    assert v1 == v2, f"a replayed claim answered {v2}, first {v1}"
        elif kind == "acquire":
            (handle,) = handles
            if first[2] and not now[2]:
                assert now[3], f"a replayed acquisition answered {now}, first {first}"
            else:
                assert first == now, f"a replayed acquisition answered {now}, first {first}"
        elif kind == "admit":
            (handle,) = handles
            if first[2] is Verdict.ADMIT and now[2] is Verdict.LOST:
                assert not handle.held, f"a replayed admission of {handle.name} answered lost"
            else:
                assert first == now, f"a replayed admission answered {now}, first {first}"
        else:
            assert first == now, f"a replayed {kind} answered {now}, first {first}"

    def heed_replay(self, item: tuple[Any, ...], now: Any) -> None:
        """What the worker learns from a duplicate's outcome ``now``."""
        kind, handles, *_rest = item
        if kind == "acquire" and now[3]:
            handles[0].slot = None
        if kind == "admit" and now[2] is Verdict.LOST:
            handles[0].held = False

    # -- comparison after every step -------------------------------------------------

    @invariant()
    def stores_agree(self) -> None:
        if "unqueued-delivery" in KNOWN:
            self.find_unqueued()
        for key in KEYS:
            records = self.both("get_record", key)
            assert (records[MEMORY] is None) == (records[REDIS] is None), (
                f"record of {key!r}:\n  memory: {records[MEMORY]}\n  redis:  {records[REDIS]}"
            )
            if records[MEMORY] is not None:
                cm, cr = self._pair(records[MEMORY].generation, records[REDIS].generation)
                rm = attrs.evolve(records[MEMORY], generation=cm)
                rr = attrs.evolve(records[REDIS], generation=cr)
                assert rm == rr, f"record of {key!r}:\n  memory: {rm}\n  redis:  {rr}"
            progress = self.both("get_progress", key)
            assert progress[MEMORY] == progress[REDIS], (
                f"progress of {key!r}:\n  memory: {progress[MEMORY]}\n  redis:  {progress[REDIS]}"
            )
        memory_pending, redis_pending = self.both("pending")
        unqueued = 0
        if "unqueued-delivery" in KNOWN:
            unqueued = sum(
                1
                for h in self.handles.values()
                if h.held and h.unqueued and not h.claimed and not h.locked
            )
        redis_pending += unqueued
        pending = (memory_pending, redis_pending)
        assert pending[MEMORY] == pending[REDIS], (
            f"pending: memory {pending[MEMORY]}, redis {pending[REDIS]}"
        )
        for later in (0.0, 1.0, 15.0):
            depths = self.both("depths", self.now + later)
            # (an unqueued delivery is still held, but gone from the stream)
            redis_depths = attrs.evolve(depths[REDIS], queued=depths[REDIS].queued + unqueued)
            assert depths[MEMORY] == redis_depths, (
                f"depths {later} s on:\n  memory: {depths[MEMORY]}\n  redis:  {redis_depths}"
            )
            assert sum(attrs.astuple(depths[MEMORY])) == memory_pending


SETTINGS = settings(
    max_examples=int(os.environ.get("DOCKET_DIFFERENTIAL_EXAMPLES", "100")),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_memory_and_redis_stores_agree(redis_server: Any) -> None:
    global URL
    URL = redis_server.url
    try:
        run_state_machine_as_test(StoreDifferential, settings=SETTINGS)
    finally:
        URL = None
