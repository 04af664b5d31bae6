"""Admission controls: whether a claimed delivery may start now.

``Debounce`` (trailing edge), ``Cooldown`` (leading edge) and ``RateLimit``
(sliding window) reduce to the policy values below.  A delivery whose task
declares any of them is judged after its ``Claim`` and before its
concurrency slot, by one ``Admit`` effect per namespace its controls live in
(``admission_groups``: the docket's own, or a scope's; on a cluster each is
one hash slot, and a step may touch one only).  The store evaluates a
group's controls in ``gate_order`` against what it keeps per control
(``admission_state``, the algebra the memory store runs and ``admit.lua``
repeats), in one atomic step, and answers ``Admitted``:

- ``ADMIT``: the delivery goes on (to the next group, its slot, or it starts);
- ``DROP``: it never runs: it is recorded cancelled;
- ``RESCHEDULE``: it runs later: its message is scheduled again at ``at``
  (a new generation, same key);
- ``LOST``: another worker holds the delivery now: nothing was judged.

In the docket's own namespace the same step settles a blocked delivery (and
checks first that the sender still holds it); in a scope's, the step only
judges, and the core settles the delivery in the docket next
(``settle_apart``).  The first control (in ``gate_order``) of a group that
blocks decides, and the controls after it are not consulted.  The groups run
one after another (``next_admit``) and stop at the first that does not admit;
each records its own ruling, so a set of controls spanning namespaces is
stricter than one atomic judgement, never looser: an earlier group may count
a start for an execution that a later group blocks.  Admission belongs to an
execution (key and generation), not to a request: asking again for an
execution that was admitted (a resend, a redelivery after a crash) is
admitted again without counting a second start (``Admitted.repeat``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, ClassVar

import attrs

from .effects import Finish, Request, RuntimeEffect, Schedule, StoreEffect
from .inputs import Outcome
from .values import ExecutionState, ScheduleMode, Symbol, TaskMessage


class ControlKind(Symbol):
    """The kinds of admission control; also their order at the gate."""

    DEBOUNCE = "debounce"
    COOLDOWN = "cooldown"
    RATE_LIMIT = "ratelimit"


#: what a worker counts when a control of each kind blocks a delivery
BLOCKED_COUNTS = {
    ControlKind.DEBOUNCE: "debounced",
    ControlKind.COOLDOWN: "cooled_down",
    ControlKind.RATE_LIMIT: "rate_limited",
}
#: what a worker counts, besides, when a blocked delivery is rescheduled
RESCHEDULED_COUNT = "rescheduled"


def _finite(
    minimum: float, *, strict: bool = False
) -> Callable[[Any, attrs.Attribute[float], float], None]:
    """An attrs validator: a finite number, at least (or above) ``minimum``."""

    def check(instance: Any, attribute: attrs.Attribute[float], value: float) -> None:
        low = value <= minimum if strict else value < minimum
        if not math.isfinite(value) or low:
            relation = "above" if strict else "at least"
            raise ValueError(f"{attribute.name} must be a finite number {relation} {minimum}")

    return check


@attrs.frozen(slots=True, kw_only=True)
class DebouncePolicy:
    """A resolved ``Debounce``: after the last submission of ``key``, wait for
    ``settle`` seconds of quiet, then run once."""

    kind: ClassVar[ControlKind] = ControlKind.DEBOUNCE
    key: str
    settle: float = attrs.field(validator=_finite(0.0))
    #: where the control's state lives (as ``ConcurrencyPolicy.scope``)
    scope: str | None = None


@attrs.frozen(slots=True, kw_only=True)
class CooldownPolicy:
    """A resolved ``Cooldown``: the first submission of ``key`` runs; the
    others within ``window`` seconds of its start are dropped."""

    kind: ClassVar[ControlKind] = ControlKind.COOLDOWN
    key: str
    window: float = attrs.field(validator=_finite(0.0))
    scope: str | None = None


@attrs.frozen(slots=True, kw_only=True)
class RateLimitPolicy:
    """A resolved ``RateLimit``: at most ``limit`` starts of ``key`` in any
    window of ``per`` seconds; the excess waits for a free place in the
    window, or is dropped with ``drop``."""

    kind: ClassVar[ControlKind] = ControlKind.RATE_LIMIT
    key: str
    limit: int = attrs.field(validator=attrs.validators.ge(1))
    per: float = attrs.field(validator=_finite(0.0, strict=True))
    drop: bool = False
    scope: str | None = None


Control = DebouncePolicy | CooldownPolicy | RateLimitPolicy

_GATE_RANK = {kind: rank for rank, kind in enumerate(ControlKind)}


def gate_order(controls: Iterable[Control]) -> tuple[Control, ...]:
    """``controls`` in the order the gate consults them: debounces first (they
    coalesce submissions), then cooldowns (a drop beats a reschedule), then
    rate limits; declaration order within a kind.  Duplicates are dropped."""
    unique = tuple(dict.fromkeys(controls))
    return tuple(sorted(unique, key=lambda control: _GATE_RANK[control.kind]))


def admission_groups(controls: Iterable[Control]) -> tuple[tuple[Control, ...], ...]:
    """``controls`` (in gate order) in one group per namespace (``scope``;
    ``None``: the docket's own), one ``Admit`` each: the groups in the gate
    order of their first control, gate order within each."""
    groups: dict[str | None, list[Control]] = {}
    for control in gate_order(controls):
        groups.setdefault(control.scope, []).append(control)
    return tuple(tuple(group) for group in groups.values())


def execution_id(key: str, generation: int) -> str:
    """The identity admission is granted to: one execution of ``key`` (a
    rescheduled message is a new generation, hence a new execution)."""
    return f"{key}#{generation}"


class Verdict(Symbol):
    """What the gate decided about one delivery."""

    ADMIT = "admit"
    RESCHEDULE = "reschedule"
    DROP = "drop"
    #: another worker holds the delivery now: nothing was judged or written
    LOST = "lost"


# -- the effect and its outcome ----------------------------------------------------


def _one_namespace(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """An attrs validator: controls that all live in one namespace."""
    if len({control.scope for control in value}) > 1:
        raise ValueError("an Admit judges the controls of one namespace (admission_groups)")


@attrs.frozen(slots=True, kw_only=True)
class Admit(StoreEffect):
    """Judge one claimed delivery against its admission ``controls`` of one
    namespace (in ``gate_order``) and record what the decision changes, in
    one atomic step in that namespace; in the docket's own (``settles``),
    also settle a blocked delivery in the same step.

    Contract, in the docket's own namespace: if the sender does not hold the
    delivery now (another worker does, or nobody), change nothing and answer
    ``LOST``.  Otherwise apply ``admission_state.decide`` to the stored state
    of each control consulted, at ``now``, and write the states it returns.
    Then, as the ruling says: ``ADMIT`` leaves the delivery to the worker;
    ``DROP`` and ``RESCHEDULE`` carry out ``settlement`` (record the key
    cancelled, or schedule its message again at ``at``; either acknowledges
    the delivery), so that no crash can leave a judged delivery to be handed
    out and judged again.  A resend answers the first outcome, except that a
    first ``ADMIT`` becomes ``LOST`` when the sender no longer holds the
    delivery.  In a scope's namespace: the same judgement, unchecked (the
    states are keyed by execution, so a delivery taken over meanwhile is
    judged as the same execution; the core's next step, in the docket,
    checks), with nothing settled; a resend answers the first outcome."""

    delivery_id: str
    message: TaskMessage
    controls: tuple[Control, ...] = attrs.field(validator=_one_namespace)
    now: float
    #: how long a debounce winner may overstay its return before a later
    #: submission takes its place (the redelivery timeout: it was lost)
    stale_after: float
    #: how long the record of a dropped delivery is kept (``execution_ttl``)
    ttl: float
    #: identity for resends (see ``effects``)
    request: Request | None = attrs.field(default=None, eq=False)

    @property
    def scope(self) -> str | None:
        """The namespace of the controls (``None``: the docket's own)."""
        return self.controls[0].scope if self.controls else None

    @property
    def settles(self) -> bool:
        """Whether the step runs in the docket's own namespace: it checks the
        delivery, and settles it there if it blocks it."""
        return self.scope is None


@attrs.frozen(slots=True, kw_only=True)
class Admitted(Outcome):
    """Outcome of ``Admit``: the verdict; for ``RESCHEDULE`` the time to run
    at; for ``RESCHEDULE`` and ``DROP`` the control that decided; for
    ``ADMIT`` whether the execution had been admitted before (a repeat
    counts no second start)."""

    delivery_id: str
    verdict: Verdict
    at: float | None = None
    blocked_by: Control | None = None
    repeat: bool = False


@attrs.frozen(slots=True, kw_only=True)
class Blocked(RuntimeEffect):
    """Tell the runtime that an admission control blocked a delivery (the
    store dropped or rescheduled it already): it logs it (``blocked_message``)."""

    delivery_id: str
    key: str
    outcome: Admitted


# -- what follows a verdict ----------------------------------------------------------


def settlement(effect: Admit, outcome: Admitted, now: float | None = None) -> Schedule | Finish:
    """What the store does with a delivery the gate did not admit (in the
    ``Admit`` step itself in the docket's own namespace, as a step of its own
    after one in a scope's), at ``now`` (default: the admission's); either
    acknowledges it.  ``RESCHEDULE``: schedule its message again at
    ``outcome.at``, replacing it unless a newer generation of the key exists
    by then (the same attempt, a new generation; a key cancelled while it
    waited concludes cancelled instead).  ``DROP``: record it cancelled, as
    pydocket does (unless superseded)."""
    message = effect.message
    at_now = effect.now if now is None else now
    if outcome.verdict is Verdict.RESCHEDULE:
        assert outcome.at is not None
        return Schedule(
            message=attrs.evolve(message, when=outcome.at),
            mode=ScheduleMode.REPLACE,
            now=at_now,
            acknowledge=effect.delivery_id,
            expect_generation=message.generation,
        )
    if outcome.verdict is not Verdict.DROP:
        raise ValueError(f"a {outcome.verdict.value} verdict blocks nothing")
    return Finish(
        delivery_id=effect.delivery_id,
        key=message.key,
        generation=message.generation,
        state=ExecutionState.CANCELLED,
        now=at_now,
        ttl=effect.ttl,
    )


def next_admit(
    effect: Admit, controls: Iterable[Control], now: float, request: Callable[[], Request | None]
) -> Admit | None:
    """After ``effect`` admitted its delivery: the ``Admit`` of the next group
    of the task's ``controls`` (``admission_groups``), at ``now``, with a
    ``request()``; ``None`` when ``effect`` judged the last group."""
    groups = admission_groups(controls)
    for index, group in enumerate(groups[:-1]):
        if group[0].scope == effect.scope:
            following = groups[index + 1]
            return attrs.evolve(effect, controls=following, now=now, request=request())
    return None


def settle_apart(
    effect: Admit, outcome: Admitted, now: float, request: Callable[[], Request | None]
) -> Schedule | Finish | None:
    """After ``effect`` blocked its delivery: the ``settlement`` to carry out
    in the docket at ``now``, with a ``request()``, when ``effect`` ran in a
    scope's namespace; ``None`` when its own step settled it (or it was
    admitted or lost)."""
    if effect.settles or outcome.verdict not in (Verdict.DROP, Verdict.RESCHEDULE):
        return None
    return attrs.evolve(settlement(effect, outcome, now), request=request())


def blocked_counts(outcome: Admitted) -> tuple[str, ...]:
    """The worker counters a blocked delivery adds to: its control's kind
    (``debounced``, ``cooled_down``, ``rate_limited``), and ``rescheduled``
    when it runs later instead of never."""
    if outcome.blocked_by is None or outcome.verdict not in (Verdict.DROP, Verdict.RESCHEDULE):
        return ()
    kind = BLOCKED_COUNTS[outcome.blocked_by.kind]
    if outcome.verdict is Verdict.RESCHEDULE:
        return (kind, RESCHEDULED_COUNT)
    return (kind,)


def _seconds(value: float) -> str:
    return str(timedelta(seconds=value))


def block_reason(control: Control) -> str:
    """Why ``control`` blocked a delivery, worded as pydocket words it
    (``debounce (0:00:05) on <key>``)."""
    if isinstance(control, DebouncePolicy):
        return f"debounce ({_seconds(control.settle)}) on {control.key}"
    if isinstance(control, CooldownPolicy):
        return f"cooldown ({_seconds(control.window)}) on {control.key}"
    return f"rate limit ({control.limit}/{_seconds(control.per)}) on {control.key}"


def blocked_message(key: str, outcome: Admitted) -> str:
    """The log line of a blocked delivery (pydocket logs these at DEBUG)."""
    if outcome.verdict is Verdict.RESCHEDULE:
        line = f"⏳ Task {key} blocked by admission control, rescheduling"
    else:
        line = f"⏭ Task {key} blocked by admission control, dropping"
    if outcome.blocked_by is not None:
        line += f" ({block_reason(outcome.blocked_by)})"
    return line
