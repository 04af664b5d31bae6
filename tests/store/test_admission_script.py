"""Differential test: ``admit.lua`` on a real server decides as the
reference algebra (``docket_core.sansio.admission_state.decide``) does.

Hypothesis draws sequences of admissions (task keys, generations, times that
may go backwards as skewed clocks do, staleness, any subset of a debounce, a
cooldown and two rate limits, one of them scoped and dropping) and resends of
earlier ones at later times.  Each delivery is held by the sender, and its
controls are judged one namespace after another (``admission_groups``), as
the worker sends them, until one does not admit.  Each step goes to the
script (prelude + admit.lua, run with EVAL in its namespace: the script is
not registered yet) and to the algebra with a memo of first outcomes; after
every step the outcomes and the stored state of every control must be equal
to the last bit.  Redis and Valkey both.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from servers import Server

from docket_core.lua.admission import admit_fields, admit_layout, admitted_from_reply
from docket_core.lua.entries import pack, unpack_fields
from docket_core.lua.protocol import GROUP, Layout, memo_header
from docket_core.sansio.admission import (
    Admit,
    Admitted,
    Control,
    ControlKind,
    CooldownPolicy,
    DebouncePolicy,
    RateLimitPolicy,
    Verdict,
    admission_groups,
)
from docket_core.sansio.admission_state import (
    Address,
    CooldownState,
    DebounceState,
    RateLog,
    State,
    address,
    admitted,
    ask_of,
    decide,
)
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import Cancel, Claim, ClaimItem, Request
from docket_core.sansio.values import ExecutionState, ScheduleMode, TaskMessage
from docket_redis import RedisStore

CONTROLS: tuple[Control, ...] = (
    DebouncePolicy(key="d:task", settle=5.0),
    CooldownPolicy(key="c:task", window=7.5),
    RateLimitPolicy(key="r:task", limit=2, per=10.0),
    RateLimitPolicy(key="r:shared", limit=1, per=3.25, drop=True, scope="admission-scope"),
)
_FOLDER = resources.files("docket_core.lua")
SCRIPT = (
    _FOLDER.joinpath("prelude.lua").read_text() + "\n" + _FOLDER.joinpath("admit.lua").read_text()
)


@pytest.fixture(scope="module", params=["redis_server", "valkey_server"])
def client(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    server: Server = request.getfixturevalue(request.param)
    connection = redis.Redis(port=server.port)
    yield connection
    connection.close()


def run_script(client: redis.Redis, layout: Layout, effects: list[Admit]) -> list[Admitted]:
    """Run one call of ``effects`` (of one namespace) where the adapter runs it."""
    request = next((e.request for e in effects if e.request is not None), None)
    blob = b"".join(admit_fields(layout, effect) for effect in effects)
    where = admit_layout(layout, effects[0])
    replies: Any = client.eval(
        SCRIPT, 2, where.stream, where.fence, where.prefix, GROUP, memo_header(request), blob
    )
    return [admitted_from_reply(e, r) for e, r in zip(effects, replies, strict=True)]


def held(client: redis.Redis, layout: Layout, count: int = 1, worker: str = "w") -> list[str]:
    """The ids of ``count`` new deliveries of the docket that ``worker`` holds."""
    try:
        client.xgroup_create(layout.stream, GROUP, id="$", mkstream=True)
    except redis.ResponseError:
        pass  # (the group exists)
    for _ in range(count):
        client.xadd(layout.stream, {"k": "x"})
    read: Any = client.xreadgroup(GROUP, worker, {layout.stream: ">"}, count=count)
    return [entry_id.decode() for entry_id, _ in read[0][1]]


def stored(client: redis.Redis, layout: Layout, control: Control) -> State | None:
    """What the server keeps for ``control``, as the algebra's value."""
    key = f"{layout.namespace(control.scope)}:{control.kind.value}:{control.key}"
    if control.kind is ControlKind.RATE_LIMIT:
        entries = client.zrange(key, 0, -1, withscores=True)
        if not entries:
            return None
        return RateLog(entries=tuple(sorted((s, m.decode()) for m, s in entries)))
    fields = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
    if not fields:
        return None
    if control.kind is ControlKind.COOLDOWN:
        return CooldownState(holder=fields["holder"], until=float(fields["until"]))
    return DebounceState(
        seen=float(fields["seen"]),
        expires=float(fields["expires"]),
        winner=fields.get("winner"),
        due=float(fields["due"]),
        ran=tuple(key.decode() for key in unpack_fields(fields.get("ran", "").encode())),
        displaced=tuple(
            key.decode() for key in unpack_fields(fields.get("displaced", "").encode())
        ),
    )


class Reference:
    """The algebra with the store's memo of first outcomes."""

    def __init__(self) -> None:
        self.states: dict[Address, State] = {}
        self.first: dict[int, Admitted] = {}

    def run(self, effect: Admit) -> Admitted:
        assert effect.request is not None
        seq = effect.request.seq
        if seq in self.first:
            return self.first[seq]
        ruling, writes = decide(effect.controls, self.states, ask_of(effect))
        for where, state in writes.items():
            if state is None:
                self.states.pop(where, None)
            else:
                self.states[where] = state
        outcome = self.first[seq] = admitted(effect, ruling)
        return outcome


step = st.tuples(
    st.sampled_from(["a", "b", "c"]),  # task key
    st.integers(1, 3),  # generation
    st.sampled_from([-2.0, -0.5, 0.0, 0.25, 1.0, 2.5, 3.25, 5.0, 7.5, 10.0, 20.0]),  # clock step
    st.sampled_from([2.0, 30.0]),  # stale_after
    st.lists(st.sampled_from(CONTROLS), min_size=0, max_size=4),
    st.integers(0, 3),  # > 0: resend the n-th latest earlier admission instead
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(steps=st.lists(step, min_size=1, max_size=40))
def test_the_script_decides_as_the_algebra(client: redis.Redis, steps: list[Any]) -> None:
    layout = Layout(f"adm-{uuid.uuid4().hex[:8]}")
    shared = client.keys("{admission-scope}:*")  # the scoped limit outlives an example
    if shared:
        client.delete(*shared)
    reference = Reference()
    sent: list[Admit] = []
    now = 1000.0
    seq = 0
    for number, (key, generation, delta, stale, chosen, resend) in enumerate(steps, start=1):
        now += delta
        fresh = not (resend and len(sent) >= resend)
        if not fresh:
            # a resend carries its first request and the time of its own attempt
            effects = [Admit(**{**_fields(sent[-resend]), "now": now})]
        else:
            (delivery_id,) = held(client, layout)
            effects = []
            for group in admission_groups(chosen) or ((),):
                seq += 1
                request = Request(origin="o", worker="w", seq=seq, floor=1, remember=1e6)
                effects.append(
                    Admit(
                        delivery_id=delivery_id,
                        message=message(key, generation),
                        controls=group,
                        now=now,
                        stale_after=stale,
                        ttl=60.0,
                        request=request,
                    )
                )
        for effect in effects:  # one namespace after another, while admitted
            (got,) = run_script(client, layout, [effect])
            expected = reference.run(effect)
            assert got == expected, (number, effect)
            if fresh:
                sent.append(effect)
            for control in CONTROLS:
                assert stored(client, layout, control) == reference.states.get(address(control)), (
                    number,
                    control,
                )
            if got.verdict is not Verdict.ADMIT:
                break


def _fields(effect: Admit) -> dict[str, Any]:
    return {
        "delivery_id": effect.delivery_id,
        "message": effect.message,
        "controls": effect.controls,
        "now": effect.now,
        "stale_after": effect.stale_after,
        "ttl": effect.ttl,
        "request": effect.request,
    }


def message(key: str, generation: int) -> TaskMessage:
    return TaskMessage(key=key, function="f", payload=b"p", when=0.0, generation=generation)


def test_a_batch_answers_one_reply_per_admission(client: redis.Redis) -> None:
    layout = Layout(f"adm-{uuid.uuid4().hex[:8]}")
    cooldown = CooldownPolicy(key="c", window=10.0)
    ids = held(client, layout, 2)
    effects = [
        Admit(
            delivery_id=ids[i - 1],
            message=message(f"k{i}", 1),
            controls=(cooldown,),
            now=100.0 + i,
            stale_after=30.0,
            ttl=60.0,
            request=Request(origin="o", worker="w", seq=i, floor=1, remember=60.0),
        )
        for i in (1, 2)
    ]
    first, second = run_script(client, layout, effects)
    assert first.verdict is Verdict.ADMIT
    assert second.verdict is Verdict.DROP and second.blocked_by == cooldown


@pytest.mark.parametrize(
    "controls",
    [
        pack([b"debounce", b"{x}", b"k", b"-1", b"", b""]),
        pack([b"ratelimit", b"{x}", b"k", b"1.5", b"10", b"0"]),
        pack([b"ratelimit", b"{x}", b"k", b"2", b"0", b"0"]),
        pack([b"cooldown", b"{x}", b"k", b"nan", b"", b""]),
        pack([b"teleport", b"{x}", b"k", b"1", b"", b""]),
        pack([b"cooldown", b"{x}", b"k"]),
    ],
)
def test_malformed_input_is_refused_before_any_write(client: redis.Redis, controls: bytes) -> None:
    layout = Layout("x")  # (the controls' namespace, "{x}")
    for leftover in client.keys("{x}*"):
        client.delete(leftover)
    good = pack([b"cooldown", b"{x}", b"ok", b"5", b"", b""])
    head = [b"k", b"1", b"f", b"p", b"1", b"100.0", b"30.0", b"60.0"]
    blob = pack([b"d1", *head, good, b"1", b"1"])
    blob += pack([b"d2", *head, controls, b"1", b"2"])
    request = Request(origin="o", worker="w", seq=1, floor=1, remember=60.0)
    with pytest.raises(redis.ResponseError, match="docket"):
        client.eval(
            SCRIPT, 2, layout.stream, layout.fence, layout.prefix, GROUP, memo_header(request), blob
        )
    assert client.keys("{x}*") == []


# -- settling blocked deliveries, with the docket's own scripts around --------------


def test_blocked_deliveries_are_settled_in_the_same_step(client: redis.Redis) -> None:
    port = client.connection_pool.connection_kwargs["port"]
    asyncio.run(_settle_scenario(f"redis://127.0.0.1:{port}/0"))


async def _settle_scenario(url: str) -> None:
    store = RedisStore.from_url(url, name=f"adm-{uuid.uuid4().hex[:8]}")
    await store.open()
    try:
        now = 1000.0
        keys = ("first", "dropped", "rescheduled", "cancelled")
        schedules = [
            plan_add(key=k, function="f", payload=b"p", when=now, mode=ScheduleMode.ADD, now=now)
            for k in keys
        ]
        await store.execute(schedules)
        read = await store.read(worker="w", count=10, now=now, redelivery_timeout=300, block=0)
        deliveries = {d.message.key: d for d in read.deliveries}
        assert sorted(deliveries) == sorted(keys)
        requests = iter(range(1, 100))

        def request() -> Request:
            return Request(origin="o", worker="w", seq=next(requests), floor=1, remember=600.0)

        items = tuple(
            ClaimItem(delivery_id=d.delivery_id, key=k, generation=d.message.generation)
            for k, d in deliveries.items()
        )
        await store.execute([Claim(worker="w", items=items, now=now, request=request())])
        # cancelled while it waits to be admitted: held back, it concludes instead
        await store.execute([Cancel(key="cancelled", now=now, ttl=600.0)])
        cooldown = CooldownPolicy(key="c", window=60.0)
        rate = RateLimitPolicy(key="r", limit=1, per=10.0)

        def admit(key: str, controls: tuple[Control, ...]) -> Admit:
            d = deliveries[key]
            return Admit(
                delivery_id=d.delivery_id,
                message=d.message,
                controls=controls,
                now=now,
                stale_after=30.0,
                ttl=600.0,
                request=request(),
            )

        effects = [
            admit("first", (cooldown, rate)),
            admit("dropped", (cooldown,)),
            admit("rescheduled", (rate,)),
            admit("cancelled", (rate,)),
        ]
        layout = store.layout
        sync = redis.Redis.from_url(url)
        blob = b"".join(admit_fields(layout, e) for e in effects)
        header = memo_header(effects[0].request)
        replies = sync.eval(
            SCRIPT, 2, layout.stream, layout.due, layout.prefix, GROUP, header, blob
        )
        first, dropped, later, held = (
            admitted_from_reply(e, r) for e, r in zip(effects, replies, strict=True)
        )
        assert held.verdict is Verdict.RESCHEDULE
        record = await store.get_record("cancelled")
        assert record is not None and record.state is ExecutionState.CANCELLED
        assert first.verdict is Verdict.ADMIT
        assert dropped.verdict is Verdict.DROP and dropped.blocked_by == cooldown
        assert later.verdict is Verdict.RESCHEDULE and later.at == 1010.0

        record = await store.get_record("dropped")
        assert record is not None and record.state is ExecutionState.CANCELLED
        record = await store.get_record("rescheduled")
        assert record is not None and record.state is ExecutionState.SCHEDULED
        assert record.when == 1010.0
        assert record.generation > deliveries["rescheduled"].message.generation
        # both were acknowledged: only the admitted one is still held; the
        # rescheduled message waits for its time
        assert sync.xpending(layout.stream, GROUP)["pending"] == 1
        assert sync.zrange(layout.due, 0, -1) == [b"rescheduled"]
        read = await store.read(worker="w", count=10, now=1010.0, redelivery_timeout=300, block=0)
        assert [(d.message.key, d.message.generation) for d in read.deliveries] == [
            ("rescheduled", record.generation)
        ]
        assert read.malformed == ()
        sync.close()
    finally:
        await store.close()
