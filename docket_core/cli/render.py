"""The rich tables the ``docket`` commands print: a snapshot (with counts by
task), the live workers, and the dead letters.

Each function builds renderables from values the public API returns and
prints nothing itself, so the layouts are tested without a store.  Text that
comes from the docket (keys, task names, reasons) is never read as markup.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import attrs
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from ..docket import DocketSnapshot, WorkerInfo
    from ..sansio.values import DeadLetter

__all__ = [
    "TaskStats",
    "dead_letters_table",
    "format_span",
    "local_time",
    "relative_time",
    "snapshot_notes",
    "snapshot_table",
    "task_stats",
    "task_stats_table",
    "workers_table",
]

#: beyond this distance from now, times are shown as dates rather than "in ..."/"... ago"
_NEAR = timedelta(minutes=30)


def local_time(when: datetime) -> str:
    return when.astimezone().strftime("%Y-%m-%d %H:%M:%S %z")


def format_span(seconds: float) -> str:
    """A short, exact-enough span: ``250ms``, ``2.5s``, ``1m30s``, ``1h00m05s``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


def relative_time(reference: datetime, moment: datetime) -> str:
    """``moment`` seen from ``reference``: ``now``, ``in 2.5s``, ``3m05s ago``,
    or ``at <local time>`` when more than half an hour away."""
    seconds = (moment - reference).total_seconds()
    if abs(seconds) < 0.0005:
        return "now"
    if abs(seconds) > _NEAR.total_seconds():
        return f"at {local_time(moment)}"
    text = format_span(abs(seconds))
    return f"in {text}" if seconds > 0 else f"{text} ago"


def _titled(title: str) -> Table:
    """A table at least as wide as its title, so the title is never broken."""
    return Table(title=title, min_width=max(len(line) for line in title.splitlines()))


# -- snapshot --------------------------------------------------------------------------------


def snapshot_table(snapshot: DocketSnapshot, docket_name: str) -> Table:
    """The snapshot table (running tasks, then future ones by time), titled
    with the true totals (``snapshot_notes`` says what it leaves out)."""
    taken = snapshot.taken
    title = "\n".join(
        [
            f"Docket: {docket_name!r}",
            f"as of {local_time(taken)}",
            f"{len(snapshot.workers)} workers, "
            f"{snapshot.running_total}/{snapshot.total_tasks} running",
        ]
    )
    table = _titled(title)
    table.add_column("When", style="green")
    table.add_column("Function", style="cyan", no_wrap=True)
    table.add_column("Key", style="cyan", no_wrap=True)
    table.add_column("Worker", style="yellow")
    table.add_column("Started", style="green")
    for running in sorted(snapshot.running, key=lambda r: r.started):
        table.add_row(
            relative_time(taken, running.when),
            Text(running.function_name),
            Text(running.key),
            Text(running.worker),
            relative_time(taken, running.started),
        )
    for execution in sorted(snapshot.future, key=lambda e: e.when):
        table.add_row(
            relative_time(taken, execution.when),
            Text(execution.function_name),
            Text(execution.key),
            "",
            "",
        )
    return table


def snapshot_notes(snapshot: DocketSnapshot, limit: int) -> list[str]:
    """The lines printed under the snapshot table: the totals by kind, what
    the table leaves out, and messages set aside."""
    shown = len(snapshot.running) + len(snapshot.future)
    notes = [f"{snapshot.future_total} scheduled or queued, {snapshot.running_total} running"]
    if not snapshot.complete:
        notes.append(f"showing {shown} of {snapshot.total_tasks} tasks (--limit {limit})")
    if snapshot.malformed or snapshot.dead_letters:
        notes.append(
            f"{len(snapshot.malformed)} malformed message(s) in the queue, "
            f"{snapshot.dead_letters} dead letter(s) (docket dead-letters ls)"
        )
    return notes


@attrs.define(slots=True, kw_only=True)
class TaskStats:
    """Counts of one task function's listed executions."""

    running: int = 0
    queued: int = 0
    oldest_queued: datetime | None = None
    latest_queued: datetime | None = None

    @property
    def total(self) -> int:
        return self.running + self.queued


def task_stats(snapshot: DocketSnapshot) -> dict[str, TaskStats]:
    """Running and future executions listed in ``snapshot``, by task name."""
    stats: dict[str, TaskStats] = {}
    for running in snapshot.running:
        stats.setdefault(running.function_name, TaskStats()).running += 1
    for execution in snapshot.future:
        counts = stats.setdefault(execution.function_name, TaskStats())
        counts.queued += 1
        if counts.oldest_queued is None or execution.when < counts.oldest_queued:
            counts.oldest_queued = execution.when
        if counts.latest_queued is None or execution.when > counts.latest_queued:
            counts.latest_queued = execution.when
    return stats


def task_stats_table(snapshot: DocketSnapshot) -> Table:
    """``--stats``: counts by task, the busiest first."""
    title = "Task Count Statistics by Function"
    if not snapshot.complete:
        shown = len(snapshot.running) + len(snapshot.future)
        title += f"\n(of the {shown} tasks listed)"
    table = _titled(title)
    table.add_column("Function", style="cyan", no_wrap=True)
    table.add_column("Total", style="bold magenta", justify="right")
    table.add_column("Running", style="green", justify="right")
    table.add_column("Queued", style="yellow", justify="right")
    table.add_column("Oldest Queued", style="dim yellow", justify="right")
    table.add_column("Latest Queued", style="dim yellow", justify="right")
    stats = task_stats(snapshot)
    for name in sorted(stats, key=lambda name: (-stats[name].total, name)):
        counts = stats[name]
        oldest, latest = counts.oldest_queued, counts.latest_queued
        table.add_row(
            Text(name),
            str(counts.total),
            str(counts.running),
            str(counts.queued),
            relative_time(snapshot.taken, oldest) if oldest else "",
            relative_time(snapshot.taken, latest) if latest else "",
        )
    return table


# -- workers and dead letters ------------------------------------------------------------------


def workers_table(
    docket_name: str,
    workers: Collection[WorkerInfo],
    highlight_task: str | None = None,
    now: datetime | None = None,
) -> Table:
    """The live workers, the most recently seen first, with their tasks
    (``highlight_task`` in bold)."""
    now = now or datetime.now(UTC)
    table = _titled(f"Workers in Docket: {docket_name}")
    table.add_column("Name", style="cyan", no_wrap=True)
    table.add_column("Last Seen", style="green")
    table.add_column("Tasks", style="yellow")
    for worker in sorted(workers, key=lambda w: w.last_seen, reverse=True):
        tasks = Text()
        for index, task in enumerate(sorted(worker.tasks)):
            if index:
                tasks.append("\n")
            tasks.append(task, style="bold" if task == highlight_task else "")
        seen = format_span(max((now - worker.last_seen).total_seconds(), 0.0))
        table.add_row(Text(worker.name), f"{seen} ago", tasks if worker.tasks else "(none)")
    return table


def dead_letters_table(total: int, letters: Sequence[DeadLetter]) -> Table:
    """The newest dead letters, with why each was set aside."""
    table = _titled(f"{total} dead letter(s)")
    table.add_column("ID", style="cyan", no_wrap=True)
    table.add_column("Key", style="cyan", no_wrap=True)
    table.add_column("Dead Since", style="green")
    table.add_column("Reason", style="red")
    for letter in letters:
        table.add_row(
            Text(letter.entry_id),
            Text(letter.key or "-"),
            local_time(datetime.fromtimestamp(letter.dead_at, UTC)),
            Text(letter.reason),
        )
    return table
