"""``Debounce``, ``Cooldown`` and ``RateLimit`` as declared on tasks
(``docket_core.controls``): the policy values each call of a task gets."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

import pytest

from docket_core._resolution import _plan, validate
from docket_core.controls import Cooldown, Debounce, RateLimit
from docket_core.sansio.admission import CooldownPolicy, DebouncePolicy, RateLimitPolicy
from docket_core.sansio.errors import UsageError


def controls(task: Any, **arguments: Any) -> list[Any]:
    """The admission controls one call of ``task`` gets, in declaration order."""
    found: list[Any] = []
    for dependency in _plan(task).per_call:
        found.extend(dependency._call_policy("task", "docket", arguments).get("admission", ()))
    return found


def test_a_default_controls_the_whole_task() -> None:
    async def task(
        debounce: Debounce = Debounce(timedelta(seconds=5)),
        rate: RateLimit = RateLimit(10, per=timedelta(minutes=1), scope="api"),
    ) -> None: ...

    assert controls(task) == [
        DebouncePolicy(key="docket:debounce:task", settle=5.0),
        RateLimitPolicy(key="api:ratelimit:task", limit=10, per=60.0, scope="api"),
    ]


def test_annotated_metadata_controls_each_argument_value() -> None:
    async def task(
        customer: Annotated[int, Cooldown(timedelta(seconds=30))],
        region: Annotated[str, RateLimit(2, per=timedelta(seconds=1), drop=True)] = "eu",
    ) -> None: ...

    assert controls(task, customer=7, region="us") == [
        CooldownPolicy(key="docket:cooldown:customer:7", window=30.0),
        RateLimitPolicy(key="docket:ratelimit:region:'us'", limit=2, per=1.0, drop=True),
    ]
    with pytest.raises(UsageError, match="no such argument"):
        controls(task, region="us")


def test_declarations_that_cannot_work_are_refused() -> None:
    with pytest.raises(UsageError):
        RateLimit(0, per=timedelta(seconds=1))
    with pytest.raises(UsageError):
        RateLimit(1, per=timedelta(0))
    with pytest.raises(UsageError):
        Cooldown(timedelta(seconds=-1))
    with pytest.raises(UsageError):
        Debounce(5)  # type: ignore[arg-type]

    async def twice(
        a: Annotated[int, Debounce(timedelta(seconds=1))],
        b: Annotated[int, Debounce(timedelta(seconds=1))],
    ) -> None: ...

    with pytest.raises(UsageError, match="Debounce"):
        validate(twice)
