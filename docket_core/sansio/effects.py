"""Effects: what the core asks the world to do.

Two families.  *Store effects* are small transactions with a condition, decided
by the core and carried out atomically by a storage adapter; each one comes back
as exactly one outcome input (``docket_core.sansio.inputs``), in order.  *Runtime
effects* are for the worker runtime itself: start or cancel a task function.

Effects carry no behaviour; adapters dispatch on their type.

Resends
-------
A reply can be lost after the store ran an effect (a server killed after its
append-only-file write, a connection killed).  The worker machine resends such
a batch, so every store effect is safe to send twice:

- ``Claim``, ``Finish``, ``Schedule``, ``AcquireSlot``, ``ReleaseSlot``,
  ``Cancel``, ``BuryMalformed``, ``TakeSlot``, ``Park`` and ``WakeParked``
  carry a ``Request``.  The store remembers the outcome of each
  request of an origin until the origin's floor passes it, and answers a resend
  with the first outcome instead of acting again.  A resend carries the time of
  its own attempt, so a replayed acquisition that came back *acquired* renews
  its slot to that time (or reports it lost, if it was taken over meanwhile), and
  a replayed claim reports the delivery lost if another worker holds it now.
- ``RenewLeases``, ``Heartbeat``, ``ConfirmSlot`` and ``Enlist`` are
  idempotent by nature: running them again at a later ``now`` renews to that
  later time (or checks the holder again), which is what a resend wants.
- An effect without a ``Request`` (a producer's ``add``, ``cancel``) is not
  remembered: producers do not resend; their caller sees the error.
"""

from __future__ import annotations

import attrs

from .values import (
    ExecutionState,
    HeldSlot,
    MalformedEntry,
    ScheduleMode,
    Symbol,
    TaskMessage,
)


class Effect:
    """Base of every effect."""

    __slots__ = ()


class StoreEffect(Effect):
    """An effect a storage adapter carries out, reporting one outcome."""

    __slots__ = ()


class RuntimeEffect(Effect):
    """An effect the worker runtime carries out itself."""

    __slots__ = ()


class BatchTurn(Symbol):
    """When the runtime writes the batch of store effects that a worker
    machine's ``effects()`` handed out (``WorkerMachine.batch_turn``), against
    the batches it handed out before (written first, always) and the runs
    handed out with it."""

    #: whenever: beside the batches out, the runs going on meanwhile
    BESIDE = "beside"
    #: before the runs handed out with it get a turn: it holds their claim
    BEFORE_RUNS = "before runs"
    #: as ``BEFORE_RUNS``, once every batch ahead of it is answered: an idle
    #: worker's pickup, so a cancel sent once its run started finds the claim
    #: done (a claim behind a batch out could meet it first, on the server)
    ALONE = "alone"


@attrs.frozen(slots=True, kw_only=True)
class Request:
    """The identity of one store effect, for answering its resends.

    ``origin`` names the sender (one worker machine's life: unique, never
    reused), ``worker`` the consumer it reads as, ``seq`` numbers its effects.
    An effect that acknowledges or admits a delivery (``Finish``, a follow-up
    ``Schedule``, ``AcquireSlot``) changes nothing while another worker
    holds the delivery (its lease lapsed and was taken over): the other
    worker's run decides.

    The store may forget the outcomes of the origin's requests below
    ``floor`` (their replies arrived), and forgets all of them ``remember``
    seconds after the origin's last request; the sender never resends past
    that."""

    origin: str
    worker: str
    seq: int
    floor: int
    remember: float


# -- store effects -----------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class Schedule(StoreEffect):
    """Store ``message`` to run at ``message.when``.

    Contract, atomically:

    - ``ADD``: only if the key has no scheduled, queued or running execution
      (a running one whose key was cancelled does not count: the key is free
      again at once, as in pydocket); otherwise change nothing and report
      ``accepted=False``.
    - ``REPLACE``: remove any scheduled or queued message of the key, bump the
      key's generation (so any message still in flight is superseded), store.
    - ``expect_generation``: if set, do nothing unless the key's current
      generation equals it (a stale predecessor never clobbers its successor);
      the acknowledgement below still happens.  When that run's key was
      cancelled while it ran (``ExecutionRecord.cancel_ttl``), nothing
      follows it: the message is not stored, and the record concludes as
      ``ended`` (with ``ended_error``), or ``cancelled`` when ``ended`` is
      unset (a retry), under a new generation, kept for the cancel's ttl;
      the outcome is ``accepted=False``.
    - ``acknowledge``: the delivery to acknowledge in the same step (a retry or
      the next run of a perpetual task replaces the message it came from).
    - ``ended``: how the run that this message follows ended (the next run of
      a perpetual task), with ``ended_error`` for a failure.  When the message
      is stored, that end is published first, as a state event with
      ``completed_at=now`` (and ``error``), as pydocket publishes every end of
      a perpetual run; the record is the new message's.

    A message whose ``when <= now`` is queued at once; a later one is scheduled.
    The new generation comes from one docket-wide counter (never reused).
    A state event is published.
    """

    message: TaskMessage
    mode: ScheduleMode
    now: float
    acknowledge: str | None = None
    expect_generation: int | None = None
    ended: ExecutionState | None = None
    ended_error: str | None = None
    #: identity for resends (see the module docstring)
    request: Request | None = attrs.field(default=None, eq=False)


@attrs.frozen(slots=True, kw_only=True)
class Cancel(StoreEffect):
    """Cancel ``key``; the outcome names the state it was in.

    - scheduled or queued (parked included): remove its message, bump its
      generation so no copy in flight may start, conclude it ``cancelled``
      (a state event); the record then lives ``ttl`` seconds (0: deleted);
    - running: mark it (``ExecutionRecord.cancel_ttl = ttl``) and nothing
      else: no new generation, no state change.  The run records its own
      end (``Finish``), and nothing follows it (see ``Schedule``); a copy of
      its delivery handed out again (its worker died) is concluded
      ``cancelled`` by its ``Claim`` instead of running, and so is one that
      ``AcquireSlot`` would park.  Cancelling a marked record changes
      nothing more;
    - ended, or no record: nothing.

    In every case but the last, a cancellation signal ``(key, generation)``
    goes to the workers, naming the first generation it spares (a waiting
    key's new one, a running key's own plus one): their runs of the key
    below it stop."""

    key: str
    now: float
    ttl: float
    #: identity for resends (see the module docstring)
    request: Request | None = attrs.field(default=None, eq=False)


@attrs.frozen(slots=True, kw_only=True)
class ClaimItem:
    delivery_id: str
    key: str
    generation: int


@attrs.frozen(slots=True, kw_only=True)
class Claim(StoreEffect):
    """Per item, atomically: if the delivery is no longer held by ``worker``,
    change nothing (verdict lost); else if ``generation`` is still the key's
    current one and the key has not ended (cancelled, or already run to its
    end by an earlier copy of the delivery), mark it running on ``worker``
    and renew its lease (state event); otherwise acknowledge the delivery so
    it is never handed out again (superseded or cancelled).  A running
    record a cancel marked (its worker died before the run's end was
    recorded) does not run again: it concludes ``cancelled`` under a new
    generation, kept for the cancel's ttl (verdict cancelled).  Without
    ``renew``, a claimed delivery's lease is left as it is: the read that
    handed the deliveries out was recent, and the machine counts their
    leases from it (``read_steps``)."""

    worker: str
    items: tuple[ClaimItem, ...]
    now: float
    renew: bool = True
    #: identity for resends (see the module docstring)
    request: Request | None = attrs.field(default=None, eq=False)


@attrs.frozen(slots=True, kw_only=True)
class Finish(StoreEffect):
    """Record the end of a run and acknowledge its delivery, as one step.

    The record is written only while ``generation`` is the key's current one
    (a superseded run leaves its successor alone); the delivery is acknowledged
    in any case.  ``result`` is kept with the record for ``ttl`` seconds;
    ``ttl == 0`` deletes the record.  A state event is published."""

    delivery_id: str
    key: str
    generation: int
    state: ExecutionState
    now: float
    ttl: float
    error: str | None = None
    result: bytes | None = None
    #: identity for resends (see the module docstring)
    request: Request | None = attrs.field(default=None, eq=False)


@attrs.frozen(slots=True, kw_only=True)
class RenewLeases(StoreEffect):
    """Keep ``worker``'s deliveries (and concurrency slots) owned as of ``now``.

    Reports the deliveries that are no longer this worker's (taken over by
    another worker after the lease ran out, or gone) and the slot holders
    whose slots are gone (taken over as stale).

    One effect; a store whose namespaces live apart splits it: the
    deliveries and the slots without a scope in ``P``, and the slots of
    each scope in that scope's ``S`` (renew each holder still in
    ``S:slots:<limit>`` to ``now``, report the others lost), merging the
    ``lost_slots``.  Every part is idempotent, so a partial failure is
    just sent again."""

    worker: str
    delivery_ids: tuple[str, ...]
    slots: tuple[HeldSlot, ...]
    now: float


@attrs.frozen(slots=True, kw_only=True)
class AcquireSlot(StoreEffect):
    """Take one of ``max_concurrent`` slots of ``limit_key`` for ``holder``.

    Atomically: if a slot is free, take it; else if a slot's holder has not
    renewed it for ``stale_after`` seconds, take that one over; else park the
    delivery: acknowledge it and put its message at the tail of the limit's
    waiters (state event: scheduled), to be queued again by a release."""

    limit_key: str
    holder: str
    max_concurrent: int
    now: float
    stale_after: float
    delivery_id: str
    message: TaskMessage
    #: where the limit's slots live (``ConcurrencyPolicy.scope``)
    scope: str | None = None
    #: identity for resends (see the module docstring)
    request: Request | None = attrs.field(default=None, eq=False)


@attrs.frozen(slots=True, kw_only=True)
class ReleaseSlot(StoreEffect):
    """Remove ``holder``'s slot of ``limit_key`` and, if it was still held,
    hand the freed slot on (a holder whose slot was taken over frees nothing).

    The slots live in ``S`` (``{scope}``, or ``P`` without a scope), and the
    release touches ``S`` only (memo in ``S:did:<origin>``): ``ZREM
    S:slots:<limit> holder``; if that removed it, hand the slot on, in order:

    1. to the oldest live waiter parked by ``AcquireSlot`` in ``S``
       (``S:wait:<limit>``: the waiters of the docket whose namespace ``S``
       is; today's ``wake()``): it is queued, ``woken=1``;
    2. else to the docket that waited longest for the limit through the
       scoped chain: ``ZPOPMIN S:stale:<limit>`` (see ``TakeSlot``), answered
       as ``wake=<docket name>`` (``None`` when none waits).

    So a limit a docket shares with others that name it as their scope
    serves both kinds of waiters.  Nothing else is read or written.

    ``pass_on`` (after a chain's ``WakeParked`` found nobody to wake,
    ``WokeParked.woken == 0``): the release already happened; only pop the
    next waiting docket (step 2), without touching the slots (``holder``
    is ignored).

    A resend answers its first outcome and does nothing."""

    limit_key: str
    holder: str
    now: float
    scope: str | None = None
    pass_on: bool = False
    #: identity for resends (see the module docstring)
    request: Request | None = attrs.field(default=None, eq=False)


# -- the scoped chain (docs/cluster.md, section 4) ---------------------------
#
# A limit with a scope (``S = {scope}``) shared by dockets (``P = {name}``) is
# taken and released in steps that each touch one slot: ``TakeSlot`` in S,
# then ``ConfirmSlot`` or ``Park`` in P; ``ReleaseSlot(scope=S)`` in S, then
# ``WakeParked`` in the waiting docket P', then ``Enlist`` in S.  Keys:
#
# - ``S:slots:<limit>``: zset holder -> when it last took or renewed its slot
#   (as today's scoped slots);
# - ``S:stale:<limit>``: the limit's *waiting dockets*, zset docket name ->
#   when it (first) waited; written with ``ZADD NX`` only;
# - ``P:waiters:<S>|<limit>``: zset key -> when it parked (first in, first
#   out), the keys of P parked behind the scoped limit; the record
#   ``P:run:<key>`` of a parked key has ``parked=<limit>`` and ``pin=<S>``,
#   and its message waits in ``P:due``/``P:msg:<key>`` at its retry time.
#
# Whoever takes a parked key off its schedule (``read``'s promotion at the
# retry time, ``unqueue`` for a cancel, replace or clear) clears its parking:
# the record's ``parked``/``pin``, ``P:parked`` and its ``P:waiters`` member.
# A scoped parked key is both in ``P:due`` and in ``P:parked``: counts of
# pending or scheduled work take it once.


@attrs.frozen(slots=True, kw_only=True)
class TakeSlot(StoreEffect):
    """Step 1 of a scoped limit (in ``S`` only; memo in ``S:did:<origin>``):
    take one of ``max_concurrent`` slots of ``limit_key`` for ``holder``.

    Fresh, atomically: if ``holder`` has a slot, renew it to ``now``
    (acquired); else if fewer than ``max_concurrent`` holders, take one
    (acquired); else if some holder's time is ``<= now - stale_after``, remove
    the one with the oldest time (ties: the smallest holder) and take its
    place (acquired).  A slot set expires as today's (``max(4 *
    stale_after, 60)`` s after its last write).  Otherwise the limit is full:
    register ``docket`` among the limit's waiting dockets (``ZADD
    S:stale:<limit> NX <now> <docket>``, with the same expiry) and answer
    ``acquired=False``.  The delivery is not looked at (no taken-over
    check: ``ConfirmSlot``/``Park`` in ``P`` make it).

    A resend answers its first outcome, except that a first *acquired* is
    renewed to the resend's ``now`` while ``holder`` still has its slot, and
    answers ``acquired=False, lost=True`` when the slot was taken over
    meanwhile."""

    scope: str
    limit_key: str
    holder: str
    max_concurrent: int
    now: float
    stale_after: float
    delivery_id: str
    #: the name of the docket the delivery belongs to (registered when full)
    docket: str
    #: identity for resends (see the module docstring)
    request: Request | None = attrs.field(default=None, eq=False)


@attrs.frozen(slots=True, kw_only=True)
class ConfirmSlot(StoreEffect):
    """Step 2a (in ``P`` only), after ``TakeSlot`` acquired: may the run start?

    ``lost`` when ``worker`` no longer holds the delivery (another worker
    took it over, or nobody holds it: ``holder_of(id) ~= worker``); nothing
    is written then.  Otherwise, if the record of ``key`` is still at
    ``generation``, mark it holding the slot (``HSET P:run:<key> slot
    <limit> pin <S>``, for snapshots); answer ``lost=False``.

    Idempotent by nature (no memo): a resend checks the holder again."""

    worker: str
    delivery_id: str
    key: str
    generation: int
    limit_key: str
    scope: str
    now: float


@attrs.frozen(slots=True, kw_only=True)
class Park(StoreEffect):
    """Step 2b (in ``P`` only; memo in ``P:did:<origin>``), after
    ``TakeSlot`` found the limit full: put the delivery's key behind it.

    Atomically: ``lost`` (nothing changes) when a request names a sender
    (``Request.worker``) that no longer holds the delivery (as
    ``ConfirmSlot``).  Otherwise acknowledge the delivery (``XACK`` and
    ``XDEL``), then, only if the record of ``message.key`` is at
    ``message.generation``:

    - a record a cancel marked (``cancel``): conclude it cancelled, as
      today's acquisition does (``parked=False``);
    - a record already parked on this limit and scope: nothing more
      (``parked=True``);
    - else: ``ZADD P:waiters:<S>|<limit> <now> <key>``, ``SADD P:parked``,
      the record ``state=scheduled``, ``parked=<limit>``, ``pin=<S>`` (its
      ``worker`` and ``started`` removed, its progress deleted), the
      message stored as a scheduled one due at ``retry_at`` (``P:msg:<key>``
      with its fields unchanged, ``ZADD P:due <retry_at> <key>``), and a
      state event ``scheduled`` (``parked=True``).

    A record at another generation, or none, only gets the acknowledgement
    (``parked=False``).  A resend answers its first outcome."""

    delivery_id: str
    message: TaskMessage
    limit_key: str
    scope: str
    now: float
    #: when the parked message runs again if no wake-up comes first
    #: (``decisions.parked_retry_at``)
    retry_at: float
    #: identity for resends (see the module docstring)
    request: Request | None = attrs.field(default=None, eq=False)


@attrs.frozen(slots=True, kw_only=True)
class WakeParked(StoreEffect):
    """Step 4 (in ``docket``'s ``P'`` only; memo in ``P':did:<origin>``):
    queue the oldest live waiter of ``P':waiters:<S>|<limit>``.

    Pop members oldest first (``ZPOPMIN``) until one is live: its record is
    ``scheduled`` with ``parked=<limit>`` and ``pin=<S>``.  For that one:
    clear its parking (record fields, ``P':parked``), take its message off
    the schedule (``P':due``, ``P':msg:<key>``) and queue it now
    (``enqueue``: state ``queued`` and its event, a wake-up for readers);
    ``woken=1``.  Dead members are dropped; ``woken=0`` when none was live.
    Then ``remaining`` is ``ZCARD`` of what is left and ``oldest`` the
    smallest score left (``None`` when empty).  A resend answers its first
    outcome."""

    #: the name of the docket whose waiters are woken (the layout it runs in)
    docket: str
    scope: str
    limit_key: str
    now: float
    #: identity for resends (see the module docstring)
    request: Request | None = attrs.field(default=None, eq=False)


@attrs.frozen(slots=True, kw_only=True)
class Enlist(StoreEffect):
    """Step 5 (in ``S`` only): ``docket`` still has keys parked behind the
    limit: register it among the waiting dockets again, as the time of its
    oldest waiter (``ZADD S:stale:<limit> NX <since> <docket>``, with the
    slot set's expiry).  Idempotent by nature (no memo)."""

    scope: str
    limit_key: str
    #: the name of the docket to register
    docket: str
    since: float
    now: float


@attrs.frozen(slots=True, kw_only=True)
class Heartbeat(StoreEffect):
    """Announce ``worker`` (and the tasks it can run) as alive at ``now``, or,
    with ``leaving``, remove it from the list of workers."""

    worker: str
    tasks: tuple[str, ...]
    now: float
    leaving: bool = False


@attrs.frozen(slots=True, kw_only=True)
class BuryMalformed(StoreEffect):
    """Move a malformed entry this worker holds to the dead-letter stream with
    its reason, and acknowledge it; when the entry is its key's current
    message (the key's record names it, or its generation is the key's and
    the key is live), record the key ``failed`` with the reason.  Changes
    nothing unless ``worker`` still holds the entry (a second bury of one
    entry, or one that was taken over, does nothing).  Answered by
    ``Buried``."""

    worker: str
    entry: MalformedEntry
    now: float
    ttl: float
    #: resend bookkeeping (see ``Request``)
    request: Request | None = attrs.field(default=None, eq=False)


# -- reads -------------------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class Read(Effect):
    """Ask the store for up to ``count`` deliveries (``StorageAdapter.read``),
    waiting up to ``block`` seconds when there are none; with ``recover``,
    first hand back what this worker already holds (the reply of an earlier
    read was lost).  With ``then_pending``, an empty read also counts what is
    pending in the store (a worker running until finished asks).  Carried out
    by the runtime's reader, one at a time; answered by ``ReadDone`` or
    ``ReadFailed``."""

    worker: str
    count: int
    now: float
    block: float
    redelivery_timeout: float
    recover: bool = False
    then_pending: bool = False
    #: look for deliveries to take over only where no read of the docket's
    #: went through them within this many seconds (0: every read looks)
    stale_scan_every: float = 0.0


# -- runtime effects ---------------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class StartTask(RuntimeEffect):
    """Run the task function of this delivery."""

    delivery_id: str


@attrs.frozen(slots=True, kw_only=True)
class SeedPerpetuals(RuntimeEffect):
    """Add every automatic perpetual task again (an add of a key that is
    still scheduled, queued or running changes nothing), so a chain that was
    cancelled, struck and restored, or dropped by an old worker resumes."""


class StopReason(Symbol):
    """Why the core stops a running task function (``CancelTask``)."""

    #: it ran past its deadline: the run fails with ``TimeoutError``
    TIMEOUT = "timeout"
    #: someone cancelled its key: the run ends cancelled
    CANCELLED = "cancelled"
    #: another worker owns the message now: nothing is recorded here
    LEASE_LOST = "lease-lost"


@attrs.frozen(slots=True, kw_only=True)
class ErrorResult:
    """An exception a stopped run keeps as its result: the runtime builds
    ``kind(message)`` and pickles it (the core never pickles)."""

    kind: type[Exception]
    message: str

    def exception(self) -> Exception:
        return self.kind(self.message)


@attrs.frozen(slots=True, kw_only=True)
class CancelTask(RuntimeEffect):
    """Cancel the running task function of this delivery, for ``reason``.

    A run that ends cancelled then reports ``result`` (pickled) as its
    ``TaskEnded.result``, or nothing when ``result`` is ``None``."""

    delivery_id: str
    reason: StopReason
    result: ErrorResult | None = None
