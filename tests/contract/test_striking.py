"""``Docket.strike`` and ``restore`` on every contract backend: by function, by
name, by parameter with every operator, both at once; at add time, when due,
already queued, while the worker runs; and undone.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import anyio
import pytest
from helpers import Now, finish, key, loaded, make_worker, running

from docket_core import Disposition, Docket, ExecutionState, Operator, UsageError, Worker

pytestmark = pytest.mark.anyio


# -- strike ---------------------------------------------------------------------------


async def test_strike_by_function(docket: Docket, worker: Worker) -> None:
    calls: list[str] = []

    async def struck(x: int) -> None:
        calls.append("struck")

    async def spared(x: int) -> None:
        calls.append("spared")

    await docket.strike(struck)
    k = key()
    execution = await docket.add(struck, key=k)(1)
    assert execution.disposition is Disposition.STRUCK
    assert await docket.get_execution(k) is None
    assert (await docket.snapshot()).future == []

    other = await docket.add(spared)(1)
    assert other.disposition is Disposition.SCHEDULED

    await finish(worker)
    assert calls == ["spared"]


async def test_strike_by_function_name(docket: Docket) -> None:
    async def by_name() -> None:
        pass

    docket.register(by_name)
    await docket.strike("by_name")
    assert (await docket.add("by_name")()).disposition is Disposition.STRUCK
    assert (await docket.add(by_name)()).disposition is Disposition.STRUCK


@pytest.mark.parametrize(
    ("operator", "value", "struck", "spared"),
    [
        ("==", 5, [5], [4, 6]),
        ("!=", 5, [4, 6], [5]),
        (">", 5, [6, 9], [5, 4]),
        (">=", 5, [5, 6], [4]),
        ("<", 5, [4, 0], [5, 6]),
        ("<=", 5, [5, 4], [6]),
        ("between", (3, 5), [3, 4, 5], [2, 6]),
        (Operator.GREATER_THAN, 5, [6], [5]),
    ],
)
async def test_strike_by_parameter(
    docket: Docket,
    worker: Worker,
    operator: str | Operator,
    value: Any,
    struck: list[int],
    spared: list[int],
) -> None:
    calls: list[tuple[str, int]] = []

    async def first(customer: int) -> None:
        calls.append(("first", customer))

    async def second(region: str, customer: int) -> None:
        calls.append(("second", customer))

    async def unrelated(other: int) -> None:
        calls.append(("unrelated", other))

    await docket.strike(None, "customer", operator, value)

    for n in struck:
        assert (await docket.add(first)(n)).disposition is Disposition.STRUCK
        assert (await docket.add(second)("eu", customer=n)).disposition is Disposition.STRUCK
        # a parameter of another name is not affected
        assert (await docket.add(unrelated)(n)).disposition is Disposition.SCHEDULED
    for n in spared:
        assert (await docket.add(first)(customer=n)).disposition is Disposition.SCHEDULED
        assert (await docket.add(second)("eu", n)).disposition is Disposition.SCHEDULED

    await finish(worker)
    expected = sorted(
        [("first", n) for n in spared]
        + [("second", n) for n in spared]
        + [("unrelated", n) for n in struck]
    )
    assert sorted(calls) == expected


async def test_incomparable_values_are_not_struck(docket: Docket) -> None:
    async def job(customer: Any) -> None:
        pass

    await docket.strike(None, "customer", ">", 5)
    assert (await docket.add(job)("text")).disposition is Disposition.SCHEDULED
    assert (await docket.add(job)(None)).disposition is Disposition.SCHEDULED
    assert (await docket.add(job)(6)).disposition is Disposition.STRUCK


async def test_strike_by_function_and_parameter(docket: Docket, worker: Worker) -> None:
    calls: list[tuple[str, int]] = []

    async def target(customer: int) -> None:
        calls.append(("target", customer))

    async def bystander(customer: int) -> None:
        calls.append(("bystander", customer))

    await docket.strike(target, "customer", "==", 1)
    assert (await docket.add(target)(1)).disposition is Disposition.STRUCK
    assert (await docket.add(target)(2)).disposition is Disposition.SCHEDULED
    assert (await docket.add(bystander)(1)).disposition is Disposition.SCHEDULED

    await finish(worker)
    assert sorted(calls) == [("bystander", 1), ("target", 2)]


async def test_strike_needs_a_function_or_parameter(docket: Docket) -> None:
    with pytest.raises(UsageError):
        await docket.strike()


# -- struck at execution --------------------------------------------------------------


async def test_struck_at_execution_when_due(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[int] = []

    async def victim(customer: int) -> None:
        calls.append(customer)

    soon = now() + timedelta(milliseconds=30)
    by_function = await docket.add(victim, when=soon)(1)
    by_value = await docket.add(victim, when=soon)(3)
    kept = await docket.add(victim, when=soon)(4)
    assert by_function.disposition is Disposition.SCHEDULED

    await docket.strike(victim, "customer", "<", 3)
    await docket.strike(None, "customer", "==", 3)

    await finish(worker)
    assert calls == [4]
    for execution in (by_function, by_value):
        stored = await docket.get_execution(execution.key)
        assert stored is not None
        assert stored.state is ExecutionState.CANCELLED, execution
    done = await docket.get_execution(kept.key)
    assert done is not None
    assert done.state is ExecutionState.COMPLETED


async def test_struck_at_execution_already_queued_when_worker_starts(
    docket: Docket, worker: Worker
) -> None:
    calls: list[int] = []

    async def victim(customer: int) -> None:
        calls.append(customer)

    queued = await docket.add(victim)(1)
    assert queued.disposition is Disposition.SCHEDULED
    await docket.strike(victim)

    await finish(worker)
    assert calls == []
    stored = await docket.get_execution(queued.key)
    assert stored is not None
    assert stored.state is ExecutionState.CANCELLED


async def test_struck_at_execution_while_the_worker_runs(
    docket: Docket, worker: Worker, now: Now
) -> None:
    calls: list[str] = []
    ran = anyio.Event()

    async def victim() -> None:
        calls.append("victim")

    async def marker() -> None:
        calls.append("marker")
        ran.set()

    async with running(worker):
        # (the strike must be in before the victim is due: a loaded suite's
        # round trips took more than a 40 ms margin once)
        execution = await docket.add(victim, when=now() + timedelta(milliseconds=300))()
        await docket.strike(victim)
        await docket.add(marker, when=now() + timedelta(milliseconds=400))()
        await ran.wait()
        # (a loaded machine may hand both out in one read: the victim's end
        # may then be recorded a moment after the marker ran)
        with anyio.fail_after(2):
            while not (stored := await loaded(docket, execution.key)).state.terminal:
                await anyio.sleep(0.01)
    assert calls == ["marker"]
    assert stored.state is ExecutionState.CANCELLED


# -- restore --------------------------------------------------------------------------


async def test_restore_undoes_a_strike(docket: Docket, worker: Worker) -> None:
    calls: list[int] = []

    async def job(customer: int) -> None:
        calls.append(customer)

    await docket.strike(job)
    await docket.strike(None, "customer", "between", (10, 20))
    assert (await docket.add(job)(1)).disposition is Disposition.STRUCK

    await docket.restore(job)
    assert (await docket.add(job)(1)).disposition is Disposition.SCHEDULED
    assert (await docket.add(job)(15)).disposition is Disposition.STRUCK

    await docket.restore(None, "customer", "between", (10, 20))
    assert (await docket.add(job)(15)).disposition is Disposition.SCHEDULED

    await finish(worker)
    assert sorted(calls) == [1, 15]


async def test_restore_lets_a_held_back_execution_run(docket: Docket, worker: Worker) -> None:
    calls: list[int] = []

    async def job() -> None:
        calls.append(1)

    execution = await docket.add(job)()
    await docket.strike(job)
    await docket.restore(job)
    await finish(worker)
    assert calls == [1]
    stored = await docket.get_execution(execution.key)
    assert stored is not None
    assert stored.state is ExecutionState.COMPLETED


# -- conditions that cannot be compared -----------------------------------------------


INCOMPATIBLE = "Incompatible type for strike condition"


async def test_an_incompatible_condition_is_not_a_match_and_says_so_on_both_sides(
    docket: Docket, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[Any] = []

    async def job(customer: Any) -> None:
        calls.append(customer)

    caplog.set_level(logging.WARNING, logger="docket.execution")
    added = await docket.add(job, key=key())("text")  # scheduled before the strike
    await docket.strike(None, "customer", ">", 5)
    # add side: checked against the strike list, not struck, and warned about
    assert (await docket.add(job)("more text")).disposition is Disposition.SCHEDULED
    assert [r.getMessage() for r in caplog.records if r.name == "docket.execution"] == [
        f"{INCOMPATIBLE}: 5 > 'more text'"
    ]
    # worker side: both run, and the worker warns about each
    caplog.clear()
    await finish(make_worker(docket))
    assert sorted(calls) == ["more text", "text"]
    warned = [r for r in caplog.records if r.getMessage().startswith(INCOMPATIBLE)]
    assert {r.getMessage() for r in warned} >= {
        f"{INCOMPATIBLE}: 5 > 'text'",
        f"{INCOMPATIBLE}: 5 > 'more text'",
    }
    assert all(r.name == "docket.execution" and r.levelno == logging.WARNING for r in warned)
    done = await docket.get_execution(added.key)
    assert done is not None and done.state is ExecutionState.COMPLETED


@pytest.mark.parametrize("value", [5, None, (1,), (1, 10, 20), "x"])
async def test_a_malformed_between_matches_nothing_and_breaks_nothing(
    docket: Docket, value: Any, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    async def job(customer: int) -> None:
        calls.append(customer)

    before = await docket.add(job)(3)
    await docket.strike(None, "customer", "between", value)
    await docket.strike(None, "customer", "==", 4)  # the list still works
    assert (await docket.add(job)(5)).disposition is Disposition.SCHEDULED
    assert (await docket.add(job)(4)).disposition is Disposition.STRUCK
    await finish(make_worker(docket))
    assert sorted(calls) == [3, 5]
    done = await docket.get_execution(before.key)
    assert done is not None and done.state is ExecutionState.COMPLETED
    assert any(m.startswith(INCOMPATIBLE) for m in caplog.messages)


async def test_between_takes_a_list_as_well_as_a_tuple(docket: Docket, worker: Worker) -> None:
    calls: list[int] = []

    async def job(customer: int) -> None:
        calls.append(customer)

    await docket.strike(job, "customer", "between", [10, 20])
    struck = [await docket.add(job)(n) for n in (10, 15, 20)]
    kept = [await docket.add(job)(n) for n in (9, 21)]
    assert {e.disposition for e in struck} == {Disposition.STRUCK}
    assert {e.disposition for e in kept} == {Disposition.SCHEDULED}
    await finish(worker)
    assert sorted(calls) == [9, 21]
