"""``docket watch KEY``: one execution's state and progress, live, until it
ends with its result or its error.

On a terminal the view is redrawn at every event (a rich ``Live``), with a
progress bar once the task reports progress: its message, a bar,
``current/total``, a percentage and the time since the run started.  When
the output is not a terminal only the final view is printed.  Events can be
missed (a reconnection), so the execution is also read again every
``poll_interval``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import anyio
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from ..sansio.values import ExecutionState

if TYPE_CHECKING:
    from ..docket import Docket
    from ..execution import Execution

__all__ = ["WatchView", "not_found_message", "watch_execution"]

_STATE_COLORS = {
    ExecutionState.SCHEDULED: "yellow",
    ExecutionState.QUEUED: "cyan",
    ExecutionState.RUNNING: "blue",
    ExecutionState.COMPLETED: "green",
    ExecutionState.FAILED: "red",
    ExecutionState.CANCELLED: "magenta",
}
#: how long the final view waits for a completed run's result
_RESULT_TIMEOUT = timedelta(seconds=5)


def not_found_message(key: str) -> str:
    return f"Task with key '{key}' not found or function not registered"


class WatchView:
    """What ``docket watch`` shows of one execution, rebuilt at every change."""

    def __init__(self, key: str, docket_name: str) -> None:
        self.key = key
        self.docket_name = docket_name
        self.state = ExecutionState.SCHEDULED
        self.worker: str | None = None
        self.error: str | None = None
        #: the run's result, once it completed
        self.result: str | None = None
        self.progress = Progress(
            TextColumn("[bold blue]{task.description}"),
            BarColumn(bar_width=None),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            expand=True,
        )
        self._bar: TaskID | None = None

    def update(self, execution: Execution) -> None:
        """Take the execution's current state and progress."""
        self.state = execution.state
        self.worker = execution.worker or self.worker
        self.error = execution.error or self.error
        progress = execution.progress
        current = progress.current or 0
        reported = progress.updated_at is not None or current > 0
        if not reported or progress.total <= 0:
            return
        description = escape(progress.message or "Processing...")
        if self._bar is None:
            self._bar = self.progress.add_task(description, total=progress.total, completed=current)
        else:
            self.progress.update(
                self._bar, total=progress.total, completed=current, description=description
            )
        if execution.started_at is not None:
            self._start_clock(execution.started_at)
        if self.state.terminal:
            self.progress.stop_task(self._bar)

    def _start_clock(self, started_at: datetime) -> None:
        """Let the elapsed time count from the run's start, not the watcher's."""
        since = (datetime.now(UTC) - started_at).total_seconds()
        for task in self.progress.tasks:
            if task.id == self._bar and task.stop_time is None:
                task.start_time = time.monotonic() - max(since, 0.0)

    def render(self) -> RenderableType:
        color = _STATE_COLORS.get(self.state, "white")
        lines = [
            Text.assemble(("Task: ", "bold"), self.key),
            Text.assemble(("Docket: ", "bold"), self.docket_name),
            Text.assemble(("State: ", "bold"), (self.state.value.upper(), color)),
        ]
        if self.worker:
            lines.append(Text.assemble(("Worker: ", "bold"), self.worker))
        if self.error:
            lines.append(Text.assemble(("Error: ", "red bold"), self.error))
        if self.state is ExecutionState.COMPLETED:
            lines.append(Text("✓ Task completed successfully", style="green bold"))
            if self.result is not None:
                lines.append(Text.assemble(("Result: ", "bold"), self.result))
        elif self.state is ExecutionState.FAILED:
            lines.append(Text("✗ Task failed", style="red bold"))
        elif self.state is ExecutionState.CANCELLED:
            lines.append(Text("✗ Task cancelled", style="magenta bold"))
        if self._bar is None:
            return Group(*lines)
        return Group(*lines, self.progress)


async def _finish(view: WatchView, execution: Execution) -> None:
    """Fill in the run's result (a completed run) and its final progress."""
    await execution.sync()
    view.update(execution)
    if execution.state is not ExecutionState.COMPLETED:
        return
    try:
        result = await execution.get_result(timeout=_RESULT_TIMEOUT)
    except Exception as error:  # the result may not load here (its type unknown)
        view.result = f"(not readable here: {error})"
    else:
        view.result = repr(result)


async def watch_execution(
    docket: Docket, key: str, console: Console, poll_interval: timedelta
) -> ExecutionState | None:
    """Show ``key``'s execution until it ends; returns its final state, or
    None (after saying so) when the docket has no such execution."""
    execution = await docket.get_execution(key)
    if execution is None:
        console.print(Text.assemble(("Error: ", "red"), not_found_message(key)), style="bold")
        return None
    view = WatchView(key, docket.name)
    view.update(execution)
    if execution.state.terminal:
        await _finish(view, execution)
        console.print(view.render())
        return execution.state

    with Live(view.render(), console=console, refresh_per_second=4) as live:

        def show() -> None:
            view.update(execution)
            live.update(view.render(), refresh=True)

        async with anyio.create_task_group() as group:

            async def follow() -> None:
                async for _ in execution.events():
                    show()
                    if execution.state.terminal:
                        group.cancel_scope.cancel()

            async def poll() -> None:
                while True:
                    await anyio.sleep(poll_interval.total_seconds())
                    await execution.sync()
                    show()
                    if execution.state.terminal:
                        group.cancel_scope.cancel()

            group.start_soon(follow)
            group.start_soon(poll)
        await _finish(view, execution)
        live.update(view.render(), refresh=True)
    return execution.state
