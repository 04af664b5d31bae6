"""The steps of a scoped concurrency limit on the in-process store: the
reference for ``TakeSlot``, ``ConfirmSlot``, ``Park``, ``WakeParked`` and
``Enlist`` (``docket_core.sansio.effects``; docs/cluster.md, section 4).

Each step touches what its server twin touches and nothing more: ``TakeSlot``
and ``Enlist`` the scope's ``Pool`` (its slots and its waiting dockets),
``ConfirmSlot`` and ``Park`` the sender's ``Shelf``, ``WakeParked`` the shelf
of the docket it names (found in the pool, where that docket registered
itself as waiting).  The store remembers and replays them as every other
effect (``MemoryStore.execute``); a step's function here runs it fresh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from docket_core.sansio.effects import (
    ConfirmSlot,
    Enlist,
    Park,
    StoreEffect,
    TakeSlot,
    WakeParked,
)
from docket_core.sansio.inputs import (
    Enlisted,
    Outcome,
    Parked,
    SlotConfirmed,
    SlotTaken,
    WokeParked,
)

from .shelf import Shelf


def take(shelf: Shelf, effect: TakeSlot) -> SlotTaken:
    """Keep, take, or take over a slot; when the limit is full, register
    the docket among its waiting dockets."""
    pool = shelf.pool(effect.scope)
    limit_key = effect.limit_key
    slots = pool.slots.setdefault(limit_key, {})
    acquired = effect.holder in slots or len(slots) < effect.max_concurrent
    if not acquired:
        cutoff = effect.now - effect.stale_after
        stale = [h for h, t in slots.items() if t <= cutoff]
        if stale:
            # the holder renewed longest ago, as the servers take it
            del slots[min(stale, key=lambda h: (slots[h], h))]
            acquired = True
    if acquired:
        slots[effect.holder] = effect.now
    else:
        pool.enlist(limit_key, effect.docket, effect.now)
        pool.shelves[effect.docket] = shelf
    # (a stale slot nobody takes over is dropped by a read, as a server
    # expires a slot set nobody writes)
    pool.restale(limit_key)
    return SlotTaken(delivery_id=effect.delivery_id, acquired=acquired)


def replay_take(shelf: Shelf, effect: TakeSlot, first: SlotTaken) -> SlotTaken:
    """A resent ``TakeSlot``: an acquired slot is renewed to the resend's
    time, or lost if it was taken over meanwhile."""
    if not first.acquired:
        return first
    pool = shelf.pool(effect.scope)
    slots = pool.slots.get(effect.limit_key)
    if slots is None or effect.holder not in slots:
        return SlotTaken(delivery_id=effect.delivery_id, acquired=False, lost=True)
    slots[effect.holder] = effect.now
    pool.restale(effect.limit_key)
    return first


def _holds(shelf: Shelf, worker: str | None, delivery_id: str) -> bool:
    """Whether ``worker`` holds the delivery now (no worker: a producer's
    effect, which concerns none)."""
    if worker is None:
        return True
    held = shelf.held.get(delivery_id)
    return held is not None and held.worker == worker


def confirm(shelf: Shelf, effect: ConfirmSlot) -> SlotConfirmed:
    """The run may start unless its delivery is no longer the sender's (the
    servers also mark the record with its slot, for snapshots)."""
    lost = not _holds(shelf, effect.worker, effect.delivery_id)
    return SlotConfirmed(delivery_id=effect.delivery_id, lost=lost)


def park(shelf: Shelf, effect: Park) -> Parked:
    """Acknowledge the delivery and put its key behind the limit, scheduled
    again at ``retry_at``; a key cancelled since its claim concludes
    cancelled, a superseded one is only acknowledged."""
    delivery_id = effect.delivery_id
    worker = effect.request.worker if effect.request is not None else None
    if not _holds(shelf, worker, delivery_id):
        return Parked(delivery_id=delivery_id, parked=False, lost=True)
    shelf.held.pop(delivery_id, None)
    message = effect.message
    record = shelf.records.get(message.key)
    if record is None or record.generation != message.generation:
        return Parked(delivery_id=delivery_id, parked=False)
    if record.cancel_ttl is not None:
        shelf.cancel(record, effect.now, record.cancel_ttl)
        return Parked(delivery_id=delivery_id, parked=False)
    where = (effect.scope, effect.limit_key)
    if shelf.scoped_parked.get(message.key) != where:
        shelf.park_scoped(effect.scope, effect.limit_key, message, effect.now, effect.retry_at)
    return Parked(delivery_id=delivery_id, parked=True)


def wake_parked(shelf: Shelf, effect: WakeParked) -> WokeParked:
    """Queue the oldest live key the named docket parked behind the limit,
    and count what still waits there."""
    target = shelf.pool(effect.scope).shelves.get(effect.docket)
    if target is None:
        woken, remaining, oldest = 0, 0, None
    else:
        woken, remaining, oldest = target.wake_scoped(effect.scope, effect.limit_key, effect.now)
    return WokeParked(
        docket=effect.docket,
        limit_key=effect.limit_key,
        woken=woken,
        remaining=remaining,
        oldest=oldest,
    )


def enlist(shelf: Shelf, effect: Enlist) -> Enlisted:
    """Register the docket among the limit's waiting dockets again."""
    shelf.pool(effect.scope).enlist(effect.limit_key, effect.docket, effect.since)
    return Enlisted(docket=effect.docket, limit_key=effect.limit_key)


#: effect type -> the step that carries it out fresh
STEPS: dict[type[StoreEffect], Callable[[Shelf, Any], Outcome]] = {
    TakeSlot: take,
    ConfirmSlot: confirm,
    Park: park,
    WakeParked: wake_parked,
    Enlist: enlist,
}
