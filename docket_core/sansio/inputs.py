"""Inputs: what the world tells the core.

Three families: deliveries and task results reported by the runtime, clock
ticks and shutdown, and the *outcomes* of store effects.  An outcome the store
reports (a claim that lost to a newer generation, a parked slot request, a
lease another worker took over) is an input like any other, never an
exception.

Naming rule: an outcome is named after the store effect it answers, as the
past participle of the effect's verb, after the effect's object when the
effect names one: ``Schedule`` -> ``Scheduled``, ``Claim`` -> ``Claimed``,
``Finish`` -> ``Finished``, ``Cancel`` -> ``Cancelled``, ``BuryMalformed`` ->
``Buried``, ``AcquireSlot`` -> ``SlotAcquired``, ``ReleaseSlot`` ->
``SlotReleased``, ``TakeSlot`` -> ``SlotTaken``, ``ConfirmSlot`` ->
``SlotConfirmed``, ``Park`` -> ``Parked``, ``WakeParked`` -> ``WokeParked``,
``Enlist`` -> ``Enlisted``, ``RenewLeases`` -> ``LeasesRenewed``, ``Heartbeat`` (a
noun: the heartbeat is sent) -> ``HeartbeatSent``.  The outcome keeps its
effect's name whatever the store decided (``Claimed`` carries the verdicts,
superseded ones too; ``SlotAcquired`` may say parked).  The runtime's own
reports name what happened to what: ``TaskEnded``, ``ReadDone``/``ReadFailed``
(the answer to ``Read``, which the runtime carries out), ``ReplyLost``,
``StoreFailed``.
"""

from __future__ import annotations

import attrs

from .effects import StoreEffect
from .values import Delivery, ExecutionState, MalformedEntry, Symbol, TaskPolicy


class Input:
    """Base of every input."""

    __slots__ = ()


class Outcome(Input):
    """What a store effect did; adapters return one per effect, in order."""

    __slots__ = ()


# -- from the runtime --------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class Arrival:
    """A delivery, prepared by the runtime for the core.

    ``problem`` says why it cannot run at all (unknown task, arguments that
    cannot be unpickled); ``struck`` says a strike matches it."""

    delivery: Delivery
    policy: TaskPolicy
    problem: str | None = None
    struck: bool = False


@attrs.frozen(slots=True, kw_only=True)
class Delivered(Input):
    """The store handed these deliveries to this worker."""

    arrivals: tuple[Arrival, ...]
    now: float


class TaskOutcome(Symbol):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: cancelled by a ``CancelTask`` or by shutdown; never retried or perpetuated
    CANCELLED = "cancelled"


@attrs.frozen(slots=True, kw_only=True)
class FollowUp:
    """What the task function asked for about its own future, through its
    ``Retry``/``Perpetual`` dependencies."""

    #: ``retry.in_``/``retry.at``: retry at this time (bounded by attempts)
    retry_at: float | None = None
    #: ``perpetual.cancel()`` was called: the chain ends here
    perpetual_cancelled: bool = False
    #: ``perpetual.at``/``after``: the next run's time instead of the interval
    perpetual_at: float | None = None
    #: ``perpetual.perpetuate(...)``: the next run's pickled arguments
    perpetual_payload: bytes | None = None
    #: a custom ``FailureHandler`` took the failure on itself: no retry and
    #: no next perpetual run (the end is recorded failed unless superseded)
    failure_handled: bool = False
    #: a ``FailureHandler`` declined the failure (``False``): no retry (a
    #: next perpetual run still follows)
    retry_declined: bool = False
    #: an ``AdmissionBlocked`` stopped the run before its work: what follows
    blocked: BlockedAction | None = None
    #: (``BlockedAction.RESCHEDULE``) when to run it again, the same attempt
    blocked_until: float | None = None


class BlockedAction(Symbol):
    """What follows a run an ``AdmissionBlocked`` stopped (pydocket's flags)."""

    #: scheduled again at ``FollowUp.blocked_until`` (``reschedule=True``)
    RESCHEDULE = "reschedule"
    #: dropped: recorded cancelled (``reschedule=False``)
    DROP = "drop"
    #: the gate settled it itself (``handled=True``): recorded failed unless
    #: the gate superseded the key meanwhile (a replace), as pydocket's safety net
    HANDLED = "handled"


@attrs.frozen(slots=True, kw_only=True)
class TaskEnded(Input):
    """A task function returned, raised or was cancelled.

    ``error`` is ``"Type: message"``; ``result`` the pickled return value (or
    exception) to keep, or ``None``.  ``started_at``: when the function
    started, by the runtime's clock (``None``: when the machine started it),
    which a perpetual task's next run counts from."""

    delivery_id: str
    now: float
    outcome: TaskOutcome
    error: str | None = None
    result: bytes | None = None
    follow_up: FollowUp | None = None
    started_at: float | None = None


@attrs.frozen(slots=True, kw_only=True)
class CancelRequested(Input):
    """Someone cancelled ``key``; stop it if it runs here.

    ``generation``: deliveries of a generation below it are stopped, newer
    ones (the key added again right after the cancel) run on; ``None`` stops
    every delivery of the key."""

    key: str
    now: float
    generation: int | None = None


@attrs.frozen(slots=True, kw_only=True)
class DeadlineExtended(Input):
    """``Timeout.extend``: the running task's deadline is now ``deadline``."""

    delivery_id: str
    deadline: float


@attrs.frozen(slots=True, kw_only=True)
class Tick(Input):
    """The runtime's timer fired (or it simply wants the core to look at ``now``)."""

    now: float


@attrs.frozen(slots=True, kw_only=True)
class ShutdownRequested(Input):
    """Stop taking work; finish what runs, then say goodbye to the store."""

    now: float


@attrs.frozen(slots=True, kw_only=True)
class AbandonRequested(Input):
    """Stop at once, without draining: nothing more goes to the store, not
    even the end of a run still going (it ends unrecorded); the store hands
    out again what this worker holds once its leases lapse."""

    now: float


@attrs.frozen(slots=True, kw_only=True)
class ReadDone(Input):
    """Outcome of ``Read``: the deliveries (prepared by the runtime), the
    ``when`` of the soonest future message, and, when the read asked and
    brought nothing, how many messages are pending in the store."""

    arrivals: tuple[Arrival, ...]
    next_due: float | None
    now: float
    pending: int | None = None
    #: entries the read brought that are not messages
    malformed: tuple[MalformedEntry, ...] = ()
    #: the store handed every delivery out after the ``Read`` was asked for
    #: (``ReadResult.fresh``): their leases count from then
    fresh: bool = True


@attrs.frozen(slots=True, kw_only=True)
class ReadFailed(Input):
    """A ``Read`` got no answer (or an error): the store may have handed out
    deliveries that never arrived, so the next read recovers them."""

    now: float
    reason: str


@attrs.frozen(slots=True, kw_only=True)
class ReplyLost(Input):
    """No reply came for a batch of store effects (the connection was lost,
    the server went away): any of them may have run, or none.  The machine
    decides when to send them again, and when to give up."""

    effects: tuple[StoreEffect, ...]
    now: float
    reason: str


@attrs.frozen(slots=True, kw_only=True)
class StoreFailed(Input):
    """The store answered a batch with an error (a refused script): the
    effects before the refused one may have run.  Sent again like a lost
    reply; a batch refused ``WorkerConfig.refusals_allowed`` times in a row
    ends the worker."""

    effects: tuple[StoreEffect, ...]
    now: float
    reason: str


# -- outcomes of store effects ----------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class Scheduled(Outcome):
    """Outcome of ``Schedule``: ``accepted`` false when an ``ADD`` met a live
    key, or an ``expect_generation`` did not match."""

    key: str
    accepted: bool
    generation: int
    state: ExecutionState | None


@attrs.frozen(slots=True, kw_only=True)
class Cancelled(Outcome):
    """Outcome of ``Cancel``: the state the key was in, if any."""

    key: str
    previous: ExecutionState | None


@attrs.frozen(slots=True, kw_only=True)
class Buried(Outcome):
    """Outcome of ``BuryMalformed``: whether the entry moved to the dead-letter
    stream (false when this worker no longer held it), and whether its key
    was recorded failed."""

    delivery_id: str
    moved: bool
    failed_key: bool = False


class ClaimVerdict(Symbol):
    CLAIMED = "claimed"
    #: a newer generation of the key exists (replace, retry, cancel)
    SUPERSEDED = "superseded"
    #: the key was cancelled
    CANCELLED = "cancelled"
    #: the delivery is no longer this worker's (its lease ran out and another
    #: worker took it over, or it was acknowledged): leave it alone
    LOST = "lost"


@attrs.frozen(slots=True, kw_only=True)
class Claimed(Outcome):
    """Outcome of ``Claim``: one verdict per item, in order."""

    verdicts: tuple[tuple[str, ClaimVerdict], ...]


@attrs.frozen(slots=True, kw_only=True)
class Finished(Outcome):
    """Outcome of ``Finish``: ``recorded`` false when a newer generation won."""

    delivery_id: str
    recorded: bool


@attrs.frozen(slots=True, kw_only=True)
class LeasesRenewed(Outcome):
    """Outcome of ``RenewLeases``: deliveries this worker no longer owns, and
    slot holders whose slots were taken over (their holder went stale)."""

    lost: tuple[str, ...] = ()
    lost_slots: tuple[str, ...] = ()


@attrs.frozen(slots=True, kw_only=True)
class SlotAcquired(Outcome):
    """Outcome of ``AcquireSlot``: acquired, or parked among the waiters; or,
    for a resent acquisition whose first send had acquired, ``lost`` when the
    slot was taken over as stale before the resend arrived."""

    delivery_id: str
    acquired: bool
    lost: bool = False


@attrs.frozen(slots=True, kw_only=True)
class SlotReleased(Outcome):
    """Outcome of ``ReleaseSlot``: how many waiters parked by ``AcquireSlot``
    were queued again, and, when none was, the docket whose waiters of the
    scoped chain to wake next (``WakeParked``), or ``None``."""

    limit_key: str
    woken: int
    wake: str | None = None


@attrs.frozen(slots=True, kw_only=True)
class SlotTaken(Outcome):
    """Outcome of ``TakeSlot``: ``acquired``, or the limit was full (the docket
    is registered as waiting); or, for a resend whose first send had
    acquired, ``lost`` when the slot was taken over before it arrived."""

    delivery_id: str
    acquired: bool
    lost: bool = False


@attrs.frozen(slots=True, kw_only=True)
class SlotConfirmed(Outcome):
    """Outcome of ``ConfirmSlot``: ``lost`` when the sender no longer holds the
    delivery (the run must not start; the slot is released)."""

    delivery_id: str
    lost: bool = False


@attrs.frozen(slots=True, kw_only=True)
class Parked(Outcome):
    """Outcome of ``Park``: ``parked`` when the key waits behind the limit (false
    when the delivery was only acknowledged: superseded or cancelled), ``lost``
    when the sender no longer held the delivery (nothing changed)."""

    delivery_id: str
    parked: bool
    lost: bool = False


@attrs.frozen(slots=True, kw_only=True)
class WokeParked(Outcome):
    """Outcome of ``WakeParked``: how many waiters were queued (0 or 1), how
    many keys still wait in that docket behind the limit, and the park time
    of the oldest of them (``None`` when none)."""

    docket: str
    limit_key: str
    woken: int
    remaining: int = 0
    oldest: float | None = None


@attrs.frozen(slots=True, kw_only=True)
class Enlisted(Outcome):
    """Outcome of ``Enlist``."""

    docket: str
    limit_key: str


@attrs.frozen(slots=True, kw_only=True)
class HeartbeatSent(Outcome):
    """Outcome of ``Heartbeat``."""
