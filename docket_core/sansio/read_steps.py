"""Reads in the worker machine (``ReadSteps``, mixed into ``WorkerMachine``).

Theory of operation
-------------------
The machine asks for work itself: a ``Read`` of as many deliveries as it
has room for (``capacity``), when no read is out, blocking at most until
the soonest scheduled message the last read saw (``_maybe_read``, decided
as the effects are drained, so the runs that end in one pass free their
room for one read).  What a read brings (``_read_done``) is handed out:
an entry that could not be parsed is set aside (``BuryMalformed``); a
delivery with a problem (an unknown task, arguments that do not bind) or
a struck one is settled unrun (``_reject``); one of a limit in the
docket's own namespace takes a slot step (``local_slots``); the rest are
claimed in one ``Claim``, and the fresh ones that need no admission, slot
or deadline start with it when the read is recent (``START_EARLY``).

A read never brings more than the room it was asked for, except the one
that recovers what a lost reply handed out (``recover``: every delivery
the store counts as this worker's), and one that also took over stale
deliveries (a worker died) where the store reads the new ones beside its
scan (up to the room again: ``ScriptedStore.run_read``).  So a read's deliveries beyond the
worker's room (``_room``: ``concurrency`` less those it runs or will run)
wait here, held (``ARRIVED``: their leases renewed, nothing asked of the
store), in the order they came, and go on as runs end
(``_from_backlog``, decided as the effects are drained): a worker never
runs more than ``concurrency`` functions at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from . import lifecycle
from .decisions import plan_bury, plan_reject
from .effects import Claim, ClaimItem, Effect, Read, StartTask
from .flight import Count, InFlight, WorkerConfig
from .inputs import Arrival, ReadDone
from .lifecycle import Phase, Step
from .local_slots import LocalWaits, SlotTake, local_limit
from .outbox import Outbox
from .values import ConcurrencyPolicy

_DELIVERED, _REDELIVERED, _STARTED = Count.DELIVERED, Count.REDELIVERED, Count.STARTED
_ARRIVED, _FINISHING = Phase.ARRIVED, Phase.FINISHING


class _Machine(Protocol):
    """What ``ReadSteps`` needs of the worker machine it is mixed into."""

    config: WorkerConfig
    in_flight: dict[str, InFlight]
    counters: Counter[Count]
    outbox: Outbox
    accepting: bool
    finished: bool
    _effects: list[Effect]
    _reading: bool
    _recover: bool
    _read_at: float | None
    _read_asked_at: float
    _read_recovered: bool
    _next_due: float | None
    _fence_at: float
    _leases_confirmed_at: float
    _backlog: dict[str, Arrival]
    _runs: int
    _run_time: float | None
    _step_time: float | None
    local: LocalWaits

    @property
    def capacity(self) -> int: ...

    def _maybe_goodbye(self, now: float) -> None: ...

    def _arrive(
        self, flight: InFlight, limit: ConcurrencyPolicy, now: float
    ) -> SlotTake | None: ...

    def _send_takes(self, takes: list[SlotTake], now: float, renew: bool = True) -> None: ...

    def _delivered(
        self, arrivals: Sequence[Arrival], now: float, early: bool = False, fresh: bool = False
    ) -> None: ...

    def _room(self) -> int: ...

    def _dispatch(
        self,
        going: list[tuple[InFlight, Arrival]],
        now: float,
        early: bool = False,
        idle: bool = False,
        renew: bool = True,
    ) -> None: ...

    def _reject(self, flight: InFlight, arrival: Arrival, now: float) -> None: ...


class ReadSteps:
    """The worker machine's steps on reads: asking for deliveries, and
    handing out what a read brought."""

    #: when the next read may go out, after a failed one (``None``: at once)
    _read_at: float | None

    def _maybe_read(self: _Machine, now: float) -> None:
        """Ask for more work when this worker has room and no read is out
        (``effects`` decides it, for the last input's ``now``)."""
        if self._reading or not self.accepting or not self.config.reads:
            return
        if self._read_at is not None:
            if now < self._read_at:
                return
            self._read_at = None
        capacity = self.capacity
        if capacity == 0:
            return
        block = self.config.read_block
        if self._next_due is not None:
            block = min(block, max(self._next_due - now, 0.0))
        self._reading = True
        self._read_asked_at = now
        self._read_recovered = self._recover
        self._effects.append(
            Read(
                worker=self.config.name,
                count=capacity,
                now=now,
                block=0.0 if self._recover else block,
                redelivery_timeout=self.config.redelivery_timeout,
                recover=self._recover,
                then_pending=self.config.until_finished and not self.in_flight,
                stale_scan_every=self.config.stale_scan_every,
            )
        )
        self._recover = False

    def _read_done(self: _Machine, event: ReadDone) -> None:
        self._reading = False
        self._next_due = event.next_due
        for entry in event.malformed:
            # never run, never retried: set aside with the reason
            self.counters[Count.MALFORMED] += 1
            bury = plan_bury(
                worker=self.config.name,
                entry=entry,
                now=event.now,
                execution_ttl=self.config.execution_ttl,
                request=self.outbox.request(),
            )
            self._effects.append(bury)
        if event.arrivals:
            # fresh deliveries may start with their claim when it goes out now
            # and the read is recent: leases younger than ``fence_after``,
            # as safe from a takeover as freshly renewed ones
            early = (
                self.config.start_early
                and self.accepting
                and self.outbox.resend_at is None
                and event.now - self._read_asked_at <= self.config.fence_after
            )
            # a recent read's leases need no renewal with their claim: they
            # count from the read (its deliveries were handed out after it),
            # and a periodic renewal comes well before they are fenced
            fresh = (
                event.fresh
                and not self._read_recovered
                and event.now - self._read_asked_at <= self.config.renew_interval / 2
            )
            self._delivered(event.arrivals, event.now, early, fresh)
        elif event.pending == 0 and not self.in_flight and self.config.until_finished:
            self.finished = True
            self.accepting = False
        self._maybe_goodbye(event.now)

    def _delivered(
        self: _Machine,
        arrivals: Sequence[Arrival],
        now: float,
        early: bool = False,
        fresh: bool = False,
    ) -> None:
        """Claim the deliveries; with ``early`` (``_read_done``), start the
        fresh ones that need no admission, slot or deadline at once too
        (``lifecycle``: ``START_EARLY``).  With ``fresh``, their leases
        count from the read that brought them, and the claim leaves them so."""
        # (the new leases count from now, or from the read: fenced no sooner)
        leased = self._read_asked_at if fresh else now
        self._fence_at = min(self._fence_at, leased + self.config.fence_after)
        # (the fence timer is rebuilt from the oldest lease confirmed: none
        # is younger than these)
        self._leases_confirmed_at = min(self._leases_confirmed_at, leased)
        idle = not self.in_flight
        room = self._room()
        going: list[tuple[InFlight, Arrival]] = []
        for arrival in arrivals:
            delivery = arrival.delivery
            if delivery.delivery_id in self.in_flight:
                continue  # already ours (a redelivery to the same worker)
            flight = InFlight(
                delivery_id=delivery.delivery_id,
                message=delivery.message,
                policy=arrival.policy,
                problem=arrival.problem,
                renewed_at=leased,
            )
            self.in_flight[delivery.delivery_id] = flight
            self.counters[_REDELIVERED if delivery.redelivered else _DELIVERED] += 1
            if arrival.problem is not None or arrival.struck:
                self._reject(flight, arrival, now)  # (it never runs: it takes no room)
            elif room > 0:
                room -= 1
                going.append((flight, arrival))
            else:
                self._backlog[delivery.delivery_id] = arrival  # (see the module)
        self._dispatch(going, now, early, idle, renew=not fresh)

    def _room(self: _Machine) -> int:
        """How many more deliveries may go on towards a run now:
        ``concurrency`` less the deliveries held that run or will run (not
        those whose end is out, ``FINISHING``, nor those in the backlog, nor
        those that wait here for a slot this worker's runs hold: each takes
        the room of the run that hands it its slot), and, ahead, those whose
        slot step is out, up to as many as the runs going are expected to
        end within one step's round trip (the mean time of each:
        ``local_slots``)."""
        backlog, waits = self._backlog, self.local.waits
        taken = 0
        for delivery_id, flight in self.in_flight.items():
            if (
                flight.phase is not _FINISHING
                and delivery_id not in backlog
                and delivery_id not in waits
            ):
                taken += 1
        room = self.config.concurrency - taken
        stepping, run_time, step_time = len(self.local.acquiring), self._run_time, self._step_time
        if stepping and run_time and step_time is not None:
            room += min(stepping, int(self._runs * step_time / run_time))
        return room

    def _from_backlog(self: _Machine, now: float) -> None:
        """Send the deliveries of the backlog on, oldest first, as far as
        the worker has room."""
        room = self._room()
        going: list[tuple[InFlight, Arrival]] = []
        backlog = self._backlog
        while backlog and room > 0:
            delivery_id = next(iter(backlog))
            arrival = backlog.pop(delivery_id)
            flight = self.in_flight.get(delivery_id)
            if flight is not None and flight.phase is _ARRIVED:
                room -= 1
                going.append((flight, arrival))
        self._dispatch(going, now)

    def _dispatch(
        self: _Machine,
        going: list[tuple[InFlight, Arrival]],
        now: float,
        early: bool = False,
        idle: bool = False,
        renew: bool = True,
    ) -> None:
        """Send the deliveries on (``ARRIVED``, with room): a slot step, or
        one ``Claim`` for them all (either renewing their leases unless told
        not to), the fresh ones started with it when ``early`` (``_delivered``)."""
        claims: list[ClaimItem] = []
        claiming: list[InFlight] = []
        starts: list[InFlight] = []
        takes: list[SlotTake] = []
        for flight, arrival in going:
            delivery = arrival.delivery
            policy = arrival.policy
            limit = local_limit(policy, self.config.docket)
            if limit is not None:  # (one step claims it into a slot: local_slots)
                take = self._arrive(flight, limit, now)
                takes += (take,) if take is not None else ()
                continue
            if (
                early
                and self._runs + len(starts) < self.config.concurrency
                and not delivery.redelivered
                and policy.concurrency is None
                and policy.timeout is None
                and not policy.admission
            ):
                flight.phase = lifecycle.advance(flight.phase, Step.START_EARLY)
                starts.append(flight)
            else:
                flight.phase = lifecycle.advance(flight.phase, Step.CLAIM)
            claiming.append(flight)
            claims.append(
                ClaimItem(
                    delivery_id=delivery.delivery_id,
                    key=delivery.message.key,
                    generation=delivery.message.generation,
                )
            )
        self._send_takes(takes, now, renew)
        if claims:
            request = self.outbox.request()
            for flight in claiming:
                flight.claim_seq = request.seq
            claim = Claim(
                worker=self.config.name,
                items=tuple(claims),
                now=now,
                renew=renew,
                request=request,
            )
            if starts:
                # runs that start with their claim: it leads the batch, so a
                # store that sends the first round of a batch at once (a
                # partitioned docket) has it on the wire before they run.  It
                # touches only these fresh deliveries, so it commutes with
                # what waits (other deliveries' ends, takes and rejects), as
                # another worker's steps would interleave with them
                self._effects.insert(0, claim)
            else:
                self._effects.append(claim)
        self._runs += len(starts)
        for flight in starts:  # (the claim goes out first)
            flight.started_at = now
            self.counters[_STARTED] += 1
            self.outbox.starts_with_claim(flight.delivery_id, idle)
            self._effects.append(StartTask(delivery_id=flight.delivery_id))

    def _reject(self: _Machine, flight: InFlight, arrival: Arrival, now: float) -> None:
        flight.phase = lifecycle.advance(flight.phase, Step.REJECT)
        self.counters[Count.FAILED if arrival.problem is not None else Count.STRUCK] += 1
        self._effects.append(
            plan_reject(
                delivery_id=flight.delivery_id,
                message=flight.message,
                now=now,
                execution_ttl=self.config.execution_ttl,
                problem=arrival.problem,
                request=self.outbox.request(),
            )
        )
