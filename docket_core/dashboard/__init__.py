"""A read-only web page of one docket, updated live (``docket dashboard``).

The page shows counts by state over time, running tasks with their progress,
the schedule of the next hour, the workers and their last heartbeat, recent
failures with their error, dead letters and strikes.  It reads the docket
through its public API every ``interval`` seconds and serves the page, its
script and the latest view from a small HTTP server on anyio streams: no
other dependency, nothing fetched from elsewhere, and no request that can
change the docket (any method but GET gets 405).

``serve_dashboard`` opens the docket and serves until interrupted;
``run_dashboard`` serves an entered ``Docket`` inside a running event loop.
"""

from __future__ import annotations

import logging
import signal
import threading

import anyio
from anyio.abc import TaskStatus

from ..docket import Docket
from .observer import Observer
from .server import DashboardServer

logger = logging.getLogger("docket.dashboard")


async def run_dashboard(
    docket: Docket,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    interval: float = 1.0,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Sample ``docket`` every ``interval`` seconds and serve its page on
    ``host``/``port`` until cancelled; tells ``task_status`` the bound port
    (``port=0`` picks a free one) once the first sample is in."""
    if interval <= 0:
        raise ValueError("the dashboard's interval must be positive")
    observer = Observer(docket, interval=interval)
    server = DashboardServer(lambda: observer.body, host=host, port=port)
    await sample(observer)
    async with anyio.create_task_group() as group:
        bound: int = await group.start(server.serve)
        logger.info(
            "dashboard of docket %r at http://%s:%d/",
            docket.name,
            f"[{host}]" if ":" in host else host,
            bound,
        )
        task_status.started(bound)
        while True:
            await anyio.sleep(interval)
            await sample(observer)


async def sample(observer: Observer) -> None:
    """One sample; a failure (the store down, say) shows on the page instead."""
    try:
        await observer.sample()
    except Exception as error:  # the page says what went wrong; the next sample retries
        logger.warning("the dashboard could not read docket %r: %s", observer.docket.name, error)
        observer.failed(error)


def serve_dashboard(
    *,
    url: str | None = None,
    name: str = "docket",
    host: str = "127.0.0.1",
    port: int = 8080,
    interval: float = 1.0,
) -> None:
    """Open docket ``name`` at ``url`` and serve its page on ``host``/``port``
    until SIGINT or SIGTERM (blocking)."""

    async def main() -> None:
        async with Docket(name=name, url=url) as docket, anyio.create_task_group() as group:
            if threading.current_thread() is threading.main_thread():
                group.start_soon(_stop_on_signal, group.cancel_scope)
            await run_dashboard(docket, host=host, port=port, interval=interval)

    try:
        anyio.run(main)
    except KeyboardInterrupt:  # (outside the main thread, or before the handler is in)
        pass


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            logger.info("dashboard got signal %s: stopping", signum)
            scope.cancel()
            return


__all__ = ["DashboardServer", "Observer", "run_dashboard", "serve_dashboard"]
