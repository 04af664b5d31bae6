"""The outbox of a worker machine: the identity of its store effects, and what
follows a batch that got no reply or an error.

Theory of operation
-------------------
Every remembered store effect gets a ``Request``: this machine's ``origin``
(unique for its life), a number, the ``floor`` (the lowest number whose reply
has not arrived: the store may forget the outcomes below it) and how long the
store keeps outcomes (``remember``).  The machine hands out a batch
(``sent``) while fewer than ``in_flight`` are out: a store that runs the
batches of one sender in the order they were sent, and answers them in that
order, may have two out (the second's effects were decided without the
first's outcomes, so they commute with it: a delivery's ``Finish`` waits for
its claim's verdict, a slot's release for its acquisition's); any other
store has one.

- A run that starts with its claim (``lifecycle``: ``START_EARLY``) is
  handed out with the batch that holds the claim, never before it; that
  batch is written before the run gets a turn, and, for an idle worker's
  pickup, once every batch ahead of it is answered (``BatchTurn``).
- The floor is the lowest request of a batch out or kept for a resend (or,
  with none, the one after the last answered): a reply to a later batch
  never lets the store forget an earlier one a resend may still need.
- A reply ends any failure streak, unless a failed batch waits for its resend.
- A batch with no reply (``ReplyLost``) or an error (``StoreFailed``) is kept
  for a resend after ``retry_delay``, doubled for each failure in a row up to
  ``BACKOFF_CAP`` times it (a store refusing writes for a while, out of
  memory or failing over, is not hammered); until then the machine holds back
  its other store effects, so nothing but a batch already out overtakes the
  failed batch (one behind it on the same connection fails with it, and is
  kept after it, in order).  The resend carries the same requests, stamped
  with the time of the new attempt: the store answers what already ran with
  its first outcome.
- A streak longer than ``resend_window`` gives the batch up (the machine
  leaves its deliveries to the store), when a failure or the resend finds it
  so (``lapsed``: a worker that stalled, or whose clock jumped, sends nothing
  of it); the store remembers outcomes for longer than that, so a resend
  never meets a store that forgot it (and acts again).  The window counts
  from the streak's first batch's send (its ``now``), not from when its
  loss was heard: a reply lost late must not stretch it past the store's
  memory.  Once the worker is stopping (``stop``), a streak longer than one
  ``retry_delay`` does: a stopping worker tries once more, then leaves the
  rest to redelivery.
- ``refusals_allowed`` errors in a row make the failure ``fatal``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import attrs

from .effects import BatchTurn, CancelTask, Effect, Request, StartTask, StoreEffect
from .inputs import ReplyLost, StoreFailed

#: the longest wait before a resend, in retry delays
BACKOFF_CAP = 4


class Outbox:
    """Requests, resends and give-ups of one worker machine."""

    def __init__(
        self,
        *,
        origin: str,
        worker: str,
        remember: float,
        retry_delay: float,
        resend_window: float,
        refusals_allowed: int,
        in_flight: int = 1,
    ) -> None:
        self._origin = origin
        self._worker = worker
        self._remember = remember
        self._retry_delay = retry_delay
        self._resend_window = resend_window
        self._refusals_allowed = refusals_allowed
        #: how many batches may be out at once
        self.in_flight = in_flight
        #: the last request number given, and the one after the last answered
        self._seq = 0
        self._answered = 1
        #: the batches out, oldest first: each one's lowest request number
        #: (``None``: it has no request)
        self._out: deque[int | None] = deque()
        #: the batches that were out behind the one that failed last (their
        #: lowest request numbers)
        self._behind: list[int | None] = []
        #: the batch to send again, and when
        self._failed: list[StoreEffect] = []
        self.resend_at: float | None = None
        self._failing_since: float | None = None
        #: when the first batch of the streak went out: the store remembers
        #: its requests from then (``lapsed``)
        self._streak_sent = 0.0
        #: failures in a row (the backoff), and refusals among them
        self._failures = 0
        self._refusals = 0
        self._stopping = False
        #: why the worker must stop: the store refused a batch for good
        self.fatal: str | None = None
        #: store effects were held back since the last batch went out
        self._held = False
        #: the runs that start with a claim not handed out yet, and the
        #: turn of that claim's batch
        self._with_claim: set[str] = set()
        self._claim_turn = BatchTurn.BESIDE

    def request(self) -> Request:
        """The identity of the next remembered effect."""
        self._seq += 1
        return Request(
            origin=self._origin,
            worker=self._worker,
            seq=self._seq,
            floor=self.floor,
            remember=self._remember,
        )

    @property
    def floor(self) -> int:
        """The lowest request number the store may still be asked about."""
        floor = self._answered
        for low in self._out:
            if low is not None and low < floor:
                floor = low
        for effect in self._failed:
            request: Request | None = getattr(effect, "request", None)
            if request is not None and request.seq < floor:
                floor = request.seq
        return floor

    @property
    def full(self) -> bool:
        """Whether as many batches are out as may be."""
        return len(self._out) >= self.in_flight

    @property
    def out(self) -> int:
        """How many batches are out."""
        return len(self._out)

    def sent(self, effects: Sequence[StoreEffect]) -> None:
        """``effects`` go out as one batch."""
        self._out.append(_lowest(effects))

    def _arrived(self, effects: Sequence[StoreEffect]) -> int | None:
        """The batch of ``effects`` is no longer out (it was answered or
        failed); batches answer in the order they went out, but one handed
        out and never sent (a test's, a stopping runtime's) is found by its
        requests too."""
        low = _lowest(effects)
        if self._out and self._out[0] == low:
            self._out.popleft()
        elif low in self._out:
            self._out.remove(low)
        return low

    def replied(self, effects: Sequence[StoreEffect]) -> None:
        """The store answered ``effects``: their requests need no memory."""
        low = self._arrived(effects)
        if self._behind and low in self._behind:
            self._behind.remove(low)
        elif self.resend_at is None:
            self._failing_since = None
            self._failures = 0
            self._refusals = 0
        for effect in reversed(effects):
            request: Request | None = getattr(effect, "request", None)
            if request is not None:
                self._answered = max(self._answered, request.seq + 1)
                return

    def failed(self, event: ReplyLost | StoreFailed) -> tuple[StoreEffect, ...]:
        """Keep the batch for a resend; returns it instead when it is given up
        (or nothing, when the failure is fatal)."""
        now = event.now
        low = self._arrived(event.effects)
        if self._behind and low in self._behind:
            # a batch that was out behind the failed one (on the same
            # connection): kept after it, for the same resend
            self._behind.remove(low)
            self._failed += event.effects
            return ()
        if type(event) is StoreFailed:
            self._refusals += 1
            if self._refusals >= self._refusals_allowed:
                self.fatal = f"the store refused a batch {self._refusals} times: {event.reason}"
                return ()
        if self._failing_since is None:
            self._failing_since = now
            # the store remembers from the time it ran the batch, not from
            # when its loss was heard
            sent_at: float = min((e.now for e in event.effects), default=now)  # type: ignore[attr-defined]
            self._streak_sent = min(now, sent_at)
        if now - self._streak_sent >= self._resend_window or (
            self._stopping and now - self._failing_since >= self._retry_delay
        ):
            self._failing_since = self._streak_sent = now
            return event.effects
        self._failed = list(event.effects)
        self._behind = list(self._out)
        self._failures += 1
        self.resend_at = now + self.backoff(self._failures)
        return ()

    def backoff(self, failures: int) -> float:
        """How long to wait before a resend, after ``failures`` in a row."""
        doublings = min(max(failures - 1, 0), 8)
        return self._retry_delay * min(2.0**doublings, BACKOFF_CAP)

    def stop(self) -> None:
        """The worker is stopping: a batch still failing after one more
        ``retry_delay`` is given up, not sent for a whole resend window."""
        self._stopping = True

    @property
    def waiting_for_claim(self) -> frozenset[str]:
        """The runs that start with a claim not handed out yet (held back
        with it, after ``hand_out``): the runtime does not run them yet."""
        return frozenset(self._with_claim)

    def starts_with_claim(self, delivery_id: str, idle: bool) -> None:
        """The run of ``delivery_id`` starts with its claim, among the effects
        to hand out: it waits for that claim's batch, which goes out before
        it (``BEFORE_RUNS``), or, where the worker ran nothing before (an
        idle worker's pickup), once every batch ahead is answered (``ALONE``)."""
        self._with_claim.add(delivery_id)
        if self._claim_turn is not BatchTurn.ALONE:
            self._claim_turn = BatchTurn.ALONE if idle else BatchTurn.BEFORE_RUNS

    def hand_out(
        self, effects: list[Effect], now: float
    ) -> tuple[list[Effect], list[Effect], BatchTurn]:
        """Split ``effects`` into what goes out now, what waits (the store
        effects, while a resend is pending or the batches out are ``full``,
        and with them the runs that start with a claim among them, and their
        cancels), and the turn of the batch going out (its store effects).
        Store effects that waited go out stamped with ``now`` (the time of
        the input that let them go), as a resend does: one held through a
        stalled store must not reach it with the time it was decided (a slot
        it renews would look stale to other workers by that much)."""
        with_claim = self._with_claim
        out: list[Effect] = effects
        held: list[Effect] = []
        if self.resend_at is not None or self.full:
            out = [e for e in effects if not isinstance(e, StoreEffect)]
            held = [e for e in effects if isinstance(e, StoreEffect)]
            if held and with_claim:
                held += [e for e in out if _waits_for_claim(e, with_claim)]
                out = [e for e in out if not _waits_for_claim(e, with_claim)]
            self._held = self._held or bool(held)
        elif self._held:
            self._held = False
            out = [_stamped(e, now) if isinstance(e, StoreEffect) else e for e in effects]
        store = [effect for effect in out if isinstance(effect, StoreEffect)]
        turn = BatchTurn.BESIDE
        if store:
            self.sent(store)
            if with_claim:
                turn, self._claim_turn = self._claim_turn, BatchTurn.BESIDE
                with_claim.clear()
        return out, held, turn

    def lapsed(self, now: float) -> tuple[StoreEffect, ...]:
        """The failed batch, given up, when its resend comes a resend window
        or more into the streak (the worker stalled): the store may have
        forgotten it by then.  ``resend`` then sends only what was held back."""
        if self.resend_at is None or now < self.resend_at or self._failing_since is None:
            return ()
        if now - self._streak_sent < self._resend_window:
            return ()
        given_up, self._failed = tuple(self._failed), []
        self._failing_since = self._streak_sent = now
        return given_up

    def resend(self, now: float, held: list[Effect]) -> list[Effect] | None:
        """At the resend time, the failed batch and then ``held``, each store
        effect stamped with ``now``; before it, ``None``."""
        if self.resend_at is None or now < self.resend_at:
            return None
        effects = [
            _stamped(e, now) if isinstance(e, StoreEffect) else e for e in (*self._failed, *held)
        ]
        self._failed = []
        self.resend_at = None
        return effects


def _lowest(effects: Sequence[StoreEffect]) -> int | None:
    """The lowest request number among ``effects`` (``None``: none has one)."""
    low: int | None = None
    for effect in effects:
        request: Request | None = getattr(effect, "request", None)
        if request is not None and (low is None or request.seq < low):
            low = request.seq
    return low


def _stamped(effect: StoreEffect, now: float) -> StoreEffect:
    """``effect`` as of ``now`` (a resend's, or a held batch's, time)."""
    if effect.now == now:  # type: ignore[attr-defined]
        return effect
    return attrs.evolve(effect, now=now)  # type: ignore[misc]


def _waits_for_claim(effect: Effect, with_claim: set[str]) -> bool:
    """Whether ``effect`` starts (or cancels) a run whose claim is held."""
    kind = type(effect)
    if kind is StartTask or kind is CancelTask:
        assert isinstance(effect, StartTask | CancelTask)
        return effect.delivery_id in with_claim
    return False
