"""Builders for unit tests of ``WorkerMachine``: hand-made arrivals, replies
and task ends, and the effects the machine answers with.  Shared by
``tests/core/test_worker_machine*.py``; no store, no runtime, no event loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from docket_core.sansio.effects import (
    CancelTask,
    Claim,
    Effect,
    Finish,
    Schedule,
    StopReason,
    StoreEffect,
)
from docket_core.sansio.inputs import (
    Arrival,
    Claimed,
    ClaimVerdict,
    Delivered,
    Finished,
    Outcome,
    ReplyLost,
    Scheduled,
    TaskEnded,
    TaskOutcome,
    Tick,
)
from docket_core.sansio.local_slots import TAKE_ACQUIRED, SlotStep, SlotStepped
from docket_core.sansio.values import (
    ConcurrencyPolicy,
    Delivery,
    ExecutionState,
    TaskMessage,
    TaskPolicy,
)
from docket_core.sansio.worker import WorkerConfig, WorkerMachine

T = TypeVar("T")

LIMIT = ConcurrencyPolicy(limit_key="limit:f:customer=1", max_concurrent=2)


#: unit tests hand out batches they never answer (a heartbeat, a step they
#: do not follow): the machine's limit of batches out would hold the rest
#: back, so it is lifted unless a test sets it (``test_batches_in_flight``)
UNLIMITED_BATCHES = 1_000_000


def make_machine(now: float = 0.0, **settings: object) -> WorkerMachine:
    settings.setdefault("batches_in_flight", UNLIMITED_BATCHES)
    config = WorkerConfig(name=str(settings.pop("name", "w1")), **settings)  # type: ignore[arg-type]
    return WorkerMachine(config, now)


def message(key: str = "k", *, attempt: int = 1, generation: int = 1) -> TaskMessage:
    return TaskMessage(
        key=key, function="f", payload=b"p", when=0.0, attempt=attempt, generation=generation
    )


def arrival(
    delivery_id: str = "d1",
    key: str | None = None,
    *,
    policy: TaskPolicy | None = None,
    attempt: int = 1,
    generation: int = 1,
    problem: str | None = None,
    struck: bool = False,
    redelivered: bool = False,
) -> Arrival:
    return Arrival(
        delivery=Delivery(
            delivery_id=delivery_id,
            message=message(key or f"key-{delivery_id}", attempt=attempt, generation=generation),
            redelivered=redelivered,
        ),
        policy=policy or TaskPolicy(),
        problem=problem,
        struck=struck,
    )


def of_type(effects: Sequence[Effect], kind: type[T]) -> list[T]:
    return [e for e in effects if isinstance(e, kind)]


def deliver(machine: WorkerMachine, *arrivals: Arrival, now: float = 0.0) -> list[Effect]:
    machine.receive(Delivered(arrivals=arrivals, now=now))
    return machine.effects()


def reply(
    machine: WorkerMachine, effect: Effect, outcome: Outcome, now: float = 0.0
) -> list[Effect]:
    assert isinstance(effect, StoreEffect)
    machine.store_replied([effect], [outcome], now)
    return machine.effects()


def claim_all(
    machine: WorkerMachine, claim: Effect, now: float = 0.0, verdict: ClaimVerdict | None = None
) -> list[Effect]:
    assert isinstance(claim, Claim)
    verdicts = tuple((item.delivery_id, verdict or ClaimVerdict.CLAIMED) for item in claim.items)
    return reply(machine, claim, Claimed(verdicts=verdicts), now)


def start(machine: WorkerMachine, a: Arrival, now: float = 0.0) -> list[Effect]:
    """Deliver ``a`` and claim it; returns the effects after the claim."""
    (claim,) = deliver(machine, a, now=now)
    return claim_all(machine, claim, now)


def end(
    machine: WorkerMachine,
    delivery_id: str,
    outcome: TaskOutcome,
    now: float,
    **fields: object,
) -> list[Effect]:
    machine.receive(TaskEnded(delivery_id=delivery_id, now=now, outcome=outcome, **fields))  # type: ignore[arg-type]
    return machine.effects()


def recorded(machine: WorkerMachine, effect: Effect, now: float = 0.0) -> list[Effect]:
    if isinstance(effect, Finish):
        outcome: Outcome = Finished(delivery_id=effect.delivery_id, recorded=True)
    else:
        assert isinstance(effect, Schedule)
        outcome = Scheduled(
            key=effect.message.key, accepted=True, generation=2, state=ExecutionState.SCHEDULED
        )
    return reply(machine, effect, outcome, now)


def stepped(step: Effect, *answers: int, wake: str | None = None) -> SlotStepped:
    """The store's answer to a ``SlotStep``: its finish recorded, its release
    handing on to ``wake`` (a docket) or to nobody, each take answered as
    ``answers`` says (``TAKE_ACQUIRED`` for those it does not name)."""
    assert isinstance(step, SlotStep)
    takes = tuple(answers) + (TAKE_ACQUIRED,) * (len(step.takes) - len(answers))
    return SlotStepped(
        recorded=None if step.finish is None else True,
        woken=0,
        wake=wake if step.release is not None else None,
        takes=takes,
    )


def start_limited(machine: WorkerMachine, a: Arrival, now: float = 0.0) -> list[Effect]:
    """Deliver ``a`` (a task with a limit of the docket's own) and answer its
    step with a slot; returns the effects after (its ``StartTask``)."""
    (step,) = deliver(machine, a, now=now)
    return reply(machine, step, stepped(step), now)


def fenced_with_no_answer(machine: WorkerMachine, since: float, until: float) -> float:
    """Tick ``machine`` at its deadlines from ``since``, every batch lost,
    until it stops a run for its lease; when it did."""
    now = since
    while now < until:
        deadline = machine.next_deadline()
        assert deadline is not None
        now = max(deadline, now)
        machine.receive(Tick(now=now))
        effects = machine.effects()
        batch = tuple(e for e in effects if isinstance(e, StoreEffect))
        if batch:  # the store never answers
            machine.receive(ReplyLost(effects=batch, now=now, reason="gone"))
            effects += machine.effects()
        if any(stop.reason is StopReason.LEASE_LOST for stop in of_type(effects, CancelTask)):
            return now
    raise AssertionError(f"no run was fenced by {until}")
