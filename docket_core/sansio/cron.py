"""Cron schedules: the next matching instant after a given time.

``Cron(expression, automatic=True, tz=...)`` is a perpetual task on wall-clock
time.  Its expression is parsed and stepped by ``cronsim`` (standard fields,
and the Vixie keywords below), in its time zone, so daylight saving changes
follow cron's usage: a time the spring change skips runs at the change, a
fixed time the autumn change repeats runs once (a wildcard hour runs in both
passes).

The rules this module owns: the next run is the first matching instant
strictly after both the end of the run and the instant the run was
scheduled for (so one instant is never scheduled twice, even when a clock
behind the store's ends a run "before" its instant), and instants are
compared as epoch seconds (``cronsim`` may step back across an autumn
change; such results are skipped).  ``now`` is always an input.
"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo

import attrs
from cronsim import CronSim, CronSimError

from .errors import UsageError

#: the Vixie cron keywords and the expressions they stand for (as pydocket)
VIXIE_KEYWORDS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: how many of cronsim's results may lie before the instant asked after (an
#: autumn change can yield a few), before the schedule counts as exhausted
_LOOKAHEAD = 64
#: any fixed instant will do to check an expression (its validity does not
#: depend on the date)
_PROBE = datetime(2000, 1, 1, tzinfo=UTC)


@attrs.frozen(slots=True, kw_only=True)
class CronPolicy:
    """A resolved ``Cron``: its expression (keywords expanded), time zone,
    and whether workers schedule it on their own."""

    expression: str
    tz: tzinfo = UTC
    automatic: bool = True


def cron_policy(expression: str, tz: tzinfo = UTC, *, automatic: bool = True) -> CronPolicy:
    """Check ``expression`` and expand a keyword; a bad one (or a ``tz``
    that is not a time zone) is a ``UsageError``."""
    if not isinstance(tz, tzinfo):
        raise UsageError(f"Cron tz must be a time zone (a tzinfo), not {tz!r}")
    text = expression.strip()
    normalized = VIXIE_KEYWORDS.get(text.lower(), text)
    try:
        CronSim(normalized, _PROBE.astimezone(tz))
    except CronSimError as error:
        raise UsageError(f"invalid cron expression {expression!r}: {error}") from None
    return CronPolicy(expression=normalized, tz=tz, automatic=automatic)


def next_instant(policy: CronPolicy, after: float) -> float | None:
    """The first instant matching ``policy`` strictly after ``after`` (epoch
    seconds), or ``None`` when there is none (past the calendar's end)."""
    try:
        start = datetime.fromtimestamp(after, policy.tz)
        instants = CronSim(policy.expression, start)
        for _ in range(_LOOKAHEAD):
            instant = next(instants).timestamp()
            if instant > after:
                return instant
    except (StopIteration, CronSimError, OverflowError, ValueError, OSError):
        return None
    return None


def next_run(policy: CronPolicy, *, ended_at: float, scheduled_for: float) -> float | None:
    """When to run again after a run scheduled for ``scheduled_for`` ended at
    ``ended_at`` (succeeded or failed): the next instant after both."""
    return next_instant(policy, max(ended_at, scheduled_for))
