"""The lifecycle of one delivery inside one worker: phases and the one table
of transitions between them.

Theory of operation
-------------------
A worker receives *deliveries* (messages the store hands it).  Each delivery
walks the phases below, driven by steps the worker machine derives from its
inputs.  Every move goes through ``TRANSITIONS``; a step the table has no row
for raises ``InvalidTransition`` naming the phase and the step, because it
means docket itself is wrong, not the user or the store.

Everything a delivery's future depends on is its phase: a delivery asked to
stop while its ``Claim``, ``Admit`` or ``AcquireSlot`` is out waits for the store in a
phase of its own (``CLAIMING_CANCELLED``, ``ADMITTING_LOST``...), and once
the store lets it run it never starts: it goes straight to ``CANCELLING``
(it ends cancelled; a run cancelled while it ran ends as it returned or
raised, with no follow-up) or ``ABANDONING`` (it ends unrecorded, another
worker owns it).  A run stopped for its timeout is ``TIMING_OUT``: it ends failed
with ``TimeoutError`` (``stopping.py``).  A row that keeps the phase is a
step that changes nothing there (a cancel that comes too late).

Nothing is acknowledged before its outcome is recorded: a crash anywhere
leaves the message with the store, which hands it out again once its lease
runs out (at-least-once).  A concurrency slot is released only by a delivery
that left ``ADMITTING`` (or one of its stopped twins) with ``slot_acquired``,
i.e. whose ``AcquireSlot`` came back acquired: the machine keeps that fact,
and only it emits ``ReleaseSlot``.  A delivery whose task has admission
controls (``admission.py``) is ``admitted`` (on to its slot, if it has a
limit, or it starts) or ``blocked``: the store dropped or rescheduled it in
the same step, acknowledging it.  ``given_up``: the store did not answer the
delivery's effect within the resend window; the delivery is left to it,
unacknowledged.

A limit whose scope is shared with other dockets (``scoped_slots.py``) lives
in another slot of a cluster than the docket, so no one step may touch both:
the delivery ``take``s its slot in the scope (``TAKING``), then, in the
docket, confirms it still holds the delivery (``CONFIRMING``, on to
``RUNNING``) or, the limit being full, parks its key there (``PARKING``,
then ``DONE``).  A confirmation that finds the delivery lost is a
``lease_lost`` first: the delivery goes ``ABANDONING`` and releases the slot
it took.  A delivery stopped while its ``TakeSlot`` or ``ConfirmSlot`` is
out waits in a phase of its own, as above; ``Park`` settles the delivery
whatever happened meanwhile (a cancelled key concludes there), so
``PARKING`` keeps its phase.  Releasing is a chain of steps too, driven by
the store's answers (``scoped_slots.ReleaseChains``), apart from any
delivery.  A crash between two steps leaves a slot that goes stale, a
delivery handed out again, or a parked key that retries at its
``retry_at``: nothing the leases and that time do not recover.

A fresh delivery (read as new, not handed out again) of a task without
admission controls, limit or timeout starts with its ``Claim``, not after
it (``START_EARLY``, ``EARLY_RUNNING``): a pickup then waits for one round
trip less.  This is safe because a cancel or a replace deletes a queued
message that no worker holds yet, so a fresh delivery's claim can find the
key cancelled or superseded (or the delivery lost) only through a race no
wider than the claim's own round trip: a verdict other than ``claimed`` is
then a cancellation that came just after the start.  The run is stopped
(``ABANDONING``) and ends unrecorded: the store already settled the message
(it acknowledged it, or another worker holds it).  A run that ends before
the verdict waits for it (``EARLY_ENDED``): its end is recorded only once
claimed, so no outcome is recorded for a run the store never let start.

A worker runs at most ``concurrency`` functions at once.  A delivery the
store lets start (claimed, admitted, its slot acquired or confirmed) while
the worker runs that many waits ``READY`` (``no_room``), holding what the
store gave it (its lease, its slot), and starts (``run``) as soon as a run
ends; stopped meanwhile, it never starts (``CANCELLING``, ``ABANDONING``,
as above).  A worker asks for slots ahead of its room (``local_slots``)
only as many as its runs are expected to end within one round trip, so a
``READY`` delivery waits about one round trip on average.

The table, as ``diagram()`` draws it (``python -m docket_core.sansio --diagram``;
a test checks that the two agree); steps that lead to the same phase share a
line, and ``(stays)`` lists the steps that change nothing::

    ARRIVED                claim                                       -> CLAIMING
                           reject                                      -> FINISHING
                           start_early                                 -> EARLY_RUNNING
                           cancel | lease_lost                         (stays)
    CLAIMING               claimed                                     -> RUNNING
                           claimed_limited                             -> ADMITTING
                           claim_lost | given_up                       -> DONE
                           cancel                                      -> CLAIMING_CANCELLED
                           lease_lost                                  -> CLAIMING_LOST
                           no_room                                     -> READY
    CLAIMING_CANCELLED     claimed                                     -> CANCELLING
                           claim_lost | given_up                       -> DONE
                           lease_lost                                  -> CLAIMING_LOST
                           cancel                                      (stays)
    CLAIMING_LOST          claimed                                     -> ABANDONING
                           claim_lost | given_up                       -> DONE
                           cancel | lease_lost                         (stays)
    ADMITTING              slot_acquired | admitted                    -> RUNNING
                           slot_parked | blocked | given_up            -> DONE
                           cancel                                      -> ADMITTING_CANCELLED
                           lease_lost                                  -> ADMITTING_LOST
                           take                                        -> TAKING
                           no_room                                     -> READY
    ADMITTING_CANCELLED    slot_acquired | admitted                    -> CANCELLING
                           slot_parked | blocked | given_up            -> DONE
                           lease_lost                                  -> ADMITTING_LOST
                           cancel                                      (stays)
    ADMITTING_LOST         slot_acquired | admitted                    -> ABANDONING
                           slot_parked | blocked | given_up            -> DONE
                           cancel | lease_lost                         (stays)
    TAKING                 slot_taken                                  -> CONFIRMING
                           slot_full                                   -> PARKING
                           cancel                                      -> TAKING_CANCELLED
                           lease_lost                                  -> TAKING_LOST
                           given_up                                    -> DONE
    TAKING_CANCELLED       slot_taken                                  -> CANCELLING
                           slot_full                                   -> PARKING
                           lease_lost                                  -> TAKING_LOST
                           given_up                                    -> DONE
                           cancel                                      (stays)
    TAKING_LOST            slot_taken                                  -> ABANDONING
                           slot_full | given_up                        -> DONE
                           cancel | lease_lost                         (stays)
    CONFIRMING             slot_confirmed                              -> RUNNING
                           cancel                                      -> CONFIRMING_CANCELLED
                           lease_lost                                  -> CONFIRMING_LOST
                           given_up                                    -> DONE
                           no_room                                     -> READY
    CONFIRMING_CANCELLED   slot_confirmed                              -> CANCELLING
                           lease_lost                                  -> CONFIRMING_LOST
                           given_up                                    -> DONE
                           cancel                                      (stays)
    CONFIRMING_LOST        slot_confirmed                              -> ABANDONING
                           given_up                                    -> DONE
                           cancel | lease_lost                         (stays)
    PARKING                parked | given_up                           -> DONE
                           cancel | lease_lost                         (stays)
    EARLY_RUNNING          claimed                                     -> RUNNING
                           claim_lost | given_up | lease_lost          -> ABANDONING
                           cancel                                      -> EARLY_CANCELLING
                           ended                                       -> EARLY_ENDED
    EARLY_CANCELLING       claimed                                     -> CANCELLING
                           claim_lost | given_up | lease_lost          -> ABANDONING
                           ended                                       -> EARLY_CANCELLED
                           cancel                                      (stays)
    EARLY_ENDED            claimed                                     -> FINISHING
                           claim_lost | given_up                       -> DONE
                           cancel | lease_lost                         (stays)
    EARLY_CANCELLED        claimed                                     -> FINISHING
                           claim_lost | given_up                       -> DONE
                           cancel | lease_lost                         (stays)
    READY                  run                                         -> RUNNING
                           cancel                                      -> CANCELLING
                           lease_lost                                  -> ABANDONING
    RUNNING                ended                                       -> FINISHING
                           timeout                                     -> TIMING_OUT
                           cancel                                      -> CANCELLING
                           lease_lost                                  -> ABANDONING
    CANCELLING             ended                                       -> FINISHING
                           lease_lost                                  -> ABANDONING
                           cancel                                      (stays)
    TIMING_OUT             ended                                       -> FINISHING
                           lease_lost                                  -> ABANDONING
                           cancel                                      (stays)
    ABANDONING             ended                                       -> DONE
                           cancel | lease_lost | claimed | claim_lost  (stays)
    FINISHING              recorded | given_up                         -> DONE
                           cancel | lease_lost                         (stays)
    DONE                   (final)
"""

from __future__ import annotations

from .errors import InvalidTransition
from .values import Symbol


class Phase(Symbol):
    #: handed to this worker; nothing asked of the store yet
    ARRIVED = "arrived"
    #: ``Claim`` sent, verdict pending
    CLAIMING = "claiming"
    #: ``Claim`` sent, and the key was cancelled since: it will not start
    CLAIMING_CANCELLED = "claiming_cancelled"
    #: ``Claim`` sent, and the lease was lost since: it will not start
    CLAIMING_LOST = "claiming_lost"
    #: claimed; ``Admit`` (its admission controls) or ``AcquireSlot`` (its
    #: concurrency slot) sent, waiting for the store's verdict
    ADMITTING = "admitting"
    #: ``Admit`` or ``AcquireSlot`` sent, and the key was cancelled since: it will not start
    ADMITTING_CANCELLED = "admitting_cancelled"
    #: ``Admit`` or ``AcquireSlot`` sent, and the lease was lost since: it will not start
    ADMITTING_LOST = "admitting_lost"
    #: a scoped limit's step 1: ``TakeSlot`` sent (in the scope), waiting
    TAKING = "taking"
    #: ``TakeSlot`` sent, and the key was cancelled since: it will not start
    TAKING_CANCELLED = "taking_cancelled"
    #: ``TakeSlot`` sent, and the lease was lost since: it will not start
    TAKING_LOST = "taking_lost"
    #: step 2a: the slot is taken (and renewed); ``ConfirmSlot`` sent (in the docket)
    CONFIRMING = "confirming"
    #: ``ConfirmSlot`` sent, and the key was cancelled since: it will not start
    CONFIRMING_CANCELLED = "confirming_cancelled"
    #: ``ConfirmSlot`` sent, and the lease was lost since: it will not start
    CONFIRMING_LOST = "confirming_lost"
    #: step 2b: the limit was full; ``Park`` sent (in the docket), which
    #: settles the delivery whatever happened since (a cancel concludes it)
    PARKING = "parking"
    #: a fresh delivery without admission controls or timeout started at
    #: once, its ``Claim`` still out (``START_EARLY``): the verdict confirms
    #: the run (``RUNNING``) or voids it (``ABANDONING``: it ends unrecorded)
    EARLY_RUNNING = "early_running"
    #: ``EARLY_RUNNING``, and its key was cancelled since (``CancelTask`` sent)
    EARLY_CANCELLING = "early_cancelling"
    #: ``EARLY_RUNNING`` and the function ended: its end waits for the verdict
    #: (recorded once claimed, dropped otherwise)
    EARLY_ENDED = "early_ended"
    #: ``EARLY_CANCELLING`` and the function ended: as ``EARLY_ENDED``, and
    #: once claimed it ends as a run cancelled while it ran (nothing follows)
    EARLY_CANCELLED = "early_cancelled"
    #: the store let it start, but the worker runs ``concurrency`` functions
    #: already: it starts (``run``) as soon as one of them ends
    READY = "ready"
    #: the task function runs
    RUNNING = "running"
    #: its key was cancelled (``CancelTask`` sent, or it never started): it
    #: ends as it ran (cancelled, unless it returned or raised anyway), and
    #: nothing follows it (no retry, no next perpetual run)
    CANCELLING = "cancelling"
    #: it ran past its deadline (``CancelTask`` sent); it ends failed, unless it returns first
    TIMING_OUT = "timing_out"
    #: the lease was lost to another worker; waiting for the function to stop
    ABANDONING = "abandoning"
    #: ``Finish`` or a follow-up ``Schedule`` sent; waiting for the store
    FINISHING = "finishing"
    #: nothing more to do here
    DONE = "done"


class Step(Symbol):
    CLAIM = "claim"
    #: ``Claim`` sent and the function started with it (``EARLY_RUNNING``)
    START_EARLY = "start_early"
    REJECT = "reject"
    CLAIMED = "claimed"
    CLAIMED_LIMITED = "claimed_limited"
    CLAIM_LOST = "claim_lost"
    SLOT_ACQUIRED = "slot_acquired"
    SLOT_PARKED = "slot_parked"
    #: its admission controls let it start (``Admitted``)
    ADMITTED = "admitted"
    #: an admission control dropped or rescheduled it (the store settled it)
    BLOCKED = "blocked"
    #: a scoped limit: ``TakeSlot`` sent
    TAKE = "take"
    #: ``TakeSlot`` answered: acquired / the limit was full
    SLOT_TAKEN = "slot_taken"
    SLOT_FULL = "slot_full"
    #: ``ConfirmSlot`` answered (a lost delivery is ``lease_lost`` first)
    SLOT_CONFIRMED = "slot_confirmed"
    #: ``Park`` answered: the key waits, or the delivery was only settled
    PARKED = "parked"
    #: the store let it start, and the worker has no room for a run (``READY``)
    NO_ROOM = "no_room"
    #: a run ended and made room for a ``READY`` one
    RUN = "run"
    TIMEOUT = "timeout"
    CANCEL = "cancel"
    LEASE_LOST = "lease_lost"
    ENDED = "ended"
    RECORDED = "recorded"
    #: the store did not answer this delivery's effect within the resend window
    GIVEN_UP = "given_up"


P, S = Phase, Step

#: (phase, step) -> next phase.  The only place phases change.
TRANSITIONS: dict[tuple[Phase, Step], Phase] = {
    (P.ARRIVED, S.CLAIM): P.CLAIMING,
    (P.ARRIVED, S.REJECT): P.FINISHING,
    (P.ARRIVED, S.START_EARLY): P.EARLY_RUNNING,
    # a delivery waiting in the worker for a slot (``local_slots``): its
    # step's claim finds out
    (P.ARRIVED, S.CANCEL): P.ARRIVED,
    (P.ARRIVED, S.LEASE_LOST): P.ARRIVED,
    (P.CLAIMING, S.CLAIMED): P.RUNNING,
    (P.CLAIMING, S.CLAIMED_LIMITED): P.ADMITTING,
    (P.CLAIMING, S.CLAIM_LOST): P.DONE,
    (P.CLAIMING, S.CANCEL): P.CLAIMING_CANCELLED,
    (P.CLAIMING, S.LEASE_LOST): P.CLAIMING_LOST,
    (P.CLAIMING, S.GIVEN_UP): P.DONE,
    (P.CLAIMING_CANCELLED, S.CLAIMED): P.CANCELLING,
    (P.CLAIMING_CANCELLED, S.CLAIM_LOST): P.DONE,
    (P.CLAIMING_CANCELLED, S.CANCEL): P.CLAIMING_CANCELLED,
    (P.CLAIMING_CANCELLED, S.LEASE_LOST): P.CLAIMING_LOST,
    (P.CLAIMING_CANCELLED, S.GIVEN_UP): P.DONE,
    (P.CLAIMING_LOST, S.CLAIMED): P.ABANDONING,
    (P.CLAIMING_LOST, S.CLAIM_LOST): P.DONE,
    (P.CLAIMING_LOST, S.CANCEL): P.CLAIMING_LOST,
    (P.CLAIMING_LOST, S.LEASE_LOST): P.CLAIMING_LOST,
    (P.CLAIMING_LOST, S.GIVEN_UP): P.DONE,
    (P.ADMITTING, S.SLOT_ACQUIRED): P.RUNNING,
    (P.ADMITTING, S.SLOT_PARKED): P.DONE,
    (P.ADMITTING, S.ADMITTED): P.RUNNING,
    (P.ADMITTING, S.BLOCKED): P.DONE,
    (P.ADMITTING, S.CANCEL): P.ADMITTING_CANCELLED,
    (P.ADMITTING, S.LEASE_LOST): P.ADMITTING_LOST,
    (P.ADMITTING, S.GIVEN_UP): P.DONE,
    (P.ADMITTING_CANCELLED, S.SLOT_ACQUIRED): P.CANCELLING,
    (P.ADMITTING_CANCELLED, S.SLOT_PARKED): P.DONE,
    (P.ADMITTING_CANCELLED, S.ADMITTED): P.CANCELLING,
    (P.ADMITTING_CANCELLED, S.BLOCKED): P.DONE,
    (P.ADMITTING_CANCELLED, S.CANCEL): P.ADMITTING_CANCELLED,
    (P.ADMITTING_CANCELLED, S.LEASE_LOST): P.ADMITTING_LOST,
    (P.ADMITTING_CANCELLED, S.GIVEN_UP): P.DONE,
    (P.ADMITTING_LOST, S.SLOT_ACQUIRED): P.ABANDONING,
    (P.ADMITTING_LOST, S.SLOT_PARKED): P.DONE,
    (P.ADMITTING_LOST, S.ADMITTED): P.ABANDONING,
    (P.ADMITTING_LOST, S.BLOCKED): P.DONE,
    (P.ADMITTING_LOST, S.CANCEL): P.ADMITTING_LOST,
    (P.ADMITTING_LOST, S.LEASE_LOST): P.ADMITTING_LOST,
    (P.ADMITTING_LOST, S.GIVEN_UP): P.DONE,
    (P.ADMITTING, S.TAKE): P.TAKING,
    (P.TAKING, S.SLOT_TAKEN): P.CONFIRMING,
    (P.TAKING, S.SLOT_FULL): P.PARKING,
    (P.TAKING, S.CANCEL): P.TAKING_CANCELLED,
    (P.TAKING, S.LEASE_LOST): P.TAKING_LOST,
    (P.TAKING, S.GIVEN_UP): P.DONE,
    (P.TAKING_CANCELLED, S.SLOT_TAKEN): P.CANCELLING,
    (P.TAKING_CANCELLED, S.SLOT_FULL): P.PARKING,
    (P.TAKING_CANCELLED, S.CANCEL): P.TAKING_CANCELLED,
    (P.TAKING_CANCELLED, S.LEASE_LOST): P.TAKING_LOST,
    (P.TAKING_CANCELLED, S.GIVEN_UP): P.DONE,
    (P.TAKING_LOST, S.SLOT_TAKEN): P.ABANDONING,
    (P.TAKING_LOST, S.SLOT_FULL): P.DONE,
    (P.TAKING_LOST, S.CANCEL): P.TAKING_LOST,
    (P.TAKING_LOST, S.LEASE_LOST): P.TAKING_LOST,
    (P.TAKING_LOST, S.GIVEN_UP): P.DONE,
    (P.CONFIRMING, S.SLOT_CONFIRMED): P.RUNNING,
    (P.CONFIRMING, S.CANCEL): P.CONFIRMING_CANCELLED,
    (P.CONFIRMING, S.LEASE_LOST): P.CONFIRMING_LOST,
    (P.CONFIRMING, S.GIVEN_UP): P.DONE,
    (P.CONFIRMING_CANCELLED, S.SLOT_CONFIRMED): P.CANCELLING,
    (P.CONFIRMING_CANCELLED, S.CANCEL): P.CONFIRMING_CANCELLED,
    (P.CONFIRMING_CANCELLED, S.LEASE_LOST): P.CONFIRMING_LOST,
    (P.CONFIRMING_CANCELLED, S.GIVEN_UP): P.DONE,
    (P.CONFIRMING_LOST, S.SLOT_CONFIRMED): P.ABANDONING,
    (P.CONFIRMING_LOST, S.CANCEL): P.CONFIRMING_LOST,
    (P.CONFIRMING_LOST, S.LEASE_LOST): P.CONFIRMING_LOST,
    (P.CONFIRMING_LOST, S.GIVEN_UP): P.DONE,
    (P.PARKING, S.PARKED): P.DONE,
    (P.PARKING, S.CANCEL): P.PARKING,
    (P.PARKING, S.LEASE_LOST): P.PARKING,
    (P.PARKING, S.GIVEN_UP): P.DONE,
    (P.EARLY_RUNNING, S.CLAIMED): P.RUNNING,
    (P.EARLY_RUNNING, S.CLAIM_LOST): P.ABANDONING,
    (P.EARLY_RUNNING, S.GIVEN_UP): P.ABANDONING,
    (P.EARLY_RUNNING, S.LEASE_LOST): P.ABANDONING,
    (P.EARLY_RUNNING, S.CANCEL): P.EARLY_CANCELLING,
    (P.EARLY_RUNNING, S.ENDED): P.EARLY_ENDED,
    (P.EARLY_CANCELLING, S.CLAIMED): P.CANCELLING,
    (P.EARLY_CANCELLING, S.CLAIM_LOST): P.ABANDONING,
    (P.EARLY_CANCELLING, S.GIVEN_UP): P.ABANDONING,
    (P.EARLY_CANCELLING, S.LEASE_LOST): P.ABANDONING,
    (P.EARLY_CANCELLING, S.CANCEL): P.EARLY_CANCELLING,
    (P.EARLY_CANCELLING, S.ENDED): P.EARLY_CANCELLED,
    (P.EARLY_ENDED, S.CLAIMED): P.FINISHING,
    (P.EARLY_ENDED, S.CLAIM_LOST): P.DONE,
    (P.EARLY_ENDED, S.GIVEN_UP): P.DONE,
    (P.EARLY_ENDED, S.CANCEL): P.EARLY_ENDED,
    (P.EARLY_ENDED, S.LEASE_LOST): P.EARLY_ENDED,
    (P.EARLY_CANCELLED, S.CLAIMED): P.FINISHING,
    (P.EARLY_CANCELLED, S.CLAIM_LOST): P.DONE,
    (P.EARLY_CANCELLED, S.GIVEN_UP): P.DONE,
    (P.EARLY_CANCELLED, S.CANCEL): P.EARLY_CANCELLED,
    (P.EARLY_CANCELLED, S.LEASE_LOST): P.EARLY_CANCELLED,
    (P.CLAIMING, S.NO_ROOM): P.READY,
    (P.ADMITTING, S.NO_ROOM): P.READY,
    (P.CONFIRMING, S.NO_ROOM): P.READY,
    (P.READY, S.RUN): P.RUNNING,
    (P.READY, S.CANCEL): P.CANCELLING,
    (P.READY, S.LEASE_LOST): P.ABANDONING,
    (P.RUNNING, S.ENDED): P.FINISHING,
    (P.RUNNING, S.TIMEOUT): P.TIMING_OUT,
    (P.RUNNING, S.CANCEL): P.CANCELLING,
    (P.RUNNING, S.LEASE_LOST): P.ABANDONING,
    (P.CANCELLING, S.ENDED): P.FINISHING,
    (P.CANCELLING, S.CANCEL): P.CANCELLING,
    (P.CANCELLING, S.LEASE_LOST): P.ABANDONING,
    (P.TIMING_OUT, S.ENDED): P.FINISHING,
    (P.TIMING_OUT, S.CANCEL): P.TIMING_OUT,
    (P.TIMING_OUT, S.LEASE_LOST): P.ABANDONING,
    (P.ABANDONING, S.ENDED): P.DONE,
    (P.ABANDONING, S.CANCEL): P.ABANDONING,
    (P.ABANDONING, S.LEASE_LOST): P.ABANDONING,
    # (the verdict of an early start's claim, after its run was voided)
    (P.ABANDONING, S.CLAIMED): P.ABANDONING,
    (P.ABANDONING, S.CLAIM_LOST): P.ABANDONING,
    (P.FINISHING, S.RECORDED): P.DONE,
    (P.FINISHING, S.CANCEL): P.FINISHING,
    (P.FINISHING, S.LEASE_LOST): P.FINISHING,
    (P.FINISHING, S.GIVEN_UP): P.DONE,
}

#: phases whose lease (and slot) this worker renews: all but the ends.  A
#: delivery lost while its claim or slot is out stays here until the store
#: answers (the renewal then reports it lost again)
HOLDING = frozenset(set(Phase) - {P.ABANDONING, P.DONE})

#: phases in which a started function runs while its ``Claim`` is out
EARLY = frozenset({P.EARLY_RUNNING, P.EARLY_CANCELLING})

#: phases in which the task function is running
EXECUTING = frozenset({P.RUNNING, P.CANCELLING, P.TIMING_OUT, P.ABANDONING}) | EARLY

#: phases in which a lost lease must still stop the function (``CancelTask``)
STOPPABLE = EXECUTING - {P.ABANDONING}


def advance(phase: Phase, step: Step) -> Phase:
    """The phase after ``step``; raises ``InvalidTransition`` if there is none."""
    try:
        return TRANSITIONS[(phase, step)]
    except KeyError:
        raise InvalidTransition(phase, step) from None


def allows(phase: Phase, step: Step) -> bool:
    """Whether the table has a row for ``step`` in ``phase``."""
    return (phase, step) in TRANSITIONS


def diagram() -> str:
    """The table as text, one block per phase (as in this module's docstring)."""
    name_width = max(len(phase.name) for phase in Phase) + 2
    rows: list[tuple[str, str, str]] = []
    for phase in Phase:
        targets: dict[Phase, list[str]] = {}
        for (source, step), target in TRANSITIONS.items():
            if source is phase:
                targets.setdefault(target, []).append(step.value)
        stays = targets.pop(phase, None)
        lines = [(" | ".join(steps), f"-> {target.name}") for target, steps in targets.items()]
        if stays:
            lines.append((" | ".join(stays), "(stays)"))
        for index, (steps, where) in enumerate(lines or [("(final)", "")]):
            rows.append((phase.name if index == 0 else "", steps, where))
    steps_width = max(len(steps) for _, steps, _ in rows) + 2
    text = (f"{name:<{name_width}} {steps:<{steps_width}}{where}" for name, steps, where in rows)
    return "\n".join(line.rstrip() for line in text)
