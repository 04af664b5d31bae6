"""Where a partitioned docket's effects go (``docket_core.sansio.partition_routes``):
each to the partition of its delivery or key, without the ``i/`` prefix;
claims and renewals split and merged back; steps on the home store or in a
scope keep their place; outcomes name the docket's delivery ids."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from docket_core.sansio.effects import (
    Cancel,
    Claim,
    ClaimItem,
    ConfirmSlot,
    Enlist,
    Finish,
    Heartbeat,
    ReleaseSlot,
    RenewLeases,
    Request,
    Schedule,
    StoreEffect,
    TakeSlot,
)
from docket_core.sansio.inputs import (
    Cancelled,
    Claimed,
    ClaimVerdict,
    Finished,
    HeartbeatSent,
    LeasesRenewed,
    Outcome,
    Scheduled,
    SlotReleased,
    SlotTaken,
)
from docket_core.sansio.partition_routes import HOME, Route, merged, route
from docket_core.sansio.partitions import partition_of
from docket_core.sansio.values import ExecutionState, HeldSlot, ScheduleMode, TaskMessage

NAMES = ("d|0.1", "d|1.0", "d|2.3")


def key_in(partition: int) -> str:
    return next(f"k{n}" for n in range(1000) if partition_of(f"k{n}", 3) == partition)


def finish(delivery_id: str, **changes: Any) -> Finish:
    fields: dict[str, Any] = {
        "key": "k",
        "generation": 3,
        "state": ExecutionState.COMPLETED,
        "now": 1.0,
        "ttl": 60.0,
    }
    return Finish(delivery_id=delivery_id, **(fields | changes))


def targets(plan: Route) -> list[list[list[int]]]:
    """Each round's groups, as the targets of their pieces."""
    return [[[plan.pieces[i].target for i in group] for group in groups] for groups in plan.rounds]


@given(
    st.sampled_from(list(ExecutionState)),
    st.none() | st.text(max_size=5),
    st.none() | st.binary(max_size=5),
    st.none() | st.integers(min_value=0, max_value=9),
)
def test_a_finish_goes_to_its_partition_as_it_is(
    state: ExecutionState, error: str | None, result: bytes | None, seq: int | None
) -> None:
    """The partition's store acts on a ``Finish``'s entry id and answers with
    the id it was given (``protocol.finish_fields``, the memory store), so
    the router neither copies the effect nor rebuilds its outcome."""
    request = (
        None if seq is None else Request(origin="o", worker="w", seq=seq, floor=0, remember=1.0)
    )
    effect = finish("2/5-1", state=state, error=error, result=result, request=request)
    plan = route([effect], 3, NAMES)
    (piece,) = plan.pieces
    assert piece.target == 2
    assert piece.effect is effect
    answer = Finished(delivery_id="2/5-1", recorded=True)
    (outcome,) = merged([effect], plan, [answer])
    assert outcome is answer


def test_a_finish_is_encoded_with_its_entry_id() -> None:
    from docket_core.lua.protocol import Layout, finish_fields

    layout = Layout("d|2.0")
    assert finish_fields(layout, finish("2/5-1")) == finish_fields(layout, finish("5-1"))


def test_a_batch_of_partition_pieces_is_one_round_a_call_per_partition() -> None:
    effects = [finish("0/1-0"), finish("1/1-0"), finish("0/2-0"), finish("2/1-0")]
    plan = route(effects, 3, NAMES)
    assert targets(plan) == [[[0, 0], [1], [2]]]
    assert not plan.checks_layout


def test_a_claim_is_split_and_its_verdicts_merged_in_order() -> None:
    items = tuple(
        ClaimItem(delivery_id=d, key=f"k{n}", generation=1)
        for n, d in enumerate(["1/1-0", "0/1-0", "1/2-0"])
    )
    effect = Claim(worker="w", items=items, now=1.0)
    plan = route([effect], 3, NAMES)
    # (its items as they are: a store claims their entry ids, and answers
    # with the ids it was given)
    assert [(p.target, [i.delivery_id for i in p.effect.items]) for p in plan.pieces] == [  # type: ignore[attr-defined]
        (1, ["1/1-0", "1/2-0"]),
        (0, ["0/1-0"]),
    ]
    replies: list[Outcome] = [
        Claimed(verdicts=(("1/1-0", ClaimVerdict.CLAIMED), ("1/2-0", ClaimVerdict.LOST))),
        Claimed(verdicts=(("0/1-0", ClaimVerdict.SUPERSEDED),)),
    ]
    (outcome,) = merged([effect], plan, replies)
    assert outcome == Claimed(
        verdicts=(
            ("1/1-0", ClaimVerdict.CLAIMED),
            ("0/1-0", ClaimVerdict.SUPERSEDED),
            ("1/2-0", ClaimVerdict.LOST),
        )
    )


def test_a_claim_of_one_partition_goes_as_it_is_and_is_encoded_with_entry_ids() -> None:
    from docket_core.lua.protocol import Layout, call_for

    def claim(*ids: str) -> Claim:
        items = tuple(ClaimItem(delivery_id=d, key="k", generation=1) for d in ids)
        return Claim(worker="w", items=items, now=1.0)

    effect = claim("2/1-0", "2/5-3")
    (piece,) = route([effect], 3, NAMES).pieces
    assert piece.target == 2 and piece.effect is effect
    bare = claim("1-0", "5-3")
    layout = Layout(NAMES[2])
    assert call_for(layout, effect).args == call_for(layout, bare).args


def test_a_renewal_is_split_its_scoped_slots_riding_with_the_first() -> None:
    slot = HeldSlot(limit_key="l", holder="h", scope="s")
    effect = RenewLeases(
        worker="w", delivery_ids=("2/1-0", "0/1-0", "2/2-0"), slots=(slot,), now=1.0
    )
    plan = route([effect], 3, NAMES)
    assert [(p.target, p.effect.delivery_ids, p.effect.slots) for p in plan.pieces] == [  # type: ignore[attr-defined]
        (2, ("1-0", "2-0"), (slot,)),
        (0, ("1-0",), ()),
    ]
    replies: list[Outcome] = [
        LeasesRenewed(lost=("2-0",), lost_slots=("h",)),
        LeasesRenewed(lost=("1-0",)),
    ]
    assert merged([effect], plan, replies) == [
        LeasesRenewed(lost=("2/2-0", "0/1-0"), lost_slots=("h",))
    ]
    empty = RenewLeases(worker="w", delivery_ids=(), slots=(slot,), now=1.0)
    (piece,) = route([empty], 3, NAMES).pieces
    assert piece.target == 0 and piece.effect == empty


def test_keys_find_their_partition_and_an_acknowledgement_must_match() -> None:
    key = key_in(1)
    message = TaskMessage(key=key, function="f", payload=b"", when=0.0)
    schedule = Schedule(message=message, mode=ScheduleMode.ADD, now=1.0, acknowledge="1/4-0")
    cancel = Cancel(key=key_in(2), now=1.0, ttl=5.0)
    plan = route([schedule, cancel], 3, NAMES)
    assert [(p.target, p.partition) for p in plan.pieces] == [(1, 1), (2, None)]
    assert plan.pieces[0].effect == attrs.evolve(schedule, acknowledge="4-0")
    replies: list[Outcome] = [
        Scheduled(key=key, accepted=True, generation=1, state=None),
        Cancelled(key=key_in(2), previous=None),
    ]
    assert merged([schedule, cancel], plan, replies) == replies
    with pytest.raises(ValueError, match="another partition"):
        route([attrs.evolve(schedule, acknowledge="0/4-0")], 3, NAMES)


def test_home_and_scope_steps_keep_their_place() -> None:
    release = ReleaseSlot(limit_key="l", holder="h", now=1.0, scope="s")
    take = TakeSlot(
        scope="s",
        limit_key="l",
        holder="h",
        max_concurrent=1,
        now=1.0,
        stale_after=5.0,
        delivery_id="2/3-0",
        docket="ignored",
    )
    beat = Heartbeat(worker="w", tasks=(), now=1.0)
    effects: list[StoreEffect] = [
        finish("0/1-0"),
        finish("1/1-0"),
        release,
        take,
        beat,
        finish("1/2-0"),
    ]
    plan = route(effects, 3, NAMES)
    # the release goes to its neighbour's store once the finishes are
    # answered; the take (in the scope) waits for it, the heartbeat for the take
    assert targets(plan) == [[[0], [1]], [[1]], [[2]], [[HOME]], [[1]]]
    assert plan.pieces[3].effect == attrs.evolve(take, delivery_id="3-0", docket=NAMES[2])
    assert plan.checks_layout
    replies: list[Outcome] = [
        Finished(delivery_id="0/1-0", recorded=True),  # (a store answers a finish's id as given)
        Finished(delivery_id="1/1-0", recorded=True),
        SlotReleased(limit_key="l", woken=0, wake=None),
        SlotTaken(delivery_id="3-0", acquired=True),
        HeartbeatSent(),
        Finished(delivery_id="1/2-0", recorded=False),
    ]
    outcomes = merged(effects, plan, replies)
    assert outcomes[3] == SlotTaken(delivery_id="2/3-0", acquired=True)
    assert outcomes[5] == Finished(delivery_id="1/2-0", recorded=False)


def test_a_leaving_worker_is_forgotten_by_every_partition() -> None:
    beat = Heartbeat(worker="w", tasks=(), now=1.0, leaving=True)
    plan = route([beat], 3, NAMES)
    assert [p.target for p in plan.pieces] == [HOME, 0, 1, 2]
    assert not plan.checks_layout  # (it leaves: no need to look)
    assert merged([beat], plan, [HeartbeatSent()] * 4) == [HeartbeatSent()]


def test_an_effect_without_a_route_is_refused() -> None:
    assert route([Enlist(scope="s", limit_key="l", docket="d", since=0.0, now=1.0)], 3, NAMES)
    with pytest.raises(ValueError, match="names no partition"):
        route([finish("7/1-0")], 3, NAMES)
    with pytest.raises(ValueError, match="names no partition"):
        route(
            [
                ConfirmSlot(
                    worker="w",
                    delivery_id="1-0",
                    key="k",
                    generation=1,
                    limit_key="l",
                    scope="s",
                    now=1.0,
                )
            ],
            3,
            NAMES,
        )

    @attrs.frozen
    class Unknown(StoreEffect):
        pass

    with pytest.raises(TypeError, match="no route"):
        route([Unknown()], 3, NAMES)
