"""Plain values shared by the core, the runtime and every storage adapter.

Nothing here has behaviour beyond construction: these are the nouns of docket.
Times are floats of seconds since the epoch (wall clock), because a task's
``when`` must mean the same instant to every process that shares a docket.
"""

from __future__ import annotations

import enum
import math
from typing import TYPE_CHECKING

import attrs

from .cron import CronPolicy

if TYPE_CHECKING:  # (``admission`` imports this module at run time: no edge back)
    from .admission import Control

#: a task's progress total until it sets one (``Progress``, the stores'
#: progress records; the Lua scripts repeat it as a literal)
DEFAULT_PROGRESS_TOTAL = 100


class Symbol(enum.Enum):
    """An enum whose members hash by identity.  ``Enum.__hash__`` is a call
    into Python, and the core looks its members up in tables (the lifecycle's
    transitions) about ten times a task; a member equals only itself, so the
    identity hash agrees with ``==``."""

    __hash__ = object.__hash__


class ExecutionState(Symbol):
    """Where an execution stands, as users (and ``Execution.state``) see it."""

    #: waiting for its ``when`` in the future queue (or parked behind a limit)
    SCHEDULED = "scheduled"
    #: due, waiting for a worker to pick it up
    QUEUED = "queued"
    #: a worker has claimed it and runs the task function
    RUNNING = "running"
    #: the task returned
    COMPLETED = "completed"
    #: the task raised and no retry was due
    FAILED = "failed"
    #: cancelled, struck, or superseded before it finished
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({ExecutionState.COMPLETED, ExecutionState.FAILED, ExecutionState.CANCELLED})
LIVE_STATES = frozenset({ExecutionState.SCHEDULED, ExecutionState.QUEUED, ExecutionState.RUNNING})


class Disposition(Symbol):
    """What a call to ``add``/``replace`` did."""

    #: not produced by add/replace (loaded from the store)
    LOADED = "loaded"
    #: stored; it will run
    SCHEDULED = "scheduled"
    #: ``add`` with a key that is already scheduled, queued or running: nothing changed
    ALREADY_SCHEDULED = "already_scheduled"
    #: a strike matched; nothing was stored
    STRUCK = "struck"


class ScheduleMode(Symbol):
    """How a ``Schedule`` effect treats an existing live execution of the same key."""

    #: only if the key is not scheduled, queued or running
    ADD = "add"
    #: supersede whatever is live: exactly one live execution remains
    REPLACE = "replace"


@attrs.frozen(slots=True, kw_only=True)
class TaskMessage:
    """One request to run a function: what travels through the store.

    ``payload`` holds ``(args, kwargs)`` as pickled by the producer; the core
    never looks inside it.  ``generation`` is assigned by the store when the
    message is scheduled: a delivery whose generation is no longer the key's
    current one has been superseded and must not run.
    """

    key: str
    function: str
    payload: bytes
    when: float
    attempt: int = 1
    generation: int = 0


@attrs.frozen(slots=True, kw_only=True)
class Delivery:
    """A message handed to one worker, identified by the store's delivery id."""

    delivery_id: str
    message: TaskMessage
    #: true when the store handed this message out before (a worker stopped renewing)
    redelivered: bool = False


@attrs.frozen(slots=True, kw_only=True)
class MalformedEntry:
    """A stream entry that is not a message (a field missing, a number that
    is not one): what could be read of it, and why it cannot run.  The core
    moves it to the dead-letter stream, and fails its key when the entry is
    the key's current message."""

    delivery_id: str
    reason: str
    key: str | None = None
    generation: int | None = None
    #: the entry's fields as the store holds them, for the dead-letter stream
    fields: tuple[tuple[str, bytes], ...] = ()


@attrs.frozen(slots=True, kw_only=True)
class DeadLetter:
    """An entry of the dead-letter stream: a malformed message set aside."""

    entry_id: str
    #: the delivery id the entry had in the queue
    original_id: str
    reason: str
    dead_at: float
    key: str | None = None
    fields: tuple[tuple[str, bytes], ...] = ()


@attrs.frozen(slots=True, kw_only=True)
class RetryPolicy:
    """``Retry``/``ExponentialRetry`` reduced to numbers.

    ``attempts`` is the total number of attempts (``None`` retries forever).
    ``decisions.retry_delay`` says how long to wait after each attempt:
    ``delay``, or when ``exponential`` ``delay * 2 ** (n - 1)`` capped at
    ``maximum_delay`` (uncapped by default).
    """

    attempts: int | None
    delay: float
    exponential: bool = False
    maximum_delay: float = math.inf


@attrs.frozen(slots=True, kw_only=True)
class PerpetualPolicy:
    """``Perpetual(every, automatic)`` reduced to numbers; a ``Cron`` is a
    perpetual task whose next run is the next instant of ``cron``."""

    every: float
    automatic: bool = False
    cron: CronPolicy | None = None


@attrs.frozen(slots=True, kw_only=True)
class ConcurrencyPolicy:
    """A resolved ``ConcurrencyLimit``: the store key of the limit and its size.

    ``scope`` names where the limit's slots and waiters live: ``None`` for the
    task's own docket, else the scope every docket naming it shares (a docket
    whose name is the scope shares it too)."""

    limit_key: str
    max_concurrent: int
    scope: str | None = None


@attrs.frozen(slots=True, kw_only=True)
class HeldSlot:
    """A concurrency slot a delivery holds: its limit, its scope, its holder."""

    limit_key: str
    holder: str
    scope: str | None = None


@attrs.frozen(slots=True, kw_only=True)
class TaskPolicy:
    """Everything the core needs to know about a task function to drive it."""

    retry: RetryPolicy | None = None
    perpetual: PerpetualPolicy | None = None
    timeout: float | None = None
    concurrency: ConcurrencyPolicy | None = None
    #: admission controls (``Debounce``, ``Cooldown``, ``RateLimit``), in gate order
    admission: tuple[Control, ...] = ()


NO_POLICY = TaskPolicy()


@attrs.frozen(slots=True, kw_only=True)
class ExecutionRecord:
    """What the store knows about one key: its latest execution."""

    key: str
    function: str
    payload: bytes
    when: float
    attempt: int
    generation: int
    state: ExecutionState
    worker: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    error: str | None = None
    #: the pickled return value or exception, when one was kept
    result: bytes | None = None
    #: set on a running record whose key was cancelled while it ran: the ttl
    #: the cancel gave, kept for the record once it concludes (its run's own
    #: end, or ``cancelled`` when the run never ends on its worker)
    cancel_ttl: float | None = None


@attrs.frozen(slots=True, kw_only=True)
class ProgressRecord:
    """A running task's progress as reported through ``Progress``."""

    current: int = 0
    total: int = DEFAULT_PROGRESS_TOTAL
    message: str | None = None
    updated_at: float | None = None


@attrs.frozen(slots=True, kw_only=True)
class WorkerRecord:
    """A live worker as seen through its heartbeats."""

    name: str
    last_seen: float
    tasks: frozenset[str]


@attrs.frozen(slots=True, kw_only=True)
class RunningRecord:
    """A message some worker holds right now."""

    message: TaskMessage
    worker: str
    started: float


@attrs.frozen(slots=True, kw_only=True)
class StoreSnapshot:
    """The raw material of ``Docket.snapshot()``."""

    taken: float
    #: scheduled or queued messages, soonest first (at most a page of them)
    future: tuple[TaskMessage, ...]
    running: tuple[RunningRecord, ...]
    workers: tuple[WorkerRecord, ...]
    #: how many messages are scheduled, queued or parked, and how many are
    #: held by workers, in all (the lists above may show fewer)
    future_total: int = 0
    running_total: int = 0
    #: entries that cannot be read as messages, still in the queue
    malformed: tuple[MalformedEntry, ...] = ()
    #: how many entries the dead-letter stream holds
    dead_letters: int = 0
