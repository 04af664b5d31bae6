"""Admission controls across namespaces, and the rate limit's quick check,
proven by properties.

A delivery whose controls live in several namespaces (the docket's own and
scopes) is judged one namespace after another (``admission_groups``), each
group in a step of its own that records its own ruling, until one does not
admit (``admission_state.decide_in_groups``, what the worker's ``Admit``
steps do together).  The bound, against one atomic judgement of every
control (``decide`` over all of them at once, from the same states):

- never looser: the groups admit an execution exactly when the atomic
  judgement does (and then they write the same states); and a later, fresh
  execution that the states the groups left admit, the states the atomic
  judgement left admit too;
- it may be stricter: an earlier group may count a start for an execution a
  later group blocks (the example below).

The rate limit's check bisects its log and admits without walking it while
fewer than ``limit`` starts lie within ``per``: it must decide as the walk
over the window that it replaced (kept here as the oracle), to the bit.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from docket_core.sansio import admission_state
from docket_core.sansio.admission import (
    Control,
    CooldownPolicy,
    DebouncePolicy,
    RateLimitPolicy,
    Verdict,
    admission_groups,
    gate_order,
)
from docket_core.sansio.admission_state import (
    Address,
    Ask,
    RateLog,
    Ruling,
    State,
    decide,
    decide_in_groups,
)

SCOPES = (None, "s1", "s2")


def _controls_in(scope: str | None) -> list[Control]:
    return [
        DebouncePolicy(key="d", settle=3.0, scope=scope),
        DebouncePolicy(key="d2", settle=1.5, scope=scope),
        CooldownPolicy(key="c", window=4.0, scope=scope),
        RateLimitPolicy(key="r", limit=2, per=5.0, scope=scope),
        RateLimitPolicy(key="rd", limit=1, per=2.0, drop=True, scope=scope),
    ]


ALL = [control for scope in SCOPES for control in _controls_in(scope)]
controls_sets = st.lists(st.sampled_from(ALL), min_size=1, max_size=5, unique=True)
asks = st.tuples(
    st.sampled_from(["a", "b", "c"]),  # task key
    st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0, 3.5, 6.0]),  # clock step
    st.sampled_from([2.0, 30.0]),  # stale_after
)


def _apply(states: dict[Address, State], writes: dict[Address, State | None]) -> None:
    for where, state in writes.items():
        if state is None:
            states.pop(where, None)
        else:
            states[where] = state


def _history(
    controls: list[Control], steps: list[tuple[str, float, float]], start: float
) -> tuple[dict[Address, State], float, int]:
    """The states a run of earlier admissions left (each judged in groups,
    as the stores judge them), the time and the generation reached."""
    states: dict[Address, State] = {}
    now, generation = start, 0
    for key, step, stale in steps:
        now += step
        generation += 1
        ask = Ask(key=key, execution=f"{key}#{generation}", now=now, stale_after=stale)
        _ruling, writes = decide_in_groups(controls, states, ask)
        _apply(states, writes)
    return states, now, generation


def _after(
    states: dict[Address, State], writes: dict[Address, State | None]
) -> dict[Address, State]:
    result = dict(states)
    _apply(result, writes)
    return result


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    controls=controls_sets,
    history=st.lists(asks, max_size=12),
    judged=asks,
    follow_ups=st.lists(asks, min_size=1, max_size=3),
)
def test_groups_are_never_looser_than_one_atomic_judgement(
    controls: list[Control],
    history: list[tuple[str, float, float]],
    judged: tuple[str, float, float],
    follow_ups: list[tuple[str, float, float]],
) -> None:
    states, now, generation = _history(controls, history, 1000.0)
    key, step, stale = judged
    ask = Ask(key=key, execution=f"{key}#{generation + 1}", now=now + step, stale_after=stale)
    atomic, atomic_writes = decide(gate_order(controls), states, ask)
    grouped, grouped_writes = decide_in_groups(controls, states, ask)
    # the same execution: admitted by the groups exactly when atomically
    assert (grouped.verdict is Verdict.ADMIT) == (atomic.verdict is Verdict.ADMIT)
    if atomic.verdict is Verdict.ADMIT:
        assert grouped == atomic
        assert _after(states, grouped_writes) == _after(states, atomic_writes)
    # a later fresh execution: the groups' states admit it only if the atomic ones do
    after_groups = _after(states, grouped_writes)
    after_atomic = _after(states, atomic_writes)
    at = ask.now
    for offset, (later_key, later_step, later_stale) in enumerate(follow_ups, start=2):
        at += abs(later_step)
        fresh = Ask(
            key=later_key,
            execution=f"{later_key}#{generation + offset}",
            now=at,
            stale_after=later_stale,
        )
        by_groups, _ = decide(gate_order(controls), after_groups, fresh)
        by_atomic, _ = decide(gate_order(controls), after_atomic, fresh)
        if by_groups.verdict is Verdict.ADMIT:
            assert by_atomic.verdict is Verdict.ADMIT, (fresh, by_groups, by_atomic)


def test_an_earlier_group_may_count_a_start_a_later_group_blocks() -> None:
    """The bound is not an equality: the scope's cooldown admits (and
    counts) the execution that the docket's rate limit then reschedules, so
    its next generation is dropped where one atomic judgement would run it."""
    cooldown = CooldownPolicy(key="c", window=10.0, scope="s1")
    rate = RateLimitPolicy(key="r", limit=1, per=5.0)  # the docket's own, and full
    controls: list[Control] = [rate, cooldown]
    assert admission_groups(controls) == ((cooldown,), (rate,))
    states: dict[Address, State] = {
        (rate.scope, rate.kind, rate.key): RateLog(entries=((99.0, "other#1"),)),
    }
    ask = Ask(key="k", execution="k#1", now=100.0, stale_after=30.0)
    grouped, grouped_writes = decide_in_groups(controls, states, ask)
    atomic, atomic_writes = decide(gate_order(controls), states, ask)
    assert grouped.verdict is atomic.verdict is Verdict.RESCHEDULE
    assert grouped.at == atomic.at == 104.0
    # the groups counted the cooldown's start; the atomic judgement did not
    assert (cooldown.scope, cooldown.kind, cooldown.key) in grouped_writes
    assert _after(states, atomic_writes).get((cooldown.scope, cooldown.kind, cooldown.key)) is None
    again = Ask(key="k", execution="k#2", now=104.0, stale_after=30.0)
    by_groups, _ = decide(gate_order(controls), _after(states, grouped_writes), again)
    by_atomic, _ = decide(gate_order(controls), _after(states, atomic_writes), again)
    assert by_groups.verdict is Verdict.DROP and by_atomic.verdict is Verdict.ADMIT


def test_groups_run_in_gate_order_and_stop_at_the_first_block() -> None:
    own = CooldownPolicy(key="c", window=10.0)
    scoped = DebouncePolicy(key="d", settle=1.0, scope="s1")
    rate = RateLimitPolicy(key="r", limit=1, per=5.0)
    groups = admission_groups([own, rate, scoped])
    assert groups == ((scoped,), (own, rate))
    # the scope's debounce reschedules a newcomer: the docket's controls are
    # not consulted (nothing written for them)
    ask = Ask(key="k", execution="k#1", now=100.0, stale_after=30.0)
    ruling, writes = decide_in_groups([own, rate, scoped], {}, ask)
    assert ruling == Ruling(verdict=Verdict.RESCHEDULE, at=101.0, blocker=0)
    assert set(writes) == {(scoped.scope, scoped.kind, scoped.key)}


# -- the rate limit's quick check against the walk it replaced --------------------------


def _walked(p: RateLimitPolicy, log: RateLog | None, ask: Ask) -> tuple[Any, ...]:
    """The former check (the oracle): trim by a scan, look for the execution
    by a scan, and walk the window."""
    now, per = ask.now, p.per
    kept = () if log is None else tuple(e for e in log.entries if e[0] + 2 * per > now)
    if any(member == ask.execution for _, member in kept):
        return (Verdict.ADMIT, None, True, kept)
    window = [s for s, _ in kept if s + per > now and s < now + per]
    if admission_state._fits(window, now, per, p.limit):
        return (Verdict.ADMIT, None, False, kept)
    at = window[-p.limit] + per
    return (Verdict.DROP if p.drop else Verdict.RESCHEDULE, None if p.drop else at, False, kept)


def _nudged(x: float, ulps: int) -> float:
    """``x`` moved by ``ulps`` adjacent doubles (a start a hair off an edge)."""
    for _ in range(abs(ulps)):
        x = math.nextafter(x, math.inf if ulps > 0 else -math.inf)
    return x


@st.composite
def rate_cases(draw: st.DrawFn) -> tuple[RateLimitPolicy, RateLog | None, Ask]:
    now = draw(st.sampled_from([1000.0, 1.7e9 + 0.123, 3.0]))
    per = draw(st.sampled_from([5.0, 0.1, 1e-7, 2.5, 3600.0]))
    limit = draw(st.integers(1, 4))
    offsets = st.one_of(
        st.floats(-3.0, 2.0, allow_nan=False),  # around the windows, future starts too
        st.sampled_from([-2.0, -1.0, 0.0, 1.0, -0.5]),  # on the edges
    )
    starts = draw(st.lists(st.tuples(offsets, st.integers(-2, 2)), max_size=12))
    entries = tuple(
        sorted((_nudged(now + o * per, ulps), f"x#{i}") for i, (o, ulps) in enumerate(starts))
    )
    execution = draw(st.sampled_from(["new#1", *(e[1] for e in entries)]))
    p = RateLimitPolicy(key="r", limit=limit, per=per, drop=draw(st.booleans()))
    log = RateLog(entries=entries) if entries else None
    return p, log, Ask(key="k", execution=execution, now=now, stale_after=30.0)


@settings(max_examples=3000, deadline=None)
@given(case=rate_cases())
def test_the_quick_rate_check_decides_as_the_walk(
    case: tuple[RateLimitPolicy, RateLog | None, Ask],
) -> None:
    p, log, ask = case
    judgement = admission_state._judge_rate(p, log, ask)
    kept = () if judgement.state is None else judgement.state.entries  # type: ignore[union-attr]
    assert (judgement.verdict, judgement.at, judgement.repeat, kept) == _walked(p, log, ask)
    if judgement.state is not None:
        state = judgement.state
        assert isinstance(state, RateLog)
        assert dict(state.starts) == {m: s for s, m in state.entries}
    ruling = Ruling(verdict=judgement.verdict)
    settled = admission_state._settle_rate(p, judgement, ruling, ask)
    if judgement.verdict is Verdict.ADMIT and not judgement.repeat:
        assert settled is not None
        assert settled.entries == tuple(sorted((*kept, (ask.now, ask.execution))))
        assert dict(settled.starts) == {m: s for s, m in settled.entries}
    else:
        assert settled == judgement.state


def test_a_log_far_above_the_limit_is_not_walked() -> None:
    """While fewer than ``limit`` starts lie within ``per`` of now, the check
    admits without consulting the window walk at all."""
    p = RateLimitPolicy(key="r", limit=3, per=1.0)
    # 2000 starts kept (within 2 * per) but outside every window of now
    entries = tuple((998.0005 + i * 0.0004, f"old#{i}") for i in range(2000))
    entries += ((999.5, "near#1"), (999.9, "near#2"))
    log = RateLog(entries=entries)
    walked: list[int] = []
    original = admission_state._fits

    def counting(window: list[float], now: float, per: float, limit: int) -> bool:
        walked.append(len(window))
        return original(window, now, per, limit)

    admission_state._fits = counting  # type: ignore[assignment]
    try:
        ask = Ask(key="k", execution="k#1", now=1000.0, stale_after=30.0)
        judgement = admission_state._judge_rate(p, log, ask)
        assert judgement.verdict is Verdict.ADMIT and walked == []
        full = attrs.evolve(p, limit=2)
        judgement = admission_state._judge_rate(full, log, ask)
        assert judgement.verdict is Verdict.RESCHEDULE and judgement.at == 1000.5
        assert walked == [2]
    finally:
        admission_state._fits = original
