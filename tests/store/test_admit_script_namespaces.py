"""``admit.lua`` in one namespace a call (issue 14), and its rate-limit check
without a walk (issue 15), on real servers (Redis and Valkey).

- A call for a scope's controls runs in the scope (its declared keys, its
  prefix): it writes only keys of the scope, its memo too, and never looks
  at the docket's delivery.  A control of another namespace is refused
  before any write.
- In the docket's own namespace the sender must still hold the delivery:
  another worker's, or nobody's, answers ``lost``, and so does a resend of
  an admission after its delivery was taken over.
- The rate limit counts its window (``ZCOUNT``, with a margin) and reads the
  ``limit``-th latest start by rank; it decides as the reference algebra to
  the bit, on logs with starts on the edges of the windows, future starts,
  large clocks and tiny windows.
"""

from __future__ import annotations

import math
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
from docket_core.lua.entries import pack
from docket_core.lua.protocol import GROUP, Layout, memo_header
from docket_core.sansio.admission import (
    Admit,
    Admitted,
    CooldownPolicy,
    RateLimitPolicy,
    Verdict,
)
from docket_core.sansio.admission_state import RateLog, address, admitted, ask_of, decide
from docket_core.sansio.effects import Request
from docket_core.sansio.values import TaskMessage

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


def run(client: redis.Redis, layout: Layout, effect: Admit) -> Admitted:
    where = admit_layout(layout, effect)
    reply: Any = client.eval(
        SCRIPT,
        2,
        where.stream,
        where.fence,
        where.prefix,
        GROUP,
        memo_header(effect.request),
        admit_fields(layout, effect),
    )
    return admitted_from_reply(effect, reply[0])


def held(client: redis.Redis, layout: Layout, worker: str = "w") -> str:
    """The id of a new delivery of the docket that ``worker`` holds."""
    try:
        client.xgroup_create(layout.stream, GROUP, id="$", mkstream=True)
    except redis.ResponseError:
        pass  # (the group exists)
    client.xadd(layout.stream, {"k": "x"})
    read: Any = client.xreadgroup(GROUP, worker, {layout.stream: ">"}, count=1)
    return str(read[0][1][0][0].decode())


def admit(
    delivery_id: str,
    controls: tuple[Any, ...],
    seq: int | None = 1,
    now: float = 100.0,
    generation: int = 1,
) -> Admit:
    request = None
    if seq is not None:
        request = Request(origin="o", worker="w", seq=seq, floor=1, remember=600.0)
    return Admit(
        delivery_id=delivery_id,
        message=TaskMessage(key="k", function="f", payload=b"p", when=0.0, generation=generation),
        controls=controls,
        now=now,
        stale_after=30.0,
        ttl=60.0,
        request=request,
    )


def names(client: redis.Redis, pattern: str) -> set[str]:
    return {key.decode() for key in client.keys(pattern)}


# -- one namespace a call -----------------------------------------------------------


def test_a_scopes_call_writes_only_the_scopes_keys(client: redis.Redis) -> None:
    layout, scope = Layout(f"adm-{uuid.uuid4().hex[:8]}"), f"sc-{uuid.uuid4().hex[:8]}"
    delivery_id = held(client, layout)
    before = names(client, f"{layout.prefix}*")
    pending: Any = client.xpending(layout.stream, GROUP)
    cooldown = CooldownPolicy(key="c", window=10.0, scope=scope)
    rate = RateLimitPolicy(key="r", limit=1, per=10.0, scope=scope)
    first = run(client, layout, admit(delivery_id, (cooldown, rate), seq=1))
    assert first.verdict is Verdict.ADMIT
    # the next execution, blocked in the scope: nothing settled there (the
    # core settles it in the docket next)
    second = run(client, layout, admit(delivery_id, (cooldown,), seq=2, now=101.0, generation=2))
    assert second.verdict is Verdict.DROP
    assert names(client, f"{layout.prefix}*") == before
    assert client.xpending(layout.stream, GROUP) == pending
    assert names(client, f"{{{scope}}}*") == {
        f"{{{scope}}}:cooldown:c",
        f"{{{scope}}}:ratelimit:r",
        f"{{{scope}}}:did:o",
    }
    # taken over since: the scope's step does not look (its resend answers the first outcome)
    client.xclaim(layout.stream, GROUP, "taker", 0, [delivery_id])
    again = run(client, layout, admit(delivery_id, (cooldown, rate), seq=1, now=102.0))
    assert again == first


def test_a_control_of_another_namespace_is_refused_before_any_write(client: redis.Redis) -> None:
    layout = Layout(f"adm-{uuid.uuid4().hex[:8]}")
    good = pack([b"cooldown", layout.prefix.encode(), b"ok", b"5", b"", b""])
    stray = pack([b"cooldown", b"{elsewhere}", b"c", b"5", b"", b""])
    head = [b"k", b"1", b"f", b"p", b"1", b"100.0", b"30.0", b"60.0"]
    blob = pack([b"d1", *head, good, b"1", b"1"]) + pack([b"d2", *head, stray, b"1", b"2"])
    request = Request(origin="o", worker="w", seq=1, floor=1, remember=60.0)
    with pytest.raises(redis.ResponseError, match="docket: admit: a control of"):
        client.eval(
            SCRIPT, 2, layout.stream, layout.fence, layout.prefix, GROUP, memo_header(request), blob
        )
    assert names(client, f"{layout.prefix}*") == set() and names(client, "{elsewhere}*") == set()


def test_the_sender_must_hold_the_delivery_in_the_dockets_namespace(client: redis.Redis) -> None:
    layout = Layout(f"adm-{uuid.uuid4().hex[:8]}")
    cooldown = CooldownPolicy(key="c", window=10.0)
    others = held(client, layout, worker="other")
    assert run(client, layout, admit(others, (cooldown,), seq=1)).verdict is Verdict.LOST
    nobodys = "1-1"  # (no such entry: nobody holds it)
    assert run(client, layout, admit(nobodys, (cooldown,), seq=2)).verdict is Verdict.LOST
    # nothing was judged
    assert names(client, f"{layout.prefix}:cooldown:*") == set()
    mine = held(client, layout)
    assert run(client, layout, admit(mine, (cooldown,), seq=3)).verdict is Verdict.ADMIT
    # a resend after the delivery was taken over answers lost
    client.xclaim(layout.stream, GROUP, "taker", 0, [mine])
    assert run(client, layout, admit(mine, (cooldown,), seq=3)).verdict is Verdict.LOST


# -- the rate limit without a walk --------------------------------------------------


def stored_log(client: redis.Redis, key: str) -> RateLog | None:
    entries = client.zrange(key, 0, -1, withscores=True)
    if not entries:
        return None
    return RateLog(entries=tuple(sorted((s, m.decode()) for m, s in entries)))


def check_rate(
    client: redis.Redis, control: RateLimitPolicy, entries: list[tuple[float, str]], effect: Admit
) -> Admitted:
    """Load ``entries`` as the log, admit ``effect`` on the server and in
    the algebra, and check that both answer and store the same."""
    layout = Layout("unused")
    key = f"{{{control.scope}}}:ratelimit:{control.key}"
    client.delete(key)
    if entries:
        client.zadd(key, {member: start for start, member in entries})
    got = run(client, layout, effect)
    states = {address(control): RateLog(entries=tuple(sorted(entries)))} if entries else {}
    ruling, writes = decide(effect.controls, states, ask_of(effect))
    assert got == admitted(effect, ruling), (entries, effect.now)
    assert stored_log(client, key) == writes.get(address(control)), (entries, effect.now)
    return got


@pytest.mark.parametrize(
    ("offsets", "expected"),
    [
        # full, no start after now: the limit-th latest start (97.0) leaves at 102.0
        ([-4.0, -3.0, -2.0, -9.0], (Verdict.RESCHEDULE, 102.0)),
        # one on the window's lower edge leaves it: room
        ([-5.0, -2.0], (Verdict.ADMIT, None)),
        # full through a future start (a faster clock's): the window after now is full
        ([-1.0, 3.0], (Verdict.RESCHEDULE, 104.0)),
        # a future start beyond the window: room
        ([-1.0, 5.0], (Verdict.ADMIT, None)),
    ],
)
def test_the_window_counts_as_before(
    client: redis.Redis, offsets: list[float], expected: tuple[Verdict, float | None]
) -> None:
    control = RateLimitPolicy(key="r", limit=2, per=5.0, scope=f"rl-{uuid.uuid4().hex[:8]}")
    entries = [(100.0 + offset, f"x#{i}") for i, offset in enumerate(offsets)]
    got = check_rate(client, control, entries, admit("d1", (control,), seq=None))
    assert (got.verdict, got.at) == expected


def _nudged(x: float, ulps: int) -> float:
    """``x`` moved by ``ulps`` adjacent doubles (a start a hair off an edge)."""
    for _ in range(abs(ulps)):
        x = math.nextafter(x, math.inf if ulps > 0 else -math.inf)
    return x


@st.composite
def rate_cases(draw: st.DrawFn) -> tuple[RateLimitPolicy, list[tuple[float, str]], float, str]:
    now = draw(st.sampled_from([1000.0, 1.7e9 + 0.123, 3.0]))
    per = draw(st.sampled_from([5.0, 0.1, 1e-7, 2.5, 3600.0]))
    offsets = st.one_of(
        st.floats(-3.0, 2.0, allow_nan=False),
        st.sampled_from([-2.0, -1.0, 0.0, 1.0, -0.5]),  # on the edges
    )
    starts = draw(st.lists(st.tuples(offsets, st.integers(-2, 2)), max_size=10))
    entries = [(_nudged(now + o * per, ulps), f"x#{i}") for i, (o, ulps) in enumerate(starts)]
    execution = draw(st.sampled_from(["k#1", *(m for _, m in entries)]))
    control = RateLimitPolicy(
        key="r", limit=draw(st.integers(1, 4)), per=per, drop=draw(st.booleans()), scope="rl-diff"
    )
    return control, entries, now, execution


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=rate_cases())
def test_the_script_counts_windows_as_the_algebra(
    client: redis.Redis, case: tuple[RateLimitPolicy, list[tuple[float, str]], float, str]
) -> None:
    control, entries, now, execution = case
    key, generation = execution.split("#")
    effect = Admit(
        delivery_id="d1",
        message=TaskMessage(
            key=key, function="f", payload=b"p", when=0.0, generation=int(generation)
        ),
        controls=(control,),
        now=now,
        stale_after=30.0,
        ttl=60.0,
    )
    check_rate(client, control, entries, effect)
