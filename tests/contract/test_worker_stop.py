"""A stopping worker ends within a bound: its drain timeout for tasks that
run on, soon after its last task when the store is gone (what it cannot
send is given up; the store hands the deliveries out again), and at once on
a second SIGTERM or SIGINT (the runs it abandons are handed out again)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
from helpers import finish, make_worker
from servers import Server, redis_server_binary

from docket_core import Docket, ExecutionState

pytestmark = pytest.mark.anyio


async def test_a_drain_timeout_cancels_what_still_runs_and_leaves_it_to_redelivery(
    docket: Docket,
) -> None:
    runs: list[int] = []
    started = anyio.Event()

    async def stubborn() -> str:
        runs.append(1)
        started.set()
        if len(runs) == 1:
            await anyio.sleep(3600)
        return "done"

    docket.register(stubborn)
    execution = await docket.add(stubborn, key="stubborn")()
    worker = make_worker(
        docket,
        drain_timeout=timedelta(milliseconds=200),
        redelivery_timeout=timedelta(seconds=1),
        schedule_automatic_tasks=False,
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_forever)
            await started.wait()
            stopping = time.monotonic()
            group.cancel_scope.cancel()
    assert time.monotonic() - stopping < 1.5
    stored = await docket.get_execution("stubborn")  # nothing recorded about the run
    assert stored is not None and stored.state is ExecutionState.RUNNING
    # the store hands it out again once its lease lapses, and it runs to its end
    await finish(make_worker(docket, redelivery_timeout=timedelta(seconds=1)), limit=10)
    assert runs == [1, 1]
    assert await execution.get_result() == "done"


async def test_a_stop_without_draining_starts_none_of_the_runs_it_abandons(
    docket: Docket, caplog: pytest.LogCaptureFixture
) -> None:
    # a batch of runs that wait is started one by one, each as the one before
    # it waits (running.Runner's chain): a stop without draining comes while
    # most are still queued, and abandons them with the rest
    started: list[int] = []
    first = anyio.Event()

    async def waits(i: int) -> None:
        started.append(i)
        first.set()
        await anyio.sleep(3600)

    docket.register(waits)
    for i in range(40):
        await docket.add(waits, key=f"waits-{i}")(i)
    worker = make_worker(
        docket, concurrency=40, drain_timeout=timedelta(0), schedule_automatic_tasks=False
    )
    caplog.set_level(logging.INFO)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_forever)
            await first.wait()
            group.cancel_scope.cancel()
    at_stop = len(started)
    await anyio.sleep(0.2)
    assert len(started) == at_stop  # nothing it abandoned starts after it stopped
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    for i in range(40):  # nothing recorded as ended: the store hands them all out again
        stored = await docket.get_execution(f"waits-{i}")
        assert stored is not None and stored.state in (
            ExecutionState.QUEUED,
            ExecutionState.RUNNING,
        )


WORKER_SCRIPT = textwrap.dedent(
    """
    import logging
    import sys
    from datetime import timedelta

    import anyio

    from docket_core import Docket, Worker

    url, docket_name, log, drain = sys.argv[1:]


    async def work(seconds: float) -> None:
        with open(log, "a") as out:
            out.write("started\\n")
        await anyio.sleep(seconds)
        with open(log, "a") as out:
            out.write("ended\\n")


    async def main() -> None:
        logging.basicConfig(level=logging.INFO)
        async with Docket(name=docket_name, url=url) as docket:
            docket.register(work)
            worker = Worker(
                docket,
                name="stopping",
                minimum_check_interval=timedelta(milliseconds=10),
                reconnection_delay=timedelta(milliseconds=100),
                schedule_automatic_tasks=False,
                drain_timeout=None if drain == "none" else timedelta(seconds=float(drain)),
            )
            await worker.run_forever()
        print("worker stopped", flush=True)


    anyio.run(main)
    """
)


async def work(seconds: float) -> None:
    """The producer's twin of the worker's task (same name and signature)."""
    raise AssertionError("runs only in the worker process")


@pytest.fixture
def own_server() -> Iterator[Server]:
    """A private server of this test alone: it gets killed."""
    binary = redis_server_binary()
    if binary is None:
        pytest.skip("redis-server is not installed")
    server = Server(binary).start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.mark.backends("redis-asyncio", "glide_redis-asyncio")
@pytest.mark.parametrize(
    ("seconds", "drain", "bound"),
    [
        # the task ends after the server is gone: its finish is given up
        (1.0, "none", 8.0),
        # the task runs on: the drain timeout stops it
        (3600.0, "1.0", 6.0),
    ],
    ids=["task-ends", "drain-timeout"],
)
async def test_sigterm_stops_a_worker_whose_server_is_gone(
    backend: str, own_server: Server, tmp_path: Path, seconds: float, drain: str, bound: float
) -> None:
    scheme = "glide" if backend.startswith("glide") else "redis"
    url = f"{scheme}://127.0.0.1:{own_server.port}/0"
    name = f"stop-{uuid.uuid4().hex}"
    async with Docket(name=name, url=url) as docket:
        docket.register(work)
        await docket.add(work, key="work")(seconds)
    script, log, out = tmp_path / "worker.py", tmp_path / "runs.log", tmp_path / "worker.out"
    script.write_text(WORKER_SCRIPT)
    with out.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, str(script), url, name, str(log), drain],
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        with anyio.fail_after(20):
            while not (log.exists() and "started" in log.read_text()):
                assert process.poll() is None, out.read_text()[-3000:]
                await anyio.sleep(0.02)
        own_server.kill()
        if seconds < 10:
            await anyio.sleep(seconds + 0.2)  # the task ends; its finish finds no server
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        with anyio.fail_after(bound, shield=True):
            while process.poll() is None:
                await anyio.sleep(0.02)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output_text = out.read_text()
    assert process.returncode == 0, output_text[-3000:]
    assert "worker stopped" in output_text
    print(f"\n{backend} {drain}: stopped {took:.2f}s after SIGTERM")


@pytest.mark.backends("redis-asyncio", "glide_valkey-asyncio")
@pytest.mark.parametrize(
    ("first", "second"),
    [
        (signal.SIGTERM, signal.SIGTERM),
        (signal.SIGTERM, signal.SIGINT),
        (signal.SIGINT, signal.SIGTERM),
    ],
    ids=["term-term", "term-int", "int-term"],
)
async def test_a_second_signal_stops_at_once_and_the_run_is_redelivered(
    make_docket: Callable[..., Awaitable[Docket]],
    docket_url: str,
    tmp_path: Path,
    first: signal.Signals,
    second: signal.Signals,
) -> None:
    name = f"again-{uuid.uuid4().hex}"
    docket = await make_docket(name)
    docket.register(work)
    execution = await docket.add(work, key="work")(3600.0)
    script, log, out = tmp_path / "worker.py", tmp_path / "runs.log", tmp_path / "worker.out"
    script.write_text(WORKER_SCRIPT)
    with out.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, str(script), docket_url, name, str(log), "none"],
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        with anyio.fail_after(20):
            while not (log.exists() and "started" in log.read_text()):
                assert process.poll() is None, out.read_text()[-3000:]
                await anyio.sleep(0.02)
            process.send_signal(first)
            while ": draining" not in out.read_text():
                await anyio.sleep(0.02)
        await anyio.sleep(0.3)
        assert process.poll() is None, "the first signal drains: the task runs on"
        process.send_signal(second)
        sent = time.monotonic()
        with anyio.fail_after(5, shield=True):
            while process.poll() is None:
                await anyio.sleep(0.02)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output_text = out.read_text()
    assert process.returncode == 0, output_text[-3000:]
    assert "again: stopping" in output_text and "stops without draining" in output_text
    assert "worker stopped" in output_text
    assert log.read_text() == "started\n"  # it never ended there, and nothing recorded it
    stored = await docket.get_execution("work")
    assert stored is not None and stored.state is ExecutionState.RUNNING
    print(f"\n{first.name}, {second.name}: stopped {took:.2f}s after the second signal")

    # the store hands the abandoned run out again, and it runs to its end here
    runs: list[float] = []

    async def finishing(seconds: float) -> None:
        runs.append(seconds)

    runner = await make_docket(name)
    runner.register(finishing, names=["work"])
    await finish(make_worker(runner, redelivery_timeout=timedelta(seconds=1)), limit=15)
    assert runs == [3600.0]
    await execution.get_result()
    stored = await docket.get_execution("work")
    assert stored is not None and stored.state is ExecutionState.COMPLETED
