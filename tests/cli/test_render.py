"""What the commands print, without a store process: the snapshot, workers
and dead-letter tables, the view ``watch`` redraws, and the log formats."""

from __future__ import annotations

import io
import json
import logging
import sys
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console, RenderableType

from docket_core import Docket
from docket_core.cli import render
from docket_core.cli.logs import JsonFormatter, LogFormat, LogLevel, configure_logging
from docket_core.cli.watch import WatchView
from docket_core.docket import WorkerInfo
from docket_core.sansio.values import DeadLetter, ExecutionState

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)


def text_of(renderable: RenderableType, width: int = 200) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_relative_times() -> None:
    assert render.relative_time(NOW, NOW) == "now"
    assert render.relative_time(NOW, NOW + timedelta(milliseconds=250)) == "in 250ms"
    assert render.relative_time(NOW, NOW - timedelta(seconds=2.5)) == "2.5s ago"
    assert render.relative_time(NOW, NOW + timedelta(minutes=1, seconds=30)) == "in 1m30s"
    assert render.relative_time(NOW, NOW - timedelta(minutes=29, seconds=5)) == "29m05s ago"
    # beyond half an hour, a time of day, as pydocket shows it
    far = NOW + timedelta(hours=2)
    assert render.relative_time(NOW, far) == f"at {render.local_time(far)}"
    assert render.relative_time(NOW, NOW - timedelta(hours=1)).startswith("at 2030-01-01 ")


def test_the_workers_table() -> None:
    workers = [
        WorkerInfo(name="old", last_seen=NOW - timedelta(seconds=9), tasks={"a", "b"}),
        WorkerInfo(name="new", last_seen=NOW - timedelta(seconds=1), tasks=set()),
    ]
    text = text_of(render.workers_table("orders", workers, highlight_task="b", now=NOW))
    assert "Workers in Docket: orders" in text
    lines = text.splitlines()
    new = next(i for i, line in enumerate(lines) if "new" in line)
    old = next(i for i, line in enumerate(lines) if "old" in line)
    assert new < old  # the most recently seen first
    assert "1.0s ago" in lines[new] and "(none)" in lines[new]
    assert "9.0s ago" in lines[old] and " a " in lines[old]
    assert " b " in lines[old + 1]  # one task a line


def test_the_dead_letters_table_reads_no_markup() -> None:
    letter = DeadLetter(
        entry_id="1733234000000-0",
        original_id="1-0",
        reason="field 'when' is not a number: [bold]x[/bold]",
        dead_at=NOW.timestamp(),
        key="poison",
    )
    text = text_of(render.dead_letters_table(1, [letter]))
    assert "1 dead letter(s)" in text
    assert "1733234000000-0" in text and "poison" in text
    assert "[bold]x[/bold]" in text


@pytest.mark.anyio
async def test_the_snapshot_shows_true_totals_beyond_its_page() -> None:
    async def job(n: int) -> None: ...

    async def later(n: int) -> None: ...

    async with Docket(name="snap", url=f"memory://{uuid.uuid4().hex}") as docket:
        for n in range(5):
            await docket.add(job, key=f"due-{n}")(n)
        await docket.add(later, key="later", when=datetime.now(UTC) + timedelta(hours=1))(0)
        full = await docket.snapshot()
        page = await docket.snapshot(limit=2)
    text = text_of(render.snapshot_table(full, "snap"))
    assert "Docket: 'snap'" in text and "0 workers, 0/6 running" in text
    for key in ("due-0", "due-4", "later"):
        assert key in text
    assert text.index("due-4") < text.index("later")  # by when
    assert render.snapshot_notes(full, 1000) == ["6 scheduled or queued, 0 running"]

    assert not page.complete
    text = text_of(render.snapshot_table(page, "snap"))
    assert "0/6 running" in text
    notes = render.snapshot_notes(page, 2)
    shown = len(page.future) + len(page.running)
    assert notes == [
        "6 scheduled or queued, 0 running",
        f"showing {shown} of 6 tasks (--limit 2)",
    ]

    stats = text_of(render.task_stats_table(full))
    (job_row,) = [line for line in stats.splitlines() if " job " in line]
    assert job_row.replace("│", " ").split()[:4] == ["job", "5", "0", "5"]
    assert "(of the" not in stats
    assert f"(of the {shown} tasks listed)" in text_of(render.task_stats_table(page))


def _execution(**fields: Any) -> Any:
    """What ``WatchView.update`` reads of an execution."""
    progress = SimpleNamespace(current=None, total=100, message=None, updated_at=None)
    progress.__dict__.update(fields.pop("progress", {}))
    defaults: dict[str, Any] = {"worker": None, "error": None, "started_at": None}
    return SimpleNamespace(**{**defaults, **fields, "progress": progress})


def test_the_watch_view_shows_state_progress_and_outcome() -> None:
    view = WatchView("k-1", "orders")
    view.update(_execution(state=ExecutionState.SCHEDULED))
    text = text_of(view.render())
    assert text.splitlines()[:3] == ["Task: k-1", "Docket: orders", "State: SCHEDULED"]
    assert "Processing" not in text  # no bar before any progress is reported

    started = datetime.now(UTC) - timedelta(seconds=3)
    running = _execution(
        state=ExecutionState.RUNNING,
        worker="w1",
        started_at=started,
        progress={"current": 1, "total": 2, "message": "[b]halfway", "updated_at": started},
    )
    view.update(running)
    text = text_of(view.render())
    assert "State: RUNNING" in text and "Worker: w1" in text
    (bar,) = [line for line in text.splitlines() if "1/2" in line]
    assert "[b]halfway" in bar and "50%" in bar and "0:00:03" in bar

    view.update(_execution(state=ExecutionState.FAILED, error="ValueError: nope"))
    text = text_of(view.render())
    assert "State: FAILED" in text and "Error: ValueError: nope" in text
    assert "✗ Task failed" in text
    assert "Worker: w1" in text  # kept from before

    done = WatchView("k-2", "orders")
    done.update(_execution(state=ExecutionState.COMPLETED))
    done.result = repr(42)
    text = text_of(done.render())
    assert "✓ Task completed successfully" in text and "Result: 42" in text


# -- log formats -------------------------------------------------------------------------------


def _record(message: str, **extra: Any) -> logging.LogRecord:
    record = logging.getLogger("docket.worker").makeRecord(
        "docket.worker", logging.INFO, __file__, 1, message, (), None, extra=extra
    )
    return record


def test_json_logs_carry_the_extra_fields() -> None:
    line = JsonFormatter().format(_record("↪ [  1ms] job(...)", **{"docket.key": "k", "n": 1}))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["name"] == "docket.worker"
    assert entry["levelname"] == "INFO"
    assert entry["message"] == "↪ [  1ms] job(...)"
    assert entry["docket.key"] == "k" and entry["n"] == 1
    assert datetime.fromisoformat(entry["asctime"])
    assert "exc_info" not in entry and "args" not in entry and "msg" not in entry


def test_json_logs_carry_the_traceback() -> None:
    try:
        raise ValueError("broken")
    except ValueError:
        record = _record("failed", when=NOW)
        record.exc_info = sys.exc_info()
    entry = json.loads(JsonFormatter().format(record))
    assert entry["exc_info"].startswith("Traceback") and "ValueError: broken" in entry["exc_info"]
    assert entry["when"] == str(NOW)  # what JSON cannot hold is written as text


@pytest.mark.parametrize(
    ("log_format", "expected"),
    [
        (LogFormat.PLAIN, "] WARNING - docket.test - hello 7"),
        (LogFormat.JSON, '"message": "hello 7"'),
    ],
)
def test_logging_is_configured_on_standard_output(
    log_format: LogFormat, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    level = root.level
    handler = configure_logging(LogLevel.WARNING, log_format)
    try:
        logging.getLogger("docket.test").info("hidden")
        logging.getLogger("docket.test").warning("hello %d", 7)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    out = capsys.readouterr().out
    assert expected in out
    assert "hidden" not in out
