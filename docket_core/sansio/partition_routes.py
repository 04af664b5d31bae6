"""Where each effect on a partitioned docket goes, in what order, and how the
partitions' answers come back as one outcome per effect (pure).

``PartitionedStore.execute`` carries out a ``Route``: its rounds one after
the other, the groups of a round side by side, each group one call to one
store.  The decisions:

- A task key lives in partition ``partition_of(key, N)``; a delivery id names
  its partition, ``"<i>/<entry id>"``.  Each effect goes to the partition of
  its delivery or key, with the ``i/`` taken off going in and put back on the
  outcome, except a ``Finish`` and a ``Claim`` (most of a busy worker's
  effects), which go as they are: a store acts on their entry ids
  (``entry_of``) and answers with the ids it was given.  A ``Claim`` or
  ``RenewLeases`` over several partitions is split,
  and its outcomes merged (a renewal's scoped slots ride with its first
  part).  A ``TakeSlot`` registers the delivery's partition as the waiting
  docket (its parked keys live there).
- A ``Heartbeat`` goes to ``HOME``, the docket-wide store (a leaving worker is
  forgotten as a consumer of every partition too).
- Steps that name their own namespace (``Enlist``, ``ReleaseSlot``,
  ``WakeParked``) run on any store: the store of a neighbouring piece, so
  they ride in its round trip.
- Order: pieces bound for partitions touch disjoint keys, so a run of them
  is one round, one group per partition.  A piece that touches a scope or
  ``HOME`` (a take, an admission, a release, a wake, an enlistment, a
  heartbeat) keeps its place: its round starts once everything before it is
  answered (a finish before the release of its slot), and holds the run of
  such pieces for the same store that follows it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import attrs

from .admission import Admit
from .effects import (
    AcquireSlot,
    BuryMalformed,
    Cancel,
    Claim,
    ClaimItem,
    ConfirmSlot,
    Enlist,
    Finish,
    Heartbeat,
    Park,
    ReleaseSlot,
    RenewLeases,
    Schedule,
    StoreEffect,
    TakeSlot,
    WakeParked,
)
from .inputs import Claimed, LeasesRenewed, Outcome
from .partitions import partition_of, split_delivery_id

#: where a piece goes besides a partition: the docket-wide store, or any store
HOME, ANY = -1, -2


class Piece(NamedTuple):
    """One effect, or one partition's part of it, bound for one store."""

    #: a partition, or ``HOME``
    target: int
    effect: StoreEffect
    #: the index of the effect it is (part of)
    origin: int
    #: the partition whose prefix its outcome's delivery ids get back
    partition: int | None


@attrs.frozen(slots=True, kw_only=True)
class Route:
    """A batch's pieces, and the order to send them in: rounds one after the
    other, each a few groups of pieces (indexes) sent side by side, a group
    one call to the store of its pieces' ``target``."""

    pieces: tuple[Piece, ...]
    rounds: tuple[tuple[tuple[int, ...], ...], ...]
    #: a heartbeat of a worker that stays: after the rounds, compare the
    #: docket's recorded partition count with the worker's (``layout_changed``)
    checks_layout: bool = False
    #: the workers a leaving heartbeat says goodbye for (their reads are over)
    leaving: tuple[str, ...] = ()


_Value = TypeVar("_Value")

#: each effect class's fields (for copies with one field changed)
_FIELDS: dict[type[Any], tuple[str, ...]] = {}


def replaced(value: _Value, **changes: Any) -> _Value:
    """``value`` (a frozen attrs value) with ``changes``: ``attrs.evolve``,
    with each class's field names looked up once (it runs once an effect)."""
    cls = type(value)
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(a.name for a in attrs.fields(cls))  # type: ignore[arg-type]
    arguments = {name: getattr(value, name) for name in names}
    arguments.update(changes)
    copy: _Value = cls(**arguments)
    return copy


#: effects whose calls name their own namespace: they run on any store
_ANYWHERE = frozenset({Enlist, ReleaseSlot, WakeParked})

#: effects bound for the partition of their ``delivery_id``, nothing else changed
_BY_DELIVERY = frozenset({ConfirmSlot, Park, Admit, AcquireSlot})


@functools.cache
def _heads(partitions: int) -> dict[str, int]:
    """The prefix of each partition's delivery ids, without the ``/``."""
    return {str(p): p for p in range(partitions)}


class _Router:
    def __init__(self, partitions: int, part_names: Sequence[str]) -> None:
        self.partitions = partitions
        self.part_names = part_names
        self.heads = _heads(partitions)

    def split(self, delivery_id: str) -> tuple[int, str]:
        """``split_delivery_id``, by a look-up (it runs once a task or more)."""
        head, sep, entry = delivery_id.partition("/")
        part = self.heads.get(head)
        if part is None or not sep:
            return split_delivery_id(delivery_id, self.partitions)  # (raises)
        return part, entry

    def pieces(self, index: int, effect: StoreEffect) -> list[Piece]:
        """The pieces of any effect but a ``Finish`` (``route`` places those)."""
        kind = type(effect)
        if kind in _BY_DELIVERY:
            part, entry = self.split(effect.delivery_id)  # type: ignore[attr-defined]
            return [Piece(part, replaced(effect, delivery_id=entry), index, part)]
        handler = _HANDLERS.get(kind)
        if handler is not None:
            return handler(self, index, effect)
        if kind in _ANYWHERE:
            return [Piece(ANY, effect, index, None)]
        # (a step on the limits of the docket's own namespace, ``SlotStep``,
        # never comes: a partitioned docket's limits are all scoped)
        raise TypeError(f"a partitioned docket has no route for {effect!r}")

    def claim(self, index: int, effect: Any) -> list[Piece]:
        # (its items as they are, as a Finish's: see the module docstring)
        by_part: dict[int, list[ClaimItem]] = {}
        for item in effect.items:
            by_part.setdefault(self.split(item.delivery_id)[0], []).append(item)
        if len(by_part) == 1:
            return [Piece(part, effect, index, None) for part in by_part]
        return [
            Piece(part, replaced(effect, items=tuple(items)), index, None)
            for part, items in by_part.items()
        ]

    def renewal(self, index: int, effect: Any) -> list[Piece]:
        ids: dict[int, list[str]] = {}
        for delivery_id in effect.delivery_ids:
            part, entry = self.split(delivery_id)
            ids.setdefault(part, []).append(entry)
        if not ids:
            ids[0] = []
        pieces = []
        for n, (part, entries) in enumerate(ids.items()):
            # (the scoped slots, in their own namespaces, ride with the first)
            slots = effect.slots if n == 0 else ()
            renewal = replaced(effect, delivery_ids=tuple(entries), slots=slots)
            pieces.append(Piece(part, renewal, index, part))
        return pieces

    def schedule(self, index: int, effect: Any) -> list[Piece]:
        part = partition_of(effect.message.key, self.partitions)
        if effect.acknowledge is not None:
            acknowledged, entry = self.split(effect.acknowledge)
            if acknowledged != part:
                raise ValueError(f"{effect!r} acknowledges a delivery of another partition")
            effect = replaced(effect, acknowledge=entry)
        return [Piece(part, effect, index, part)]

    def cancel(self, index: int, effect: Any) -> list[Piece]:
        return [Piece(partition_of(effect.key, self.partitions), effect, index, None)]

    def heartbeat(self, index: int, effect: Any) -> list[Piece]:
        # a worker leaving is forgotten as a consumer of every partition too
        extra = range(self.partitions) if effect.leaving else ()
        return [Piece(target, effect, index, None) for target in (HOME, *extra)]

    def bury(self, index: int, effect: Any) -> list[Piece]:
        part, entry = self.split(effect.entry.delivery_id)
        moved = replaced(effect, entry=replaced(effect.entry, delivery_id=entry))
        return [Piece(part, moved, index, part)]

    def take(self, index: int, effect: Any) -> list[Piece]:
        # its waiting docket is the delivery's partition (its parked keys live there)
        part, entry = self.split(effect.delivery_id)
        taken = replaced(effect, delivery_id=entry, docket=self.part_names[part])
        return [Piece(part, taken, index, part)]


_HANDLERS: dict[type[Any], Callable[[_Router, int, Any], list[Piece]]] = {
    Claim: _Router.claim,
    RenewLeases: _Router.renewal,
    Schedule: _Router.schedule,
    Cancel: _Router.cancel,
    Heartbeat: _Router.heartbeat,
    BuryMalformed: _Router.bury,
    TakeSlot: _Router.take,
}


#: pieces bound for a partition that keep their place all the same (a take
#: and an admission run in a scope's namespace)
_IN_ORDER = frozenset({TakeSlot, Admit})


def route(effects: Sequence[StoreEffect], partitions: int, part_names: Sequence[str]) -> Route:
    """The pieces of ``effects`` on a docket of ``partitions`` (whose
    partitions' store names are ``part_names``), and their rounds."""
    router = _Router(partitions, part_names)
    pieces: list[Piece] = []
    in_order: list[bool] = []
    checks_layout = False
    leaving: list[str] = []
    for index, effect in enumerate(effects):
        if type(effect) is Finish:  # (most of a busy worker's effects; as it is)
            assert isinstance(effect, Finish)
            pieces.append(Piece(router.split(effect.delivery_id)[0], effect, index, None))
            in_order.append(False)
            continue
        more = router.pieces(index, effect)
        pieces += more
        in_order += [p.target < 0 or type(p.effect) in _IN_ORDER for p in more]
        if isinstance(effect, Heartbeat):
            if effect.leaving:
                leaving.append(effect.worker)
            else:
                checks_layout = True
    _settle_any(pieces)
    rounds: list[tuple[tuple[int, ...], ...]] = []
    start = 0
    while start < len(pieces):
        end = start + 1
        if in_order[start]:  # with the next in-order pieces for the same store
            target = pieces[start].target
            while end < len(pieces) and in_order[end] and pieces[end].target == target:
                end += 1
            rounds.append((tuple(range(start, end)),))
        else:
            while end < len(pieces) and not in_order[end]:
                end += 1
            by_store: dict[int, list[int]] = {}
            for index in range(start, end):
                by_store.setdefault(pieces[index].target, []).append(index)
            rounds.append(tuple(tuple(group) for group in by_store.values()))
        start = end
    return Route(
        pieces=tuple(pieces),
        rounds=tuple(rounds),
        checks_layout=checks_layout,
        leaving=tuple(leaving),
    )


def _settle_any(pieces: list[Piece]) -> None:
    """Give each piece that may run on any store the store of a neighbour
    (so it rides in its round trip), or partition 0."""
    if not any(p.target == ANY for p in pieces):
        return
    targets = [p.target for p in pieces]
    for index, piece in enumerate(pieces):
        if piece.target != ANY:
            continue
        before = next((t for t in reversed(targets[:index]) if t >= 0), None)
        after = next((t for t in targets[index + 1 :] if t >= 0), None)
        target = before if before is not None else after if after is not None else 0
        targets[index] = target
        pieces[index] = piece._replace(target=target)


def _prefix(outcome: Outcome, partition: int) -> Outcome:
    """The outcome of a partition's piece, naming delivery ids as the docket
    does (prefixed with ``partition``)."""
    kind = type(outcome)
    if kind is LeasesRenewed:
        assert isinstance(outcome, LeasesRenewed)
        return replaced(outcome, lost=tuple(f"{partition}/{d}" for d in outcome.lost))
    delivery_id = getattr(outcome, "delivery_id", None)
    if isinstance(delivery_id, str):
        return replaced(outcome, delivery_id=f"{partition}/{delivery_id}")
    return outcome


def merged(
    effects: Sequence[StoreEffect], plan: Route, replies: Sequence[Outcome]
) -> list[Outcome]:
    """One outcome per effect, in order, from the replies to ``plan``'s
    pieces (in the pieces' order): split claims and renewals merged."""
    outcomes: list[Outcome | None] = [None] * len(effects)
    split: dict[int, list[Outcome]] = {}
    for piece, reply in zip(plan.pieces, replies, strict=True):
        origin = piece.origin
        if piece.partition is not None:
            reply = _prefix(reply, piece.partition)
        if outcomes[origin] is None:
            outcomes[origin] = reply
        else:
            split.setdefault(origin, [outcomes[origin]]).append(reply)  # type: ignore[list-item]
    for origin, parts in split.items():
        effect = effects[origin]
        if isinstance(effect, Claim):
            verdicts = dict(v for part in parts if isinstance(part, Claimed) for v in part.verdicts)
            outcomes[origin] = Claimed(
                verdicts=tuple((i.delivery_id, verdicts[i.delivery_id]) for i in effect.items)
            )
        elif isinstance(effect, RenewLeases):
            renewed = [part for part in parts if isinstance(part, LeasesRenewed)]
            outcomes[origin] = LeasesRenewed(
                lost=tuple(d for part in renewed for d in part.lost),
                lost_slots=tuple(s for part in renewed for s in part.lost_slots),
            )
        # (a leaving heartbeat: the home store's outcome, the first)
    assert all(outcome is not None for outcome in outcomes), "an effect without a reply"
    return outcomes  # type: ignore[return-value]


__all__ = ["ANY", "HOME", "Piece", "Route", "merged", "replaced", "route"]
