"""Tasks for the command-line tests (imported by a worker subprocess)."""

from __future__ import annotations

import gc
import os


async def record_pid(n: int) -> int:
    return os.getpid() * 1000 + n


async def frozen_objects() -> int:
    """How many objects the garbage collector leaves alone (``gc.freeze``)."""
    return gc.get_freeze_count()


tasks = [record_pid, frozen_objects]


async def fallback(*args: object, **kwargs: object) -> str:
    return f"fallback{args}"
