"""Leases in the worker machine (``LeaseSteps``, mixed into ``WorkerMachine``).

Theory of operation
-------------------
Every delivery a worker holds (``lifecycle.HOLDING``) is leased: the store
hands it to another worker once it has gone ``redelivery_timeout`` without a
renewal.  The machine renews them all every ``renew_interval``
(``RenewLeases``); the store answers with the ones it no longer holds for
this worker, and each of those is ``lease_lost``: a run stops
(``CancelTask``) and ends unrecorded, a delivery still waiting for the store
never starts.

A renewal the store does not answer confirms nothing: once this worker's
last confirmed renewal is ``fence_after`` old, it stops those runs itself
(``_fence``), a renewal interval before another worker may take them over.
A renewal confirms only what it names: a slot taken by a step that was out
when the renewal was decided counts from that step (``_slot_held_from``),
as the store counts it, until a renewal names it.
A batch the store never answered within the resend window is given up
(``_give_up``): its deliveries are left to the store, which hands them out
again once their leases lapse; a run that started with its claim
(``EARLY_RUNNING``) is stopped, since the store never said it may run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from . import lifecycle
from .admission import Admit
from .effects import (
    AcquireSlot,
    Claim,
    ConfirmSlot,
    Effect,
    Finish,
    Park,
    ReleaseSlot,
    RenewLeases,
    Schedule,
    StopReason,
    StoreEffect,
    TakeSlot,
)
from .errors import InternalError
from .flight import Count, InFlight, WorkerConfig
from .inputs import ClaimVerdict, ReplyLost, StoreFailed, TaskEnded, TaskOutcome
from .lifecycle import Phase, Step
from .local_slots import SlotStep
from .outbox import Outbox
from .scoped_slots import ReleaseChains
from .stopping import stop_task
from .values import HeldSlot


class _Machine(Protocol):
    """What ``LeaseSteps`` needs of the worker machine it is mixed into."""

    config: WorkerConfig
    in_flight: dict[str, InFlight]
    counters: Counter[Count]
    outbox: Outbox
    chains: ReleaseChains
    _effects: list[Effect]
    _leases_confirmed_at: float
    _fence_at: float
    _next_renewal: float

    def holder(self, delivery_id: str) -> str: ...

    def _held_slots(self) -> tuple[HeldSlot, ...]: ...

    def _maybe_goodbye(self, now: float) -> None: ...

    def _lease_lost(self, delivery_id: str, now: float) -> None: ...

    def _end_unrun(self, flight: InFlight, now: float) -> None: ...

    def _give_up(self, effects: Sequence[StoreEffect], now: float) -> None: ...

    def _step_given_up(self, effect: SlotStep) -> None: ...

    def _end(
        self,
        flight: InFlight,
        event: TaskEnded,
        outcome: TaskOutcome,
        error: str | None,
        cancelled: bool,
        release: ReleaseSlot | None,
    ) -> None: ...


class LeaseSteps:
    """The worker machine's steps on leases: renewing, fencing, losing them,
    and giving up what the store never answered; and the verdict of a claim
    whose run started with it."""

    def _early_verdict(self: _Machine, flight: InFlight, verdict: ClaimVerdict, now: float) -> None:
        """The claim of a run that started with it: ``claimed`` confirms the
        run (and records an end that waited for it); any other verdict voids
        it, as a cancel just after the start would have: the function is
        stopped, nothing is recorded (the store settled the message)."""
        claimed = verdict is ClaimVerdict.CLAIMED
        was = flight.phase
        phase = flight.phase = lifecycle.advance(was, Step.CLAIMED if claimed else Step.CLAIM_LOST)
        if phase is Phase.FINISHING:
            ended, flight.ended = flight.ended, None
            if ended is None:
                raise InternalError(f"no end kept for delivery {flight.delivery_id!r}")
            cancelled = was is Phase.EARLY_CANCELLED
            self._end(flight, ended, ended.outcome, ended.error, cancelled, None)
        elif phase is Phase.DONE:
            flight.ended = None
            del self.in_flight[flight.delivery_id]
        elif phase is Phase.ABANDONING and was is Phase.EARLY_RUNNING:
            reason = StopReason.LEASE_LOST if verdict is ClaimVerdict.LOST else StopReason.CANCELLED
            self._effects.append(stop_task(flight.delivery_id, reason, flight.message))

    def _lease_lost(self: _Machine, delivery_id: str, now: float) -> None:
        flight = self.in_flight.get(delivery_id)
        if flight is None:
            return
        was = flight.phase
        flight.phase = lifecycle.advance(was, Step.LEASE_LOST)
        self.counters[Count.LEASE_LOST] += 1
        if was in lifecycle.STOPPABLE:
            self._effects.append(stop_task(delivery_id, StopReason.LEASE_LOST, flight.message))
        elif was is Phase.READY:
            self._end_unrun(flight, now)

    def _store_failed(self: _Machine, event: ReplyLost | StoreFailed) -> None:
        self.counters[Count.STORE_ERRORS] += 1
        given_up = self.outbox.failed(event)
        if given_up:
            self._give_up(given_up, event.now)

    def _give_up(self: _Machine, effects: Sequence[StoreEffect], now: float) -> None:
        """Leave the deliveries of a batch the store never answered to the
        store: it hands them out again once their leases lapse."""
        self.counters[Count.GIVEN_UP] += len(effects)
        for effect in effects:
            if isinstance(effect, Claim):
                ids: tuple[str | None, ...] = tuple(item.delivery_id for item in effect.items)
            elif isinstance(effect, TakeSlot) and self.chains.owns(effect):
                self.chains.given_up(effect)
                continue
            elif isinstance(effect, Finish | AcquireSlot | Admit | TakeSlot | ConfirmSlot | Park):
                ids = (effect.delivery_id,)
            elif isinstance(effect, Schedule):
                ids = (effect.acknowledge,)
            elif isinstance(effect, SlotStep):  # (local_slots)
                ids = effect.delivery_ids
                self._step_given_up(effect)
                if effect.release is not None:
                    self.chains.given_up(effect.release)
            else:
                # a release, a chain's link, a renewal or a heartbeat: leases
                # and the parked keys' retry times settle it
                self.chains.given_up(effect)
                continue
            for delivery_id in ids:
                flight = self.in_flight.get(delivery_id) if delivery_id else None
                if flight is not None and lifecycle.allows(flight.phase, Step.GIVEN_UP):
                    was = flight.phase
                    flight.phase = lifecycle.advance(was, Step.GIVEN_UP)
                    if flight.phase is Phase.DONE:
                        del self.in_flight[flight.delivery_id]
                    elif was is Phase.EARLY_RUNNING:  # (its claim never answered: stop it)
                        stop = stop_task(flight.delivery_id, StopReason.LEASE_LOST, flight.message)
                        self._effects.append(stop)
        self._maybe_goodbye(now)

    def _renewed(self: _Machine, effect: RenewLeases) -> None:
        """A renewal answered: the leases it named count from its ``now``.
        A delivery whose slot it did not name (taken after the renewal was
        decided) keeps its slot's time, and no lease of this worker counts
        as younger than the oldest it holds."""
        covered = {slot.holder for slot in effect.slots}
        now = oldest = effect.now
        for delivery_id in effect.delivery_ids:
            flight = self.in_flight.get(delivery_id)
            if flight is not None and (flight.slot is None or self.holder(delivery_id) in covered):
                flight.renewed_at = max(flight.renewed_at, now)
        for flight in self.in_flight.values():
            if flight.renewed_at < oldest and flight.phase in lifecycle.HOLDING:
                oldest = flight.renewed_at
        self._leases_confirmed_at = max(self._leases_confirmed_at, oldest)

    def _slot_held_from(self: _Machine, flight: InFlight, at: float) -> None:
        """``flight`` took a slot that the store counts from ``at`` (the step
        that took it): its leases are no younger than that until a renewal
        names the slot, and it is fenced by then."""
        if at < flight.renewed_at:
            flight.renewed_at = at
        if at < self._leases_confirmed_at:
            self._leases_confirmed_at = at
        self._fence_at = min(self._fence_at, at + self.config.fence_after)

    def _fence(self: _Machine, now: float) -> None:
        """Stop every run whose lease this worker could not renew in time
        (the store did not answer): another worker may own it by now."""
        # (deadlines computed as the timer's, so that the timer's tick fences)
        fence_after = self.config.fence_after
        self._fence_at = self._leases_confirmed_at + fence_after
        if self._fence_at > now:
            return
        self._fence_at = float("inf")
        for flight in list(self.in_flight.values()):
            if flight.phase not in lifecycle.HOLDING:
                continue
            due = flight.renewed_at + fence_after
            if due <= now:
                self.counters[Count.FENCED] += 1
                flight.slot = None
                self._lease_lost(flight.delivery_id, now)
            else:
                self._fence_at = min(self._fence_at, due)

    def _renew(self: _Machine, now: float) -> None:
        self._next_renewal = now + self.config.renew_interval
        held = tuple(f.delivery_id for f in self.in_flight.values() if f.phase in lifecycle.HOLDING)
        slots = self._held_slots()
        if held or slots:
            self._effects.append(
                RenewLeases(worker=self.config.name, delivery_ids=held, slots=slots, now=now)
            )


__all__ = ["LeaseSteps"]
