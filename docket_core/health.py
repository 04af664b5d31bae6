"""A worker's health, as a liveness or readiness probe sees it.

``Health`` is what a probe is told; ``HealthState`` follows one worker run
through the events the worker reports (``Worker.health`` reads it), and
``serve_healthcheck`` answers HTTP probes from it (``docket worker
--healthcheck-port``, ``Worker.run(healthcheck_port=...)``).

A worker is ready once a SIGTERM would drain it and the store answered:
its signal handlers are installed (when it has any: one that does not run
in the main thread, or was made with ``handle_signals=False``, leaves the
signals to its host) and its first read reached the store.  It then stays
ready until it starts to drain, save while the store is lost: from a read
that failed or a batch that got no reply, to the next read or batch the
store answers.  Only ``READY`` answers 200; every other state answers 503.
"""

from __future__ import annotations

import enum
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio

__all__ = ["Health", "HealthState", "close_healthcheck", "serve_healthcheck", "stop_signals"]

#: the signals that drain a worker (a second one stops it at once)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Health(enum.Enum):
    """Where a worker stands; the value is what a probe's body says."""

    #: not yet able to drain on a signal, or its store not yet reached
    STARTING = "starting"
    #: taking work: the only healthy state
    READY = "ready"
    #: its last read failed, or a batch got no reply, and nothing came back since
    STORE_LOST = "store lost"
    #: asked to stop: it takes no more work and finishes what it runs
    DRAINING = "draining"
    #: its run is over
    STOPPED = "stopped"

    @property
    def healthy(self) -> bool:
        return self is Health.READY


class HealthState:
    """The health of one worker run, from the events the worker reports.

    Only the worker's event loop changes it; any thread may read ``health``
    (one attribute, replaced whole on every change)."""

    __slots__ = ("_draining", "_lost", "_reached", "_signals", "_stopped", "health")

    health: Health

    def __init__(self) -> None:
        self.begin(signals=True)

    def begin(self, *, signals: bool) -> None:
        """A run begins; ``signals``: it must install its signal handlers
        before it is ready."""
        self._signals = not signals
        self._reached = self._lost = self._draining = self._stopped = False
        self._update()

    def signals_installed(self) -> None:
        """A SIGTERM or SIGINT now drains the worker."""
        self._signals = True
        self._update()

    def read_succeeded(self) -> None:
        """A read reached the store."""
        self._reached = True
        self._lost = False
        self._update()

    def store_answered(self) -> None:
        """A batch got its reply: the store is there (a worker whose
        capacity is full reads nothing, so its batches tell)."""
        self._lost = False
        self._update()

    def store_lost(self) -> None:
        """A read failed, or a batch got no reply."""
        self._lost = True
        self._update()

    def draining(self) -> None:
        """The worker was asked to stop."""
        self._draining = True
        self._update()

    def stopped(self) -> None:
        """The run is over."""
        self._stopped = True
        self._update()

    def _update(self) -> None:
        if self._stopped:
            health = Health.STOPPED
        elif self._draining:
            health = Health.DRAINING
        elif self._lost:
            health = Health.STORE_LOST
        elif self._signals and self._reached:
            health = Health.READY
        else:
            health = Health.STARTING
        self.health = health


def serve_healthcheck(
    port: int | None, health: Callable[[], Health], host: str = "0.0.0.0"
) -> ThreadingHTTPServer | None:
    """Answer GET (and HEAD) on ``port``, from a thread: 200 ``ok`` while
    ``health()`` is ``READY``, else 503 with the state (``draining``...).
    Returns the server (``close_healthcheck`` stops it), or None without a port."""
    if not port:
        return None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(body=True)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def _answer(self, *, body: bool) -> None:
            state = health()
            text = b"ok\n" if state.healthy else f"{state.value}\n".encode()
            self.send_response(200 if state.healthy else 503)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(text)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(text)

        def log_message(self, format: str, *args: Any) -> None:
            return None  # probes every few seconds would flood the log

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="docket-healthcheck", daemon=True).start()
    return server


def close_healthcheck(server: ThreadingHTTPServer) -> None:
    """Stop serving and free the port (blocks until the serving thread ends)."""
    server.shutdown()
    server.server_close()


@contextmanager
def stop_signals(
    owned: bool, health: HealthState
) -> Iterator[AsyncIterator[signal.Signals] | None]:
    """Install the handlers of the stop signals for one worker run, when it
    ``owned`` them, and put back what was there after: asyncio resets a
    handler it removes to the default, and SIGTERM would then kill the
    process while it closes its docket."""
    if not owned:
        yield None
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    try:
        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
            health.signals_installed()
            yield signals
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
