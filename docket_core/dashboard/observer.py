"""What the dashboard shows: samples of one docket, read through its public API.

``Observer.sample`` reads the docket once (``snapshot``, ``dead_letters``,
``strike_list``, ``get_execution`` for the progress of running tasks and for the
end of tasks that left the snapshot) and keeps a bounded history; ``view``
turns the latest reading into the JSON-ready dictionary the page renders.
Nothing here writes to the docket.

The public API has no feed of finished executions, so the dashboard learns
how a task ended by looking up each key it saw scheduled, queued or running
once that key leaves the snapshot: a task that is added and ends between two
samples is not seen, and the finished counts are those of this dashboard.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import attrs

from ..sansio.values import ExecutionState

if TYPE_CHECKING:
    from ..docket import Docket, DocketSnapshot
    from ..execution import Execution

#: samples kept for the chart (five minutes at one a second)
HISTORY = 300
#: tasks a snapshot lists of each kind (its totals are exact whatever this is)
SNAPSHOT_LIMIT = 1000
#: the schedule shown: tasks due within this many seconds
HORIZON = 3600.0
#: rows shown per table, and lookups made per sample
SCHEDULE_ROWS = 100
RUNNING_ROWS = 50
FINISHED_ROWS = 50
FAILURE_ROWS = 25
DEAD_LETTER_ROWS = 20
LOOKUPS_PER_SAMPLE = 100
#: how many samples a key that left the snapshot but has not ended is looked up
LOOKUP_TRIES = 5
#: the longest text (an error, a key, a strike value) sent to the page
TEXT_LIMIT = 1000


def clip(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, marked when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def finite(value: float | None) -> float | None:
    """``value``, or ``None`` where JSON has no number for it (NaN, infinity)."""
    return value if value is not None and math.isfinite(value) else None


def seconds(moment: datetime | None) -> float | None:
    """A datetime as a Unix timestamp (``None`` stays ``None``)."""
    return None if moment is None else finite(moment.timestamp())


def redact(url: str) -> str:
    """The docket URL without its password and query (which may hold secrets)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            user = parts.username or ""
            host = netloc.rpartition("@")[2]
            netloc = f"{user}:***@{host}" if user else f"***@{host}"
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    except ValueError:
        return "(a URL that does not parse)"


def describe_value(value: Any) -> str:
    """A strike's value as text, whatever its type."""
    try:
        return clip(repr(value), 200)
    except Exception:  # a repr may raise: show the type instead
        return f"<{type(value).__name__}>"


def strike_row(
    task: str | None, parameter: str | None, operator: Any, value: Any
) -> dict[str, Any]:
    """One strike as the page shows it (no parameter: every call of the task)."""
    return {
        "function": None if task is None else clip(task),
        "parameter": None if parameter is None else clip(parameter),
        "operator": None if operator is None else str(getattr(operator, "value", operator)),
        "value": None if parameter is None else describe_value(value),
    }


@attrs.frozen(slots=True, kw_only=True)
class Sample:
    """The docket's counts at one moment; the finished counts are those this
    dashboard saw end since the sample before."""

    taken: float
    scheduled: int
    queued: int
    running: int
    completed: int
    failed: int
    cancelled: int


@attrs.frozen(slots=True, kw_only=True)
class Finished:
    """A task the dashboard saw live, and how it ended."""

    key: str
    function: str
    state: ExecutionState
    ended: float | None
    attempt: int
    worker: str | None
    error: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "key": clip(self.key),
            "function": clip(self.function),
            "state": self.state.value,
            "ended": self.ended,
            "attempt": self.attempt,
            "worker": None if self.worker is None else clip(self.worker),
            "error": None if self.error is None else clip(self.error),
        }


class Observer:
    """Samples one entered ``Docket`` and keeps what the page needs."""

    def __init__(self, docket: Docket, *, interval: float = 1.0, history: int = HISTORY) -> None:
        self.docket = docket
        self.interval = interval
        self.history: deque[Sample] = deque(maxlen=history)
        self.finished: deque[Finished] = deque(maxlen=FINISHED_ROWS)
        self.failures: deque[Finished] = deque(maxlen=FAILURE_ROWS)
        #: key -> function name of the tasks live in the last snapshot
        self._live: dict[str, str] = {}
        #: key -> (function name, lookups left) of keys that left the snapshot
        self._leaving: dict[str, tuple[str, int]] = {}
        self._view: dict[str, Any] = self._empty_view()
        #: the latest view, encoded once for every client that asks
        self.body: bytes = self._encode(self._view)

    # -- sampling --------------------------------------------------------------------

    async def sample(self) -> None:
        """Read the docket once and update the view."""
        docket = self.docket
        snapshot = await docket.snapshot(limit=SNAPSHOT_LIMIT)
        now = snapshot.taken.timestamp()
        dead_total, dead = await docket.dead_letters(limit=DEAD_LETTER_ROWS)
        await docket.wait_for_strikes_loaded()
        running = [await self._progress_of(r.execution) for r in snapshot.running[:RUNNING_ROWS]]
        ended = await self._collect_endings(snapshot)

        queued = sum(1 for e in snapshot.future if e.when.timestamp() <= now)
        scheduled = max(snapshot.future_total - queued, 0)
        self.history.append(
            Sample(
                taken=now,
                scheduled=scheduled,
                queued=queued,
                running=snapshot.running_total,
                completed=sum(1 for f in ended if f.state is ExecutionState.COMPLETED),
                failed=sum(1 for f in ended if f.state is ExecutionState.FAILED),
                cancelled=sum(1 for f in ended if f.state is ExecutionState.CANCELLED),
            )
        )
        for finished in ended:
            self.finished.appendleft(finished)
            if finished.state is ExecutionState.FAILED:
                self.failures.appendleft(finished)

        view = self._empty_view()
        view.update(
            now=now,
            ok=True,
            totals={
                "scheduled": scheduled,
                "queued": queued,
                "running": snapshot.running_total,
                "workers": len(snapshot.workers),
                "dead_letters": dead_total,
                "malformed": len(snapshot.malformed),
                "listed_all": snapshot.complete,
            },
            history=[attrs.asdict(s) for s in self.history],
            running=[
                self._running_row(r.execution, r.worker, r.started, progress)
                for r, progress in zip(snapshot.running, running, strict=False)
            ],
            schedule=self._schedule(snapshot, now),
            workers=[
                {
                    "name": clip(w.name),
                    "last_seen": seconds(w.last_seen),
                    "tasks": len(w.tasks),
                }
                for w in sorted(snapshot.workers, key=lambda w: w.name)
            ],
            finished=[f.as_json() for f in self.finished],
            failures=[f.as_json() for f in self.failures],
            dead_letters=[
                {
                    "entry_id": clip(d.entry_id),
                    "key": None if d.key is None else clip(d.key),
                    "reason": clip(d.reason),
                    "dead_at": finite(d.dead_at),
                }
                for d in dead
            ],
            strikes=self._strikes(),
        )
        self._view = view
        self.body = self._encode(view)

    def failed(self, error: BaseException) -> None:
        """Keep the last view, marked stale with why the sample failed."""
        view = dict(self._view)
        view.update(ok=False, error=clip(f"{type(error).__name__}: {error}"), now=time.time())
        self._view = view
        self.body = self._encode(view)

    def view(self) -> dict[str, Any]:
        """The latest view (a copy)."""
        return dict(self._view)

    async def _progress_of(self, execution: Execution) -> dict[str, Any] | None:
        current = await self.docket.get_execution(execution.key)
        if current is None:
            return None
        p = current.progress
        message = None if p.message is None else clip(p.message)
        return {"current": p.current, "total": p.total, "message": message}

    async def _collect_endings(self, snapshot: DocketSnapshot) -> list[Finished]:
        """Look up the keys that left the snapshot since the last sample."""
        live = {e.key: e.function_name for e in snapshot.future}
        live.update((r.key, r.function_name) for r in snapshot.running)
        for key, function in self._live.items():
            if key not in live:
                self._leaving[key] = (function, LOOKUP_TRIES)
        for key in live:
            self._leaving.pop(key, None)
        self._live = live

        ended: list[Finished] = []
        for key in list(self._leaving)[:LOOKUPS_PER_SAMPLE]:
            function, tries = self._leaving.pop(key)
            execution = await self.docket.get_execution(key)
            if execution is None:
                continue  # expired, or never stored: nothing to show
            if execution.state.terminal:
                ended.append(
                    Finished(
                        key=key,
                        function=execution.function_name or function,
                        state=execution.state,
                        ended=seconds(execution.completed_at),
                        attempt=execution.attempt,
                        worker=execution.worker,
                        error=execution.error,
                    )
                )
            elif tries > 1:  # between two stages: look again next time
                self._leaving[key] = (function, tries - 1)
        return ended

    # -- rows ---------------------------------------------------------------------------

    @staticmethod
    def _running_row(
        execution: Execution, worker: str, started: datetime, progress: dict[str, Any] | None
    ) -> dict[str, Any]:
        return {
            "key": clip(execution.key),
            "function": clip(execution.function_name),
            "worker": clip(worker),
            "started": seconds(started),
            "attempt": execution.attempt,
            "progress": progress,
        }

    @staticmethod
    def _schedule(snapshot: DocketSnapshot, now: float) -> list[dict[str, Any]]:
        soon = [e for e in snapshot.future if e.when.timestamp() <= now + HORIZON]
        soon.sort(key=lambda e: e.when)
        return [
            {
                "key": clip(e.key),
                "function": clip(e.function_name),
                "when": seconds(e.when),
                "attempt": e.attempt,
                "state": "queued" if e.when.timestamp() <= now else "scheduled",
            }
            for e in soon[:SCHEDULE_ROWS]
        ]

    def _strikes(self) -> list[dict[str, Any]]:
        """The strikes in effect, by task then by parameter (``docket.strike_list``)."""
        strikes = self.docket.strike_list
        rows: list[dict[str, Any]] = []
        scoped: list[tuple[str | None, dict[str, set[tuple[Any, Any]]]]] = [
            (task, parameters) for task, parameters in sorted(strikes.task_strikes.items())
        ]
        scoped.append((None, strikes.parameter_strikes))
        for task, parameters in scoped:
            if task is not None and not parameters:
                rows.append(strike_row(task, None, None, None))
            for parameter, entries in sorted(parameters.items()):
                for operator, value in sorted(entries, key=repr):
                    rows.append(strike_row(task, parameter, operator, value))
        return rows

    # -- encoding -------------------------------------------------------------------------

    def _empty_view(self) -> dict[str, Any]:
        return {
            "docket": clip(self.docket.name),
            "url": clip(redact(self.docket.url)),
            "interval": self.interval,
            "horizon": HORIZON,
            "now": time.time(),
            "ok": False,
            "error": None,
            "totals": {},
            "history": [],
            "running": [],
            "schedule": [],
            "workers": [],
            "finished": [],
            "failures": [],
            "dead_letters": [],
            "strikes": [],
        }

    @staticmethod
    def _encode(view: dict[str, Any]) -> bytes:
        # every time went through `finite`: JSON has no NaN
        return json.dumps(view, default=str, separators=(",", ":"), allow_nan=False).encode()
