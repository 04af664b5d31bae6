"""A worker's health and its healthcheck: 503 while it starts, 200 once a
SIGTERM would drain it and its store answered, 503 while it drains and while
its store is lost, 200 again once the store is back.

The embedded worker runs in this process (``handle_signals=False``, as in a
web server's lifespan); the worker of ``Worker.run(healthcheck_port=...)``
runs as a subprocess, and the race test sends it SIGTERM the moment its
healthcheck first says 200: it must drain, never die.  CI runs the race a few
times per backend; ``DOCKET_HEALTH_ROUNDS=50`` runs it 50 times.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from helpers import make_worker
from servers import Server, free_port, redis_server_binary

from docket_core import Docket, ExecutionState, Worker
from docket_core.health import (
    Health,
    HealthState,
    close_healthcheck,
    serve_healthcheck,
)

pytestmark = pytest.mark.anyio

ROUNDS = int(os.environ.get("DOCKET_HEALTH_ROUNDS", "3"))

Answer = tuple[int, str]


def probe(port: int) -> Answer:
    """One GET of the healthcheck: (status, body), or (0, "") when nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


async def probe_until(port: int, wanted: Answer, allowed: set[Answer], limit: float = 20) -> None:
    """Probe until ``wanted``; every answer before it must be one of ``allowed``."""
    with anyio.fail_after(limit):
        while (answer := await anyio.to_thread.run_sync(probe, port)) != wanted:
            assert answer in allowed, answer
            await anyio.sleep(0.02)


async def health_becomes(worker: Worker, wanted: Health, limit: float = 20) -> None:
    with anyio.fail_after(limit):
        while worker.health is not wanted:
            await anyio.sleep(0.01)


@asynccontextmanager
async def healthcheck(worker: Worker) -> AsyncIterator[int]:
    port = free_port()
    server = serve_healthcheck(port, lambda: worker.health, host="127.0.0.1")
    assert server is not None
    try:
        yield port
    finally:
        await anyio.to_thread.run_sync(close_healthcheck, server)


STARTING, READY = (503, "starting\n"), (200, "ok\n")
DRAINING, LOST, STOPPED = (503, "draining\n"), (503, "store lost\n"), (503, "stopped\n")


# -- the states --------------------------------------------------------------------------


def test_ready_needs_the_signal_handlers_and_a_read() -> None:
    state = HealthState()
    assert state.health is Health.STARTING
    state.read_succeeded()
    assert state.health is Health.STARTING  # a SIGTERM would not drain it yet
    state.signals_installed()
    assert state.health is Health.READY
    state.store_lost()
    assert state.health is Health.STORE_LOST
    state.store_answered()
    assert state.health is Health.READY
    state.store_lost()
    state.read_succeeded()
    assert state.health is Health.READY
    state.draining()
    state.read_succeeded()
    assert state.health is Health.DRAINING
    state.stopped()
    assert state.health is Health.STOPPED
    state.begin(signals=False)  # a run of its own: handlers are the host's business
    assert state.health is Health.STARTING
    state.store_lost()
    assert state.health is Health.STORE_LOST  # (never reached its store yet)
    state.read_succeeded()
    assert state.health is Health.READY
    assert [h for h in Health if h.healthy] == [Health.READY]


# -- an embedded worker --------------------------------------------------------------------


@pytest.mark.backends("memory-asyncio", "memory-trio", "redis-asyncio", "glide_valkey-asyncio")
async def test_an_embedded_worker_answers_from_its_own_state(docket: Docket) -> None:
    started, release = anyio.Event(), anyio.Event()

    async def hold() -> str:
        started.set()
        await release.wait()
        return "held"

    docket.register(hold)
    worker = make_worker(docket, handle_signals=False, schedule_automatic_tasks=False)
    handler = signal.getsignal(signal.SIGTERM)
    stop = anyio.CancelScope()

    async def run() -> None:
        with stop:
            await worker.run_forever()

    async with healthcheck(worker) as port:
        assert worker.health is Health.STARTING
        assert await anyio.to_thread.run_sync(probe, port) == STARTING
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await probe_until(port, READY, {STARTING})
                # ready without handlers: the host owns the signals
                assert signal.getsignal(signal.SIGTERM) is handler
                execution = await docket.add(hold)()
                await started.wait()
                stop.cancel()  # the host stops it: it drains
                await health_becomes(worker, Health.DRAINING)
                assert await anyio.to_thread.run_sync(probe, port) == DRAINING
                await anyio.sleep(0.1)
                assert await anyio.to_thread.run_sync(probe, port) == DRAINING
                release.set()
        assert worker.health is Health.STOPPED
        assert await anyio.to_thread.run_sync(probe, port) == STOPPED
    assert await execution.get_result() == "held"


@pytest.mark.parametrize("handle_signals", [True, False])
async def test_a_worker_holds_the_stop_signals_only_while_it_runs(
    docket: Docket, handle_signals: bool
) -> None:
    def host_handler(signum: int, frame: object) -> None:
        raise AssertionError("the host's handler must not run here")

    # the host's own handlers (an earlier test may have left asyncio's no-op
    # handler installed, which is also the one a running worker installs)
    stop_signals = (signal.SIGTERM, signal.SIGINT)
    previous = {signum: signal.signal(signum, host_handler) for signum in stop_signals}
    try:
        before = {signum: signal.getsignal(signum) for signum in stop_signals}
        worker = make_worker(docket, handle_signals=handle_signals, schedule_automatic_tasks=False)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(worker.run_forever)
                await health_becomes(worker, Health.READY)
                during = {signum: signal.getsignal(signum) for signum in before}
                group.cancel_scope.cancel()
        after = {signum: signal.getsignal(signum) for signum in before}
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert after == before
    if handle_signals:
        assert all(during[signum] is not before[signum] for signum in before), during
    else:
        assert during == before


# -- the store goes and comes back ---------------------------------------------------------


@pytest.fixture
def own_server() -> Iterator[Server]:
    """A private server of this test alone: it gets stopped and started again."""
    binary = redis_server_binary()
    if binary is None:
        pytest.skip("redis-server is not installed")
    server = Server(binary).start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.mark.backends("redis-asyncio", "glide_redis-asyncio")
async def test_the_health_says_when_the_store_is_lost_and_back(
    backend: str, own_server: Server
) -> None:
    scheme = "glide" if backend.startswith("glide") else "redis"
    url = f"{scheme}://127.0.0.1:{own_server.port}/0"
    async with Docket(name=f"health-{uuid.uuid4().hex}", url=url) as docket:
        worker = make_worker(
            docket,
            handle_signals=False,
            schedule_automatic_tasks=False,
            minimum_check_interval=timedelta(milliseconds=20),
            reconnection_delay=timedelta(milliseconds=100),
        )
        async with healthcheck(worker) as port, anyio.create_task_group() as group:
            group.start_soon(worker.run_forever)
            await probe_until(port, READY, {STARTING})
            own_server.stop()
            await probe_until(port, LOST, {READY})
            await anyio.sleep(0.5)  # reads keep failing: still lost
            assert await anyio.to_thread.run_sync(probe, port) == LOST
            await anyio.to_thread.run_sync(own_server.start)
            await probe_until(port, READY, {LOST}, limit=30)
            group.cancel_scope.cancel()
        assert worker.health is Health.STOPPED


# -- Worker.run(healthcheck_port=...) in a process of its own --------------------------

WORKER_SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    import time
    from datetime import timedelta

    import anyio

    from docket_core import TaskKey, Worker

    url, docket_name, port, log = sys.argv[1:]


    def note(line: str) -> None:
        with open(log, "a") as out:
            out.write(line + "\\n")


    async def pause(seconds: float, key: str = TaskKey()) -> str:
        note(f"started {key}")
        await anyio.sleep(seconds)
        note(f"ended {key}")
        return "paused"


    async def hold(release: str, key: str = TaskKey()) -> str:
        note(f"started {key}")
        while not os.path.exists(release):
            await anyio.sleep(0.01)
        note(f"ended {key}")
        return "held"


    tasks = [pause, hold]

    anyio.run(
        lambda: Worker.run(
            docket_name,
            url,
            healthcheck_port=int(port),
            tasks=["__main__:tasks"],
            name="healthy",
            minimum_check_interval=timedelta(milliseconds=10),
            schedule_automatic_tasks=False,
        )
    )
    note("exited")
    """
)


async def pause(seconds: float) -> str:
    """The producer's twin of the worker's task (same name and signature)."""
    raise AssertionError("runs only in the worker process")


async def hold(release: str) -> str:
    raise AssertionError("runs only in the worker process")


@attrs.define
class WorkerProcess:
    """A ``Worker.run`` subprocess with its healthcheck port, its tasks' log
    and its output."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    out_path: Path

    def log(self) -> list[str]:
        return self.log_path.read_text().splitlines() if self.log_path.exists() else []

    def output(self) -> str:
        return self.out_path.read_text()[-3000:]

    async def exited(self, limit: float = 30) -> int:
        with anyio.fail_after(limit):
            while self.process.poll() is None:
                await anyio.sleep(0.02)
        return self.process.returncode


@asynccontextmanager
async def worker_process(
    docket_url: str, name: str, tmp_path: Path
) -> AsyncIterator[WorkerProcess]:
    script, log, out = tmp_path / "worker.py", tmp_path / "runs.log", tmp_path / "worker.out"
    script.write_text(WORKER_SCRIPT)
    port = free_port()
    with out.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, str(script), docket_url, name, str(port), str(log)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        yield WorkerProcess(process, port, log, out)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.backends("redis-asyncio", "glide_valkey-asyncio")
@pytest.mark.parametrize("attempt", range(ROUNDS))
async def test_sigterm_the_moment_the_health_says_200_drains(
    make_docket: Callable[..., Any], docket_url: str, tmp_path: Path, attempt: int
) -> None:
    name = f"race-{uuid.uuid4().hex}"
    docket = await make_docket(name)
    docket.register(pause)
    execution = await docket.add(pause, key="pause")(0.3)
    async with worker_process(docket_url, name, tmp_path) as worker:
        await probe_until(worker.port, READY, {(0, ""), STARTING})
        worker.process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = await worker.exited()
    assert code == 0, worker.output()
    # the task the first read took ran to its end before the worker left
    assert worker.log() == ["started pause", "ended pause", "exited"], worker.output()
    stored = await docket.get_execution("pause")
    assert stored is not None and stored.state is ExecutionState.COMPLETED
    assert await execution.get_result() == "paused"
    assert await docket.workers() == []
    print(f"\nround {attempt}: stopped {time.monotonic() - sent:.2f}s after SIGTERM")


@pytest.mark.backends("redis-asyncio", "glide_valkey-asyncio")
async def test_a_draining_worker_process_answers_503_until_it_exits(
    make_docket: Callable[..., Any], docket_url: str, tmp_path: Path
) -> None:
    name = f"drain-{uuid.uuid4().hex}"
    docket = await make_docket(name)
    docket.register(hold)
    release = tmp_path / "release"
    await docket.add(hold, key="hold")(str(release))
    async with worker_process(docket_url, name, tmp_path) as worker:
        await probe_until(worker.port, READY, {(0, ""), STARTING})
        with anyio.fail_after(20):
            while worker.log() != ["started hold"]:
                await anyio.sleep(0.02)
        worker.process.send_signal(signal.SIGTERM)
        await probe_until(worker.port, DRAINING, {READY}, limit=10)
        for _ in range(5):  # it drains as long as its task runs
            await anyio.sleep(0.1)
            assert await anyio.to_thread.run_sync(probe, worker.port) == DRAINING
        release.touch()
        code = await worker.exited()
        # the probe went with the worker
        assert await anyio.to_thread.run_sync(probe, worker.port) == (0, "")
    assert code == 0, worker.output()
    assert worker.log() == ["started hold", "ended hold", "exited"]
    stored = await docket.get_execution("hold")
    assert stored is not None and stored.state is ExecutionState.COMPLETED
