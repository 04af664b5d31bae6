"""Tasks every docket knows: ``trace``, ``fail`` and ``sleep`` (``standard_tasks``).

They take pydocket's parameters and say what pydocket's say, so
``docket tasks trace "hello"`` reads the same in a worker's log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio

from .dependencies import CurrentDocket, CurrentExecution, CurrentWorker, Retry, TaskLogger

if TYPE_CHECKING:
    from .docket import Docket
    from .execution import Execution
    from .worker import Worker

TaskCollection = Iterable[Callable[..., Any]]


def _waited(execution: Execution) -> str:
    return str(datetime.now(UTC) - execution.when)


async def trace(
    message: str,
    logger: logging.LoggerAdapter[logging.Logger] = TaskLogger(),
    docket: Docket = CurrentDocket(),
    worker: Worker = CurrentWorker(),
    execution: Execution = CurrentExecution(),
) -> None:
    """Log ``message``, with how long the call waited and who runs it."""
    logger.info(
        "%s: %r added to docket %r %s ago now running on worker %r",
        message,
        execution.key,
        docket.name,
        _waited(execution),
        worker.name,
    )


async def fail(
    message: str,
    docket: Docket = CurrentDocket(),
    worker: Worker = CurrentWorker(),
    execution: Execution = CurrentExecution(),
    retry: Retry = Retry(attempts=2),
) -> None:
    """Raise an error carrying ``message`` (tried twice)."""
    raise Exception(
        f"{message}: {execution.key} added to docket {docket.name} "
        f"{_waited(execution)} ago now running on worker {worker.name}"
    )


async def sleep(
    seconds: float, logger: logging.LoggerAdapter[logging.Logger] = TaskLogger()
) -> None:
    """Sleep for ``seconds``."""
    logger.info("Sleeping for %s seconds", seconds)
    await anyio.sleep(seconds)


standard_tasks: list[Callable[..., Any]] = [trace, fail, sleep]

__all__ = ["TaskCollection", "fail", "sleep", "standard_tasks", "trace"]
