"""Fixtures of the dashboard tests: a dashboard served on a free loopback port.

``open_dashboard(docket, interval=0.2)`` is an async context manager: it runs
``run_dashboard`` on ``docket`` in the background and yields the page's base
URL (``http://127.0.0.1:<port>/``), stopping the server when the block ends.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio
import pytest

from docket_core import Docket
from docket_core.dashboard import run_dashboard

OpenDashboard = Callable[..., AbstractAsyncContextManager[str]]


@asynccontextmanager
async def _serving(docket: Docket, interval: float = 0.2) -> AsyncIterator[str]:
    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            serve = functools.partial(
                run_dashboard, docket, host="127.0.0.1", port=0, interval=interval
            )
            port: int = await group.start(serve)
            try:
                yield f"http://127.0.0.1:{port}/"
            finally:
                group.cancel_scope.cancel()


@pytest.fixture
def open_dashboard() -> OpenDashboard:
    return _serving
