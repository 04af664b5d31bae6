"""The lifecycle of one delivery inside one worker: phases and the one table
of transitions between them.

Theory of operation
-------------------
A worker receives *deliveries* (messages the store hands it).  Each delivery
walks the phases below, driven by steps the worker machine derives from its
inputs.  Every move goes through ``TRANSITIONS``; a step the table has no row
for raises ``InvalidTransition`` naming the phase and the step, because it
means docket itself is wrong, not the user or the store.

    ARRIVED --claim--> CLAIMING --claimed--> RUNNING --ended--> FINISHING --recorded--> DONE
       |                  |   \\--claimed_limited--> ADMITTING --slot_acquired--> RUNNING
       |                  |                              \\--slot_parked--> DONE
       |                  \\--claim_lost--> DONE      (superseded or cancelled: the store acked it)
       \\--reject--> FINISHING                       (unknown task, bad payload, struck)

    RUNNING --timeout / cancel--> CANCELLING --ended--> FINISHING
    RUNNING --lease_lost--> ABANDONING --ended--> DONE  (another worker owns it: no ack)
    CLAIMING / ADMITTING / FINISHING --given_up--> DONE  (the store stayed away past
                                                        the resend window: no ack)

Nothing is acknowledged before its outcome is recorded: a crash anywhere
leaves the message with the store, which hands it out again once its lease
runs out (at-least-once).  A concurrency slot is released only by a delivery
that reached RUNNING through ADMITTING, i.e. whose ``AcquireSlot`` came back
acquired: the machine keeps that fact, and only it emits ``ReleaseSlot``.
"""

from __future__ import annotations

import enum

from .errors import InvalidTransition


class Phase(enum.Enum):
    #: handed to this worker; nothing asked of the store yet
    ARRIVED = "arrived"
    #: ``Claim`` sent, verdict pending
    CLAIMING = "claiming"
    #: claimed; ``AcquireSlot`` sent, waiting for a concurrency slot
    ADMITTING = "admitting"
    #: the task function runs
    RUNNING = "running"
    #: ``CancelTask`` sent (timeout or cancellation); waiting for the function to stop
    CANCELLING = "cancelling"
    #: the lease was lost to another worker; waiting for the function to stop
    ABANDONING = "abandoning"
    #: ``Finish`` or a follow-up ``Schedule`` sent; waiting for the store
    FINISHING = "finishing"
    #: nothing more to do here
    DONE = "done"


class Step(enum.Enum):
    CLAIM = "claim"
    REJECT = "reject"
    CLAIMED = "claimed"
    CLAIMED_LIMITED = "claimed_limited"
    CLAIM_LOST = "claim_lost"
    SLOT_ACQUIRED = "slot_acquired"
    SLOT_PARKED = "slot_parked"
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
    (P.CLAIMING, S.CLAIMED): P.RUNNING,
    (P.CLAIMING, S.CLAIMED_LIMITED): P.ADMITTING,
    (P.CLAIMING, S.CLAIM_LOST): P.DONE,
    (P.CLAIMING, S.CANCEL): P.CLAIMING,
    (P.CLAIMING, S.LEASE_LOST): P.CLAIMING,
    (P.ADMITTING, S.SLOT_ACQUIRED): P.RUNNING,
    (P.ADMITTING, S.SLOT_PARKED): P.DONE,
    (P.ADMITTING, S.CANCEL): P.ADMITTING,
    (P.ADMITTING, S.LEASE_LOST): P.ADMITTING,
    (P.RUNNING, S.ENDED): P.FINISHING,
    (P.RUNNING, S.TIMEOUT): P.CANCELLING,
    (P.RUNNING, S.CANCEL): P.CANCELLING,
    (P.RUNNING, S.LEASE_LOST): P.ABANDONING,
    (P.CANCELLING, S.ENDED): P.FINISHING,
    (P.CANCELLING, S.TIMEOUT): P.CANCELLING,
    (P.CANCELLING, S.CANCEL): P.CANCELLING,
    (P.CANCELLING, S.LEASE_LOST): P.ABANDONING,
    (P.ABANDONING, S.ENDED): P.DONE,
    (P.ABANDONING, S.TIMEOUT): P.ABANDONING,
    (P.ABANDONING, S.CANCEL): P.ABANDONING,
    (P.ABANDONING, S.LEASE_LOST): P.ABANDONING,
    (P.FINISHING, S.RECORDED): P.DONE,
    (P.FINISHING, S.CANCEL): P.FINISHING,
    (P.FINISHING, S.TIMEOUT): P.FINISHING,
    (P.FINISHING, S.LEASE_LOST): P.FINISHING,
    (P.CLAIMING, S.GIVEN_UP): P.DONE,
    (P.ADMITTING, S.GIVEN_UP): P.DONE,
    (P.FINISHING, S.GIVEN_UP): P.DONE,
}

#: phases in which this worker holds the delivery and must keep its lease
HOLDING = frozenset(
    {
        P.ARRIVED,
        P.CLAIMING,
        P.ADMITTING,
        P.RUNNING,
        P.CANCELLING,
        P.FINISHING,
    }
)

#: phases in which the task function is running
EXECUTING = frozenset({P.RUNNING, P.CANCELLING, P.ABANDONING})


def advance(phase: Phase, step: Step) -> Phase:
    """The phase after ``step``; raises ``InvalidTransition`` if there is none."""
    try:
        return TRANSITIONS[(phase, step)]
    except KeyError:
        raise InvalidTransition(phase, step) from None
