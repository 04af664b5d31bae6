"""``Agenda.scatter`` on every contract backend: calls spread evenly over a
window, with deterministic jitter, checked before anything is added.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from helpers import Now, finish

from docket_core import Agenda, Disposition, Docket, Worker

pytestmark = pytest.mark.anyio


async def test_agenda_scatter_spreads_over_the_window(docket: Docket, now: Now) -> None:
    async def job(n: int) -> None:
        pass

    agenda = Agenda()
    for n in range(5):
        agenda.add(job)(n)
    agenda.add(job, key="fixed")(99)
    assert len(agenda) == 6

    start = now() + timedelta(seconds=10)
    executions = await agenda.scatter(docket, over=timedelta(seconds=50), start=start)
    assert [e.disposition for e in executions] == [Disposition.SCHEDULED] * 6
    offsets = [round((e.when - start).total_seconds(), 6) for e in executions]
    assert offsets == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    assert executions[-1].key == "fixed"
    assert [e.args for e in executions] == [(n,) for n in [0, 1, 2, 3, 4, 99]]
    snapshot = await docket.snapshot()
    assert len(snapshot.future) == 6

    again = await agenda.scatter(docket, over=timedelta(seconds=50), start=start)
    assert again[-1].disposition is Disposition.ALREADY_SCHEDULED
    assert len((await docket.snapshot()).future) == 11


async def test_agenda_scatter_single_goes_in_the_middle(docket: Docket, now: Now) -> None:
    async def job() -> None:
        pass

    agenda = Agenda()
    agenda.add(job)()
    start = now() + timedelta(seconds=1)
    (execution,) = await agenda.scatter(docket, over=timedelta(seconds=10), start=start)
    assert execution.when - start == timedelta(seconds=5)


async def test_agenda_scatter_with_jitter_is_deterministic(docket: Docket, now: Now) -> None:
    async def job(n: int) -> None:
        pass

    agenda = Agenda()
    for n in range(3):
        agenda.add(job)(n)
    draws: Iterator[float] = iter([0.0, 0.75, 0.5])
    start = now() + timedelta(seconds=5)
    executions = await agenda.scatter(
        docket,
        over=timedelta(seconds=20),
        start=start,
        jitter=timedelta(seconds=4),
        random=lambda: next(draws),
    )
    offsets = [(e.when - start).total_seconds() for e in executions]
    # evenly 0, 10, 20; jitter (2*r - 1) * 4: -4 (clamped to start), +2, 0
    assert offsets == pytest.approx([0.0, 12.0, 20.0], abs=1e-6)


async def test_agenda_scatter_rejects_unknown_names_first(docket: Docket) -> None:
    async def job() -> None:
        pass

    agenda = Agenda()
    agenda.add(job)()
    agenda.add("no_such_task")()
    with pytest.raises(KeyError, match="Task 'no_such_task' is not registered"):
        await agenda.scatter(docket, over=timedelta(seconds=10))
    assert (await docket.snapshot()).future == []


async def test_agenda_scatter_rejects_an_empty_window(docket: Docket) -> None:
    async def job() -> None:
        pass

    agenda = Agenda()
    agenda.add(job)()
    with pytest.raises(ValueError, match=r"^'over' parameter must be a positive duration$"):
        await agenda.scatter(docket, over=timedelta(0))
    assert (await docket.snapshot()).future == []


async def test_agenda_items_keep_their_arguments_and_key(docket: Docket, now: Now) -> None:
    """Iterating gives pydocket's ``(function, args, kwargs, key)``, and
    scatter schedules each call with exactly those."""

    async def job(n: int, *, label: str = "") -> None:
        pass

    agenda = Agenda()
    agenda.add(job, key="first")(1, label="one")
    agenda.add("trace")("hello")
    agenda.add(job)(2)
    assert list(agenda) == [
        (job, (1,), {"label": "one"}, "first"),
        ("trace", ("hello",), {}, None),
        (job, (2,), {}, None),
    ]

    executions = await agenda.scatter(docket, over=timedelta(seconds=30), start=now())
    assert [(e.function_name, e.args, e.kwargs) for e in executions] == [
        ("job", (1,), {"label": "one"}),
        ("trace", ("hello",), {}),
        ("job", (2,), {}),
    ]
    assert executions[0].key == "first"
    assert executions[2].key not in {"first", executions[1].key}
    stored = {e.key: e for e in (await docket.snapshot()).future}
    assert stored["first"].kwargs == {"label": "one"} and stored["first"].args == (1,)
    assert stored[executions[1].key].args == ("hello",)

    agenda.clear()
    assert len(agenda) == 0 and list(agenda) == []


async def test_agenda_scatter_then_run(docket: Docket, worker: Worker, now: Now) -> None:
    calls: list[int] = []

    async def job(n: int) -> None:
        calls.append(n)

    agenda = Agenda()
    for n in range(3):
        agenda.add(job)(n)
    await agenda.scatter(docket, over=timedelta(milliseconds=60))
    await finish(worker)
    assert sorted(calls) == [0, 1, 2]
