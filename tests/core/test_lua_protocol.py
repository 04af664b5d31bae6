"""``docket_core.lua.protocol`` on its own: store effects in, script calls out;
script replies in, outcomes out.  No server: the replies are hand-made in the
shapes both clients return (bytes, ints, lists, ``None``), and a reply of
another shape is a ``StoreError`` naming it, never a crash of another kind."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from docket_core.lua.entries import pack, unpack_fields
from docket_core.lua.protocol import (
    BATCHED,
    GROUP,
    Layout,
    ScriptCall,
    call_for,
    calls_for,
    finish_fields,
    memo_header,
    number,
    number_bytes,
    outcome_for,
    outcomes_for,
    pack_fields,
    progress_call,
)
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import (
    AcquireSlot,
    BuryMalformed,
    Cancel,
    Claim,
    ClaimItem,
    Finish,
    Heartbeat,
    ReleaseSlot,
    RenewLeases,
    Request,
    Schedule,
    StoreEffect,
)
from docket_core.sansio.errors import StoreError
from docket_core.sansio.inputs import (
    Buried,
    Cancelled,
    Claimed,
    ClaimVerdict,
    Finished,
    HeartbeatSent,
    LeasesRenewed,
    Outcome,
    Scheduled,
    SlotAcquired,
    SlotReleased,
)
from docket_core.sansio.values import (
    ExecutionState,
    HeldSlot,
    MalformedEntry,
    ScheduleMode,
    TaskMessage,
)

LAYOUT = Layout("orders")
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
        limit_key="limit:f",
        holder=f"w1/{n}-0",
        max_concurrent=2,
        now=10.0,
        stale_after=60.0,
        delivery_id=f"{n}-0",
        message=message(f"k{n}"),
        **fields,
    )


CLAIM = Claim(
    worker="w1",
    items=(
        ClaimItem(delivery_id="1-0", key="a", generation=1),
        ClaimItem(delivery_id="2-0", key="b", generation=4),
    ),
    now=10.0,
    request=REQUEST,
)
RENEW = RenewLeases(
    worker="w1",
    delivery_ids=("1-0", "2-0"),
    slots=(HeldSlot(limit_key="limit:f", holder="w1/1-0", scope="shared"),),
    now=10.0,
)
RELEASE = ReleaseSlot(limit_key="limit:f", holder="w1/1-0", now=10.0, request=REQUEST)
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

#: one effect of every kind a script carries out
EVERY_KIND: list[StoreEffect] = [
    finish(),
    schedule(),
    acquire(),
    CLAIM,
    RENEW,
    RELEASE,
    CANCEL,
    BURY,
    HEARTBEAT,
]


# -- numbers and packed fields ------------------------------------------------------------


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_numbers_are_exact_decimal_text(value: float) -> None:
    assert float(number(value)) == value
    assert number_bytes(value) == number(value).encode()


@given(st.lists(st.binary(max_size=40), max_size=12))
def test_packed_values_unpack_as_they_were(values: list[bytes]) -> None:
    assert unpack_fields(pack(values)) == values


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
        LAYOUT.stream,
        LAYOUT.due,
        LAYOUT.strikes,
        LAYOUT.cancel_channel,
        LAYOUT.events_channel("k"),
        LAYOUT.run_key("k"),
        LAYOUT.progress_key("k"),
    ]
    assert all(key.startswith("{orders}:") for key in keys)
    assert len(set(keys)) == len(keys)
    assert LAYOUT.namespace(None) == "{orders}"
    assert LAYOUT.namespace("shared") == "{shared}"


# -- effects to calls -------------------------------------------------------------------------


@pytest.mark.parametrize("effect", EVERY_KIND, ids=lambda e: type(e).__name__)
def test_every_call_takes_the_docket_keys_and_only_text_or_bytes(effect: StoreEffect) -> None:
    ((call, covered),) = calls_for(LAYOUT, [effect])
    assert covered == 1
    assert call.keys == (LAYOUT.stream, LAYOUT.due)
    assert call.args[:2] == ("{orders}", GROUP)
    assert all(isinstance(arg, str | bytes) for arg in call.args), call.args


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
    # then its effects' fields, packed into one argument, in order
    (header, packed) = calls[0][0].args[2:]
    assert header == b""
    assert isinstance(packed, bytes) and packed.startswith(b"1:a1:f0:")
    assert b"1:b1:f0:" in packed


@pytest.mark.parametrize(
    "effects",
    [
        [finish(1), finish(2, state=ExecutionState.FAILED, error="boom"), finish(3, result=b"r")],
        [schedule("a"), schedule("b", acknowledge="1-0", expect_generation=4)],
        [acquire(1), acquire(2, scope="shared")],
    ],
    ids=["finish", "schedule", "acquire"],
)
def test_a_batched_call_carries_fixed_fields_an_effect_the_last_its_request_number(
    effects: list[StoreEffect],
) -> None:
    script, fields_of = BATCHED[type(effects[0])]
    ((call, covered),) = calls_for(LAYOUT, effects)
    assert (call.name, covered) == (script, len(effects))
    header, packed = call.args[2:]
    assert header == b""
    assert isinstance(packed, bytes)
    fields = unpack_fields(packed)
    width = 12 if isinstance(effects[0], Schedule) else 10  # a schedule says how a run ended
    assert len(fields) == width * len(effects)
    assert packed == b"".join(fields_of(LAYOUT, effect) for effect in effects)
    assert fields[width - 1 :: width] == [b""] * len(effects)  # no request: nobody resends these


def test_finish_fields_say_whether_a_result_was_kept() -> None:
    kept = unpack_fields(finish_fields(LAYOUT, finish(result=b"")))
    none = unpack_fields(finish_fields(LAYOUT, finish()))
    assert (kept[7], kept[8]) == (b"1", b"")
    assert (none[7], none[8]) == (b"0", b"")


def test_a_batch_remembers_the_request_of_its_first_remembered_effect() -> None:
    first = Request(origin="o-1", worker="w1", seq=8, floor=3, remember=90.0)
    second = Request(origin="o-1", worker="w1", seq=9, floor=3, remember=90.0)
    effects = [finish(1), finish(2, request=first), finish(3, request=second)]
    ((call, covered),) = calls_for(LAYOUT, effects)
    assert covered == 3
    assert call.args[2] == memo_header(first)
    assert unpack_fields(call.args[3])[9::10] == [b"", b"8", b"9"]  # type: ignore[arg-type]


def test_a_claim_lists_its_items_after_its_request() -> None:
    call = call_for(LAYOUT, CLAIM)
    assert call.name == "claim"
    assert call.args[2:] == (
        memo_header(REQUEST),
        "7",
        "w1",
        "10.0",
        *("1-0", "a", "1"),
        *("2-0", "b", "4"),
    )


def test_a_renewal_counts_its_deliveries_then_lists_its_slots() -> None:
    call = call_for(LAYOUT, RENEW)
    assert call.name == "renew"
    worker, now, _ttl, count, *rest = call.args[2:]
    assert (worker, now, count) == ("w1", "10.0", "2")
    assert rest == ["1-0", "2-0", "{shared}", "limit:f", "w1/1-0"]


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
        (RELEASE, 2, SlotReleased(limit_key="limit:f", woken=2)),
        (CANCEL, b"scheduled", Cancelled(key="k", previous=ExecutionState.SCHEDULED)),
        (CANCEL, b"", Cancelled(key="k", previous=None)),
        (BURY, 0, Buried(delivery_id="9-0", moved=False)),
        (BURY, 1, Buried(delivery_id="9-0", moved=True)),
        (BURY, 2, Buried(delivery_id="9-0", moved=True, failed_key=True)),
        (HEARTBEAT, b"OK", HeartbeatSent()),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, StoreEffect) else None,
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


@pytest.mark.parametrize(
    ("effects", "replies"),
    [
        ([finish(1), finish(2)], [1]),  # not a list
        ([finish(1), finish(2)], [[1]]),  # one reply short
        ([finish(1), finish(2)], [[1, 1, 1]]),  # one reply too many
        ([finish(1)], [[b"yes"]]),
        ([schedule()], [[[1, 2]]]),  # two of three values
        ([schedule()], [[[1, b"x", b"queued"]]]),
        ([schedule()], [[[1, 2, b"no-such-state"]]]),
        ([acquire()], [[None]]),
        ([CLAIM], [[b"claimed"]]),  # one verdict for two items
        ([CLAIM], [[b"claimed", b"maybe"]]),
        ([RENEW], [None]),
        ([RELEASE], [b"many"]),
        ([CANCEL], [b"gone"]),
        ([BURY], [[1]]),
    ],
    ids=[
        "batch-not-a-list",
        "batch-short",
        "batch-long",
        "finish-not-a-number",
        "schedule-two-values",
        "schedule-bad-generation",
        "schedule-bad-state",
        "acquire-none",
        "claim-short",
        "claim-bad-verdict",
        "renew-none",
        "release-not-a-number",
        "cancel-bad-state",
        "bury-a-list",
    ],
)
def test_a_reply_of_another_shape_is_a_store_error(
    effects: list[StoreEffect], replies: list[Any]
) -> None:
    calls = calls_for(LAYOUT, effects)
    with pytest.raises(StoreError, match=r"answered|unexpected reply"):
        outcomes_for(effects, calls, replies)
