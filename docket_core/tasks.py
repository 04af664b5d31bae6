"""Tasks every docket knows: ``trace``, ``fail`` and ``sleep``."""

from __future__ import annotations

import logging

import anyio

from .dependencies import Retry, TaskKey

logger = logging.getLogger("docket.tasks")


async def trace(message: str, key: str = TaskKey()) -> None:
    """Log ``message``."""
    logger.info("%s: %s", key, message)


async def fail(message: str, retry: Retry = Retry(attempts=2)) -> None:
    """Raise an error carrying ``message`` (retried once)."""
    raise Exception(message)


async def sleep(seconds: float) -> None:
    """Sleep for ``seconds``."""
    await anyio.sleep(seconds)


standard_tasks = [trace, fail, sleep]

__all__ = ["fail", "sleep", "standard_tasks", "trace"]
