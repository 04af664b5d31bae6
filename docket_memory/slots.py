"""Concurrency slots and admission on the in-process store: the reference for
``AcquireSlot``, ``ReleaseSlot``, ``Admit`` and ``SlotStep``
(``docket_core.sansio.local_slots``), as ``acquire.lua``, ``release.lua``,
``admit.lua`` and ``step.lua`` carry them out on the servers.

Each function carries out one effect fresh on a ``MemoryStore`` (its shelf,
and its ``Finish`` for a step's end); the store remembers and replays them as
every other effect (``MemoryStore.execute``; ``replay`` here for the ones
whose first outcome time may have changed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from docket_core.sansio.admission import Admit, Admitted, Verdict, settlement
from docket_core.sansio.admission_state import (
    Address,
    State,
    address,
    admitted,
    ask_of,
    decide,
)
from docket_core.sansio.effects import AcquireSlot, ReleaseSlot, StoreEffect
from docket_core.sansio.inputs import Outcome, SlotAcquired, SlotReleased
from docket_core.sansio.local_slots import (
    TAKE_ACQUIRED,
    TAKE_CANCELLED,
    TAKE_LOST,
    TAKE_PARKED,
    TAKE_SUPERSEDED,
    SlotStep,
    SlotStepped,
    SlotTake,
)
from docket_core.sansio.values import ExecutionState

from .shelf import Pool

if TYPE_CHECKING:
    from .store import MemoryStore


def _take_from(slots: dict[str, float], holder: str, limit: int, now: float, stale: float) -> bool:
    """Whether ``holder`` may have a slot of ``slots``: its own, a free one,
    or the one renewed longest ago if that is stale (removed for it)."""
    if holder in slots or len(slots) < limit:
        return True
    old = [h for h, t in slots.items() if t <= now - stale]
    if not old:
        return False
    # the holder renewed longest ago, as the servers take it
    del slots[min(old, key=lambda h: (slots[h], h))]
    return True


def acquire(store: MemoryStore, effect: AcquireSlot) -> SlotAcquired:
    shelf = store.shelf
    if not store._sender_holds(effect.request, effect.delivery_id):
        return SlotAcquired(delivery_id=effect.delivery_id, acquired=False, lost=True)
    pool = shelf.pool(effect.scope)
    slots = pool.slots.setdefault(effect.limit_key, {})
    acquired = _take_from(
        slots, effect.holder, effect.max_concurrent, effect.now, effect.stale_after
    )
    if acquired:
        slots[effect.holder] = effect.now
        pool.restale(effect.limit_key)
    else:
        shelf.held.pop(effect.delivery_id, None)
        shelf.park(pool, effect.limit_key, effect.message, effect.now)
    return SlotAcquired(delivery_id=effect.delivery_id, acquired=acquired)


def admit(store: MemoryStore, effect: Admit) -> Admitted:
    """Judge a delivery against its admission controls of one namespace
    (``admission_state.decide``) and store what the ruling changes; in the
    docket's own (``Admit.settles``), only for a delivery its sender holds,
    and settle a blocked one in the same step (``settlement``)."""
    if effect.settles and not store._sender_holds(effect.request, effect.delivery_id):
        return Admitted(delivery_id=effect.delivery_id, verdict=Verdict.LOST)
    shelf = store.shelf
    states: dict[Address, State] = {}
    for control in effect.controls:
        kept = shelf.pool(control.scope).admission.get((control.kind, control.key))
        if kept is not None:
            states[address(control)] = kept[1]
    ruling, writes = decide(effect.controls, states, ask_of(effect))
    for control in effect.controls:
        where = address(control)
        if where not in writes:
            continue
        table = shelf.pool(control.scope).admission
        state = writes[where]
        if state is None:
            table.pop((control.kind, control.key), None)
        else:
            table[(control.kind, control.key)] = (control, state)
    outcome = admitted(effect, ruling)
    blocked = outcome.verdict is Verdict.DROP or outcome.verdict is Verdict.RESCHEDULE
    if blocked and effect.settles:
        store._carry_out(settlement(effect, outcome))
    return outcome


def release(store: MemoryStore, effect: ReleaseSlot) -> SlotReleased:
    pool = store.shelf.pool(effect.scope)
    key = effect.limit_key
    slots = None if effect.pass_on else pool.slots.get(key)
    held = slots is not None and slots.pop(effect.holder, None) is not None
    if slots is not None and not slots and not pool.waiters.get(key):
        del pool.slots[key]
    woken = pool.wake(key, effect.now) if held else 0
    # no waiter of its own: the docket that waited longest through the chain
    chain = effect.pass_on or (held and not woken)
    wake = pool.next_waiting(key) if chain else None
    return SlotReleased(limit_key=key, woken=woken, wake=wake)


def step(store: MemoryStore, effect: SlotStep) -> SlotStepped:
    """A ``SlotStep``: its end, its release, its takes, in order."""
    now = effect.now
    recorded = None
    if effect.finish is not None:
        finish = effect.finish
        if finish.now != now:
            finish = attrs.evolve(finish, now=now)
        recorded = store._finish(finish).recorded
    woken, wake, handed = 0, None, False
    if effect.release is not None:
        woken, wake = _step_release(store.shelf.pool(), effect.release, now)
        handed = bool(woken or wake)
    answers = tuple(
        _claim_and_take(store, effect, take, park=index == 0 and handed)
        for index, take in enumerate(effect.takes)
    )
    return SlotStepped(recorded=recorded, woken=woken, wake=wake, takes=answers)


def _step_release(pool: Pool, effect: ReleaseSlot, now: float) -> tuple[int, str | None]:
    """A step's release: as ``ReleaseSlot``, but a freed slot nobody waits
    for stays free for the step's takes (nothing is woken)."""
    key = effect.limit_key
    slots = pool.slots.get(key)
    if slots is None or slots.pop(effect.holder, None) is None:
        return 0, None
    if not slots and not pool.waiters.get(key):
        del pool.slots[key]
    if not pool.waiters.get(key) and not pool.waiting_dockets.get(key):
        pool.restale(key)
        return 0, None
    woken = pool.wake(key, now)
    return woken, None if woken else pool.next_waiting(key)


def _claim_and_take(store: MemoryStore, effect: SlotStep, take: SlotTake, *, park: bool) -> int:
    """Claim the take's delivery as ``Claim`` claims one item, then take a
    slot for it or park it (``park``: park it); its ``TAKE_*`` answer."""
    if effect.request is None:
        raise ValueError("a step's take needs a request (its sender)")
    shelf, worker, delivery_id = store.shelf, effect.request.worker, take.delivery_id
    if not store._sender_holds(effect.request, delivery_id):
        return TAKE_LOST
    held = shelf.held.get(delivery_id)
    now, message = effect.now, take.message
    key = message.key
    record = shelf.records.get(key)
    answer = TAKE_ACQUIRED
    if record is not None and record.state is ExecutionState.CANCELLED:
        answer = TAKE_CANCELLED
    elif record is None or record.generation != message.generation or record.state.terminal:
        answer = TAKE_SUPERSEDED
    elif record.cancel_ttl is not None:
        # cancelled while it ran, and its worker never recorded the end
        answer = TAKE_CANCELLED
        shelf.cancel(record, now, record.cancel_ttl)
    if answer != TAKE_ACQUIRED or record is None:
        shelf.held.pop(delivery_id, None)
        return answer
    pool = shelf.pool()
    holder = take.holder
    slots = pool.slots.get(take.limit_key)
    if slots is None:
        slots = pool.slots[take.limit_key] = {}
    if not park and _take_from(slots, holder, take.max_concurrent, now, effect.stale_after):
        slots[holder] = now
        pool.restale(take.limit_key)
        if held is not None and effect.renew:
            held.renewed_at = now
        shelf.records[key] = attrs.evolve(
            record, state=ExecutionState.RUNNING, worker=worker, started_at=now
        )
        shelf.progress.pop(key, None)  # (0 of 100 until a report: ``get_progress``)
        shelf.publish_state(key, ExecutionState.RUNNING, worker=worker, started_at=now)
        return TAKE_ACQUIRED
    if not slots:
        del pool.slots[take.limit_key]
    shelf.held.pop(delivery_id, None)
    shelf.park(pool, take.limit_key, message, now)
    return TAKE_PARKED


def replay(store: MemoryStore, effect: StoreEffect, first: Outcome, now: float) -> Outcome:
    """The first outcome of a resent acquisition or step: a slot it took is
    renewed to ``now`` (a step's with its delivery's lease), or lost if
    either was taken over."""
    shelf = store.shelf
    if isinstance(effect, AcquireSlot) and isinstance(first, SlotAcquired) and first.acquired:
        pool = shelf.pool(effect.scope)
        slots = pool.slots.get(effect.limit_key)
        if slots is None or effect.holder not in slots:
            return SlotAcquired(delivery_id=effect.delivery_id, acquired=False, lost=True)
        slots[effect.holder] = now
        pool.restale(effect.limit_key)
        return first
    if not isinstance(effect, SlotStep) or not isinstance(first, SlotStepped):
        return first
    if TAKE_ACQUIRED not in first.takes or effect.request is None:
        return first
    pool, worker = shelf.pool(), effect.request.worker
    answers = list(first.takes)
    for index, take in enumerate(effect.takes):
        if answers[index] != TAKE_ACQUIRED:
            continue
        held = shelf.held.get(take.delivery_id)
        holder = take.holder
        slots = pool.slots.get(take.limit_key)
        if held is None or held.worker != worker or not slots or holder not in slots:
            answers[index] = TAKE_LOST
            continue
        held.renewed_at = now
        slots[holder] = now
        pool.restale(take.limit_key)
    return attrs.evolve(first, takes=tuple(answers))


#: effect type -> what carries it out fresh on a store
HANDLERS: dict[type[StoreEffect], Callable[[MemoryStore, Any], Outcome]] = {
    AcquireSlot: acquire,
    ReleaseSlot: release,
    Admit: admit,
    SlotStep: step,
}
