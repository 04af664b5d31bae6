"""``docket_core.lua.protocol`` on its own: store effects in, script calls out;
script replies in, outcomes out.  No server: the replies are hand-made in the
shapes both clients return (bytes, ints, lists, ``None``), and a reply of
another shape is a ``StoreError`` naming it, never a crash of another kind."""

from __future__ import annotations

import time
import uuid
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from docket_core.lua.entries import pack, parse_count, parse_layout, unpack_fields
from docket_core.lua.protocol import (
    BATCHED,
    GROUP,
    RENEWED_SLOT_TTL_MS,
    Layout,
    ScriptCall,
    acquire_fields,
    call_for,
    calls_for,
    confirm_fields,
    finish_fields,
    memo_header,
    number,
    number_bytes,
    outcome_for,
    outcomes_for,
    pack_batch,
    pack_fields,
    park_fields,
    progress_call,
    take_fields,
    unpack_batch,
)
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import (
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
    Request,
    Schedule,
    StoreEffect,
    TakeSlot,
    WakeParked,
)
from docket_core.sansio.errors import StoreError
from docket_core.sansio.inputs import (
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
from docket_core.sansio.values import (
    ExecutionState,
    HeldSlot,
    MalformedEntry,
    ScheduleMode,
    TaskMessage,
)

LAYOUT = Layout("orders")
#: the namespace of the scope the scoped effects below name
SHARED = Layout("shared")
#: another docket, whose parked keys a ``WakeParked`` wakes
OTHER = Layout("other")
REQUEST = Request(origin="o-1", worker="w1", seq=7, floor=3, remember=90.5)


def message(key: str = "k", generation: int = 1) -> TaskMessage:
    return TaskMessage(key=key, function="f", payload=b"\x00p:1", when=10.5, generation=generation)


def finish(n: int = 1, **fields: Any) -> Finish:
    fields.setdefault("state", ExecutionState.COMPLETED)
    return Finish(delivery_id=f"{n}-0", key=f"k{n}", generation=1, now=20.0, ttl=60.0, **fields)


def schedule(key: str = "k", **fields: Any) -> Schedule:
    return Schedule(message=message(key), mode=ScheduleMode.ADD, now=10.0, **fields)


def acquire(n: int = 1, **fields: Any) -> AcquireSlot:
    return AcquireSlot(
        limit_key="limit:f", holder=f"w1/{n}-0", max_concurrent=2, now=10.0, stale_after=60.0,
        delivery_id=f"{n}-0", message=message(f"k{n}"), **fields,
    )  # fmt: skip


def take(n: int = 1, **fields: Any) -> TakeSlot:
    fields = {"scope": "shared", "max_concurrent": 2, **fields}
    return TakeSlot(
        limit_key="limit:f", holder=f"w1/{n}-0", now=10.0, stale_after=60.0,
        delivery_id=f"{n}-0", docket="orders", **fields,
    )  # fmt: skip


def confirm(n: int = 1) -> ConfirmSlot:
    return ConfirmSlot(
        worker="w1", delivery_id=f"{n}-0", key=f"k{n}", generation=3, limit_key="limit:f",
        scope="shared", now=10.0,
    )  # fmt: skip


def park(n: int = 1, **fields: Any) -> Park:
    fields.setdefault("retry_at", 70.0)
    return Park(
        delivery_id=f"{n}-0", message=message(f"k{n}", generation=3), limit_key="limit:f",
        scope="shared", now=10.0, **fields,
    )  # fmt: skip


CLAIM = Claim(
    worker="w1",
    items=(
        ClaimItem(delivery_id="1-0", key="a", generation=1),
        ClaimItem(delivery_id="2-0", key="b", generation=4),
    ),
    now=10.0,
    request=REQUEST,
)
#: a renewal whose slots all live in the docket's namespace: one call
RENEW = RenewLeases(
    worker="w1",
    delivery_ids=("1-0", "2-0"),
    slots=(
        HeldSlot(limit_key="limit:f", holder="w1/1-0"),
        # a scope named as the docket is the docket's own namespace
        HeldSlot(limit_key="limit:g", holder="w1/2-0", scope="orders"),
    ),
    now=10.0,
)
#: a renewal holding slots of two scopes and one of its own, interleaved
RENEW_SCOPED = RenewLeases(
    worker="w1",
    delivery_ids=("1-0", "2-0"),
    slots=(
        HeldSlot(limit_key="limit:f", holder="w1/1-0", scope="shared"),
        HeldSlot(limit_key="limit:g", holder="w1/2-0"),
        HeldSlot(limit_key="limit:h", holder="w1/3-0", scope="other"),
        HeldSlot(limit_key="limit:f", holder="w1/4-0", scope="shared"),
    ),
    now=10.0,
)
RELEASE = ReleaseSlot(limit_key="limit:f", holder="w1/1-0", now=10.0, request=REQUEST)
RELEASE_SCOPED = ReleaseSlot(
    limit_key="limit:f", holder="w1/1-0", now=10.0, scope="shared", request=REQUEST
)
PASS_ON = ReleaseSlot(limit_key="limit:f", holder="", now=10.0, scope="shared", pass_on=True)
WAKE = WakeParked(docket="other", scope="shared", limit_key="limit:f", now=10.0, request=REQUEST)
ENLIST = Enlist(scope="shared", limit_key="limit:f", docket="other", since=8.5, now=10.0)
CANCEL = Cancel(key="k", now=10.0, ttl=60.0, request=REQUEST)
BURY = BuryMalformed(
    worker="w1",
    entry=MalformedEntry(
        delivery_id="9-0", reason="no key", key="k", generation=2, fields=(("x", b"\xff"),)
    ),
    now=10.0,
    ttl=60.0,
)
HEARTBEAT = Heartbeat(worker="w1", tasks=("f", "g"), now=10.0)

#: one effect of every kind a script carries out in one call, with the
#: namespace that call runs in
EVERY_KIND: list[tuple[StoreEffect, Layout]] = [
    (finish(), LAYOUT),
    (schedule(), LAYOUT),
    (acquire(), LAYOUT),
    (acquire(scope="orders"), LAYOUT),
    (CLAIM, LAYOUT),
    (RENEW, LAYOUT),
    (RELEASE, LAYOUT),
    (RELEASE_SCOPED, SHARED),
    (PASS_ON, SHARED),
    (take(), SHARED),
    (confirm(), LAYOUT),
    (park(), LAYOUT),
    (WAKE, OTHER),
    (ENLIST, SHARED),
    (CANCEL, LAYOUT),
    (BURY, LAYOUT),
    (HEARTBEAT, LAYOUT),
]


def kind_id(value: object) -> str | None:
    return type(value).__name__ if isinstance(value, StoreEffect) else None


# -- numbers and packed fields ------------------------------------------------------------


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_numbers_are_exact_decimal_text(value: float) -> None:
    assert float(number(value)) == value
    assert number_bytes(value) == number(value).encode()


@given(st.lists(st.binary(max_size=40), max_size=12))
def test_packed_values_unpack_as_they_were(values: list[bytes]) -> None:
    assert unpack_fields(pack(values)) == values


@given(st.lists(st.binary(max_size=300), max_size=12))
def test_batch_fields_unpack_as_they_were(values: list[bytes]) -> None:
    packed = pack_batch(values)
    assert unpack_batch(packed) == values
    assert unpack_batch(packed[:-1]) == values[:-1]  # a field cut short is dropped


@given(st.lists(st.binary(max_size=40), min_size=10, max_size=10))
def test_ten_packed_fields_are_packed_values(fields: list[bytes]) -> None:
    packed = pack_fields(*fields)
    assert packed == pack(fields)
    assert unpack_fields(packed) == fields


def test_unpacking_stops_at_the_first_field_that_does_not_parse() -> None:
    assert unpack_fields(b"1:a2:bcx:zz") == [b"a", b"bc"]
    assert unpack_fields(b"3:ab") == [b"ab"]  # a short last field is what is left
    assert unpack_fields(b"no colon") == []


def test_the_memo_header_packs_the_request_and_is_empty_without_one() -> None:
    assert memo_header(None) == b""
    assert unpack_fields(memo_header(REQUEST)) == [b"3", b"90500", b"w1", b"o-1"]


# -- the key layout ---------------------------------------------------------------------------


def test_every_key_of_a_docket_shares_its_hash_tag() -> None:
    keys = [
        LAYOUT.stream, LAYOUT.wake_stream, LAYOUT.due, LAYOUT.fence, LAYOUT.strikes,
        LAYOUT.cancel_channel, LAYOUT.events_channel("k"), LAYOUT.run_key("k"),
        LAYOUT.progress_key("k"),
    ]  # fmt: skip
    assert all(key.startswith("{orders}:") for key in keys)
    assert len(set(keys)) == len(keys)
    assert LAYOUT.namespace(None) == "{orders}"
    assert LAYOUT.namespace("orders") == "{orders}"
    assert LAYOUT.namespace("shared") == "{shared}"


def test_a_calls_tag_is_its_layouts_prefix_or_its_first_keys_hash_tag() -> None:
    assert LAYOUT.call("x").tag == "{orders}"
    assert ScriptCall(name="x", keys=("{a}:q", "{a}:fence"), args=()).tag == "{a}"
    assert ScriptCall(name="x", keys=(), args=()).tag == ""


# -- effects to calls -------------------------------------------------------------------------


@pytest.mark.parametrize(("effect", "where"), EVERY_KIND, ids=kind_id)
def test_every_call_declares_its_namespaces_queue_and_fence_and_only_text_or_bytes(
    effect: StoreEffect, where: Layout
) -> None:
    ((call, covered),) = calls_for(LAYOUT, [effect])
    assert covered == 1
    assert call.layout == where
    assert call.tag == where.prefix
    assert call.keys == (where.stream, where.fence)
    assert call.args[:2] == (where.prefix, GROUP)
    assert all(isinstance(arg, str | bytes) for arg in call.args), call.args
    if type(effect) not in BATCHED:
        assert call_for(LAYOUT, effect) == call


def test_consecutive_schedules_and_finishes_share_calls_in_order() -> None:
    now = time.time()

    def add(key: str) -> object:
        return plan_add(
            key=key, function="f", payload=b"", when=now, mode=ScheduleMode.ADD, now=now
        )

    def finish(n: int) -> Finish:
        return Finish(
            delivery_id=f"{n}-0",
            key=f"k{n}",
            generation=1,
            state=ExecutionState.COMPLETED,
            now=now,
            ttl=60,
        )

    cancel = Cancel(key="x", now=now, ttl=60)
    effects = [add("a"), add("b"), finish(1), finish(2), add("c"), cancel, add("d")]
    calls = calls_for(Layout(f"batch-{uuid.uuid4().hex}"), effects)  # type: ignore[arg-type]
    assert [(call.name, covered) for call, covered in calls] == [
        ("schedule", 2),
        ("finish", 2),
        ("schedule", 1),
        ("cancel", 1),
        ("schedule", 1),
    ]
    # each call carries its memo header (empty: a producer does not resend),
    # then its effects' fields, packed into one argument, in order, then the
    # partition count of its layout (an add names it: ``refuse_closed``)
    (header, packed, count) = calls[0][0].args[2:]
    assert header == b"" and count == b"1"
    assert calls_for(Layout("orders|0.1", 3), effects)[0][0].args[4] == b"3"
    assert isinstance(packed, bytes)
    fields = unpack_batch(packed)
    assert (fields[:3], fields[12:15]) == ([b"a", b"f", b""], [b"b", b"f", b""])


@pytest.mark.parametrize(
    ("effects", "width", "where"),
    [
        (
            [
                finish(1),
                finish(2, state=ExecutionState.FAILED, error="boom"),
                finish(3, result=b"r"),
            ],
            10,
            LAYOUT,
        ),
        ([schedule("a"), schedule("b", acknowledge="1-0", expect_generation=4)], 12, LAYOUT),
        ([acquire(1), acquire(2), acquire(3, scope="orders")], 10, LAYOUT),
        ([take(1), take(2, max_concurrent=5)], 7, SHARED),
        ([confirm(1), confirm(2)], 6, LAYOUT),
        ([park(1), park(2, retry_at=99.5)], 12, LAYOUT),
    ],
    ids=["finish", "schedule", "acquire", "take", "confirm", "park"],
)
def test_a_batched_call_carries_fixed_fields_an_effect_the_last_its_request_number(
    effects: list[StoreEffect], width: int, where: Layout
) -> None:
    script, fields_of = BATCHED[type(effects[0])]
    ((call, covered),) = calls_for(LAYOUT, effects)
    assert (call.name, covered, call.layout) == (script, len(effects), where)
    header, packed, *count = call.args[2:]
    assert header == b""
    assert isinstance(packed, bytes)
    assert count == ([b"1"] if script == "schedule" else [])  # (an add names its layout's)
    # the hot batches take the faster form (unpack_batch in the scripts)
    fast = script in ("finish", "schedule")
    fields = unpack_batch(packed) if fast else unpack_fields(packed)
    assert len(fields) == width * len(effects)
    assert packed == b"".join(fields_of(LAYOUT, effect) for effect in effects)
    if hasattr(effects[0], "request"):  # a confirmation is not remembered: it has none
        assert fields[width - 1 :: width] == [b""] * len(effects)  # nobody resends these


def test_finish_fields_say_whether_a_result_was_kept() -> None:
    kept = unpack_batch(finish_fields(LAYOUT, finish(result=b"")))
    none = unpack_batch(finish_fields(LAYOUT, finish()))
    assert (kept[7], kept[8]) == (b"1", b"")
    assert (none[7], none[8]) == (b"0", b"")


def test_a_batch_remembers_the_request_of_its_first_remembered_effect() -> None:
    first = Request(origin="o-1", worker="w1", seq=8, floor=3, remember=90.0)
    second = Request(origin="o-1", worker="w1", seq=9, floor=3, remember=90.0)
    effects = [finish(1), finish(2, request=first), finish(3, request=second)]
    ((call, covered),) = calls_for(LAYOUT, effects)
    assert covered == 3
    assert call.args[2] == memo_header(first)
    assert unpack_batch(call.args[3])[9::10] == [b"", b"8", b"9"]  # type: ignore[arg-type]


# -- concurrency slots: one script without a scope, the chain with one ----------------------


def test_an_acquisition_without_a_scope_names_the_dockets_namespace() -> None:
    fields = unpack_fields(acquire_fields(LAYOUT, acquire(2, request=REQUEST)))
    assert fields == [
        b"limit:f", b"w1/2-0", b"2", b"10.0", b"60.0", b"2-0", b"k2", b"1", b"{orders}", b"7",
    ]  # fmt: skip
    # a scope named as the docket is the docket's own namespace
    assert acquire_fields(LAYOUT, acquire(2, scope="orders", request=REQUEST)) == pack(fields)


def test_a_scoped_acquisition_is_refused_it_takes_the_chain() -> None:
    scoped = acquire(2, scope="shared")
    with pytest.raises(ValueError, match="TakeSlot"):
        acquire_fields(LAYOUT, scoped)
    with pytest.raises(ValueError, match="TakeSlot"):
        calls_for(LAYOUT, [scoped])
    with pytest.raises(ValueError, match="TakeSlot"):  # not half a batch either
        calls_for(LAYOUT, [acquire(1), scoped])


def test_a_take_runs_in_the_scope_and_names_the_docket_that_waits() -> None:
    effect = take(4, request=REQUEST)
    assert unpack_fields(take_fields(LAYOUT, effect)) == [
        b"limit:f", b"w1/4-0", b"2", b"10.0", b"60.0", b"orders", b"7",
    ]  # fmt: skip
    ((call, covered),) = calls_for(LAYOUT, [effect])
    assert (call.name, call.tag, covered) == ("take", "{shared}", 1)
    assert call.args[2:] == (memo_header(REQUEST), take_fields(LAYOUT, effect))


def test_takes_share_a_call_only_while_they_name_one_scope() -> None:
    effects: list[StoreEffect] = [
        take(1),
        take(2),
        take(3, scope="exports"),
        take(4),
        confirm(1),
        confirm(2),
        park(4),
    ]
    calls = calls_for(LAYOUT, effects)
    assert [(call.name, call.tag, covered) for call, covered in calls] == [
        ("take", "{shared}", 2),
        ("take", "{exports}", 1),
        ("take", "{shared}", 1),
        ("confirm", "{orders}", 2),
        ("park", "{orders}", 1),
    ]


def test_a_confirmation_and_a_parking_run_in_the_docket_and_name_the_scope() -> None:
    assert unpack_fields(confirm_fields(LAYOUT, confirm(2))) == [
        b"w1", b"2-0", b"k2", b"3", b"limit:f", b"{shared}",
    ]  # fmt: skip
    assert unpack_fields(park_fields(LAYOUT, park(2, request=REQUEST))) == [
        b"2-0", b"k2", b"f", b"\x00p:1", b"10.5", b"1", b"3",  # the message
        b"limit:f", b"{shared}", b"10.0", b"70.0", b"7",
    ]  # fmt: skip
    ((call, _),) = calls_for(LAYOUT, [park(2, request=REQUEST)])
    assert call.args[2] == memo_header(REQUEST)
    ((call, _),) = calls_for(LAYOUT, [confirm(2)])
    assert call.args[2] == b""  # a confirmation is idempotent: no memo


def test_a_release_runs_where_its_slots_live() -> None:
    call = call_for(LAYOUT, RELEASE)
    assert (call.name, call.tag) == ("release", "{orders}")
    assert call.args[2:] == (memo_header(REQUEST), "7", "limit:f", "w1/1-0", "10.0", "0")
    call = call_for(LAYOUT, RELEASE_SCOPED)
    assert (call.name, call.tag) == ("release", "{shared}")
    assert call.args[2:] == (memo_header(REQUEST), "7", "limit:f", "w1/1-0", "10.0", "0")
    call = call_for(LAYOUT, PASS_ON)
    assert (call.name, call.tag) == ("release", "{shared}")
    assert call.args[2:] == (b"", "", "limit:f", "", "10.0", "1")


def test_a_wake_up_runs_in_the_waiting_docket_and_an_enlistment_in_the_scope() -> None:
    call = call_for(LAYOUT, WAKE)
    assert (call.name, call.tag) == ("wake", "{other}")
    assert call.args[2:] == (memo_header(REQUEST), "7", "limit:f", "{shared}", "10.0")
    call = call_for(LAYOUT, ENLIST)
    assert (call.name, call.tag) == ("enlist", "{shared}")
    assert call.args[2:] == ("limit:f", "other", "8.5")


# -- renewals --------------------------------------------------------------------------------


def test_a_renewal_counts_its_deliveries_then_lists_its_own_slots() -> None:
    call = call_for(LAYOUT, RENEW)
    assert call.name == "renew"
    worker, now, ttl, count, *rest = call.args[2:]
    assert (worker, now, ttl, count) == ("w1", "10.0", RENEWED_SLOT_TTL_MS, "2")
    assert rest == ["1-0", "2-0", "limit:f", "w1/1-0", "limit:g", "w1/2-0"]


def test_a_renewal_of_scoped_slots_renews_each_scope_in_its_namespace() -> None:
    calls = calls_for(LAYOUT, [RENEW_SCOPED])
    assert [(call.name, call.tag, covered) for call, covered in calls] == [
        ("renew", "{orders}", 1),
        ("renew_slots", "{shared}", 0),  # scopes in the order their slots first appear
        ("renew_slots", "{other}", 0),
    ]
    (renew, _), (shared, _), (other, _) = calls
    assert renew.args[2:] == (
        *("w1", "10.0", RENEWED_SLOT_TTL_MS, "2", "1-0", "2-0"),
        *("limit:g", "w1/2-0"),  # only the slot without a scope
    )
    assert shared.args[2:] == (
        "10.0",
        RENEWED_SLOT_TTL_MS,
        *("limit:f", "w1/1-0"),
        *("limit:f", "w1/4-0"),
    )
    assert other.args[2:] == ("10.0", RENEWED_SLOT_TTL_MS, "limit:h", "w1/3-0")
    assert all(call.keys == (call.tag + ":q", call.tag + ":fence") for call, _ in calls)
    with pytest.raises(ValueError, match="several calls"):
        call_for(LAYOUT, RENEW_SCOPED)


def test_a_split_renewal_answers_one_outcome_merging_its_lost_slots() -> None:
    effects: list[StoreEffect] = [finish(1), RENEW_SCOPED, RENEW_SCOPED, CANCEL]
    calls = calls_for(LAYOUT, effects)
    assert [covered for _, covered in calls] == [1, 1, 0, 0, 1, 0, 0, 1]
    replies = [
        [1],
        [[b"2-0"], [b"w1/2-0"]],
        [[], [b"w1/4-0"]],
        [[], [b"w1/3-0"]],
        [[], []],  # the second renewal lost nothing
        [[], []],
        [[], [b"w1/3-0"]],
        b"",
    ]
    assert outcomes_for(effects, calls, replies) == [
        Finished(delivery_id="1-0", recorded=True),
        LeasesRenewed(lost=("2-0",), lost_slots=("w1/2-0", "w1/4-0", "w1/3-0")),
        LeasesRenewed(lost_slots=("w1/3-0",)),
        Cancelled(key="k", previous=None),
    ]


@pytest.mark.parametrize("part", [None, 1, [[]], [b"x", b"y", b"z"]])
def test_a_part_of_a_split_renewal_of_another_shape_is_a_store_error(part: Any) -> None:
    calls = calls_for(LAYOUT, [RENEW_SCOPED])
    with pytest.raises(StoreError, match=r"answered|unexpected reply"):
        outcomes_for([RENEW_SCOPED], calls, [[[], []], [[], []], part])


# -- other calls -------------------------------------------------------------------------------


def test_a_claim_lists_its_items_after_its_request() -> None:
    call = call_for(LAYOUT, CLAIM)
    assert call.name == "claim"
    assert call.args[2:] == (
        memo_header(REQUEST),
        "7",
        "w1",
        "10.0",
        "1",
        *("1-0", "a", "1"),
        *("2-0", "b", "4"),
    )
    quiet = call_for(LAYOUT, attrs.evolve(CLAIM, renew=False))
    assert quiet.args[2:7] == (*call.args[2:6], "0") and quiet.args[7:] == call.args[7:]


def test_a_heartbeat_sends_its_tasks_as_json() -> None:
    call = call_for(LAYOUT, Heartbeat(worker="w1", tasks=("f",), now=1.0, leaving=True))
    assert call.name == "heartbeat"
    assert call.args[2:4] == ("w1", "1.0")
    assert call.args[4] == "1"
    assert call.args[-1] == '["f"]'


def test_an_effect_no_script_carries_out_is_refused() -> None:
    class Unknown(StoreEffect):
        pass

    with pytest.raises(TypeError, match="no script"):
        calls_for(LAYOUT, [Unknown()])
    with pytest.raises(TypeError, match="no script"):
        outcome_for(Unknown(), 1)


def test_a_progress_call_leaves_what_it_does_not_set_empty() -> None:
    def args(**fields: Any) -> tuple[str | bytes, ...]:
        options: dict[str, Any] = {
            "now": 5.0,
            "generation": None,
            "current": None,
            "increment": None,
            "total": None,
            "message": None,
            "clear_message": False,
        }
        options.update(fields)
        call: ScriptCall = progress_call(LAYOUT, "k", **options)
        assert call.name == "progress"
        return call.args[2:]

    assert args() == ("k", "5.0", "", "", "", "", "0", "")
    assert args(current=3, total=9, generation=2) == ("k", "5.0", "3", "", "9", "", "0", "2")
    assert args(increment=1, message="half") == ("k", "5.0", "", "1", "", "half", "0", "")
    assert args(message="")[-2] == "1"  # an empty message clears it
    assert args(clear_message=True)[-2] == "1"


# -- replies to outcomes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("effect", "reply", "outcome"),
    [
        (finish(), 1, Finished(delivery_id="1-0", recorded=True)),
        (finish(), b"0", Finished(delivery_id="1-0", recorded=False)),
        (
            schedule(),
            [1, b"3", b"queued"],
            Scheduled(key="k", accepted=True, generation=3, state=ExecutionState.QUEUED),
        ),
        (schedule(), [0, 2, b""], Scheduled(key="k", accepted=False, generation=2, state=None)),
        (acquire(), 1, SlotAcquired(delivery_id="1-0", acquired=True)),
        (acquire(), 0, SlotAcquired(delivery_id="1-0", acquired=False)),
        (acquire(), 2, SlotAcquired(delivery_id="1-0", acquired=False, lost=True)),
        (
            CLAIM,
            [b"claimed", "lost"],
            Claimed(verdicts=(("1-0", ClaimVerdict.CLAIMED), ("2-0", ClaimVerdict.LOST))),
        ),
        (RENEW, [[], []], LeasesRenewed()),
        (RENEW, [[b"2-0"], [b"w1/1-0"]], LeasesRenewed(lost=("2-0",), lost_slots=("w1/1-0",))),
        (RELEASE, [1, b""], SlotReleased(limit_key="limit:f", woken=1)),
        (RELEASE, [0, ""], SlotReleased(limit_key="limit:f", woken=0)),
        (RELEASE_SCOPED, [0, b"other"], SlotReleased(limit_key="limit:f", woken=0, wake="other")),
        (PASS_ON, [b"0", "other"], SlotReleased(limit_key="limit:f", woken=0, wake="other")),
        (take(), 1, SlotTaken(delivery_id="1-0", acquired=True)),
        (take(), b"0", SlotTaken(delivery_id="1-0", acquired=False)),
        (take(), 2, SlotTaken(delivery_id="1-0", acquired=False, lost=True)),
        (confirm(), 1, SlotConfirmed(delivery_id="1-0")),
        (confirm(), b"2", SlotConfirmed(delivery_id="1-0", lost=True)),
        (park(), 1, Parked(delivery_id="1-0", parked=True)),
        (park(), 0, Parked(delivery_id="1-0", parked=False)),
        (park(), 2, Parked(delivery_id="1-0", parked=False, lost=True)),
        (
            WAKE,
            [1, 2, b"12.5"],
            WokeParked(docket="other", limit_key="limit:f", woken=1, remaining=2, oldest=12.5),
        ),
        (WAKE, [0, 0, b""], WokeParked(docket="other", limit_key="limit:f", woken=0)),
        (ENLIST, 1, Enlisted(docket="other", limit_key="limit:f")),
        (CANCEL, b"scheduled", Cancelled(key="k", previous=ExecutionState.SCHEDULED)),
        (CANCEL, b"", Cancelled(key="k", previous=None)),
        (BURY, 0, Buried(delivery_id="9-0", moved=False)),
        (BURY, 1, Buried(delivery_id="9-0", moved=True)),
        (BURY, 2, Buried(delivery_id="9-0", moved=True, failed_key=True)),
        (HEARTBEAT, b"OK", HeartbeatSent()),
    ],
    ids=kind_id,
)
def test_a_reply_becomes_the_effects_outcome(
    effect: StoreEffect, reply: Any, outcome: Outcome
) -> None:
    calls = calls_for(LAYOUT, [effect])
    batched = type(effect) in BATCHED
    assert outcomes_for([effect], calls, [[reply] if batched else reply]) == [outcome]


def test_a_batch_answers_one_reply_per_effect_in_order() -> None:
    effects: list[StoreEffect] = [finish(1), finish(2), CANCEL, schedule("a"), schedule("b")]
    calls = calls_for(LAYOUT, effects)
    assert [covered for _, covered in calls] == [2, 1, 2]
    replies = [[1, 0], b"queued", [[1, 5, b"queued"], [0, 6, b"running"]]]
    assert outcomes_for(effects, calls, replies) == [
        Finished(delivery_id="1-0", recorded=True),
        Finished(delivery_id="2-0", recorded=False),
        Cancelled(key="k", previous=ExecutionState.QUEUED),
        Scheduled(key="a", accepted=True, generation=5, state=ExecutionState.QUEUED),
        Scheduled(key="b", accepted=False, generation=6, state=ExecutionState.RUNNING),
    ]


def test_the_chains_batches_answer_one_reply_per_effect_in_order() -> None:
    effects: list[StoreEffect] = [take(1), take(2), confirm(1), park(2)]
    calls = calls_for(LAYOUT, effects)
    assert [covered for _, covered in calls] == [2, 1, 1]
    assert outcomes_for(effects, calls, [[1, 0], [2], [1]]) == [
        SlotTaken(delivery_id="1-0", acquired=True),
        SlotTaken(delivery_id="2-0", acquired=False),
        SlotConfirmed(delivery_id="1-0", lost=True),
        Parked(delivery_id="2-0", parked=True),
    ]


@pytest.mark.parametrize(
    ("effects", "replies"),
    [
        pytest.param([finish(1), finish(2)], [1], id="batch-not-a-list"),
        pytest.param([finish(1), finish(2)], [[1]], id="batch-short"),
        pytest.param([finish(1), finish(2)], [[1, 1, 1]], id="batch-long"),
        pytest.param([finish(1)], [[b"yes"]], id="finish-not-a-number"),
        pytest.param([schedule()], [[[1, 2]]], id="schedule-two-values"),
        pytest.param([schedule()], [[[1, b"x", b"queued"]]], id="schedule-bad-generation"),
        pytest.param([schedule()], [[[1, 2, b"no-such-state"]]], id="schedule-bad-state"),
        pytest.param([acquire()], [[None]], id="acquire-none"),
        pytest.param([take(1), take(2)], [[1]], id="take-short"),
        pytest.param([take()], [[None]], id="take-none"),
        pytest.param([confirm()], [[b"no"]], id="confirm-not-a-number"),
        pytest.param([park()], [[[1]]], id="park-a-list"),
        pytest.param([CLAIM], [[b"claimed"]], id="claim-short"),  # one verdict for two items
        pytest.param([CLAIM], [[b"claimed", b"maybe"]], id="claim-bad-verdict"),
        pytest.param([RENEW], [None], id="renew-none"),
        pytest.param([RELEASE], [b"many"], id="release-not-a-pair"),
        pytest.param([RELEASE], [2], id="release-a-bare-number"),  # the shape before [woken, wake]
        pytest.param([RELEASE], [[b"x", b""]], id="release-woken-not-a-number"),
        pytest.param([WAKE], [[1, 2]], id="wake-two-values"),
        pytest.param([WAKE], [[1, 2, b"soon"]], id="wake-oldest-not-a-number"),
        pytest.param([CANCEL], [b"gone"], id="cancel-bad-state"),
        pytest.param([BURY], [[1]], id="bury-a-list"),
    ],
)
def test_a_reply_of_another_shape_is_a_store_error(
    effects: list[StoreEffect], replies: list[Any]
) -> None:
    calls = calls_for(LAYOUT, effects)
    with pytest.raises(StoreError, match=r"answered|unexpected reply"):
        outcomes_for(effects, calls, replies)


@pytest.mark.parametrize("reply", [b"x", None, [1], b""])
def test_a_count_or_layout_reply_of_another_shape_is_a_store_error(reply: object) -> None:
    with pytest.raises(StoreError, match="unexpected reply to a closing step"):
        parse_count(reply, "a closing step")
    with pytest.raises(StoreError, match="unexpected reply to a partition count"):
        parse_layout(reply)


def test_a_count_and_a_layout_read_as_numbers() -> None:
    assert parse_count(b"1", "a closing step") == 1
    recorded = parse_layout([b"3", b"", b"2"])
    assert (recorded.count, recorded.leaving, recorded.epoch) == (3, None, 2)
    assert parse_layout([b"3", b"1", b"2"]).leaving == 1
    with pytest.raises(StoreError):
        parse_layout([b"0", b"", b"0"])  # (a count is at least 1)


@pytest.mark.parametrize("renew", [True, False])
def test_a_slot_step_carries_21_fields_an_item_its_renew_last(renew: bool) -> None:
    from docket_core.lua.slot_steps import step_fields
    from docket_core.sansio.local_slots import SlotStep, SlotTake

    takes = tuple(SlotTake(f"{n}-0", message(f"k{n}"), "limit:x", 2, f"w1/{n}-0") for n in (1, 2))
    step = SlotStep(finish=finish(), takes=takes, stale_after=60.0, now=10.0, renew=renew)
    fields = unpack_batch(step_fields(LAYOUT, step))
    assert len(fields) == 21 * 2
    assert fields[0::21] == [b"1", b"0"]  # the step's first item, then a further take
    assert fields[14::21] == [b"1-0", b"2-0"]
    assert fields[20::21] == [b"1" if renew else b"0"] * 2


@pytest.mark.parametrize("error", [None, "boom"])
def test_a_step_that_hands_its_slot_to_one_take_is_laid_out_as_any_step(
    error: str | None,
) -> None:
    """A drain's step (an end, its release, one take) takes a format of its
    own: its item is the first item of the same step with a second take."""
    from docket_core.lua.slot_steps import step_fields
    from docket_core.sansio.local_slots import SlotStep, SlotTake

    release = ReleaseSlot(limit_key="limit:x", holder="w1/0-1", now=10.0)
    take = SlotTake("1-0", message("k1"), "limit:x", 2, "w1/1-0")
    end = finish(2, error=error, result=b"r" if error is None else None)
    step = SlotStep(finish=end, release=release, takes=(take,), stale_after=60.0, now=10.0)
    one = step_fields(LAYOUT, step)
    two = step_fields(LAYOUT, attrs.evolve(step, takes=(take, take)))
    assert len(unpack_batch(one)) == 21 and two.startswith(one)
    with pytest.raises(ValueError, match="its docket's own only"):
        step_fields(LAYOUT, attrs.evolve(step, release=attrs.evolve(release, scope="shared")))
