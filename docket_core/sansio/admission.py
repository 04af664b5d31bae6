"""Admission controls: whether a claimed delivery may start now.

``Debounce`` (trailing edge), ``Cooldown`` (leading edge) and ``RateLimit``
(sliding window) reduce to the policy values below.  A delivery whose task
declares any of them is judged after its ``Claim`` and before its
concurrency slot, by one ``Admit`` effect that covers all of its controls:
the store evaluates them in ``gate_order`` against what it keeps per control
(``admission_state``, the algebra the memory store runs and ``admit.lua``
repeats), in one atomic step, and answers ``Admitted``:

- ``ADMIT``: the delivery goes on (to its slot, or it starts);
- ``DROP``: it never runs; the same step recorded it cancelled;
- ``RESCHEDULE``: it runs later; the same step scheduled its message again
  at ``at`` (a new generation, same key);
- ``LOST``: another worker holds the delivery now: nothing was judged.

The first control (in ``gate_order``) that blocks decides; the controls after
it are not consulted.  Admission belongs to an execution (key and
generation), not to a request: asking again for an execution that was
admitted (a resend, a redelivery after a crash) is admitted again without
counting a second start (``Admitted.repeat``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, ClassVar

import attrs

from .effects import Finish, Request, RuntimeEffect, Schedule, StoreEffect
from .inputs import Outcome
from .values import ExecutionState, ScheduleMode, TaskMessage


class ControlKind(enum.Enum):
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


def execution_id(key: str, generation: int) -> str:
    """The identity admission is granted to: one execution of ``key`` (a
    rescheduled message is a new generation, hence a new execution)."""
    return f"{key}#{generation}"


class Verdict(enum.Enum):
    """What the gate decided about one delivery."""

    ADMIT = "admit"
    RESCHEDULE = "reschedule"
    DROP = "drop"
    #: another worker holds the delivery now: nothing was judged or written
    LOST = "lost"


# -- the effect and its outcome ----------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class Admit(StoreEffect):
    """Judge one claimed delivery against its admission ``controls`` (in
    ``gate_order``), record what the decision changes, and settle a blocked
    delivery, all in one atomic step.

    Contract: if another worker holds the delivery now, change nothing and
    answer ``LOST``.  Otherwise apply ``admission_state.decide`` to the
    stored state of each control consulted, at ``now``, and write the states
    it returns.  Then, as the ruling says: ``ADMIT`` leaves the delivery to
    the worker; ``DROP`` and ``RESCHEDULE`` carry out ``settlement`` (record
    the key cancelled, or schedule its message again at ``at``; either
    acknowledges the delivery), so that no crash can leave a judged delivery
    to be handed out and judged again.  A resend answers the first outcome,
    except that a first ``ADMIT`` becomes ``LOST`` when another worker holds
    the delivery by then."""

    delivery_id: str
    message: TaskMessage
    controls: tuple[Control, ...]
    now: float
    #: how long a debounce winner may overstay its return before a later
    #: submission takes its place (the redelivery timeout: it was lost)
    stale_after: float
    #: how long the record of a dropped delivery is kept (``execution_ttl``)
    ttl: float
    #: identity for resends (see ``effects``)
    request: Request | None = attrs.field(default=None, eq=False)


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


def settlement(effect: Admit, outcome: Admitted) -> Schedule | Finish:
    """What the store does, in the ``Admit`` step itself, with a delivery the
    gate did not admit; either acknowledges it.  ``RESCHEDULE``: schedule its
    message again at ``outcome.at``, replacing it unless a newer generation
    of the key exists by then (the same attempt, a new generation; a key
    cancelled while it waited concludes cancelled instead).
    ``DROP``: record it cancelled, as pydocket does (unless superseded)."""
    message = effect.message
    if outcome.verdict is Verdict.RESCHEDULE:
        assert outcome.at is not None
        return Schedule(
            message=attrs.evolve(message, when=outcome.at),
            mode=ScheduleMode.REPLACE,
            now=effect.now,
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
        now=effect.now,
        ttl=effect.ttl,
    )


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
