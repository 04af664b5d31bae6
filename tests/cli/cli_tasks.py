"""Tasks for the command-line tests (imported by a worker subprocess)."""

from __future__ import annotations

import os


async def record_pid(n: int) -> int:
    return os.getpid() * 1000 + n


tasks = [record_pid]


async def fallback(*args: object, **kwargs: object) -> str:
    return f"fallback{args}"
