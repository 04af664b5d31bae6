"""docket: distributed background tasks for Python, now or at any time.

The public API, with pydocket's names and semantics: a pydocket program ports
by changing its imports to ``docket_core``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from . import testing
from .adapter import ProgressEvent, StateEvent, StoreEvent
from .agenda import Agenda
from .dependencies import (
    CallArgument,
    ConcurrencyLimit,
    Cooldown,
    Cron,
    CurrentDocket,
    CurrentExecution,
    CurrentWorker,
    CycleError,
    Debounce,
    Depends,
    ExponentialRetry,
    ForcedRetry,
    Logged,
    Perpetual,
    Progress,
    RateLimit,
    Retry,
    Shared,
    TaskArgument,
    TaskKey,
    TaskLogger,
    Timeout,
)
from .docket import Docket, DocketSnapshot, RunningExecution, WorkerInfo
from .execution import Execution, TaskCall
from .sansio.errors import (
    DocketError,
    ExecutionCancelled,
    StoreError,
    StoreUnavailable,
    UsageError,
)
from .sansio.strikes import Operator
from .sansio.values import Disposition, ExecutionState
from .strikelist import Restore, Strike, StrikeList
from .worker import Worker

try:
    __version__ = version("docket")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"

__all__ = [
    "Agenda",
    "CallArgument",
    "ConcurrencyLimit",
    "Cooldown",
    "Cron",
    "CurrentDocket",
    "CurrentExecution",
    "CurrentWorker",
    "CycleError",
    "Debounce",
    "Depends",
    "Disposition",
    "Docket",
    "DocketError",
    "DocketSnapshot",
    "Execution",
    "ExecutionCancelled",
    "ExecutionState",
    "ExponentialRetry",
    "ForcedRetry",
    "Logged",
    "Operator",
    "Perpetual",
    "Progress",
    "ProgressEvent",
    "RateLimit",
    "Restore",
    "Retry",
    "RunningExecution",
    "Shared",
    "StateEvent",
    "StoreError",
    "StoreEvent",
    "StoreUnavailable",
    "Strike",
    "StrikeList",
    "TaskArgument",
    "TaskCall",
    "TaskKey",
    "TaskLogger",
    "Timeout",
    "UsageError",
    "Worker",
    "WorkerInfo",
    "__version__",
    "testing",
]
