"""Concurrency slots in the worker machine: taking, parking and releasing.

Theory of operation
-------------------
A limit without a scope (or scoped by the docket's own name) lives in the
docket's namespace ``P``: one ``AcquireSlot`` takes a slot or parks the
delivery, one ``ReleaseSlot`` frees the slot and hands it on.

A limit whose scope names another namespace ``S``, shared by dockets, cannot
work that way on a cluster, where ``S`` and ``P`` live in different hash
slots: no one step may touch both.  It takes the steps of docs/cluster.md,
section 4, each in one namespace:

- *Acquiring*, per delivery (the phases ``TAKING``, ``CONFIRMING`` and
  ``PARKING`` of ``lifecycle``): ``TakeSlot`` in ``S``; acquired, then
  ``ConfirmSlot`` in ``P`` (it runs, or, lost, releases the slot); full (the
  docket is registered as waiting), then ``Park`` in ``P``, its key
  scheduled again at ``decisions.parked_retry_at``.
- *Rechecking*, after a ``Park``: a release that came between the
  ``TakeSlot`` and the ``Park`` found nobody parked yet and woke nobody.  So
  the machine takes the slot once more for the parked holder: full, and the
  docket is registered again, with holders whose releases will come; free,
  and it registers the docket (``Enlist``) and gives that slot back at once
  (``ReleaseSlot``), which wakes the docket that waited longest.
- *Releasing*, apart from any delivery (``ReleaseChains``): ``ReleaseSlot``
  in ``S`` names the docket ``P'`` to wake; ``WakeParked`` in ``P'`` queues
  its oldest waiter and counts the rest; ``Enlist`` in ``S`` registers
  ``P'`` again while some remain.  When ``P'`` had nobody left, the chain
  passes the wake-up on (``ReleaseSlot(pass_on=True)``).  A one-script
  release that woke no waiter of its own names a docket too: both kinds of
  waiter share a limit that a docket shares with those naming it.

Each link is one effect and its answer; ``CHAIN`` is the one table of what
follows an answer.  A chain holds no lease: a crash (or a batch given up)
between two links leaves a free slot or an unregistered docket, and the
parked keys' ``retry_at`` recovers them.  The machine says goodbye only
once no link is out.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from . import lifecycle
from .decisions import parked_retry_at
from .effects import (
    AcquireSlot,
    ConfirmSlot,
    Effect,
    Enlist,
    Park,
    ReleaseSlot,
    StoreEffect,
    TakeSlot,
    WakeParked,
)
from .flight import Count, InFlight, WorkerConfig
from .inputs import (
    Enlisted,
    Outcome,
    Parked,
    SlotAcquired,
    SlotConfirmed,
    SlotReleased,
    SlotTaken,
    WokeParked,
)
from .lifecycle import Phase, Step
from .local_slots import LocalSlotSteps, SlotStep, SlotStepped
from .outbox import Outbox
from .values import ConcurrencyPolicy, HeldSlot, Symbol


def chain_scope(limit: ConcurrencyPolicy | None, docket: str) -> str | None:
    """The scope of a limit that takes the chain of single-slot steps, or
    ``None`` for one that takes the one-script path (no scope, or the
    docket's own name: its slots live with the docket)."""
    if limit is None or limit.scope is None or limit.scope == docket:
        return None
    return limit.scope


class Link(Symbol):
    """The effect of a chain that is out."""

    #: ``TakeSlot`` again for a holder just parked
    RECHECKING = "rechecking"
    #: ``ReleaseSlot``, or its ``pass_on``
    RELEASING = "releasing"
    #: ``WakeParked``
    WAKING = "waking"
    #: ``Enlist``
    ENLISTING = "enlisting"


class Answer(Symbol):
    """What the store answered a link."""

    #: the limit was full: the docket is registered (or the slot was lost)
    FULL = "full"
    #: a slot was free: it is the recheck's now
    ROOM = "room"
    #: the release named a docket to wake
    HANDED_ON = "handed_on"
    #: the release had nobody to hand the slot on to, or queued a waiter itself
    SETTLED = "settled"
    #: one waiter queued, none left there / some left there
    WOKE = "woke"
    WOKE_SOME = "woke_some"
    #: nobody waited there any more
    WOKE_NONE = "woke_none"
    ENLISTED = "enlisted"


#: (link, answer) -> the links that follow (none: that chain is done)
CHAIN: dict[tuple[Link, Answer], tuple[Link, ...]] = {
    (Link.RECHECKING, Answer.FULL): (),
    (Link.RECHECKING, Answer.ROOM): (Link.ENLISTING, Link.RELEASING),
    (Link.RELEASING, Answer.HANDED_ON): (Link.WAKING,),
    (Link.RELEASING, Answer.SETTLED): (),
    (Link.WAKING, Answer.WOKE): (),
    (Link.WAKING, Answer.WOKE_SOME): (Link.ENLISTING,),
    (Link.WAKING, Answer.WOKE_NONE): (Link.RELEASING,),
    (Link.ENLISTING, Answer.ENLISTED): (),
}

_LINKS: dict[type[StoreEffect], Link] = {
    TakeSlot: Link.RECHECKING,
    ReleaseSlot: Link.RELEASING,
    WakeParked: Link.WAKING,
    Enlist: Link.ENLISTING,
}


def answer_of(outcome: Outcome) -> Answer:
    """The answer an outcome gives its link."""
    if isinstance(outcome, SlotTaken):
        return Answer.ROOM if outcome.acquired else Answer.FULL
    if isinstance(outcome, SlotReleased):
        return Answer.HANDED_ON if outcome.wake is not None else Answer.SETTLED
    if isinstance(outcome, WokeParked):
        if not outcome.woken:
            return Answer.WOKE_NONE
        return Answer.WOKE_SOME if outcome.remaining and outcome.oldest is not None else Answer.WOKE
    if isinstance(outcome, Enlisted):
        return Answer.ENLISTED
    raise TypeError(f"not the answer of a chain's link: {outcome!r}")


class ReleaseChains:
    """The chains of one worker machine: what follows each answer, and how
    many links are out."""

    def __init__(self, *, docket: str, outbox: Outbox) -> None:
        self._docket = docket
        self._outbox = outbox
        #: links sent and not yet answered (nor given up)
        self.open = 0
        #: holders whose recheck ``TakeSlot`` is out
        self._rechecking: set[str] = set()

    def release(
        self, *, limit_key: str, holder: str, now: float, scope: str | None, alone: bool = True
    ) -> ReleaseSlot:
        """The ``ReleaseSlot`` of a slot a delivery held: a chain's first link
        (not ``alone``: a part of a ``SlotStep``, which has the request)."""
        self.open += 1
        return ReleaseSlot(
            limit_key=limit_key,
            holder=holder,
            now=now,
            scope=scope,
            request=self._outbox.request() if alone else None,
        )

    def recheck(self, take: TakeSlot) -> TakeSlot:
        """``take``, the slot taken again for a holder just parked (see the
        module), as a chain's first link."""
        self.open += 1
        self._rechecking.add(take.holder)
        return take

    def owns(self, effect: StoreEffect) -> bool:
        """Whether a ``TakeSlot`` is a recheck (not a delivery's own)."""
        return isinstance(effect, TakeSlot) and effect.holder in self._rechecking

    def replied(self, effect: StoreEffect, outcome: Outcome, now: float) -> list[StoreEffect]:
        """The links that follow a link's answer."""
        link = _LINKS[type(effect)]
        self._close(effect)
        following = CHAIN[(link, answer_of(outcome))]
        effects = [self._link(each, effect, outcome, now) for each in following]
        self.open += len(effects)
        return effects

    def stepped(self, effect: ReleaseSlot, wake: str | None, now: float) -> list[StoreEffect]:
        """The links that follow the answer to a release a ``SlotStep`` made
        (``wake``: the docket it named)."""
        if wake is None:
            self._close(effect)
            return []
        outcome = SlotReleased(limit_key=effect.limit_key, woken=0, wake=wake)
        return self.replied(effect, outcome, now)

    def given_up(self, effect: StoreEffect) -> None:
        """A link the store never answered: its chain ends here (``retry_at``
        recovers what it would have woken)."""
        if type(effect) in _LINKS and (not isinstance(effect, TakeSlot) or self.owns(effect)):
            self._close(effect)

    def _close(self, effect: StoreEffect) -> None:
        self.open -= 1
        if isinstance(effect, TakeSlot):
            self._rechecking.discard(effect.holder)

    def _scope(self, effect: ReleaseSlot | WakeParked | TakeSlot) -> str:
        return effect.scope if effect.scope is not None else self._docket

    def _link(self, link: Link, effect: StoreEffect, outcome: Outcome, now: float) -> StoreEffect:
        """The effect of ``link``, following ``effect``'s answer ``outcome``."""
        if isinstance(effect, TakeSlot):  # a recheck found room: enlist, give it back
            if link is Link.ENLISTING:
                return Enlist(
                    scope=effect.scope,
                    limit_key=effect.limit_key,
                    docket=effect.docket,
                    since=effect.now,
                    now=now,
                )
            return ReleaseSlot(
                limit_key=effect.limit_key,
                holder=effect.holder,
                now=now,
                scope=effect.scope,
                request=self._outbox.request(),
            )
        if isinstance(effect, ReleaseSlot):  # on to the docket it named
            assert isinstance(outcome, SlotReleased) and outcome.wake is not None
            return WakeParked(
                docket=outcome.wake,
                scope=self._scope(effect),
                limit_key=effect.limit_key,
                now=now,
                request=self._outbox.request(),
            )
        assert isinstance(effect, WakeParked) and isinstance(outcome, WokeParked)
        if link is Link.ENLISTING:  # some still wait there
            assert outcome.oldest is not None
            return Enlist(
                scope=effect.scope,
                limit_key=effect.limit_key,
                docket=effect.docket,
                since=outcome.oldest,
                now=now,
            )
        return ReleaseSlot(  # nobody waited there: the next docket
            limit_key=effect.limit_key,
            holder="",
            now=now,
            scope=effect.scope,
            pass_on=True,
            request=self._outbox.request(),
        )


#: the outcomes ``SlotSteps._slot_replied`` takes
SLOT_ANSWERS = frozenset(
    {
        SlotAcquired,
        SlotTaken,
        SlotConfirmed,
        Parked,
        SlotReleased,
        WokeParked,
        Enlisted,
        SlotStepped,
    }
)


class _Machine(Protocol):
    """What ``SlotSteps`` needs of the worker machine it is mixed into."""

    config: WorkerConfig
    in_flight: dict[str, InFlight]
    counters: Counter[Count]
    outbox: Outbox
    chains: ReleaseChains
    _effects: list[Effect]

    def holder(self, delivery_id: str) -> str: ...

    def _take(self, flight: InFlight, now: float) -> TakeSlot: ...

    def _slot(self, outcome: SlotAcquired, now: float, taken_at: float) -> None: ...

    def _taken(self, effect: TakeSlot, outcome: SlotTaken, now: float) -> None: ...

    def _confirmed(self, outcome: SlotConfirmed, now: float) -> None: ...

    def _parked(self, outcome: Parked, now: float) -> None: ...

    def _stepped(self, effect: SlotStep, outcome: SlotStepped, now: float) -> None: ...

    def _start(self, flight: InFlight, step: Step, now: float) -> None: ...

    def _lease_lost(self, delivery_id: str, now: float) -> None: ...

    def _slot_held_from(self, flight: InFlight, at: float) -> None: ...


class SlotSteps(LocalSlotSteps):
    """The worker machine's steps on concurrency slots (mixed into
    ``WorkerMachine``): what it asks of the store for a delivery's slot, and
    what it does with the answers (those of a limit in the docket's own
    namespace: ``local_slots.LocalSlotSteps``)."""

    def _slot_replied(self: _Machine, effect: StoreEffect, outcome: Outcome, now: float) -> None:
        """Take the answer to a step on a slot (one of ``SLOT_ANSWERS``)."""
        if isinstance(outcome, SlotStepped):
            assert isinstance(effect, SlotStep)
            self._stepped(effect, outcome, now)
        elif isinstance(outcome, SlotAcquired):
            assert isinstance(effect, AcquireSlot)
            self._slot(outcome, now, effect.now)
        elif isinstance(outcome, SlotTaken) and not self.chains.owns(effect):
            assert isinstance(effect, TakeSlot)
            self._taken(effect, outcome, now)
        elif isinstance(outcome, SlotConfirmed):
            self._confirmed(outcome, now)
        elif isinstance(outcome, Parked):
            self._parked(outcome, now)
        else:  # a link of a chain: a release, a wake-up, an enlistment, a recheck
            self._effects.extend(self.chains.replied(effect, outcome, now))

    def _released_links(
        self: _Machine, effect: ReleaseSlot, wake: str | None, now: float
    ) -> list[StoreEffect]:
        """The links of the chain that follow a step's release."""
        return self.chains.stepped(effect, wake, now)

    def _acquire(self: _Machine, flight: InFlight, now: float) -> AcquireSlot | TakeSlot:
        """Ask for the concurrency slot of a claimed (and admitted) delivery."""
        limit = flight.policy.concurrency
        assert limit is not None
        if chain_scope(limit, self.config.docket) is None:
            return AcquireSlot(
                limit_key=limit.limit_key,
                holder=self.holder(flight.delivery_id),
                max_concurrent=limit.max_concurrent,
                now=now,
                stale_after=self.config.redelivery_timeout,
                delivery_id=flight.delivery_id,
                message=flight.message,
                scope=limit.scope,
                request=self.outbox.request(),
            )
        flight.phase = lifecycle.advance(flight.phase, Step.TAKE)
        return self._take(flight, now)

    def _take(self: _Machine, flight: InFlight, now: float) -> TakeSlot:
        """The ``TakeSlot`` of a delivery's scoped limit."""
        limit = flight.policy.concurrency
        scope = chain_scope(limit, self.config.docket)
        assert limit is not None and scope is not None
        return TakeSlot(
            scope=scope,
            limit_key=limit.limit_key,
            holder=self.holder(flight.delivery_id),
            max_concurrent=limit.max_concurrent,
            now=now,
            stale_after=self.config.redelivery_timeout,
            delivery_id=flight.delivery_id,
            docket=self.config.docket,
            request=self.outbox.request(),
        )

    def _slot(self: _Machine, outcome: SlotAcquired, now: float, taken_at: float) -> None:
        flight = self.in_flight.get(outcome.delivery_id)
        if flight is None:
            return
        if outcome.lost:
            # a resent acquisition whose slot was taken over meanwhile: the
            # delivery is another worker's by now, and never starts here
            self._lease_lost(outcome.delivery_id, now)
            self._start(flight, Step.SLOT_ACQUIRED, now)
        elif outcome.acquired:
            assert flight.policy.concurrency is not None
            flight.slot = flight.policy.concurrency.limit_key
            self._slot_held_from(flight, taken_at)
            self._start(flight, Step.SLOT_ACQUIRED, now)
        else:
            self.counters[Count.PARKED] += 1
            flight.phase = lifecycle.advance(flight.phase, Step.SLOT_PARKED)
            del self.in_flight[outcome.delivery_id]

    def _taken(self: _Machine, effect: TakeSlot, outcome: SlotTaken, now: float) -> None:
        """Step 1 answered: confirm the slot, or park the delivery."""
        flight = self.in_flight.get(outcome.delivery_id)
        if flight is None:
            return
        if outcome.lost:
            # a resend whose slot was taken over meanwhile: as its lease, lost
            self._lease_lost(outcome.delivery_id, now)
        if outcome.acquired:
            flight.slot = effect.limit_key
            self._slot_held_from(flight, effect.now)
            if flight.phase is not Phase.TAKING:
                self._start(flight, Step.SLOT_TAKEN, now)  # stopped: ends, releasing
                return
            flight.phase = lifecycle.advance(flight.phase, Step.SLOT_TAKEN)
            self._effects.append(
                ConfirmSlot(
                    worker=self.config.name,
                    delivery_id=flight.delivery_id,
                    key=flight.message.key,
                    generation=flight.message.generation,
                    limit_key=effect.limit_key,
                    scope=effect.scope,
                    now=now,
                )
            )
            return
        flight.phase = lifecycle.advance(flight.phase, Step.SLOT_FULL)
        if flight.phase is Phase.DONE:  # another worker holds it now
            del self.in_flight[flight.delivery_id]
            return
        self._effects.append(
            Park(
                delivery_id=flight.delivery_id,
                message=flight.message,
                limit_key=effect.limit_key,
                scope=effect.scope,
                now=now,
                retry_at=parked_retry_at(now, self.config.redelivery_timeout),
                request=self.outbox.request(),
            )
        )

    def _confirmed(self: _Machine, outcome: SlotConfirmed, now: float) -> None:
        """Step 2a answered: the run starts, or (lost) ends releasing its slot."""
        flight = self.in_flight.get(outcome.delivery_id)
        if flight is None:
            return
        if outcome.lost:
            self._lease_lost(outcome.delivery_id, now)
        self._start(flight, Step.SLOT_CONFIRMED, now)

    def _parked(self: _Machine, outcome: Parked, now: float) -> None:
        """Step 2b answered: the delivery is settled; a parked key's slot is
        checked again (see the module)."""
        flight = self.in_flight.get(outcome.delivery_id)
        if flight is None:
            return
        if outcome.lost:
            self._lease_lost(outcome.delivery_id, now)
        else:
            self.counters[Count.PARKED] += 1
        flight.phase = lifecycle.advance(flight.phase, Step.PARKED)
        del self.in_flight[outcome.delivery_id]
        if outcome.parked:
            self._effects.append(self.chains.recheck(self._take(flight, now)))

    def _held_slots(self: _Machine) -> tuple[HeldSlot, ...]:
        """The slots this worker's deliveries hold, to renew (one effect; a
        store whose namespaces live apart splits it per scope)."""
        return tuple(
            HeldSlot(
                limit_key=f.slot,
                holder=self.holder(f.delivery_id),
                scope=f.policy.concurrency.scope if f.policy.concurrency else None,
            )
            for f in self.in_flight.values()
            if f.slot is not None
        )

    def _release(self: _Machine, flight: InFlight, now: float) -> ReleaseSlot | None:
        """The release of the slot a delivery holds, if any."""
        if flight.slot is None:
            return None
        limit = flight.policy.concurrency
        assert limit is not None
        release = self.chains.release(
            limit_key=flight.slot,
            holder=self.holder(flight.delivery_id),
            now=now,
            scope=limit.scope,
            alone=chain_scope(limit, self.config.docket) is not None,
        )
        flight.slot = None
        return release
