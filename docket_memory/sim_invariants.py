"""The simulator's invariants (``InvariantChecks``, mixed into
``simulate.Simulation``), checked after every step and once it settled:

- a concurrency limit is never exceeded by tasks running on live workers,
  nor a worker's concurrency by the functions it runs;
- a slot is released only by its holder (or after a takeover of a stale slot);
- the same generation of a key never runs on two live workers at once, and
  while it runs it neither waits behind a limit nor is queued again;
- admission controls keep their rules in the frame of the times the store
  recorded (``note_admissions``, ``check_admission``);
- nothing is lost: once quiet, every accepted add ended or was superseded,
  and the store holds no messages, slots or waiters.

A breach raises ``InvariantViolated``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from docket_core.sansio.admission import (
    Admit,
    Admitted,
    Control,
    CooldownPolicy,
    DebouncePolicy,
    RateLimitPolicy,
    Verdict,
)
from docket_core.sansio.admission_state import DebounceState
from docket_core.sansio.effects import ReleaseSlot, StoreEffect
from docket_core.sansio.lifecycle import Phase
from docket_core.sansio.values import ExecutionState, TaskPolicy

from .shelf import Pool, Shelf

if TYPE_CHECKING:
    from .simulate import SimWorker

#: how far a worker's clock is off the simulation's, at most
MAX_SKEW = 0.5


class InvariantViolated(AssertionError):
    pass


class _Simulation(Protocol):
    """What ``InvariantChecks`` needs of the simulation it is mixed into."""

    shelves: dict[str, Shelf]
    pools: dict[str, Pool]
    #: (origin, seq) of every request sent to a store
    sent: set[tuple[str, int]]
    evicted: set[str]
    judged: set[tuple[str, int]]
    quiet_from: dict[tuple[str | None, str], float]
    admitted: dict[tuple[str | None, str, str], dict[str, float]]
    accepted: list[tuple[str, str, int]]

    def live(self, docket: str | None = None) -> list[SimWorker]: ...

    def clock(self, worker: SimWorker) -> float: ...

    def policy_for(self, key: str) -> TaskPolicy: ...

    @staticmethod
    def check_admission(control: Control, times: list[float]) -> None: ...

    def check_no_second_copy(self, docket: str, key: str, generation: int) -> None: ...


class InvariantChecks:
    """The checks of ``Simulation``'s invariants."""

    def check_release(self: _Simulation, worker: SimWorker, effect: ReleaseSlot) -> None:
        if effect.pass_on:
            return  # a wake-up passed on: it releases nothing
        if effect.request is not None:
            ident = (effect.request.origin, effect.request.seq)
            if ident in self.sent:
                return  # a resend: the store answers it without acting
            self.sent.add(ident)
        pool = self.shelves[worker.docket].pool(effect.scope)
        slots = pool.slots.get(effect.limit_key, {})
        if effect.holder not in slots and effect.holder not in self.evicted:
            raise InvariantViolated(
                f"{effect.holder} released a slot of {effect.limit_key} it does not hold"
            )

    def displaced(self: _Simulation, docket: str) -> set[tuple[str, str]]:
        """(debounce key, task key) of the lost winners ``docket``'s debounces
        remember now: if one comes back it is dropped, and is no submission."""
        pool = self.shelves[docket].pool()
        return {
            (key, task)
            for (_, key), (_, state) in pool.admission.items()
            if isinstance(state, DebounceState)
            for task in state.displaced
        }

    def note_admissions(
        self: _Simulation,
        effects: Sequence[StoreEffect],
        outcomes: Sequence[Any],
        displaced: set[tuple[str, str]],
    ) -> None:
        """Record the starts the store admitted, and check each control's rule
        over the times it recorded them at."""
        for effect, outcome in zip(effects, outcomes, strict=True):
            if not isinstance(effect, Admit) or not isinstance(outcome, Admitted):
                continue
            if effect.request is not None:
                ident = (effect.request.origin, effect.request.seq)
                if ident in self.judged:
                    continue  # a resend: the store answered it without judging again
                self.judged.add(ident)
            control = outcome.blocked_by
            if (
                outcome.verdict is Verdict.DROP
                and isinstance(control, DebouncePolicy)
                and (control.key, effect.message.key) not in displaced
            ):
                # a submission dropped while another waits: the winner waits for it
                where = (control.scope, control.key)
                self.quiet_from[where] = max(self.quiet_from.get(where, 0.0), effect.now)
            if outcome.verdict is not Verdict.ADMIT:
                continue
            message = effect.message
            execution = f"{message.key}#{message.generation}"
            for control in effect.controls:
                starts = self.admitted.setdefault(
                    (control.scope, control.kind.value, control.key), {}
                )
                if execution in starts:
                    continue  # admitted again as itself (a resend, a redelivery)
                if outcome.repeat:
                    raise InvariantViolated(f"{execution} admitted as a repeat, never admitted")
                starts[execution] = effect.now
                self.check_admission(control, sorted(starts.values()))
                if isinstance(control, DebouncePolicy):
                    latest = self.quiet_from.get((control.scope, control.key), -math.inf)
                    if effect.now < latest + control.settle:
                        raise InvariantViolated(
                            f"{control.key} admitted {effect.now - latest:.3f}s after a "
                            f"submission, before it settled ({control.settle}s)"
                        )

    @staticmethod
    def check_admission(control: Control, times: list[float]) -> None:
        if isinstance(control, RateLimitPolicy):
            for first, later in zip(times, times[control.limit :], strict=False):
                if later - first < control.per:
                    raise InvariantViolated(
                        f"{control.key} admitted {control.limit + 1} starts within "
                        f"{control.per}s: {times}"
                    )
            return
        # a debounce waits ``settle`` after the latest submission by the
        # submitter's clock: two workers' starts may lie closer by their skew
        if isinstance(control, CooldownPolicy):
            gap = control.window
        else:
            gap = control.settle - 2 * MAX_SKEW
        for first, later in itertools.pairwise(times):
            if later - first < gap:
                raise InvariantViolated(f"{control.key} admitted two starts within {gap}s")

    def check_no_second_copy(self: _Simulation, docket: str, key: str, generation: int) -> None:
        """A running generation is neither waiting behind a limit nor queued
        again: either would become a second run of it."""
        shelf = self.shelves[docket]
        parked = shelf.parked.get(key)
        if parked is not None:
            pool, limit_key = parked
            for waiter in pool.waiters.get(limit_key, ()):
                if waiter.shelf is shelf and waiter.message.generation == generation:
                    raise InvariantViolated(f"{key} of {docket} runs while it waits behind a limit")
        future = shelf.future.get(key)
        if key in shelf.scoped_parked and future is not None and future.generation == generation:
            raise InvariantViolated(f"{key} of {docket} runs while it waits behind a scoped limit")
        queued = shelf.ready.get(shelf.ready_ids.get(key, ""))
        if queued is not None and queued.generation == generation:
            raise InvariantViolated(f"{key} of {docket} runs while it is queued again")

    def check(self: _Simulation) -> None:
        running_by_limit: dict[tuple[str, str], int] = {}
        running_generations: set[tuple[str, str, int]] = set()
        for worker in self.live():
            concurrency = worker.machine.config.concurrency
            if len(worker.running) > concurrency:
                raise InvariantViolated(
                    f"{worker.name} runs {len(worker.running)} functions at once "
                    f"(concurrency {concurrency})"
                )
            for delivery_id, (end, _outcome) in worker.running.items():
                flight = worker.machine.in_flight.get(delivery_id)
                if flight is None:
                    continue
                if end <= self.clock(worker):
                    # over by now (cancelled at this instant, or its time ran
                    # out): it ended before anything else; the step's
                    # ``finish_due`` tells its machine
                    continue
                message = flight.message
                ident = (worker.docket, message.key, message.generation)
                if ident in running_generations:
                    raise InvariantViolated(f"{ident} runs on two live workers at once")
                running_generations.add(ident)
                if flight.phase is Phase.RUNNING or flight.phase is Phase.EARLY_RUNNING:
                    self.check_no_second_copy(worker.docket, message.key, message.generation)
                limit = self.policy_for(message.key).concurrency
                if limit is not None and flight.slot is not None:
                    where = (limit.scope or worker.docket, limit.limit_key)
                    count = running_by_limit.get(where, 0) + 1
                    running_by_limit[where] = count
                    if count > limit.max_concurrent:
                        raise InvariantViolated(
                            f"{count} tasks run under {limit.limit_key} "
                            f"(max {limit.max_concurrent})"
                        )
                elif limit is not None and flight.phase is not Phase.ABANDONING:
                    # (an abandoned run, its slot lost or given up, is being stopped)
                    raise InvariantViolated(f"{message.key} runs without its slot")
        for shelf in self.shelves.values():
            if len(shelf.ready) != len(shelf.ready_ids) or any(
                key in shelf.ready_ids for key in shelf.parked
            ):
                raise InvariantViolated(f"a key of {shelf.name} is queued twice, or parked too")

    def check_nothing_lost(self: _Simulation) -> None:
        for shelf in self.shelves.values():
            if shelf.ready or shelf.future or shelf.held or shelf.parked:
                raise InvariantViolated(f"messages left in {shelf.name} after settling")
            if shelf.scoped_parked or shelf.scoped_waiters:
                raise InvariantViolated(f"scoped waiters left in {shelf.name}")
        for scope, pool in self.pools.items():
            if any(pool.slots.values()) or any(pool.waiters.values()):
                raise InvariantViolated(
                    f"slots or waiters of {scope} leaked: {pool.slots} {pool.waiters}"
                )

        latest: dict[tuple[str, str], int] = {}
        for docket, key, generation in self.accepted:
            latest[docket, key] = max(latest.get((docket, key), 0), generation)
        for docket, key in latest:
            record = self.shelves[docket].records.get(key)
            if record is None:
                raise InvariantViolated(f"{key} of {docket} vanished")
            if record.state not in (
                ExecutionState.COMPLETED,
                ExecutionState.FAILED,
                ExecutionState.CANCELLED,
            ):
                raise InvariantViolated(f"{key} of {docket} ended {record.state}")
