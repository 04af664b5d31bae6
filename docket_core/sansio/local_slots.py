"""Concurrency slots of limits in the docket's own namespace: one store step
per start and per end, and deliveries that wait in the worker for a slot its
own runs hold.

Theory of operation
-------------------
A limit without a scope (or scoped by the docket's own name) keeps its slots
and its waiters with the docket (``P``), so one atomic step may touch a
delivery, its record and the limit together: a ``SlotStep``.  A delivery of
such a limit whose task has no admission controls takes no ``Claim``: its
``SlotStep`` claims it (as ``Claim`` does one item) and, claimed, takes a
slot or parks it (as ``AcquireSlot``).  The end of a run that holds such a
slot is one ``SlotStep`` too: it records the end (as ``Finish``), releases
the slot (as ``ReleaseSlot``) and, when this worker holds a delivery waiting
for that limit, claims it into the slot just freed.  Consecutive steps of a
flush go in one script call, so a drain of limited tasks costs the store
what an unlimited one does, and a slot step more.

Waiting here: a delivery of limit ``L`` that arrives while this worker's own
runs hold (or are taking) every slot of ``L`` cannot start before one of
them ends.  Parked in the store, it would be acknowledged, queued again when
a slot frees, then read, decoded and claimed a second time.  Instead the
worker keeps it (``ARRIVED``: nothing asked of the store yet; its lease is
renewed, the store still counts it handed to this worker) and the first of
its runs of ``L`` to end hands it the slot in its own step.  The store hands
a freed slot to the waiters it parked first, if any (first in, first out):
the delivery kept here then parks behind them, and so do the others kept
here for ``L``.  A delivery waits here only while this worker's runs of
``L`` all started less than ``HOLD_FOR`` ago, at most ``HOLD_FOR``, and at
most ``DEPTH`` per slot of ``L``: a slot held long, or many deliveries of one
limit, take the store's way (their steps park them), so waiting here never
holds a worker's capacity long.  A delivery waiting here takes no room of a
run (``read_steps._room``): it takes the room of the run that hands it its
slot.  So the worker reads on while some wait, and a slot its end freed with
nobody waiting here for it soon has a delivery of its limit, instead of
standing idle until a run of another limit ends (a worker holds at most
twice its concurrency in deliveries: ``capacity``).  A stopping worker sends
every delivery that waits here its step at once.

Asking ahead: a delivery whose step is out cannot start before the store's
answer, one round trip.  So that a drain of short limited tasks does not
leave a run's room idle for that long at every start, the deliveries whose
steps are out leave their room to the next read, as many as the runs going
are expected to end within one round trip (``read_steps``: ``_room``, from
the mean time of a run and of a step).  A step that comes back with a slot
while the worker runs ``concurrency`` functions leaves its delivery
``READY`` (``lifecycle``): it starts when the next run ends, about one
round trip later on average.  A worker whose runs are long next to a
round trip asks nothing ahead.

``SlotStep`` answers with the claim's verdict: the machine moves the
delivery's phase as a ``Claim`` would (``claimed`` into a slot: it runs;
anything else, a parking included: the store settled the delivery, it is
done here).  A delivery cancelled (or lost) while it waits here stays
``ARRIVED``: its step's claim finds out, as a claim would.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import NamedTuple, Protocol

import attrs

from . import lifecycle
from .effects import (
    Effect,
    Finish,
    ReleaseSlot,
    Request,
    StoreEffect,
)
from .flight import Count, InFlight, WorkerConfig, moving_mean
from .inputs import ClaimVerdict, Outcome
from .lifecycle import Phase, Step
from .outbox import Outbox
from .values import ConcurrencyPolicy, TaskMessage, TaskPolicy

#: the longest a delivery waits in the worker for a slot its own runs hold
#: (and how recently those runs must have started for one to wait at all)
HOLD_FOR = 1.0
#: how many deliveries may wait in the worker per slot of a limit
DEPTH = 4

_ARRIVED = Phase.ARRIVED


class SlotTake(NamedTuple):
    """A delivery a ``SlotStep`` claims into a slot of its limit for ``holder``."""

    delivery_id: str
    message: TaskMessage
    limit_key: str
    max_concurrent: int
    holder: str


#: what a ``SlotStep`` answers for each ``SlotTake``
TAKE_PARKED, TAKE_ACQUIRED, TAKE_LOST, TAKE_SUPERSEDED, TAKE_CANCELLED = range(5)
#: the claim verdict of each answer
TAKE_VERDICTS = (
    ClaimVerdict.CLAIMED,
    ClaimVerdict.CLAIMED,
    ClaimVerdict.LOST,
    ClaimVerdict.SUPERSEDED,
    ClaimVerdict.CANCELLED,
)


@attrs.frozen(slots=True, kw_only=True)
class SlotStep(StoreEffect):
    """One atomic step on limits in the docket's own namespace (``P``).

    In order, each part if given: ``finish``, carried out as ``Finish`` is;
    ``release``, as ``ReleaseSlot`` is (a holder whose slot was taken over
    frees nothing; a freed slot wakes the oldest waiter parked in the store,
    else names the docket that waited longest through the scoped chain);
    then each of ``takes``: claim its delivery as ``Claim`` claims one item
    (not the sender's: lost, nothing changed; superseded or cancelled:
    acknowledged, as a claim does), then, claimed, take a slot of its limit
    for its holder as ``AcquireSlot`` does (``stale_after`` its stale age),
    or park the delivery as it does.  A slot
    that ``release`` freed goes to the first take when nobody waits for it
    in the store (neither a parked key nor a docket of the scoped chain);
    when the release woke one, that take parks behind it, whatever slot is
    free.  Claimed into a slot, the record runs on the sender (state event);
    parked, it goes from queued to scheduled.

    The parts' own ``now`` and requests are ignored: the step's count (a
    resend restamps the step).  A resend answers the first outcome, except
    that a take that got a slot answers lost when the sender no longer
    holds the delivery or the slot (else both are renewed).

    With ``renew``, a take that gets a slot renews its delivery's lease to
    ``now`` too; without, the lease stays as a recent read made it (the
    machine counts it from that read: ``Claim.renew``)."""

    finish: Finish | None = None
    release: ReleaseSlot | None = None
    takes: tuple[SlotTake, ...] = ()
    stale_after: float = 0.0
    now: float
    renew: bool = True
    #: identity for resends (see ``effects``)
    request: Request | None = attrs.field(default=None, eq=False)

    @property
    def delivery_ids(self) -> tuple[str, ...]:
        """The deliveries the step settles or claims."""
        ids = tuple(take.delivery_id for take in self.takes)
        return ids if self.finish is None else (self.finish.delivery_id, *ids)


@attrs.frozen(slots=True, kw_only=True)
class SlotStepped(Outcome):
    """Outcome of ``SlotStep``: whether ``finish`` was recorded (``None``
    without one), what ``release`` did (``ReleaseSlot``'s answer, without
    one: 0 and ``None``), and one ``TAKE_*`` answer per take."""

    recorded: bool | None = None
    woken: int = 0
    wake: str | None = None
    takes: tuple[int, ...] = ()


class LocalWaits:
    """The bookkeeping of one worker machine's limits in its own namespace."""

    def __init__(self) -> None:
        #: limit key -> deliveries whose step's acquisition is out or that
        #: hold a slot of it (pruned when counted)
        self.bound: dict[str, set[str]] = {}
        #: delivery -> limit key, of the steps whose acquisition is out
        self.acquiring: dict[str, str] = {}
        #: limit key -> deliveries waiting here, first in first
        self.waiting: dict[str, deque[str]] = {}
        #: delivery waiting here -> (limit key, since when)
        self.waits: dict[str, tuple[str, float]] = {}
        #: (since, delivery) of the waits, oldest first (stale ones skipped)
        self.order: deque[tuple[float, str]] = deque()


def local_limit(policy: TaskPolicy, docket: str) -> ConcurrencyPolicy | None:
    """The limit of a task whose slot ``SlotStep`` takes: one in the docket's
    own namespace, and no admission controls to judge first."""
    limit = policy.concurrency
    if limit is None or policy.admission:
        return None
    if limit.scope is not None and limit.scope != docket:
        return None
    return limit


class _Machine(Protocol):
    """What ``LocalSlotSteps`` needs of the worker machine it is mixed into."""

    config: WorkerConfig
    in_flight: dict[str, InFlight]
    counters: Counter[Count]
    outbox: Outbox
    accepting: bool
    local: LocalWaits
    _effects: list[Effect]
    _holder_prefix: str
    _step_time: float | None

    def _start(self, flight: InFlight, step: Step, now: float) -> None: ...

    def _slot_held_from(self, flight: InFlight, at: float) -> None: ...

    def _recorded(self, effect: StoreEffect, now: float) -> None: ...

    def _busy(self, limit_key: str) -> int: ...

    def _slot_take(self, flight: InFlight, limit: ConcurrencyPolicy) -> SlotTake: ...

    def _step(
        self,
        takes: tuple[SlotTake, ...],
        now: float,
        finish: Finish | None = None,
        release: ReleaseSlot | None = None,
        renew: bool = True,
    ) -> SlotStep: ...

    def _send_takes(self, takes: list[SlotTake], now: float, renew: bool = True) -> None: ...

    def _next_waiter(self, limit_key: str) -> InFlight | None: ...

    def _promote(self, limit_key: str, now: float) -> None: ...

    def _released_links(
        self, effect: ReleaseSlot, wake: str | None, now: float
    ) -> list[StoreEffect]: ...


class LocalSlotSteps:
    """The worker machine's slot steps on its own limits (mixed into it
    through ``scoped_slots.SlotSteps``)."""

    #: the mean round trip of a step (``None`` until one is known)
    _step_time: float | None

    # -- a delivery arrives ---------------------------------------------------------

    def _arrive(
        self: _Machine, flight: InFlight, limit: ConcurrencyPolicy, now: float
    ) -> SlotTake | None:
        """A fresh delivery of ``limit`` (``local_limit``): the take of its
        step, to send now, or ``None``: it waits here for a slot this
        worker's runs hold (see the module)."""
        local = self.local
        key = limit.limit_key
        queue = local.waiting.get(key)
        if not queue and self._busy(key) < limit.max_concurrent:
            return self._slot_take(flight, limit)
        if not self.accepting or (queue and len(queue) >= DEPTH * limit.max_concurrent):
            return self._slot_take(flight, limit)
        in_flight = self.in_flight
        for delivery_id in local.bound.get(key, ()):
            holder = in_flight.get(delivery_id)
            if holder is not None and holder.slot and holder.started_at + HOLD_FOR <= now:
                # a run of the limit here holds its slot long: no wait here
                return self._slot_take(flight, limit)
        if queue is None:
            queue = local.waiting[key] = deque()
        queue.append(flight.delivery_id)
        local.waits[flight.delivery_id] = (key, now)
        local.order.append((now, flight.delivery_id))
        self._promote(key, now)
        return None

    def _busy(self: _Machine, limit_key: str) -> int:
        """How many deliveries here hold or are taking a slot of the limit
        (through steps), forgetting the others."""
        bound = self.local.bound.get(limit_key)
        if not bound:
            return 0
        acquiring, in_flight = self.local.acquiring, self.in_flight
        gone = []
        for delivery_id in bound:
            flight = in_flight.get(delivery_id)
            if flight is None or (flight.slot != limit_key and delivery_id not in acquiring):
                gone.append(delivery_id)
        for delivery_id in gone:
            bound.discard(delivery_id)
        return len(bound)

    def _slot_take(self: _Machine, flight: InFlight, limit: ConcurrencyPolicy) -> SlotTake:
        """The take of ``flight`` (``ARRIVED``; ``CLAIMING`` from now)."""
        delivery_id, key = flight.delivery_id, limit.limit_key
        flight.phase = lifecycle.advance(flight.phase, Step.CLAIM)
        local = self.local
        local.acquiring[delivery_id] = key
        bound = local.bound.get(key)
        if bound is None:
            bound = local.bound[key] = set()
        bound.add(delivery_id)
        holder = self._holder_prefix + delivery_id
        return SlotTake(delivery_id, flight.message, key, limit.max_concurrent, holder)

    def _step(
        self: _Machine,
        takes: tuple[SlotTake, ...],
        now: float,
        finish: Finish | None = None,
        release: ReleaseSlot | None = None,
        renew: bool = True,
    ) -> SlotStep:
        """A step with these parts (an end's step has its finish's request);
        without ``renew``, its takes leave their leases as the read made them."""
        request = finish.request if finish is not None else None
        return SlotStep(
            finish=finish,
            release=release,
            takes=takes,
            stale_after=self.config.redelivery_timeout,
            now=now,
            renew=renew,
            request=request if request is not None else self.outbox.request(),
        )

    def _send_takes(self: _Machine, takes: list[SlotTake], now: float, renew: bool = True) -> None:
        """One step for ``takes`` (``_arrive``'s), if any (``renew``: ``_step``)."""
        if takes:
            self._effects.append(self._step(tuple(takes), now, renew=renew))

    # -- waiting here ---------------------------------------------------------------

    def _next_waiter(self: _Machine, limit_key: str) -> InFlight | None:
        """The delivery that waited here longest for the limit, no longer waiting."""
        local = self.local
        queue = local.waiting.get(limit_key)
        while queue:
            delivery_id = queue.popleft()
            if local.waits.pop(delivery_id, None) is None:
                continue
            flight = self.in_flight.get(delivery_id)
            if flight is not None and flight.phase is _ARRIVED:
                if not queue:
                    del local.waiting[limit_key]
                return flight
        local.waiting.pop(limit_key, None)
        return None

    def _promote(self: _Machine, limit_key: str, now: float) -> None:
        """Send their steps to the deliveries waiting here for the limit, as
        many as it has slots this worker's runs do not hold or take."""
        local = self.local
        takes: list[SlotTake] = []
        while True:
            queue = local.waiting.get(limit_key)
            if not queue:
                break
            head = self.in_flight.get(queue[0])
            if head is None or head.phase is not _ARRIVED or queue[0] not in local.waits:
                local.waits.pop(queue.popleft(), None)  # (gone, or on its way already)
                if not queue:
                    del local.waiting[limit_key]
                continue
            limit = head.policy.concurrency
            assert limit is not None
            if self._busy(limit_key) >= limit.max_concurrent:
                break
            waiter = self._next_waiter(limit_key)
            if waiter is not None:
                takes.append(self._slot_take(waiter, limit))
        self._send_takes(takes, now)

    def _wait_deadline(self: _Machine, deadline: float) -> float:
        """``deadline``, or when the delivery that waits here longest has
        waited ``HOLD_FOR`` if sooner."""
        order, waits = self.local.order, self.local.waits
        while order:
            since, delivery_id = order[0]
            entry = waits.get(delivery_id)
            if entry is not None and entry[1] == since:
                return min(deadline, since + HOLD_FOR)
            order.popleft()
        return deadline

    def _waited(self: _Machine, now: float, everyone: bool = False) -> None:
        """Send their steps to the deliveries that waited here ``HOLD_FOR``
        (``everyone``: to all of them, a stopping worker)."""
        local = self.local
        order, waits = local.order, local.waits
        if not waits:
            return
        takes: list[SlotTake] = []
        while order and (everyone or order[0][0] + HOLD_FOR <= now):
            since, delivery_id = order.popleft()
            entry = waits.get(delivery_id)
            if entry is None or entry[1] != since:
                continue
            key = entry[0]
            del waits[delivery_id]
            queue = local.waiting.get(key)
            if queue is not None:
                queue.remove(delivery_id)
                if not queue:
                    del local.waiting[key]
            flight = self.in_flight.get(delivery_id)
            limit = flight.policy.concurrency if flight is not None else None
            if flight is not None and limit is not None and flight.phase is _ARRIVED:
                takes.append(self._slot_take(flight, limit))
        self._send_takes(takes, now)

    # -- a run ends -------------------------------------------------------------------

    def _send_end(
        self: _Machine, effect: StoreEffect | None, release: ReleaseSlot | None, now: float
    ) -> None:
        """Send what ends a run: its ``effect`` (``plan_end``'s), then the
        release of its slot, if any; in one ``SlotStep`` for a limit in the
        docket's own namespace, which hands the slot on to a delivery waiting
        here for it."""
        if release is None or release.request is not None:  # (a scoped chain's: alone)
            if effect is not None:
                self._effects.append(effect)
            if release is not None:
                self._effects.append(release)
            return
        finish = effect if type(effect) is Finish else None
        if effect is not None and finish is None:
            self._effects.append(effect)  # (a follow-up goes first, on its own)
        waiter = self._next_waiter(release.limit_key)
        limit = waiter.policy.concurrency if waiter is not None else None
        takes = (
            (self._slot_take(waiter, limit),) if waiter is not None and limit is not None else ()
        )
        self._effects.append(self._step(takes, now, finish, release))

    # -- the store answers -------------------------------------------------------------

    def _stepped(self: _Machine, effect: SlotStep, outcome: SlotStepped, now: float) -> None:
        if effect.finish is not None:
            self._recorded(effect.finish, now)
        if effect.release is not None:
            self._effects.extend(self._released_links(effect.release, outcome.wake, now))
        if not effect.takes:
            return
        self._step_time = moving_mean(self._step_time, now - effect.now)  # (read_steps._room)
        local, in_flight, counters = self.local, self.in_flight, self.counters
        freed: set[str] = set()
        for take, answer in zip(effect.takes, outcome.takes, strict=True):
            delivery_id = take.delivery_id
            local.acquiring.pop(delivery_id, None)
            flight = in_flight.get(delivery_id)
            if flight is None:
                continue
            if answer == TAKE_ACQUIRED:
                flight.slot = take.limit_key
                self._slot_held_from(flight, effect.now)
                self._start(flight, Step.CLAIMED, now)  # (a stopped one ends, releasing)
                continue
            counters[Count.PARKED if answer == TAKE_PARKED else _COUNTS[answer]] += 1
            flight.phase = lifecycle.advance(flight.phase, Step.CLAIM_LOST)
            del in_flight[delivery_id]
            freed.add(take.limit_key)
        for key in freed:
            self._promote(key, now)

    def _step_given_up(self: _Machine, effect: SlotStep) -> None:
        """A step the store never answered: its takes are out no more."""
        for take in effect.takes:
            self.local.acquiring.pop(take.delivery_id, None)


#: the counter of each answer of a take that did not claim
_COUNTS = {answer: Count(TAKE_VERDICTS[answer].value) for answer in (2, 3, 4)}
