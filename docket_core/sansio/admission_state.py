"""The admission algebra: what the store keeps per control, and the one
atomic step (``decide``) that judges a delivery against it.

The memory store runs ``decide`` as it is; ``admit.lua`` repeats it step for
step on the servers (same comparisons, same arithmetic, so both answer alike
to the last bit).  Times are the ``now`` each admission carries: the workers'
clocks, which may disagree a little.  The rules are written so that they hold
in the frame of the times the store records, whatever order those arrive in.

Per control (addressed by scope, kind and key):

``DebounceState`` (a hash): ``seen``, the latest submission; ``winner``, the
task key of the one submission that waits to run, and ``due``, when it was
told to come back; ``ran``, the executions admitted last (a few).  A submission when
nobody waits becomes the winner and comes back ``settle`` after the latest
submission; any other submission is a loser: it moves ``seen`` and is
dropped.  The winner, back, runs once ``seen + settle`` has passed, else
comes back then.  A winner that overstays ``due`` by ``stale_after`` is
taken for lost (its worker crashed): the next submission takes its place,
and the scope remembers it as ``displaced``, so that if it comes back after
all it is dropped (once: its key may then submit again).  So exactly one
execution runs per quiet period.

``CooldownState`` (a hash): ``holder``, the execution that started, and
``until``, the end of its window.  A submission while the window is open is
dropped; otherwise it starts and opens the window.

``RateLog`` (a sorted set): the start time of each admitted execution.  A
start at ``t`` is admitted only if no window ``(x - per, x]`` that contains
``t`` already holds ``limit`` starts; future starts (a faster clock's)
count too.  Starts are kept ``2 * per``, so a clock up to ``per`` behind
the others still sees every start that shares a window with it.  Blocked, it
may start once the ``limit``-th latest start of its windows leaves them.
The check never walks the log while fewer than ``limit`` starts lie within
``per`` of ``t`` (bisection here, ``ZCOUNT`` on the servers): it admits.

Every state has an end (``expiry``): from then on it counts as absent, and
the store may delete it (the servers also set a TTL past it).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence

import attrs

from .admission import (
    Admit,
    Admitted,
    Control,
    ControlKind,
    CooldownPolicy,
    DebouncePolicy,
    RateLimitPolicy,
    Verdict,
    admission_groups,
    execution_id,
    gate_order,
)

#: how long a debounce scope remembers its winners and its last run after
#: its last activity: a winner (or an admitted run, redelivered after a
#: crash) that comes back later counts as a new submission
DEBOUNCE_MEMORY = 86400.0
#: how many of its runs, and of its winners taken for lost, a debounce
#: scope remembers (the latest)
REMEMBERED = 8


@attrs.frozen(slots=True, kw_only=True)
class DebounceState:
    seen: float
    expires: float
    winner: str | None = None
    due: float = 0.0
    #: the executions admitted last (the latest few)
    ran: tuple[str, ...] = ()
    #: winners taken for lost (a later submission took over): if one comes
    #: back after all, it is dropped
    displaced: tuple[str, ...] = ()


@attrs.frozen(slots=True, kw_only=True)
class CooldownState:
    holder: str
    until: float


def _starts_of(log: RateLog) -> Mapping[str, float]:
    return {execution: start for start, execution in log.entries}


@attrs.frozen(slots=True, kw_only=True)
class RateLog:
    #: (start, execution), sorted
    entries: tuple[tuple[float, str], ...]
    #: execution -> start, of the same entries (derived, read-only: the
    #: repeat check looks one up without a scan; never ``evolve`` only one)
    starts: Mapping[str, float] = attrs.field(
        default=attrs.Factory(_starts_of, takes_self=True), eq=False, repr=False
    )


State = DebounceState | CooldownState | RateLog
#: where a control's state lives: its scope, its kind, its key
Address = tuple[str | None, ControlKind, str]


def address(control: Control) -> Address:
    return (control.scope, control.kind, control.key)


@attrs.frozen(slots=True, kw_only=True)
class Ask:
    """One admission: the submission's task key and execution, and when."""

    key: str
    execution: str
    now: float
    stale_after: float


@attrs.frozen(slots=True, kw_only=True)
class Ruling:
    """The gate's answer: ``blocker`` is the index of the deciding control."""

    verdict: Verdict
    at: float | None = None
    blocker: int | None = None
    repeat: bool = False


@attrs.frozen(slots=True, kw_only=True)
class _Judgement:
    verdict: Verdict
    #: the stored state, expired or trimmed parts gone
    state: State | None
    at: float | None = None
    #: an execution admitted before
    repeat: bool = False
    #: (debounce) a submission that becomes the winner
    newcomer: bool = False
    #: (debounce) a submission dropped while another waits to run
    loser: bool = False


# -- debounce ------------------------------------------------------------------------


def _remember(*times: float) -> float:
    return max(times) + DEBOUNCE_MEMORY


def _judge_debounce(p: DebouncePolicy, st: DebounceState | None, ask: Ask) -> _Judgement:
    now = ask.now
    if st is not None and st.expires <= now:
        st = None
    if st is None:
        return _Judgement(verdict=Verdict.RESCHEDULE, state=None, at=now + p.settle, newcomer=True)
    if ask.execution in st.ran:
        return _Judgement(verdict=Verdict.ADMIT, state=st, repeat=True)
    if st.winner == ask.key:
        ready = st.seen + p.settle
        if now >= ready:
            return _Judgement(verdict=Verdict.ADMIT, state=st)
        return _Judgement(verdict=Verdict.RESCHEDULE, state=st, at=ready)
    if ask.key in st.displaced:
        # a winner taken for lost, back after all: its period is another's now
        return _Judgement(verdict=Verdict.DROP, state=st)
    seen = max(st.seen, now)
    if st.winner is None:
        return _Judgement(verdict=Verdict.RESCHEDULE, state=st, at=seen + p.settle, newcomer=True)
    if now >= st.due + ask.stale_after:
        # the winner overstayed its return: it was lost; this one takes over
        return _Judgement(verdict=Verdict.RESCHEDULE, state=st, at=seen + p.settle, newcomer=True)
    return _Judgement(verdict=Verdict.DROP, state=st, loser=True)


def _settle_debounce(
    p: DebouncePolicy, j: _Judgement, ruling: Ruling, ask: Ask
) -> DebounceState | None:
    st = j.state
    assert st is None or isinstance(st, DebounceState)
    now = ask.now
    if j.repeat:
        return st
    if j.verdict is Verdict.DROP and not j.loser:
        # a lost winner back after all, dropped once: its key is free again
        assert st is not None
        return attrs.evolve(st, displaced=tuple(k for k in st.displaced if k != ask.key))
    if j.verdict is Verdict.DROP:  # a loser: its submission is seen
        assert st is not None
        seen = max(st.seen, now)
        return attrs.evolve(st, seen=seen, expires=_remember(st.due, seen + p.settle, now))
    if j.verdict is Verdict.RESCHEDULE:
        assert j.at is not None
        ran: tuple[str, ...]
        displaced: tuple[str, ...]
        if st is None:
            seen, ran, displaced = now, (), ()
        elif j.newcomer:
            seen, ran, displaced = max(st.seen, now), st.ran, st.displaced
            if st.winner is not None:  # a takeover
                displaced = (*displaced, st.winner)[-REMEMBERED:]
        else:
            seen, ran, displaced = st.seen, st.ran, st.displaced
        return DebounceState(
            seen=seen,
            expires=_remember(j.at, seen + p.settle, now),
            winner=ask.key,
            due=j.at,
            ran=ran,
            displaced=displaced,
        )
    # the winner, settled: the ruling may still be a later control's
    assert st is not None
    if ruling.verdict is Verdict.RESCHEDULE:
        assert ruling.at is not None
        expires = _remember(ruling.at, st.seen + p.settle, now)
        return attrs.evolve(st, due=ruling.at, expires=expires)
    runs = (*st.ran, ask.execution)[-REMEMBERED:] if ruling.verdict is Verdict.ADMIT else st.ran
    expires = _remember(st.seen + p.settle, now)
    return attrs.evolve(st, winner=None, due=0.0, ran=runs, expires=expires)


# -- cooldown ------------------------------------------------------------------------


def _judge_cooldown(p: CooldownPolicy, st: CooldownState | None, ask: Ask) -> _Judgement:
    if st is not None and st.until <= ask.now:
        st = None
    if st is None:
        return _Judgement(verdict=Verdict.ADMIT, state=None)
    if st.holder == ask.execution:
        return _Judgement(verdict=Verdict.ADMIT, state=st, repeat=True)
    return _Judgement(verdict=Verdict.DROP, state=st)


def _settle_cooldown(
    p: CooldownPolicy, j: _Judgement, ruling: Ruling, ask: Ask
) -> CooldownState | None:
    st = j.state
    assert st is None or isinstance(st, CooldownState)
    if j.verdict is Verdict.ADMIT and not j.repeat and ruling.verdict is Verdict.ADMIT:
        until = ask.now + p.window
        return CooldownState(holder=ask.execution, until=until) if until > ask.now else None
    return st


# -- rate limit ----------------------------------------------------------------------


def _fits(window: Sequence[float], now: float, per: float, limit: int) -> bool:
    """Whether a start at ``now`` leaves every window ``(x - per, x]`` that
    contains it with at most ``limit`` starts; ``window`` holds the sorted
    starts in ``(now - per, now + per)``.  The count of such a window only
    rises at ``x = now`` and at the starts after ``now``: those are checked."""
    size = len(window)
    entered = left = 0
    for x in (now, *(s for s in window if s > now)):
        while entered < size and window[entered] <= x:
            entered += 1
        while left < size and window[left] + per <= x:
            left += 1
        if entered - left >= limit:
            return False
    return True


def _kept(log: RateLog | None, now: float, per: float) -> RateLog | None:
    """``log`` without the starts that left it (``start + 2 * per <= now``)."""
    if log is None or not log.entries:
        return None
    entries = log.entries
    # (``start + 2 * per`` never falls as ``start`` rises: the log bisects by it)
    cut = bisect_right(entries, now, key=lambda entry: entry[0] + 2 * per)
    if cut == 0:
        return log
    if cut == len(entries):
        return None
    starts = dict(log.starts)
    for _, execution in entries[:cut]:
        del starts[execution]
    return RateLog(entries=entries[cut:], starts=starts)


def _judge_rate(p: RateLimitPolicy, log: RateLog | None, ask: Ask) -> _Judgement:
    now, per = ask.now, p.per
    st = _kept(log, now, per)
    if st is None:
        return _Judgement(verdict=Verdict.ADMIT, state=None)
    if ask.execution in st.starts:
        return _Judgement(verdict=Verdict.ADMIT, state=st, repeat=True)
    # the window: the starts with ``s + per > now`` and ``s < now + per``
    entries = st.entries
    low = bisect_right(entries, now, key=lambda entry: entry[0] + per)
    high = bisect_left(entries, now + per, key=lambda entry: entry[0])
    if high - low < p.limit:  # no window can be full: no walk
        return _Judgement(verdict=Verdict.ADMIT, state=st)
    window = [s for s, _ in entries[low:high]]
    if _fits(window, now, per, p.limit):
        return _Judgement(verdict=Verdict.ADMIT, state=st)
    at = window[-p.limit] + per
    verdict = Verdict.DROP if p.drop else Verdict.RESCHEDULE
    return _Judgement(verdict=verdict, state=st, at=None if p.drop else at)


def _settle_rate(p: RateLimitPolicy, j: _Judgement, ruling: Ruling, ask: Ask) -> RateLog | None:
    st = j.state
    assert st is None or isinstance(st, RateLog)
    if j.verdict is Verdict.ADMIT and not j.repeat and ruling.verdict is Verdict.ADMIT:
        entry = (ask.now, ask.execution)
        if st is None:
            return RateLog(entries=(entry,), starts={ask.execution: ask.now})
        entries = st.entries
        at = bisect_right(entries, entry)
        # (concatenation: a copy in C; unpacking would iterate the entries)
        placed = entries[:at] + (entry,) + entries[at:]  # noqa: RUF005
        return RateLog(entries=placed, starts={**st.starts, ask.execution: ask.now})
    return st


# -- the step ------------------------------------------------------------------------


def _judge(control: Control, state: State | None, ask: Ask) -> _Judgement:
    if isinstance(control, DebouncePolicy):
        assert state is None or isinstance(state, DebounceState)
        return _judge_debounce(control, state, ask)
    if isinstance(control, CooldownPolicy):
        assert state is None or isinstance(state, CooldownState)
        return _judge_cooldown(control, state, ask)
    assert state is None or isinstance(state, RateLog)
    return _judge_rate(control, state, ask)


def _settle(control: Control, j: _Judgement, ruling: Ruling, ask: Ask) -> State | None:
    if isinstance(control, DebouncePolicy):
        return _settle_debounce(control, j, ruling, ask)
    if isinstance(control, CooldownPolicy):
        return _settle_cooldown(control, j, ruling, ask)
    return _settle_rate(control, j, ruling, ask)


def decide(
    controls: Sequence[Control], states: Mapping[Address, State], ask: Ask
) -> tuple[Ruling, dict[Address, State | None]]:
    """Judge one delivery against ``controls`` (in gate order) and their
    stored ``states``: the ruling, and the state to store for each control
    consulted (``None``: delete it).

    Each control is judged against the state as it was before this step;
    the first one that does not admit decides, and the ones after it are
    not consulted.  Then each control consulted records the ruling: a
    debounce its submission (or its winner's return), a cooldown and a rate
    limit a start, if the delivery starts."""
    judged: list[tuple[Control, _Judgement]] = []
    ruling = Ruling(verdict=Verdict.ADMIT, repeat=True)
    for index, control in enumerate(controls):
        judgement = _judge(control, states.get(address(control)), ask)
        judged.append((control, judgement))
        if judgement.verdict is not Verdict.ADMIT:
            ruling = Ruling(verdict=judgement.verdict, at=judgement.at, blocker=index)
            break
        if not judgement.repeat:
            ruling = Ruling(verdict=Verdict.ADMIT)
    if not judged:
        ruling = Ruling(verdict=Verdict.ADMIT)
    writes: dict[Address, State | None] = {}
    for control, judgement in judged:
        writes[address(control)] = _settle(control, judgement, ruling, ask)
    return ruling, writes


def decide_in_groups(
    controls: Sequence[Control], states: Mapping[Address, State], ask: Ask
) -> tuple[Ruling, dict[Address, State | None]]:
    """What one delivery's ``Admit`` steps decide together: ``decide`` for
    each group of ``controls`` (``admission_groups``) in turn, each against
    the states the groups before it left, until one does not admit (its
    ruling ends the sequence).  ``blocker`` indexes ``gate_order(controls)``;
    ``repeat`` holds when every group admitted a repeat."""
    ordered = gate_order(controls)
    current: dict[Address, State] = dict(states)
    writes: dict[Address, State | None] = {}
    ruling = Ruling(verdict=Verdict.ADMIT)
    repeats = True
    for group in admission_groups(ordered):
        ruling, written = decide(group, current, ask)
        writes.update(written)
        for where, state in written.items():
            if state is None:
                current.pop(where, None)
            else:
                current[where] = state
        if ruling.verdict is not Verdict.ADMIT:
            assert ruling.blocker is not None
            blocker = ordered.index(group[ruling.blocker])
            return attrs.evolve(ruling, blocker=blocker), writes
        repeats = repeats and ruling.repeat
    return Ruling(verdict=Verdict.ADMIT, repeat=repeats and bool(ordered)), writes


def expiry(control: Control, state: State) -> float:
    """When ``state`` stops counting: the store may delete it from then on."""
    if isinstance(state, DebounceState):
        return state.expires
    if isinstance(state, CooldownState):
        return state.until
    assert isinstance(control, RateLimitPolicy)
    return state.entries[-1][0] + 2 * control.per if state.entries else 0.0


def ask_of(effect: Admit) -> Ask:
    """The admission an ``Admit`` effect asks for."""
    message = effect.message
    return Ask(
        key=message.key,
        execution=execution_id(message.key, message.generation),
        now=effect.now,
        stale_after=effect.stale_after,
    )


def admitted(effect: Admit, ruling: Ruling) -> Admitted:
    """The outcome of ``effect`` ruled ``ruling``."""
    blocked_by = None if ruling.blocker is None else effect.controls[ruling.blocker]
    return Admitted(
        delivery_id=effect.delivery_id,
        verdict=ruling.verdict,
        at=ruling.at,
        blocked_by=blocked_by,
        repeat=ruling.repeat and ruling.verdict is Verdict.ADMIT,
    )
