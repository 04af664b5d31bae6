"""One progress default: ``DEFAULT_PROGRESS_TOTAL`` is the total a task's
progress starts with, whoever reports it (``Progress``, the records of every
store, the Lua scripts' literal)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import make_worker

from docket_core import Docket, Progress
from docket_core.execution import ExecutionProgress
from docket_core.lua.entries import parse_progress
from docket_core.sansio.values import DEFAULT_PROGRESS_TOTAL, ProgressRecord

pytestmark = pytest.mark.anyio

LUA = Path(__file__).resolve().parents[2] / "docket_core" / "lua"


def test_the_records_and_the_dependency_start_at_the_default() -> None:
    assert ProgressRecord().total == DEFAULT_PROGRESS_TOTAL
    assert Progress().total == DEFAULT_PROGRESS_TOTAL  # type: ignore[attr-defined]


def test_a_stored_record_without_a_total_reads_as_the_default() -> None:
    record = parse_progress([b"current", b"3"])
    assert record is not None and record.total == DEFAULT_PROGRESS_TOTAL


@pytest.mark.parametrize(
    ("script", "pattern"),
    [
        ("inspect.lua", r"'current', '0', 'total', '(\d+)'"),
        ("progress.lua", r"r\[2\] or '(\d+)'"),
    ],
)
def test_the_lua_literals_are_the_constant(script: str, pattern: str) -> None:
    source = (LUA / script).read_text()
    literals = re.findall(pattern, source)
    assert literals and {int(n) for n in literals} == {DEFAULT_PROGRESS_TOTAL}
    assert "DEFAULT_PROGRESS_TOTAL" in source


async def test_a_claimed_execution_reports_the_default(docket: Docket) -> None:
    """A run that reported no progress reads as 0 of the default total (a
    claim writes no progress: the store makes it at the first report); an
    ended one as none."""
    seen: list[tuple[int | None, int]] = []

    async def task() -> None:
        execution = await docket.get_execution("watched")
        assert execution is not None
        seen.append((execution.progress.current, execution.progress.total))

    execution = await docket.add(task, key="watched")()
    assert execution.progress.total == DEFAULT_PROGRESS_TOTAL
    async with make_worker(docket) as worker:
        await worker.run_until_finished()
    assert seen == [(0, DEFAULT_PROGRESS_TOTAL)]
    await execution.sync()
    assert execution.progress.current is None


@pytest.mark.parametrize("reporter", ["task", "outside"])
async def test_the_progress_a_run_reported_goes_at_its_end(docket: Docket, reporter: str) -> None:
    """Progress reported while a run runs, by the task or from outside it, is
    deleted when the run ends (on Redis and Valkey the report marks the
    record, and only a marked record's end deletes progress)."""

    async def task(progress: Progress = Progress()) -> None:
        if reporter == "task":
            await progress.set_total(5)
            await progress.increment(2)
        else:
            outside = await ExecutionProgress.create(docket, "reported")
            await outside.increment(3)
        record = await docket.adapter.get_progress("reported")
        assert record is not None and record.current in (2, 3)

    await docket.add(task, key="reported")()
    async with make_worker(docket) as worker:
        await worker.run_until_finished()
    assert worker.counters["succeeded"] == 1
    assert await docket.adapter.get_progress("reported") is None
