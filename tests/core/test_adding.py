"""One home for "is this add struck": ``Docket.add``/``replace`` and ``Batch``
hand a ``PendingCall`` to the core's ``plan_add`` and do what it says."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from docket_core import Disposition, Docket, ExecutionState, UsageError, _calls
from docket_core import batch as batch_module
from docket_core import docket as docket_module
from docket_core.sansio import decisions
from docket_core.sansio.decisions import PendingCall
from docket_core.sansio.effects import Schedule
from docket_core.sansio.strikes import StrikeList
from docket_core.sansio.values import ScheduleMode

pytestmark = [pytest.mark.anyio, pytest.mark.backends("memory-asyncio", "memory-trio")]


async def invoice(customer: int, region: str = "eu") -> None: ...


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[PendingCall, Schedule | None]]:
    """Every ``plan_add`` the producers make, with what it decided."""
    seen: list[tuple[PendingCall, Schedule | None]] = []

    def spy(call: PendingCall, strikes: StrikeList, *, now: float) -> Schedule | None:
        effect = decisions.plan_add(call, strikes, now=now)
        seen.append((call, effect))
        return effect

    monkeypatch.setattr(docket_module, "plan_add", spy)
    monkeypatch.setattr(batch_module, "plan_add", spy)
    return seen


async def test_add_and_replace_ask_the_core(
    docket: Docket, planned: list[tuple[PendingCall, Schedule | None]]
) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    added = await docket.add(invoice, key="a")(1)
    replaced = await docket.replace(invoice, later, "a")(2, region="us")
    assert [(c.key, c.mode, c.function) for c, _ in planned] == [
        ("a", ScheduleMode.ADD, "invoice"),
        ("a", ScheduleMode.REPLACE, "invoice"),
    ]
    assert planned[1][0].when == later.timestamp()
    assert dict(planned[1][0].arguments) == {"customer": 2, "region": "us"}
    assert added.disposition is replaced.disposition is Disposition.SCHEDULED


async def test_a_batch_asks_the_core_for_each_call(
    docket: Docket, planned: list[tuple[PendingCall, Schedule | None]]
) -> None:
    await docket.strike(invoice, "customer", "==", 13)
    async with docket.batch() as collected:
        struck = collected.add(invoice)(13)
        kept = collected.add(invoice, key="kept")(12)
    assert [call.arguments["customer"] for call, _ in planned] == [13, 12]
    assert [effect is None for _, effect in planned] == [True, False]
    assert struck.disposition is Disposition.STRUCK
    assert struck.state is ExecutionState.CANCELLED
    assert kept.disposition is Disposition.SCHEDULED


async def test_the_core_decides_what_is_struck(
    docket: Docket, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a core that strikes everything: neither producer second-guesses it
    def strike_all(call: PendingCall, strikes: StrikeList, *, now: float) -> Schedule | None:
        return None

    monkeypatch.setattr(docket_module, "plan_add", strike_all)
    monkeypatch.setattr(batch_module, "plan_add", strike_all)
    assert (await docket.add(invoice)(1)).disposition is Disposition.STRUCK
    async with docket.batch() as collected:
        in_batch = collected.add(invoice)(1)
    assert in_batch.disposition is Disposition.STRUCK
    assert (await docket.snapshot()).future == []


async def test_arguments_are_bound_only_when_a_strike_names_a_parameter(
    docket: Docket, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any) -> Any:
        raise AssertionError("the arguments were bound")

    monkeypatch.setattr(_calls, "bind_arguments", refuse)
    await docket.strike("another_task")
    assert (await docket.add(invoice)(1)).disposition is Disposition.SCHEDULED
    async with docket.batch() as collected:
        collected.add(invoice)(2)


async def test_an_unpicklable_argument_fails_at_once(docket: Docket) -> None:
    with pytest.raises(UsageError, match="cannot be pickled"):
        await docket.add(invoice)(threading.Lock())  # type: ignore[arg-type]
