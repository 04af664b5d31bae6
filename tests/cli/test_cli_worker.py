"""``docket worker`` and the inspection commands, against real servers: a
worker subprocess drains, lists itself, answers its healthcheck and serves its
metrics to Prometheus."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
from servers import free_port

from docket_core import Disposition, Docket, ExecutionState, Progress, Worker

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends("redis-asyncio", "glide_valkey-asyncio"),
]

TESTS = Path(__file__).parent


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.run(
        [sys.executable, "-m", "docket_core", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


async def test_the_worker_command_drains_a_docket(docket: Docket, docket_url: str) -> None:
    from cli_tasks import record_pid

    docket.register(record_pid)
    executions = [await docket.add(record_pid)(n) for n in range(20)]
    result = run_cli(
        "worker",
        "--url",
        docket_url,
        "--docket",
        docket.name,
        "--tasks",
        "cli_tasks:tasks",
        "--until-finished",
        "--minimum-check-interval",
        "10ms",
    )
    assert result.returncode == 0, result.stderr
    results = []
    for execution in executions:
        stored = await docket.get_execution(execution.key)
        assert stored is not None and stored.state is ExecutionState.COMPLETED
        results.append(await execution.get_result())
    # every call ran in the worker process, not in this one
    assert {r // 1000 for r in results} != {os.getpid()}
    assert sorted(r % 1000 for r in results) == list(range(20))


async def test_snapshot_strike_and_clear_commands(docket: Docket, docket_url: str) -> None:
    from cli_tasks import record_pid

    await docket.add(record_pid, key="first")(1)
    common = ["--url", docket_url, "--docket", docket.name]
    result = run_cli("snapshot", *common)
    assert result.returncode == 0, result.stderr
    assert "first" in result.stdout and "record_pid" in result.stdout

    result = run_cli("strike", "record_pid", "n", ">=", "int:10", *common)
    assert result.returncode == 0, result.stderr
    # a strike made by another process reaches this one within its refresh interval
    with anyio.fail_after(5):
        while (await docket.add(record_pid)(10)).disposition is not Disposition.STRUCK:
            await anyio.sleep(0.1)
    assert (await docket.add(record_pid)(9)).disposition is Disposition.SCHEDULED
    result = run_cli("restore", "record_pid", "n", ">=", "int:10", *common)
    assert result.returncode == 0, result.stderr
    with anyio.fail_after(5):
        while (await docket.add(record_pid)(11)).disposition is Disposition.STRUCK:
            await anyio.sleep(0.1)

    pending = len((await docket.snapshot()).future)
    assert pending >= 3
    result = run_cli("clear", *common)
    assert result.returncode == 0, result.stderr
    assert str(pending) in result.stdout
    assert (await docket.snapshot()).future == []


async def test_the_worker_command_takes_a_fallback_task(docket: Docket, docket_url: str) -> None:
    async def retired_task(n: int) -> None:
        raise AssertionError("never runs here")

    execution = await docket.add(retired_task)(5)
    result = run_cli(
        "worker",
        "--url",
        docket_url,
        "--docket",
        docket.name,
        "--tasks",
        "cli_tasks:tasks",
        "--fallback-task",
        "cli_tasks:fallback",
        "--until-finished",
        "--minimum-check-interval",
        "10ms",
    )
    assert result.returncode == 0, result.stderr
    assert await execution.get_result() == "fallback(5,)"


# -- watch, the built-in tasks, workers for-task, the healthcheck ---------------------------


async def test_watch_follows_a_task_to_its_end(docket: Docket, docket_url: str) -> None:
    async def reporting(progress: Progress = Progress()) -> None:
        await progress.set_total(2)
        for step in ("halfway", "done"):
            await anyio.sleep(0.2)
            await progress.increment()
            await progress.set_message(step)

    docket.register(reporting)
    when = datetime.now(UTC) + timedelta(seconds=3)  # the watcher's process starts first
    await docket.add(reporting, key="watched", when=when)()
    common = ["--url", docket_url, "--docket", docket.name]
    watched: list[subprocess.CompletedProcess[str]] = []

    async def watch() -> None:
        watched.append(await anyio.to_thread.run_sync(run_cli, "watch", "watched", *common))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            worker = Worker(docket, minimum_check_interval=timedelta(milliseconds=10))
            await worker.run_until_finished()
    (result,) = watched
    assert result.returncode == 0, result.stderr
    lines = [line.split(" ", 2)[2] for line in result.stdout.splitlines()]
    assert lines[0] == "state scheduled"
    assert lines[-1] == "state completed"
    assert any(line.startswith("state running on ") for line in lines)
    assert "progress 2/2 done" in lines
    assert lines.index("progress 1/2 halfway") < lines.index("progress 2/2 done")


async def test_watch_of_an_unknown_key_is_a_clear_error(docket: Docket, docket_url: str) -> None:
    result = run_cli("watch", "nope", "--url", docket_url, "--docket", docket.name)
    assert result.returncode == 2
    assert "has no execution 'nope'" in result.stderr


async def test_the_tasks_command_adds_the_builtin_tasks(docket: Docket, docket_url: str) -> None:
    common = ["--url", docket_url, "--docket", docket.name]
    result = run_cli("tasks", "trace", "hello there", "--delay", "1h", *common)
    assert result.returncode == 0, result.stderr
    key = trace_key = result.stdout.strip().split("'")[1]
    execution = await docket.get_execution(key)
    assert execution is not None and execution.function_name == "trace"
    assert execution.state is ExecutionState.SCHEDULED
    assert execution.args == ("hello there",)
    assert execution.when > datetime.now(UTC) + timedelta(minutes=59)

    result = run_cli("tasks", "sleep", "0.01", *common)
    assert result.returncode == 0, result.stderr
    key = result.stdout.strip().split("'")[1]
    await docket.cancel(trace_key)
    with anyio.fail_after(10):
        await Worker(docket, minimum_check_interval=timedelta(milliseconds=10)).run_until_finished()
    execution = await docket.get_execution(key)
    assert execution is not None and execution.state is ExecutionState.COMPLETED


async def test_workers_for_task_lists_the_workers_that_run_it(
    docket: Docket, docket_url: str
) -> None:
    from cli_tasks import record_pid

    docket.register(record_pid)
    common = ["--url", docket_url, "--docket", docket.name]
    async with anyio.create_task_group() as group:
        worker = Worker(docket, name="lister", minimum_check_interval=timedelta(milliseconds=10))
        group.start_soon(worker.run_forever)
        with anyio.fail_after(10):
            while not await docket.workers():
                await anyio.sleep(0.05)
        known = await anyio.to_thread.run_sync(
            run_cli, "workers", "for-task", "record_pid", *common
        )
        unknown = await anyio.to_thread.run_sync(run_cli, "workers", "for-task", "nothing", *common)
        group.cancel_scope.cancel()
    assert known.returncode == 0, known.stderr
    assert "lister" in known.stdout
    assert unknown.returncode == 0, unknown.stderr
    assert "lister" not in unknown.stdout


async def test_the_worker_answers_its_healthcheck(docket: Docket, docket_url: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    command = [
        *(sys.executable, "-m", "docket_core", "worker", "--healthcheck-port", str(port)),
        *("--url", docket_url, "--docket", docket.name, "--tasks", "cli_tasks:tasks"),
    ]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/"

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except OSError:
            return 0, ""

    try:
        with anyio.fail_after(20):
            while (answer := await anyio.to_thread.run_sync(get)) != (200, "ok\n"):
                assert answer[0] in (0, 503), answer
                await anyio.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr


# -- the worker command serves Prometheus ---------------------------------------------------


@pytest.mark.backends("redis-asyncio")
async def test_the_worker_command_serves_metrics_to_prometheus(
    docket: Docket, docket_url: str
) -> None:
    from cli_tasks import record_pid

    docket.register(record_pid)
    executions = [await docket.add(record_pid)(n) for n in range(5)]
    port = free_port()
    env = dict(os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    command = [
        *(sys.executable, "-m", "docket_core", "worker"),
        *("--url", docket_url, "--docket", docket.name, "--tasks", "cli_tasks:tasks"),
        *("--metrics-port", str(port), "--minimum-check-interval", "10ms"),
    ]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        with anyio.fail_after(30):
            for execution in executions:
                while (stored := await docket.get_execution(execution.key)) is None or (
                    stored.state is not ExecutionState.COMPLETED
                ):
                    await anyio.sleep(0.05)
        url = f"http://127.0.0.1:{port}/metrics"
        body = await anyio.to_thread.run_sync(lambda: urllib.request.urlopen(url).read().decode())
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    started = [
        line
        for line in body.splitlines()
        if line.startswith("docket_tasks_started") and f'docket_name="{docket.name}"' in line
    ]
    assert started and started[0].endswith(" 5.0"), body
    assert "docket_task_duration" in body
