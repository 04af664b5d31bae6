"""Cron schedules (``docket_core.sansio.cron``): expressions and keywords, time
zones and daylight saving changes, and the rule that one instant is never
scheduled twice nor skipped while no run is going."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docket_core.sansio.cron import (
    VIXIE_KEYWORDS,
    CronPolicy,
    cron_policy,
    next_instant,
    next_run,
)
from docket_core.sansio.errors import UsageError

UTC = UTC
NEW_YORK = ZoneInfo("America/New_York")


def at(*fields: int, tz: object = UTC, fold: int = 0) -> float:
    return datetime(*fields, tzinfo=tz, fold=fold).timestamp()  # type: ignore[arg-type, misc]


def local(instant: float, tz: ZoneInfo = NEW_YORK) -> str:
    return datetime.fromtimestamp(instant, tz).isoformat()


def instants(policy: CronPolicy, after: float, until: float) -> list[float]:
    found: list[float] = []
    current = next_instant(policy, after)
    while current is not None and current <= until:
        found.append(current)
        current = next_instant(policy, current)
    return found


# -- expressions ---------------------------------------------------------------------


@pytest.mark.parametrize(("keyword", "expression"), sorted(VIXIE_KEYWORDS.items()))
def test_vixie_keywords_stand_for_their_expressions(keyword: str, expression: str) -> None:
    assert cron_policy(keyword).expression == expression
    assert cron_policy(keyword.upper()).expression == expression


@pytest.mark.parametrize("bad", ["61 * * * *", "* * *", "@reboot", "", "0 0 30 2 *"])
def test_a_bad_expression_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="invalid cron expression"):
        cron_policy(bad)


def test_a_time_zone_must_be_a_tzinfo() -> None:
    with pytest.raises(UsageError, match="time zone"):
        cron_policy("@daily", "America/New_York")  # type: ignore[arg-type]


def test_the_next_instant_is_strictly_after() -> None:
    every_minute = cron_policy("* * * * *")
    assert next_instant(every_minute, at(2024, 1, 1, 10, 0)) == at(2024, 1, 1, 10, 1)
    assert next_instant(every_minute, at(2024, 1, 1, 10, 0) + 0.5) == at(2024, 1, 1, 10, 1)
    weekly = cron_policy("0 9 * * 1")  # Mondays at 9
    assert next_instant(weekly, at(2024, 1, 1, 9, 0)) == at(2024, 1, 8, 9, 0)


def test_there_is_no_instant_past_the_calendar() -> None:
    assert next_instant(cron_policy("@yearly"), at(9999, 6, 1)) is None
    assert next_instant(cron_policy("@hourly"), 1e18) is None


# -- time zones and daylight saving ------------------------------------------------------


def test_a_time_zone_sets_the_wall_clock() -> None:
    policy = cron_policy("0 9 * * 1-5", NEW_YORK)
    assert local(next_instant(policy, at(2024, 7, 5, 14, 0)) or 0) == "2024-07-08T09:00:00-04:00"
    assert local(next_instant(policy, at(2024, 12, 6, 15, 0)) or 0) == "2024-12-09T09:00:00-05:00"


def test_a_time_the_spring_change_skips_runs_at_the_change() -> None:
    policy = cron_policy("30 2 * * *", NEW_YORK)
    runs = instants(policy, at(2024, 3, 9, 12, 0, tz=NEW_YORK), at(2024, 3, 11, 12, 0, tz=NEW_YORK))
    assert [local(r) for r in runs] == ["2024-03-10T03:00:00-04:00", "2024-03-11T02:30:00-04:00"]


def test_a_fixed_time_the_autumn_change_repeats_runs_once() -> None:
    policy = cron_policy("30 1 * * *", NEW_YORK)
    runs = instants(
        policy, at(2024, 11, 2, 12, 0, tz=NEW_YORK), at(2024, 11, 4, 12, 0, tz=NEW_YORK)
    )
    assert [local(r) for r in runs] == ["2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"]
    # asked from inside the repeated hour, it does not step back into the first pass
    inside = at(2024, 11, 3, 1, 10, tz=NEW_YORK, fold=1)
    assert local(next_instant(policy, inside) or 0) == "2024-11-04T01:30:00-05:00"


@pytest.mark.parametrize(("day", "hours"), [((2024, 3, 10), 23), ((2024, 11, 3), 25)])
def test_hourly_runs_follow_the_length_of_the_day(day: tuple[int, int, int], hours: int) -> None:
    policy = cron_policy("@hourly", NEW_YORK)
    start = datetime(*day, tzinfo=NEW_YORK)
    end = datetime.combine(start.date() + timedelta(days=1), start.timetz())
    runs = instants(policy, start.timestamp() - 1, end.timestamp() - 1)
    assert len(runs) == hours
    assert len(set(runs)) == hours and runs == sorted(runs)


# -- one instant once, none skipped ------------------------------------------------------


def test_a_run_that_ends_before_its_instant_is_not_scheduled_for_it_again() -> None:
    policy = cron_policy("*/5 * * * *")
    instant = at(2024, 1, 1, 10, 5)
    # a worker whose clock is behind ends the 10:05 run at 10:04:58 by its clock
    assert next_run(policy, ended_at=instant - 2, scheduled_for=instant) == at(2024, 1, 1, 10, 10)
    # a run that overran skips the instants it covered
    assert next_run(policy, ended_at=instant + 720, scheduled_for=instant) == at(2024, 1, 1, 10, 20)


EXPRESSIONS = [
    "* * * * *",
    "*/7 * * * *",
    "0 * * * *",
    "30 1 * * *",
    "30 2 * * *",
    "15,45 1 * * *",
    "0 0 * * 0",
    "0 12 L * *",
    "0 0 29 2 *",
    "*/20 1-3 * * *",
]
ZONES = [UTC, NEW_YORK, ZoneInfo("Europe/London"), ZoneInfo("Australia/Lord_Howe")]
#: instants around daylight saving changes of the zones above, and a plain day
AROUND = [
    at(2024, 3, 10, 6, 0),
    at(2024, 11, 3, 5, 0),
    at(2024, 3, 31, 0, 30),
    at(2024, 10, 27, 0, 30),
    at(2024, 4, 6, 14, 30),
    at(2024, 10, 5, 15, 30),
    at(2024, 6, 1, 12, 0),
]


@settings(max_examples=400, deadline=None)
@given(
    expression=st.sampled_from(EXPRESSIONS),
    tz=st.sampled_from(ZONES),
    base=st.sampled_from(AROUND),
    offset=st.floats(-3 * 3600, 3 * 3600),
    within=st.floats(0, 1, exclude_max=True),
)
def test_no_instant_is_skipped_or_repeated(
    expression: str, tz: ZoneInfo, base: float, offset: float, within: float
) -> None:
    policy = cron_policy(expression, tz)
    after = base + offset
    first = next_instant(policy, after)
    assert first is not None and first > after
    # asked from anywhere before it, the answer is the same instant: none
    # lies between, and none is handed out twice
    later = after + (first - after) * within
    if later < first:  # (not rounded up to it)
        assert next_instant(policy, later) == first
    assert next_instant(policy, first - 1e-3) == first
    second = next_instant(policy, first)
    assert second is not None and second > first


@settings(max_examples=200, deadline=None)
@given(
    expression=st.sampled_from([*EXPRESSIONS[:3], "*/30 * * * *"]),
    tz=st.sampled_from(ZONES),
    base=st.sampled_from(AROUND),
    durations=st.lists(st.floats(0, 5400), min_size=1, max_size=30),
    skews=st.lists(st.floats(-2, 2), min_size=1, max_size=30),
)
def test_a_chain_of_runs_meets_every_instant_once_unless_a_run_covered_it(
    expression: str, tz: ZoneInfo, base: float, durations: list[float], skews: list[float]
) -> None:
    """Runs of one cron task, each lasting a while and ending by a clock a
    little off: every matching instant is run exactly once, except those that
    came while the previous run was still going."""
    policy = cron_policy(expression, tz)
    scheduled = next_instant(policy, base)
    assert scheduled is not None
    runs: list[float] = []
    busy: list[tuple[float, float]] = []
    for index, duration in enumerate(durations):
        runs.append(scheduled)
        ended = scheduled + duration + skews[index % len(skews)]
        busy.append((scheduled, ended))
        following = next_run(policy, ended_at=ended, scheduled_for=scheduled)
        assert following is not None and following > scheduled
        scheduled = following
    assert len(runs) == len(set(runs))
    for instant in instants(policy, runs[0] - 1e-3, runs[-1]):
        if instant not in runs:
            assert any(start < instant <= end for start, end in busy), local(instant, tz)
