"""Cron chains, proven by properties: never one instant twice, never a skip.

A cron task is a chain of runs: the first is scheduled at the first instant
after the worker starts (``next_instant``), each run's end schedules the
next through the core's ``plan_end`` (the next instant after both the run's
end and its own instant).  Hypothesis draws expressions (Vixie keywords
included), time zones with daylight saving changes (Lord Howe's is half an
hour), starts near those changes, run durations and the worker's clock
jumps (a clock behind ends a run "before" its own instant).

The oracle is ``cronsim`` on its own, stepped once from the start: its
instants as epoch seconds, strictly increasing (a repeated wall-clock hour
is not a new instant).  The chain must be a subsequence of it, strictly
increasing, each link the oracle's first instant after the run's end and
instant; and while every run ends (by every clock) before the next instant,
the chain is exactly the oracle's sequence, skipping nothing.

Below, each rule is broken (``>=`` for ``>``, the ``max`` with the
scheduled instant dropped) and the property must catch it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import attrs
import pytest
from cronsim import CronSim
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from docket_core.sansio import cron, decisions
from docket_core.sansio.cron import CronPolicy, cron_policy, next_instant
from docket_core.sansio.effects import Schedule
from docket_core.sansio.inputs import TaskEnded, TaskOutcome
from docket_core.sansio.values import PerpetualPolicy, TaskMessage, TaskPolicy

EXPRESSIONS = (
    "@hourly",
    "@daily",
    "@midnight",
    "@weekly",
    "* * * * *",
    "*/15 * * * *",
    "30 2 * * *",
    "0 1 * * *",
    "15,45 1-3 * * *",
    "0 */2 * * *",
    "59 23 * * 6",
    "0 0 1 * *",
)
ZONES = ("America/New_York", "Europe/London", "Australia/Lord_Howe", "UTC")
#: daylight saving changes (UTC) of those zones, to start chains near
CHANGES = tuple(
    datetime(*moment, tzinfo=UTC).timestamp()
    for moment in (
        (2025, 3, 9, 7),  # New York, spring
        (2025, 11, 2, 6),  # New York, autumn
        (2025, 3, 30, 1),  # London, spring
        (2025, 10, 26, 1),  # London, autumn
        (2025, 4, 5, 15),  # Lord Howe, back half an hour
        (2025, 10, 4, 15, 30),  # Lord Howe, forward half an hour
    )
)
MINUTE, HOUR = 60.0, 3600.0


@attrs.frozen(kw_only=True)
class Run:
    """One link: picked up ``latency`` after its instant, ran ``duration``,
    and the worker's clock was ``skew`` off when it ended."""

    latency: float
    duration: float
    skew: float


def oracle(policy: CronPolicy, start: float, count: int, until: float = 0.0) -> list[float]:
    """cronsim's own instants after ``start``, as strictly increasing epoch
    seconds: at least ``count`` of them, and one past ``until``."""
    instants: list[float] = []
    for moment in CronSim(policy.expression, datetime.fromtimestamp(start, policy.tz)):
        instant = moment.timestamp()
        if instant > start and (not instants or instant > instants[-1]):
            instants.append(instant)
            if len(instants) >= count and instant > until:
                break
    return instants


def chain(policy: CronPolicy, start: float, runs: list[Run]) -> list[tuple[float, float]]:
    """(instant, the end the worker reported) of each run, through the core."""
    task = TaskPolicy(perpetual=PerpetualPolicy(every=0.0, automatic=True, cron=policy))
    first = next_instant(policy, start)
    assert first is not None
    message = TaskMessage(key="cron", function="tick", payload=b"", when=first)
    links: list[tuple[float, float]] = []
    for run in runs:
        started = message.when + run.latency
        reported_end = started + run.duration + run.skew
        links.append((message.when, reported_end))
        effect = decisions.plan_end(
            delivery_id="1-0",
            message=message,
            policy=task,
            ended=TaskEnded(delivery_id="1-0", now=reported_end, outcome=TaskOutcome.SUCCEEDED),
            outcome=TaskOutcome.SUCCEEDED,
            error=None,
            started_at=started + run.skew,
            execution_ttl=60.0,
        )
        assert isinstance(effect, Schedule), effect
        message = effect.message
    links.append((message.when, message.when))
    return links


runs_strategy = st.lists(
    st.builds(
        Run,
        latency=st.one_of(st.just(0.0), st.floats(0.0, 2.0)),
        duration=st.one_of(st.just(0.0), st.floats(0.0, 5.0), st.floats(0.0, 3 * HOUR)),
        skew=st.one_of(st.just(0.0), st.floats(-HOUR, HOUR), st.sampled_from([-MINUTE, -1.0])),
    ),
    min_size=1,
    max_size=12,
)
starts = st.one_of(
    st.builds(lambda c, d: c + d, st.sampled_from(CHANGES), st.floats(-30 * HOUR, 6 * HOUR)),
    st.floats(
        datetime(2024, 1, 1, tzinfo=UTC).timestamp(), datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    ),
)
policies = st.builds(
    lambda e, z: cron_policy(e, ZoneInfo(z)), st.sampled_from(EXPRESSIONS), st.sampled_from(ZONES)
)
quick = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_chain(policy: CronPolicy, start: float, runs: list[Run]) -> None:
    links = chain(policy, start, runs)
    instants = [instant for instant, _ in links]
    until = max(max(instant, end) for instant, end in links)
    expected = oracle(policy, start, 1, until)
    assert instants[0] == expected[0], "the first run is the first instant after the start"
    for (instant, reported_end), following in zip(links, instants[1:], strict=False):
        assert following > instant, f"instant {instant} scheduled again (or earlier): {following}"
        cutoff = max(instant, reported_end)
        wanted = expected[bisect.bisect_right(expected, cutoff)]
        assert following == wanted, (
            f"after the run of {instant} that ended at {reported_end}: "
            f"scheduled {following}, the next instant is {wanted}"
        )
        next_of_instant = expected[bisect.bisect_right(expected, instant)]
        if reported_end < next_of_instant:
            assert following == next_of_instant, f"skipped {next_of_instant}"


@quick
@given(policy=policies, start=starts, runs=runs_strategy)
def test_a_cron_chain_never_repeats_nor_skips_an_instant(
    policy: CronPolicy, start: float, runs: list[Run]
) -> None:
    check_chain(policy, start, runs)


@quick
@given(policy=policies, start=starts, count=st.integers(1, 30))
def test_runs_that_end_in_time_follow_cronsim_exactly(
    policy: CronPolicy, start: float, count: int
) -> None:
    """Quick runs on a true clock: the chain is cronsim's sequence, nothing skipped."""
    runs = [Run(latency=0.0, duration=0.5, skew=0.0)] * count
    instants = [instant for instant, _ in chain(policy, start, runs)]
    assert instants == oracle(policy, start, len(instants))


# -- mutations: each rule, broken, must be caught ------------------------------------------


def _at_or_after(policy: CronPolicy, after: float) -> float | None:
    """The first instant at or after ``after`` (``>=`` for ``>``).  Swapping
    the operator in ``next_instant`` alone changes little, as cronsim itself
    steps strictly past its start: so this one starts cronsim a second early."""
    start = datetime.fromtimestamp(after - 1.0, policy.tz)
    for moment in CronSim(policy.expression, start):
        if moment.timestamp() >= after:
            return moment.timestamp()
    return None


def _instant_on_its_own(original: Callable[..., Any]) -> Callable[..., Any]:
    """An instant at or after the end, dropping ``>``: the scheduled instant
    may come back when a run ends on it."""

    def mutant(policy: CronPolicy, *, ended_at: float, scheduled_for: float) -> float | None:
        return _at_or_after(policy, max(ended_at, scheduled_for))

    return mutant


def _without_max(original: Callable[..., Any]) -> Callable[..., Any]:
    """The next instant after the end alone, ignoring the run's own instant."""

    def mutant(policy: CronPolicy, *, ended_at: float, scheduled_for: float) -> float | None:
        return cron.next_instant(policy, ended_at)

    return mutant


def _after_the_start(original: Callable[..., Any]) -> Callable[..., Any]:
    """The next instant after the run's own instant only (an overrun runs late
    instants back to back instead of skipping to the next one)."""

    def mutant(policy: CronPolicy, *, ended_at: float, scheduled_for: float) -> float | None:
        return cron.next_instant(policy, scheduled_for)

    return mutant


MUTANTS = {"at-or-after": _instant_on_its_own, "no-max": _without_max, "no-end": _after_the_start}


@contextmanager
def mutated(name: str) -> Iterator[None]:
    original = decisions.next_run
    decisions.next_run = MUTANTS[name](original)  # type: ignore[assignment]
    try:
        yield
    finally:
        decisions.next_run = original


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_property_catches_a_broken_rule(mutant: str) -> None:
    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(policy=policies, start=starts, runs=runs_strategy)
    def probe(policy: CronPolicy, start: float, runs: list[Run]) -> None:
        check_chain(policy, start, runs)

    with mutated(mutant), pytest.raises(AssertionError):
        probe()
