"""Store effects as script calls, and script replies as outcomes.

Pure translation shared by the Redis and GLIDE adapters: every argument is a
``str`` or ``bytes`` (GLIDE accepts nothing else), every reply is decoded from
the shapes both clients return (bytes, ints, lists, ``None``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ..sansio.admission import Admit
from ..sansio.effects import (
    AcquireSlot,
    BuryMalformed,
    Cancel,
    Claim,
    ConfirmSlot,
    Enlist,
    Finish,
    Heartbeat,
    Park,
    ReleaseSlot,
    RenewLeases,
    Request,
    Schedule,
    StoreEffect,
    TakeSlot,
    WakeParked,
)
from ..sansio.errors import StoreError
from ..sansio.inputs import (
    Buried,
    Cancelled,
    Claimed,
    ClaimVerdict,
    Enlisted,
    Finished,
    HeartbeatSent,
    LeasesRenewed,
    Outcome,
    Parked,
    Scheduled,
    SlotAcquired,
    SlotConfirmed,
    SlotReleased,
    SlotTaken,
    WokeParked,
)
from ..sansio.local_slots import SlotStep
from ..sansio.partitions import entry_of
from ..sansio.values import (
    ExecutionState,
)
from .admission import admit_fields, admit_layout, admitted_from_reply
from .batch_fields import (
    acquire_fields,
    confirm_fields,
    finish_fields,
    park_fields,
    schedule_fields,
    take_fields,
)
from .batch_fields import memo_header as memo_header
from .batch_fields import number as number
from .batch_fields import number_bytes as number_bytes
from .batch_fields import pack_batch as pack_batch
from .batch_fields import pack_fields as pack_fields
from .batch_fields import request_seq as request_seq
from .batch_fields import unpack_batch as unpack_batch
from .entries import pack, text
from .slot_steps import step_fields, stepped_from_reply

GROUP = "docket-workers"
#: how long a worker's task list outlives its last heartbeat
WORKER_INFO_TTL_MS = "600000"
#: a renewed slot set lives at least this long (holders renew far more often)
RENEWED_SLOT_TTL_MS = "86400000"
#: how many due messages one read moves to the stream at most
PROMOTE_LIMIT = "1000"


@attrs.frozen(slots=True, kw_only=True)
class ScriptCall:
    """Run script ``name`` with ``keys`` and ``args`` in ``layout``: the
    namespace (one hash tag, so one cluster slot) whose keys the script
    touches, and whose keys the call declares for routing."""

    name: str
    keys: tuple[str, ...]
    args: tuple[str | bytes, ...]
    layout: Layout | None = None
    #: whether what the call may write must outlive a failover (a store with
    #: replicas to wait for waits after it): False for a call that writes
    #: nothing, or nothing whose loss harms (it is written again, or only
    #: refuses adds with its error until then)
    durable: bool = True

    @property
    def tag(self) -> str:
        """The hash tag the call runs in (its keys' ``{...}``)."""
        if self.layout is not None:
            return self.layout.prefix
        return self.keys[0].partition("}")[0] + "}" if self.keys else ""


@attrs.frozen(slots=True)
class Layout:
    """The key names of one namespace: a docket's (``Layout(name)``), or the
    one every docket naming a scope shares (``Layout(scope)``).
    ``partitions`` is the count of the layout a docket's store belongs to:
    its adds name it, and a partition a change of the count closed refuses
    those of another count (``refuse_closed``)."""

    name: str
    partitions: int = 1

    @property
    def prefix(self) -> str:
        return "{" + self.name + "}"

    @property
    def stream(self) -> str:
        return f"{self.prefix}:q"

    @property
    def wake_stream(self) -> str:
        """Wake-up entries for blocked readers (apart from the queue)."""
        return f"{self.prefix}:wake"

    @property
    def due(self) -> str:
        return f"{self.prefix}:due"

    @property
    def fence(self) -> str:
        """A key no script ever writes, declared by every call beside the
        queue: on a cluster, while this prefix's slot is being moved, the
        server answers TRYAGAIN (or ASK) to the whole call, so no script runs
        on half a slot."""
        return f"{self.prefix}:fence"

    @property
    def strikes(self) -> str:
        return f"{self.prefix}:strikes"

    @property
    def cancel_channel(self) -> str:
        return f"{self.prefix}:cancel"

    def events_channel(self, key: str) -> str:
        return f"{self.prefix}:events:{key}"

    def run_key(self, key: str) -> str:
        return f"{self.prefix}:run:{key}"

    def progress_key(self, key: str) -> str:
        return f"{self.prefix}:prog:{key}"

    def namespace(self, scope: str | None) -> str:
        """Where the slots and waiters of a limit with ``scope`` live: this
        docket's prefix, or the one every docket naming ``scope`` shares."""
        return self.prefix if scope is None else "{" + scope + "}"

    def call(self, name: str, *args: str | bytes, durable: bool = True) -> ScriptCall:
        """A call of script ``name`` in this namespace: it declares the queue
        and the fence, so a cluster client routes it to this slot's node."""
        return ScriptCall(
            name=name,
            keys=(self.stream, self.fence),
            args=(self.prefix, GROUP, *args),
            layout=self,
            durable=durable,
        )

    def remembered_call(self, name: str, request: Request | None, *args: str | bytes) -> ScriptCall:
        """A call of a script that remembers outcomes for resends: ARGV[3] is
        the memo header of ``request`` (``open_memo`` in the prelude)."""
        return self.call(name, memo_header(request), *args)


# -- effects to calls ---------------------------------------------------------


#: effects whose consecutive runs in one namespace share one script call (it
#: loops over the packed fields and answers one reply per effect): kind ->
#: (script, fields)
BATCHED: dict[type[StoreEffect], tuple[str, Callable[[Layout, StoreEffect], bytes]]] = {
    Finish: ("finish", finish_fields),
    Schedule: ("schedule", schedule_fields),
    AcquireSlot: ("acquire", acquire_fields),
    Admit: ("admit", admit_fields),
    TakeSlot: ("take", take_fields),
    ConfirmSlot: ("confirm", confirm_fields),
    Park: ("park", park_fields),
    SlotStep: ("step", step_fields),
}


def layout_for(layout: Layout, effect: StoreEffect) -> Layout:
    """The namespace the call of ``effect`` runs in (docket ``layout``'s own,
    a scope's, or the docket whose parked keys ``WakeParked`` wakes)."""
    if isinstance(effect, TakeSlot | Enlist):
        return Layout(effect.scope)
    if isinstance(effect, ReleaseSlot) and effect.scope is not None:
        return Layout(effect.scope)
    if isinstance(effect, WakeParked):
        return Layout(effect.docket)
    if isinstance(effect, Admit):
        return admit_layout(layout, effect)
    return layout


def calls_for(layout: Layout, effects: Sequence[StoreEffect]) -> list[tuple[ScriptCall, int]]:
    """The script calls that carry out ``effects``, in order, each with how
    many effects it covers: consecutive finishes (or schedules...) in one
    namespace share one call.  A renewal holding scoped slots is split per
    namespace: its first call covers it, the others cover 0 (their replies
    add to its outcome).  ``same_slot_groups`` cuts the calls into round
    trips."""
    calls: list[tuple[ScriptCall, int]] = []
    run: list[bytes] = []
    run_of: tuple[type[StoreEffect], Layout] | None = None
    script = ""
    covered = 0
    request: Request | None = None
    for effect in effects:
        kind, where = type(effect), layout_for(layout, effect)
        if covered and (kind, where) != run_of:
            assert run_of is not None
            calls.append((_batch_call(run_of[1], script, request, run), covered))
            run, covered, request = [], 0, None
        batched = BATCHED.get(kind)
        if batched is None:
            if isinstance(effect, RenewLeases):
                parts = renewal_calls(layout, effect)
                calls += [(part, 1 if n == 0 else 0) for n, part in enumerate(parts)]
            else:
                calls.append((call_for(layout, effect), 1))
            continue
        run_of, (script, fields) = (kind, where), batched
        run.append(fields(layout, effect))
        request = request or getattr(effect, "request", None)
        covered += 1
    if covered:
        assert run_of is not None
        calls.append((_batch_call(run_of[1], script, request, run), covered))
    return calls


def _batch_call(
    where: Layout, script: str, request: Request | None, fields: list[bytes]
) -> ScriptCall:
    """The call of a batched ``script`` over ``fields`` in ``where``; an add
    names its layout's partition count after them."""
    if script == "schedule":
        return where.remembered_call(script, request, b"".join(fields), b"%d" % where.partitions)
    return where.remembered_call(script, request, b"".join(fields))


def same_slot_groups(calls: Sequence[ScriptCall]) -> list[list[ScriptCall]]:
    """``calls`` cut into runs of consecutive calls in one namespace, in
    order: on a cluster each run is one round trip, sent after the one
    before has answered (a cluster pipeline runs its nodes side by side, and
    a ``Finish`` in ``P`` must go before the ``ReleaseSlot`` in ``S``)."""
    groups: list[list[ScriptCall]] = []
    for call in calls:
        if groups and groups[-1][-1].tag == call.tag:
            groups[-1].append(call)
        else:
            groups.append([call])
    return groups


def outcomes_for(
    effects: Sequence[StoreEffect], calls: Sequence[tuple[ScriptCall, int]], replies: Sequence[Any]
) -> list[Outcome]:
    """Decode the replies of ``calls_for(effects)`` into one outcome per effect."""
    outcomes: list[Outcome] = []
    index = 0
    for (_, covered), reply in zip(calls, replies, strict=True):
        if covered == 0:  # a further part of the renewal before
            outcomes[-1] = merged_renewal(outcomes[-1], effects[index - 1], reply)
        elif type(effects[index]) not in BATCHED:
            outcomes.append(outcome_for(effects[index], reply))
        else:
            try:
                items = list(reply)
            except TypeError as error:
                raise StoreError(f"unexpected reply {reply!r} to {effects[index]!r}") from error
            if len(items) != covered:
                raise StoreError(f"a batch of {covered} effects answered {reply!r}")
            for effect, item in zip(effects[index : index + covered], items, strict=True):
                outcomes.append(outcome_for(effect, item))
        index += covered
    return outcomes


def renewal_calls(layout: Layout, effect: RenewLeases) -> list[ScriptCall]:
    """The calls of a renewal: ``renew`` in ``P`` (the deliveries and the
    slots of limits without a scope), then one ``renew_slots`` in each
    scope's namespace its slots name, in the order they first appear."""
    own: list[str] = []
    scoped: dict[str, list[str]] = {}
    for slot in effect.slots:
        where = layout.namespace(slot.scope)
        pairs = own if where == layout.prefix else scoped.setdefault(slot.scope or "", [])
        pairs += [slot.limit_key, slot.holder]
    now = number(effect.now)
    calls = [
        layout.call(
            "renew",
            effect.worker,
            now,
            RENEWED_SLOT_TTL_MS,
            str(len(effect.delivery_ids)),
            *effect.delivery_ids,
            *own,
        )
    ]
    for scope, pairs in scoped.items():
        calls.append(Layout(scope).call("renew_slots", now, RENEWED_SLOT_TTL_MS, *pairs))
    return calls


def merged_renewal(outcome: Outcome, effect: StoreEffect, reply: Any) -> Outcome:
    """A renewal's outcome with the lost slots of one more of its parts."""
    part = outcome_for(effect, reply)
    if not isinstance(outcome, LeasesRenewed) or not isinstance(part, LeasesRenewed):
        raise StoreError(f"a split renewal answered {reply!r} to {effect!r}")
    return attrs.evolve(
        outcome, lost=outcome.lost + part.lost, lost_slots=outcome.lost_slots + part.lost_slots
    )


def call_for(layout: Layout, effect: StoreEffect) -> ScriptCall:
    """The script call that carries out one effect that is not batched (a
    renewal holding scoped slots takes several: ``calls_for``)."""
    kind = type(effect)
    if kind is Claim:
        assert isinstance(effect, Claim)
        items: list[str] = []
        for item in effect.items:  # (a partition's Claim keeps its prefixes)
            items += [entry_of(item.delivery_id), item.key, str(item.generation)]
        return layout.remembered_call(
            "claim",
            effect.request,
            request_seq(effect).decode(),
            effect.worker,
            number(effect.now),
            "1" if effect.renew else "0",
            *items,
        )
    if kind is RenewLeases:
        assert isinstance(effect, RenewLeases)
        calls = renewal_calls(layout, effect)
        if len(calls) > 1:
            raise ValueError(f"a renewal of scoped slots takes several calls: {effect!r}")
        return calls[0]
    if kind is ReleaseSlot:
        assert isinstance(effect, ReleaseSlot)
        return layout_for(layout, effect).remembered_call(
            "release",
            effect.request,
            request_seq(effect).decode(),
            effect.limit_key,
            effect.holder,
            number(effect.now),
            "1" if effect.pass_on else "0",
        )
    if kind is WakeParked:
        assert isinstance(effect, WakeParked)
        return Layout(effect.docket).remembered_call(
            "wake",
            effect.request,
            request_seq(effect).decode(),
            effect.limit_key,
            layout.namespace(effect.scope),
            number(effect.now),
        )
    if kind is Enlist:
        assert isinstance(effect, Enlist)
        return Layout(effect.scope).call(
            "enlist", effect.limit_key, effect.docket, number(effect.since)
        )
    if kind is Cancel:
        assert isinstance(effect, Cancel)
        return layout.remembered_call(
            "cancel",
            effect.request,
            request_seq(effect).decode(),
            effect.key,
            number(effect.now),
            number(effect.ttl),
        )
    if kind is BuryMalformed:
        assert isinstance(effect, BuryMalformed)
        entry = effect.entry
        return layout.remembered_call(
            "bury",
            effect.request,
            request_seq(effect),
            entry.delivery_id.encode(),
            entry.reason.encode(),
            number_bytes(effect.now),
            number_bytes(effect.ttl),
            (entry.key or "").encode(),
            b"0" if entry.key is None else b"1",
            b"" if entry.generation is None else b"%d" % entry.generation,
            pack([part for field in entry.fields for part in (field[0].encode(), field[1])]),
        )
    if kind is Heartbeat:
        assert isinstance(effect, Heartbeat)
        return layout.call(
            "heartbeat",
            effect.worker,
            number(effect.now),
            "1" if effect.leaving else "0",
            WORKER_INFO_TTL_MS,
            json.dumps(list(effect.tasks)),
        )
    raise TypeError(f"no script carries out {effect!r}")


# -- replies to outcomes -------------------------------------------------------


def outcome_for(effect: StoreEffect, reply: Any) -> Outcome:
    """Decode the reply of ``call_for(effect)`` into the core's outcome."""
    kind = type(effect)
    try:
        if kind is Finish:
            assert isinstance(effect, Finish)
            return Finished(delivery_id=effect.delivery_id, recorded=int(reply) == 1)
        if kind is Claim:
            assert isinstance(effect, Claim)
            verdicts = tuple(
                (item.delivery_id, ClaimVerdict(text(v)))
                for item, v in zip(effect.items, reply, strict=True)
            )
            return Claimed(verdicts=verdicts)
        if kind is Schedule:
            assert isinstance(effect, Schedule)
            accepted, generation, state = reply
            return Scheduled(
                key=effect.message.key,
                accepted=int(accepted) == 1,
                generation=int(text(generation)),
                state=ExecutionState(text(state)) if text(state) else None,
            )
        if kind is RenewLeases:
            lost, lost_slots = reply
            return LeasesRenewed(
                lost=tuple(text(i) for i in lost), lost_slots=tuple(text(h) for h in lost_slots)
            )
        if kind is AcquireSlot:
            assert isinstance(effect, AcquireSlot)
            verdict = int(reply)
            return SlotAcquired(
                delivery_id=effect.delivery_id, acquired=verdict == 1, lost=verdict == 2
            )
        if kind is Admit:
            assert isinstance(effect, Admit)
            return admitted_from_reply(effect, reply)
        if kind is SlotStep:
            assert isinstance(effect, SlotStep)
            return stepped_from_reply(effect, reply)
        if kind is ReleaseSlot:
            assert isinstance(effect, ReleaseSlot)
            woken, wake = reply
            return SlotReleased(
                limit_key=effect.limit_key, woken=int(woken), wake=text(wake) or None
            )
        if kind is TakeSlot:
            assert isinstance(effect, TakeSlot)
            verdict = int(reply)
            return SlotTaken(
                delivery_id=effect.delivery_id, acquired=verdict == 1, lost=verdict == 2
            )
        if kind is ConfirmSlot:
            assert isinstance(effect, ConfirmSlot)
            return SlotConfirmed(delivery_id=effect.delivery_id, lost=int(reply) == 2)
        if kind is Park:
            assert isinstance(effect, Park)
            verdict = int(reply)
            return Parked(delivery_id=effect.delivery_id, parked=verdict == 1, lost=verdict == 2)
        if kind is WakeParked:
            assert isinstance(effect, WakeParked)
            woken, remaining, oldest = reply
            return WokeParked(
                docket=effect.docket,
                limit_key=effect.limit_key,
                woken=int(woken),
                remaining=int(remaining),
                oldest=float(text(oldest)) if text(oldest) else None,
            )
        if kind is Enlist:
            assert isinstance(effect, Enlist)
            return Enlisted(docket=effect.docket, limit_key=effect.limit_key)
        if kind is Cancel:
            assert isinstance(effect, Cancel)
            previous = text(reply)
            return Cancelled(
                key=effect.key, previous=ExecutionState(previous) if previous else None
            )
        if kind is BuryMalformed:
            assert isinstance(effect, BuryMalformed)
            verdict = int(reply)
            return Buried(
                delivery_id=effect.entry.delivery_id, moved=verdict >= 1, failed_key=verdict == 2
            )
        if kind is Heartbeat:
            return HeartbeatSent()
    except (TypeError, ValueError) as error:
        raise StoreError(f"unexpected reply {reply!r} to {effect!r}") from error
    raise TypeError(f"no script carries out {effect!r}")


def progress_call(
    layout: Layout,
    key: str,
    *,
    now: float,
    generation: int | None,
    current: int | None,
    increment: int | None,
    total: int | None,
    message: str | None,
    clear_message: bool,
) -> ScriptCall:
    def opt(value: int | None) -> str:
        return "" if value is None else str(value)

    return layout.call(
        "progress",
        key,
        number(now),
        opt(current),
        opt(increment),
        opt(total),
        message or "",
        "1" if clear_message or message == "" else "0",
        opt(generation),
    )
