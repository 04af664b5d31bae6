"""The worker machine: every delivery a worker holds, its leases, slots and
deadlines, as one pure state machine.

The runtime feeds it inputs (``receive``) and the outcomes of the store effects
it ran (``store_replied``), drains the effects it produced (``effects``), and
keeps one timer armed at ``next_deadline()``, calling ``receive(Tick(now))``
when it fires.  Phase changes of each delivery go through
``lifecycle.advance``; this module decides which step an input is.

The machine decides its own reads (``Read``, answered by ``ReadDone`` or
``ReadFailed``), when its effects are drained, so the runs that end in one
pass of the runtime make one read; a delivery whose end is out to the store
leaves its room to that read (``capacity``), which then goes out beside the
ends instead of after their reply.  It also decides what follows a batch
of store effects that got no reply or an error: its ``Outbox``
(``outbox.py``) sends it again, gives it up or declares it fatal.  A worker
that cannot renew its leases for ``fence_after`` stops those runs itself,
before another worker may take them.

Any exception out of ``receive`` or ``store_replied`` is docket's bug
(``InvalidTransition``, ``InternalError``) or a misuse (an input it does not
take), and may have left the machine half-way: as h11's connections do, the
machine then refuses everything (``receive``, ``store_replied``, ``effects``)
with an ``InternalError`` naming that first error.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from typing import NoReturn

from . import lifecycle
from .admission import (
    Admit,
    Admitted,
    Blocked,
    Verdict,
    admission_groups,
    blocked_counts,
    next_admit,
    settle_apart,
)
from .decisions import may_follow, plan_end
from .effects import (
    BatchTurn,
    Claim,
    Effect,
    Finish,
    Heartbeat,
    ReleaseSlot,
    RenewLeases,
    Request,
    Schedule,
    SeedPerpetuals,
    StartTask,
    StopReason,
    StoreEffect,
)
from .errors import InternalError
from .flight import Count, InFlight, WorkerConfig, moving_mean
from .inputs import (
    AbandonRequested,
    Arrival,
    BlockedAction,
    Buried,
    CancelRequested,
    Claimed,
    ClaimVerdict,
    DeadlineExtended,
    Delivered,
    Finished,
    Input,
    LeasesRenewed,
    Outcome,
    ReadDone,
    ReadFailed,
    ReplyLost,
    Scheduled,
    ShutdownRequested,
    StoreFailed,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from .leases import LeaseSteps
from .lifecycle import Phase, Step
from .local_slots import LocalWaits
from .outbox import Outbox
from .read_steps import ReadSteps
from .scoped_slots import SLOT_ANSWERS, ReleaseChains, SlotSteps
from .stopping import stop_task, timed_out_end

# the members every run meets, bound once: on Python 3.11 looking a member
# up on its enum class costs several times a global's lookup
_RUNNING, _TIMING_OUT, _CANCELLING = Phase.RUNNING, Phase.TIMING_OUT, Phase.CANCELLING
_EARLY_RUNNING, _EARLY = Phase.EARLY_RUNNING, lifecycle.EARLY
#: the phases in which the verdict of a claim comes after the run started
_STARTED_BEFORE_VERDICT = lifecycle.EARLY | {Phase.EARLY_ENDED, Phase.EARLY_CANCELLED}
_DELIVERED, _REDELIVERED, _STARTED = Count.DELIVERED, Count.REDELIVERED, Count.STARTED
#: the counter of each way a run ends, and of each claim that lost
_ENDED = {outcome: Count(outcome.value) for outcome in TaskOutcome}
_LOST = {v: Count(v.value) for v in ClaimVerdict if v is not ClaimVerdict.CLAIMED}
#: the counter of each way a run an ``AdmissionBlocked`` stopped goes on
_BLOCKED_END = {BlockedAction.RESCHEDULE: Count.RESCHEDULED, BlockedAction.DROP: Count.CANCELLED}


class WorkerMachine(ReadSteps, SlotSteps, LeaseSteps):
    """The decisions of one worker, fed by its runtime (its steps on reads:
    ``read_steps.ReadSteps``; on concurrency slots:
    ``scoped_slots.SlotSteps``; on leases: ``leases.LeaseSteps``)."""

    def __init__(self, config: WorkerConfig, now: float) -> None:
        self.config = config
        self.in_flight: dict[str, InFlight] = {}
        self.counters: Counter[Count] = Counter()
        self._rescheduled = False
        #: an early run's end whose plan ``rescheduled`` works out when asked
        self._rescheduled_if: tuple[InFlight, TaskEnded, bool] | None = None
        self._effects: list[Effect] = []
        #: when the runtime writes the batch the last ``effects()`` handed out
        self.batch_turn = BatchTurn.BESIDE
        self._next_renewal = now + config.renew_interval
        #: the ``now`` of the last renewal the store confirmed (or of a moment
        #: this worker held nothing): no lease of it is older
        self._leases_confirmed_at = now
        #: when ``_fence`` may next stop a run (a timer of its own: the
        #: renewal and heartbeat ticks may come an interval too late)
        self._fence_at = now + config.fence_after
        self._next_heartbeat = now
        # the runtime seeds automatic perpetual tasks as it starts; re-seed later
        self._next_seed = now + config.reseed_interval if config.reseed_interval else None
        self._timeouts = 0
        self.accepting = True
        self.said_goodbye = False
        #: stopped without draining (``AbandonRequested``): hands out nothing more
        self.abandoned = False
        docket = f"{config.docket}/" if config.docket else ""
        self._holder_prefix = f"{docket}{config.name}/"
        self.outbox = Outbox(
            origin=config.origin or config.name,
            worker=config.name,
            remember=config.remember,
            retry_delay=config.retry_delay,
            resend_window=config.resend_window,
            refusals_allowed=config.refusals_allowed,
            in_flight=config.batches_in_flight,
        )
        self.chains = ReleaseChains(docket=config.docket, outbox=self.outbox)
        self.local = LocalWaits()
        #: the task functions running (started, their ``TaskEnded`` not in)
        self._runs = 0
        #: the ``READY`` deliveries, oldest first (``lifecycle``)
        self._ready: deque[str] = deque()
        #: the mean time of a run and of a slot step's round trip (moving
        #: averages; ``None`` until one is known): how many runs end within
        #: one round trip (``read_steps._room``)
        self._run_time: float | None = None
        self._step_time: float | None = None
        #: deliveries a read brought beyond the room, in arrival order
        #: (``read_steps``): held, waiting for runs to end
        self._backlog: dict[str, Arrival] = {}
        #: a ``Read`` is out; the next one recovers lost deliveries; not before
        self._reading = False
        self._recover = False
        self._read_at: float | None = None
        #: the ``now`` of the last ``Read`` asked for: its deliveries were
        #: handed out after it
        self._read_asked_at = now
        #: whether that read recovered deliveries a lost reply handed out
        #: (their leases are as old as that read: the claim renews them)
        self._read_recovered = False
        #: the ``now`` of the last input or reply: whether to read is decided
        #: when the effects are drained (``effects``), so the runs that end
        #: in one pass of the runtime free their room for one read
        self._read_due: float | None = None
        #: the ``now`` of the last input or reply (a held batch goes out
        #: stamped with it)
        self._now = now
        #: the soonest future message the last read saw
        self._next_due: float | None = None
        #: ``until_finished`` and nothing was left: the worker stops
        self.finished = False
        #: the exception that failed this machine: it takes no more input
        self.failed: BaseException | None = None

    # -- queries -------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """How many more deliveries this worker may take now: ``concurrency``
        less those it runs or will run.  A delivery whose end is out to the
        store (``FINISHING``) leaves its room to the next read, so that read
        goes out with the ends, not after their reply; so do deliveries
        whose slot steps are out, as many as runs are expected to end within
        a round trip (``read_steps._room``; they may wait ``READY``, see
        ``lifecycle``), and those that wait here for a slot this worker's
        runs hold (``local_slots``).  But for the backlog of a recovering
        read (``read_steps``), a worker holds at most twice its concurrency
        in deliveries.  None while that backlog waits."""
        if not self.accepting or self._backlog:
            return 0
        return max(min(self._room(), 2 * self.config.concurrency - len(self.in_flight)), 0)

    @property
    def idle(self) -> bool:
        return not self.in_flight

    def holder(self, delivery_id: str) -> str:
        """The slot holder identity of a delivery: unique per docket, worker and
        delivery, so a redelivered copy elsewhere never counts as the same holder."""
        return self._holder_prefix + delivery_id

    @property
    def quiet(self) -> bool:
        """Said goodbye, with nothing left to send to the store."""
        return self.said_goodbye and self.outbox.resend_at is None and not self.outbox.out

    @property
    def fatal(self) -> str | None:
        """Why the worker must stop: the store refused a batch for good."""
        return self.outbox.fatal

    def next_deadline(self) -> float | None:
        """When the runtime must call back with ``Tick``."""
        resend_at = self.outbox.resend_at
        if self.said_goodbye:
            return resend_at
        deadline = self._next_heartbeat
        if resend_at is not None:
            deadline = min(deadline, resend_at)
        if self._read_at is not None and self.accepting:
            deadline = min(deadline, self._read_at)
        if self._next_seed is not None and self.accepting:
            deadline = min(deadline, self._next_seed)
        if self.in_flight:
            deadline = min(deadline, self._next_renewal, self._fence_at)
        deadline = self._wait_deadline(deadline)  # (local_slots)
        if self._timeouts:
            for flight in self.in_flight.values():
                if flight.deadline is not None and flight.phase is Phase.RUNNING:
                    deadline = min(deadline, flight.deadline)
        return deadline

    def effects(self) -> list[Effect]:
        """Drain the effects produced so far (swap and return).  Their store
        effects are one batch, to be sent as one, in order, after any batch
        handed out before.  Store effects are held back while a failed batch
        waits to be sent again, or while as many batches are out as may be
        (``WorkerConfig.batches_in_flight``): the next call after a reply
        hands them out (and the runs that start with a claim among them).
        ``batch_turn`` says when the runtime writes the batch."""
        if self.failed is not None:
            self._refuse()
        if self.abandoned:
            self._effects = []
            return []
        if self._read_due is not None:
            now, self._read_due = self._read_due, None
            if self._backlog:
                self._from_backlog(now)
            self._maybe_read(now)
        hand_out = self.outbox.hand_out
        out, self._effects, self.batch_turn = hand_out(self._effects, self._now)
        return out

    # -- inputs --------------------------------------------------------------

    def receive(self, event: Input) -> None:
        """Take one input from the runtime."""
        if self.failed is not None:
            self._refuse()
        try:
            self._receive(event)
            now: float | None = getattr(event, "now", None)
            if now is not None:
                self._read_due = self._now = now
                if self._read_at is not None and now >= self._read_at:
                    self._read_at = None  # (no longer a deadline: the read is due)
        except BaseException as error:
            self.failed = error
            raise

    def _refuse(self) -> NoReturn:
        error = self.failed
        raise InternalError(
            f"the worker machine failed earlier and takes no more input: "
            f"{type(error).__name__}: {error}"
        ) from error

    def _receive(self, event: Input) -> None:
        if self.abandoned:
            self._after_abandon(event)
        elif type(event) is TaskEnded:
            self._runs -= 1
            flight = self.in_flight.get(event.delivery_id)
            if flight is not None:  # (the mean run time: ``read_steps._room``)
                self._run_time = moving_mean(self._run_time, event.now - flight.started_at)
            self._task_ended(event)
            if self._ready:
                self._run_ready(event.now)
        elif type(event) is ReadDone:
            assert isinstance(event, ReadDone)
            self._read_done(event)
        elif type(event) is Delivered:
            self._delivered(event.arrivals, event.now)
        elif type(event) is Tick:
            self._tick(event.now)
        elif type(event) is CancelRequested:
            self._cancel_requested(event)
        elif type(event) is DeadlineExtended:
            flight = self.in_flight.get(event.delivery_id)
            if flight is not None and flight.phase is Phase.RUNNING:
                if flight.deadline is None:
                    self._timeouts += 1
                flight.deadline = event.deadline
        elif type(event) is ShutdownRequested:
            self.accepting = False
            self.outbox.stop()
            self._waited(event.now, everyone=True)
            self._maybe_goodbye(event.now)
        elif type(event) is AbandonRequested:
            self.accepting = False
            self.abandoned = True
            self.outbox.stop()
            self._effects = []
        elif type(event) is ReadFailed:
            assert isinstance(event, ReadFailed)
            self.counters[Count.STORE_ERRORS] += 1
            self._reading = False
            self._recover = True
            self._read_at = event.now + self.config.retry_delay
            self._maybe_goodbye(event.now)
        elif type(event) is ReplyLost or type(event) is StoreFailed:
            assert isinstance(event, ReplyLost | StoreFailed)
            self._store_failed(event)
        else:
            raise TypeError(f"not an input the worker machine takes: {event!r}")

    def _after_abandon(self, event: Input) -> None:
        """An abandoned worker's runs end unrecorded; it takes nothing else."""
        if type(event) is TaskEnded:
            self._runs -= 1
            self._rescheduled, self._rescheduled_if = False, None
            if self.in_flight.pop(event.delivery_id, None) is not None:
                self.counters[Count.ABANDONED] += 1

    def store_replied(
        self, effects: Sequence[StoreEffect], outcomes: Sequence[Outcome], now: float
    ) -> None:
        """Take the outcomes of store effects this machine produced, in order
        (an abandoned worker's are left unheard: it acts on nothing more)."""
        if self.failed is not None:
            self._refuse()
        if self.abandoned:
            return
        try:
            self._store_replied(effects, outcomes, now)
        except BaseException as error:
            self.failed = error
            raise

    def _store_replied(
        self, effects: Sequence[StoreEffect], outcomes: Sequence[Outcome], now: float
    ) -> None:
        self.outbox.replied(effects)
        self._read_due = self._now = now
        for effect, outcome in zip(effects, outcomes, strict=True):
            kind = type(outcome)
            if kind is Finished or kind is Scheduled:
                self._recorded(effect, now)
            elif kind is Buried:
                assert isinstance(outcome, Buried)
                self.counters[Count.DEAD_LETTERED if outcome.moved else Count.BURY_LOST] += 1
            elif kind is Claimed:
                assert isinstance(outcome, Claimed) and isinstance(effect, Claim)
                self._claimed(effect, outcome, now)
            elif kind in SLOT_ANSWERS:  # (scoped_slots)
                self._slot_replied(effect, outcome, now)
            elif kind is Admitted:
                assert isinstance(outcome, Admitted) and isinstance(effect, Admit)
                self._admitted(effect, outcome, now)
            elif kind is LeasesRenewed:
                assert isinstance(outcome, LeasesRenewed) and isinstance(effect, RenewLeases)
                self._renewed(effect)
                for delivery_id in outcome.lost:
                    self._lease_lost(delivery_id, now)
                for holder in outcome.lost_slots:
                    # the slot was taken over as stale: the run must stop too
                    delivery_id = holder.removeprefix(self._holder_prefix)
                    flight = self.in_flight.get(delivery_id)
                    if flight is not None:
                        flight.slot = None
                        self._lease_lost(delivery_id, now)
        self._maybe_goodbye(now)
        self._maybe_read(now)

    # -- handlers ------------------------------------------------------------

    def _claimed(self, effect: Claim, outcome: Claimed, now: float) -> None:
        request = effect.request
        seq = 0 if request is None else request.seq
        for delivery_id, verdict in outcome.verdicts:
            flight = self.in_flight.get(delivery_id)
            if flight is None or flight.claim_seq != seq:
                # (a verdict for an earlier copy of the delivery, handed back
                # to this worker after that copy's run was stopped: not this one's)
                continue
            if verdict is not ClaimVerdict.CLAIMED:
                self.counters[_LOST[verdict]] += 1
            if flight.phase in _STARTED_BEFORE_VERDICT or flight.phase is Phase.ABANDONING:
                self._early_verdict(flight, verdict, now)
                continue
            if verdict is not ClaimVerdict.CLAIMED:
                flight.phase = lifecycle.advance(flight.phase, Step.CLAIM_LOST)
                del self.in_flight[delivery_id]
                continue
            policy = flight.policy
            if not (policy.concurrency or policy.admission) or flight.phase is not Phase.CLAIMING:
                self._start(flight, Step.CLAIMED, now)  # (a stopped one never starts)
                continue
            flight.phase = lifecycle.advance(flight.phase, Step.CLAIMED_LIMITED)
            if policy.admission:
                # admission first: a start it admits counts, even if a full limit
                # parks it; one step per namespace, the first group first
                self._effects.append(
                    Admit(
                        delivery_id=delivery_id,
                        message=flight.message,
                        controls=admission_groups(policy.admission)[0],
                        now=now,
                        stale_after=self.config.redelivery_timeout,
                        ttl=self.config.execution_ttl,
                        request=self.outbox.request(),
                    )
                )
            else:
                self._effects.append(self._acquire(flight, now))

    def _admitted(self, effect: Admit, outcome: Admitted, now: float) -> None:
        flight = self.in_flight.get(outcome.delivery_id)
        if flight is None:
            return
        if outcome.verdict is Verdict.LOST:  # another worker holds it now: no start here
            self._lease_lost(outcome.delivery_id, now)
            self._start(flight, Step.ADMITTED, now)
        elif outcome.verdict is Verdict.ADMIT:
            following = None
            if flight.phase is Phase.ADMITTING:  # the controls of the next namespace, if any
                following = next_admit(effect, flight.policy.admission, now, self.outbox.request)
            if following is not None:
                self._effects.append(following)  # (still ADMITTING)
            elif flight.policy.concurrency is not None and flight.phase is Phase.ADMITTING:
                self._effects.append(self._acquire(flight, now))  # (still ADMITTING)
            else:
                self._start(flight, Step.ADMITTED, now)
        else:  # dropped or rescheduled: settled by the store's step, or next, in the docket
            settle = settle_apart(effect, outcome, now, self.outbox.request)
            if settle is not None:
                self._effects.append(settle)
            for name in blocked_counts(outcome):
                self.counters[Count(name)] += 1
            flight.phase = lifecycle.advance(flight.phase, Step.BLOCKED)
            del self.in_flight[outcome.delivery_id]
            self._effects.append(
                Blocked(delivery_id=outcome.delivery_id, key=flight.message.key, outcome=outcome)
            )

    def _start(self, flight: InFlight, step: Step, now: float) -> None:
        """The store let ``flight`` start (``step``): it runs, or, with no
        room for a run, waits ``READY``; stopped meanwhile, or fenced (its
        lease lapsed before the answer came, as the next tick's ``_fence``
        would find), it ends unrun."""
        phase = lifecycle.advance(flight.phase, step)
        if phase is _RUNNING:
            if flight.renewed_at + self.config.fence_after <= now:
                # another worker may hold it, and its slot, by now
                self.counters[Count.FENCED] += 1
                was = flight.phase
                self._lease_lost(flight.delivery_id, now)
                if was is Phase.READY:
                    return  # (ended by its lost lease)
                phase = lifecycle.advance(flight.phase, step)  # (abandoned)
            elif self._runs >= self.config.concurrency:
                flight.phase = lifecycle.advance(flight.phase, Step.NO_ROOM)
                self._ready.append(flight.delivery_id)
                return
        flight.phase = phase
        flight.started_at = now
        if flight.phase is not _RUNNING:
            # cancelled, or taken over by another worker, while it was being
            # claimed or admitted: it never starts, and it ends as it would have
            self._end_unrun(flight, now)
            return
        if flight.policy.timeout is not None:
            flight.deadline = now + flight.policy.timeout
            self._timeouts += 1
        self.counters[_STARTED] += 1
        self._runs += 1
        self._effects.append(StartTask(delivery_id=flight.delivery_id))

    def _run_ready(self, now: float) -> None:
        """Start the ``READY`` deliveries, oldest first, while there is room."""
        ready, in_flight = self._ready, self.in_flight
        while ready and self._runs < self.config.concurrency:
            flight = in_flight.get(ready.popleft())
            if flight is not None and flight.phase is Phase.READY:
                self._start(flight, Step.RUN, now)

    def _end_unrun(self, flight: InFlight, now: float) -> None:
        """A delivery stopped before its run started (``CANCELLING``,
        ``ABANDONING``: while the store was asked, or ``READY``): it never
        starts, and ends as a run stopped at once would."""
        self._task_ended(
            TaskEnded(delivery_id=flight.delivery_id, now=now, outcome=TaskOutcome.CANCELLED)
        )

    def _task_ended(self, event: TaskEnded) -> None:
        flight = self.in_flight.get(event.delivery_id)
        if flight is None:
            raise InternalError(f"no task runs for delivery {event.delivery_id!r}")
        if flight.deadline is not None:
            self._timeouts -= 1
            flight.deadline = None
        phase = flight.phase
        self._rescheduled, self._rescheduled_if = False, None
        if phase in _EARLY:
            # started with its claim: the end waits for the verdict; what it
            # will lead to once claimed is planned then (``rescheduled`` plans
            # it now, for the end's log line, only if asked)
            cancelled = phase is not _EARLY_RUNNING
            flight.phase = lifecycle.advance(phase, Step.ENDED)
            flight.ended = event
            self._rescheduled_if = (flight, event, cancelled)
            return
        release = self._release(flight, event.now)
        if phase is Phase.ABANDONING:
            flight.phase = lifecycle.advance(phase, Step.ENDED)
            del self.in_flight[event.delivery_id]
            self.counters[Count.ABANDONED] += 1
            self._send_end(None, release, event.now)
            self._maybe_goodbye(event.now)
            return
        outcome, error = event.outcome, event.error
        if phase is _TIMING_OUT:
            outcome, error = timed_out_end(event, flight.policy)
        flight.phase = lifecycle.advance(phase, Step.ENDED)
        self._end(flight, event, outcome, error, phase is _CANCELLING, release)

    def _end(
        self,
        flight: InFlight,
        event: TaskEnded,
        outcome: TaskOutcome,
        error: str | None,
        cancelled: bool,
        release: ReleaseSlot | None,
    ) -> None:
        """Plan what the end of a run leads to (``FINISHING`` now), and send it."""
        effect = self._plan(flight, event, outcome, error, cancelled, self.outbox.request())
        follow_up = event.follow_up
        if follow_up is not None and follow_up.blocked is not None and not cancelled:
            # (an ``AdmissionBlocked``; one its gate handled ends failed)
            self.counters[_BLOCKED_END.get(follow_up.blocked, Count.FAILED)] += 1
        elif isinstance(effect, Schedule):
            retrying = effect.message.attempt > flight.message.attempt
            self.counters[Count.RETRIED if retrying else Count.PERPETUATED] += 1
            self._rescheduled = True
        else:
            self.counters[_ENDED[outcome]] += 1
        # the outcome first, then the release (same round trip): a waiter woken
        # by the release then sees this run's record already concluded
        self._send_end(effect, release, event.now)

    @property
    def rescheduled(self) -> bool:
        """Whether the last ``TaskEnded`` led (or, for a run that started
        with its claim, leads once claimed) to a retry or a perpetual task's
        next run: its end line's arrow (``worker_logs``).  Asked right after
        that ``receive``."""
        pending = self._rescheduled_if
        if pending is not None:
            flight, event, cancelled = pending
            self._rescheduled = may_follow(flight.policy, event) and isinstance(
                self._plan(flight, event, event.outcome, event.error, cancelled), Schedule
            )
            self._rescheduled_if = None
        return self._rescheduled

    def _plan(
        self,
        flight: InFlight,
        event: TaskEnded,
        outcome: TaskOutcome,
        error: str | None,
        cancelled: bool,
        request: Request | None = None,
    ) -> StoreEffect:
        return plan_end(
            delivery_id=flight.delivery_id,
            message=flight.message,
            policy=flight.policy,
            ended=event,
            outcome=outcome,
            error=error,
            started_at=flight.started_at if event.started_at is None else event.started_at,
            execution_ttl=self.config.execution_ttl,
            request=request,
            cancelled=cancelled,
        )

    def _recorded(self, effect: StoreEffect, now: float) -> None:
        if isinstance(effect, Finish):
            delivery_id: str | None = effect.delivery_id
        elif isinstance(effect, Schedule):
            delivery_id = effect.acknowledge
        else:
            return
        flight = self.in_flight.get(delivery_id) if delivery_id else None
        if flight is None or flight.phase is not Phase.FINISHING:
            return
        flight.phase = lifecycle.advance(flight.phase, Step.RECORDED)
        del self.in_flight[flight.delivery_id]

    def _cancel_requested(self, event: CancelRequested) -> None:
        for flight in list(self.in_flight.values()):
            if flight.message.key != event.key:
                continue
            if event.generation is not None and flight.message.generation >= event.generation:
                continue  # added again after the cancel
            was = flight.phase
            flight.phase = lifecycle.advance(was, Step.CANCEL)
            if was is _RUNNING or was is _EARLY_RUNNING:
                stop = stop_task(flight.delivery_id, StopReason.CANCELLED, flight.message)
                self._effects.append(stop)
            elif was is Phase.READY:
                self._end_unrun(flight, event.now)

    def _tick(self, now: float) -> None:
        lapsed = self.outbox.lapsed(now)
        if lapsed:
            self._give_up(lapsed, now)  # stalled past the window: never resent
        resent = self.outbox.resend(now, self._effects)
        if resent is not None:
            self._effects = resent
        if self.in_flight:
            self._fence(now)
        self._waited(now)
        self._maybe_goodbye(now)
        if self._timeouts:
            for flight in self.in_flight.values():
                if (
                    flight.phase is Phase.RUNNING
                    and flight.deadline is not None
                    and flight.deadline <= now
                ):
                    flight.phase = lifecycle.advance(flight.phase, Step.TIMEOUT)
                    self.counters[Count.TIMED_OUT] += 1
                    stop = stop_task(flight.delivery_id, StopReason.TIMEOUT, flight.message)
                    self._effects.append(stop)
        if self.in_flight and now >= self._next_renewal:
            self._renew(now)
        elif not self.in_flight and now >= self._next_renewal:
            self._next_renewal = now + self.config.renew_interval
            self._leases_confirmed_at = now  # nothing held: nothing to renew
        if self._next_seed is not None and self.accepting and now >= self._next_seed:
            assert self.config.reseed_interval is not None
            self._next_seed = now + self.config.reseed_interval
            self._effects.append(SeedPerpetuals())
        if now >= self._next_heartbeat and not self.said_goodbye:
            self._next_heartbeat = now + self.config.heartbeat_interval
            if self.accepting:
                self._effects.append(
                    Heartbeat(worker=self.config.name, tasks=self.config.tasks, now=now)
                )

    def _maybe_goodbye(self, now: float) -> None:
        # (a read still out may bring deliveries: they must reach this machine
        # and be drained, or they would wait for their leases to lapse)
        if (
            not self.accepting
            and not self.in_flight
            and not self.said_goodbye
            and not self._reading
            and not self.chains.open
        ):
            self.said_goodbye = True
            self._effects.append(
                Heartbeat(worker=self.config.name, tasks=self.config.tasks, now=now, leaving=True)
            )


__all__ = ["InFlight", "WorkerConfig", "WorkerMachine"]
