"""``docket worker`` and the inspection commands as subprocesses against real
servers, their output and exit statuses compared with pydocket's: a worker
drains, logs as JSON, lists itself, answers its healthcheck and serves its
metrics to Prometheus; strikes with every operator reach the producers;
``snapshot`` shows true totals; ``watch`` follows a run to its result."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest
from servers import Servers, command, free_port

from docket_core import Disposition, Docket, ExecutionState, Progress, Worker
from docket_core.lua.base import ScriptedStore

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.backends("redis-asyncio", "glide_valkey-asyncio"),
]

TESTS = Path(__file__).parent


def cli_environment(**extra: str) -> dict[str, str]:
    """The environment of a ``docket`` subprocess: it can import ``cli_tasks``,
    prints 200 columns, and none of the ``DOCKET_*`` variables of this one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKET_")}
    env["PYTHONPATH"] = f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env["COLUMNS"] = "200"
    return {**env, **extra}


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "docket_core", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_environment(**env),
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


@pytest.mark.parametrize("flag", ["--freeze-gc", "--no-freeze-gc", None])
async def test_the_worker_command_freezes_the_heap_unless_told_not_to(
    docket: Docket, docket_url: str, flag: str | None
) -> None:
    from cli_tasks import frozen_objects

    docket.register(frozen_objects)
    execution = await docket.add(frozen_objects)()
    common = ["--url", docket_url, "--docket", docket.name, "--tasks", "cli_tasks:tasks"]
    result = run_cli("worker", *common, "--until-finished", *([flag] if flag else []))
    assert result.returncode == 0, result.stderr
    frozen = await execution.get_result()
    if flag == "--no-freeze-gc":
        assert frozen == 0
    else:  # (the default)
        assert frozen > 1000


async def test_the_worker_takes_the_environment_and_logs_json(
    docket: Docket, docket_url: str
) -> None:
    from cli_tasks import record_pid

    docket.register(record_pid)
    execution = await docket.add(record_pid)(3)
    result = run_cli(
        *("worker", "--until-finished", "--logging-format", "json"),
        DOCKET_URL=docket_url,
        DOCKET_NAME=docket.name,
        DOCKET_TASKS="cli_tasks:tasks",
        DOCKET_WORKER_MINIMUM_CHECK_INTERVAL="10ms",
    )
    assert result.returncode == 0, result.stderr
    assert (await execution.get_result()) % 1000 == 3
    entries = [json.loads(line) for line in result.stdout.splitlines()]  # one object a line
    assert entries and all({"name", "asctime", "levelname", "message"} <= set(e) for e in entries)
    assert any(e["message"].startswith("Starting worker") for e in entries)
    # the records of the run carry its fields as extras
    assert any(execution.key in e.values() and e["name"] == "docket.worker" for e in entries)


async def test_snapshot_strike_and_clear_commands(docket: Docket, docket_url: str) -> None:
    from cli_tasks import record_pid

    await docket.add(record_pid, key="first")(1)
    common = ["--url", docket_url, "--docket", docket.name]
    result = run_cli("snapshot", *common)
    assert result.returncode == 0, result.stderr
    assert "first" in result.stdout and "record_pid" in result.stdout
    assert f"Docket: '{docket.name}'" in result.stdout
    assert "0 workers, 0/1 running" in result.stdout

    result = run_cli("strike", "record_pid", "n", ">=", "int:10", *common)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Striking record_pid n >= 10\n"
    # a strike made by another process reaches this one within its refresh interval
    with anyio.fail_after(5):
        while (await docket.add(record_pid)(10)).disposition is not Disposition.STRUCK:
            await anyio.sleep(0.1)
    assert (await docket.add(record_pid)(9)).disposition is Disposition.SCHEDULED
    result = run_cli("restore", "record_pid", "n", ">=", "int:10", *common)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Restoring record_pid n >= 10\n"
    with anyio.fail_after(5):
        while (await docket.add(record_pid)(11)).disposition is Disposition.STRUCK:
            await anyio.sleep(0.1)

    pending = len((await docket.snapshot()).future)
    assert pending >= 3
    result = run_cli("clear", *common)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"Cleared {pending} tasks from docket '{docket.name}'\n"
    assert (await docket.snapshot()).future == []


STRIKES = [
    # operator, value, which of n = 1, 5, 9 are struck
    ("==", "int:5", {5}),
    ("!=", "int:5", {1, 9}),
    (">", "int:5", {9}),
    (">=", "int:5", {5, 9}),
    ("<", "int:5", {1}),
    ("<=", "int:5", {1, 5}),
    ("between", "int:2,int:9", {5, 9}),
]


@pytest.mark.parametrize(("operator", "value", "struck"), STRIKES)
async def test_the_strike_command_takes_every_operator(
    docket: Docket, docket_url: str, operator: str, value: str, struck: set[int]
) -> None:
    from cli_tasks import record_pid

    result = run_cli(
        "strike", "*", "n", operator, value, "--url", docket_url, "--docket", docket.name
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Striking (all tasks) n {operator} ")
    probe = min(struck)
    with anyio.fail_after(5):  # the strike reaches this process within its refresh
        while (await docket.add(record_pid)(probe)).disposition is not Disposition.STRUCK:
            await anyio.sleep(0.1)
    dispositions = {n: (await docket.add(record_pid)(n)).disposition for n in (1, 5, 9)}
    assert {n for n, d in dispositions.items() if d is Disposition.STRUCK} == struck


async def test_snapshot_counts_beyond_its_page(docket: Docket, docket_url: str) -> None:
    from cli_tasks import record_pid

    for n in range(5):
        await docket.add(record_pid, key=f"due-{n}")(n)
    later = datetime.now(UTC) + timedelta(hours=2)
    await docket.add(record_pid, key="later", when=later)(9)
    result = run_cli(
        *("snapshot", "--limit", "2", "--stats", "--tasks", "cli_tasks:tasks"),
        *("--url", docket_url, "--docket", docket.name),
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "0 workers, 0/6 running" in out
    assert "6 scheduled or queued, 0 running" in out
    page = await docket.snapshot(limit=2)
    shown = len(page.future) + len(page.running)
    assert shown < 6
    assert f"showing {shown} of 6 tasks (--limit 2)" in out
    keys = [key for key in ("due-0", "due-1", "due-2", "due-3", "due-4", "later") if key in out]
    assert len(keys) == shown
    assert "Task Count Statistics by Function" in out
    assert f"(of the {shown} tasks listed)" in out


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


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


async def test_watch_follows_a_task_to_its_end(
    docket: Docket, docket_url: str, server_for: Callable[[], Servers | None]
) -> None:
    async def reporting(progress: Progress = Progress()) -> int:
        await progress.set_total(2)
        for step in ("halfway", "done"):
            await anyio.sleep(0.3)
            await progress.increment()
            await progress.set_message(step)
        return 42

    docket.register(reporting)
    await docket.add(reporting, key="watched")()
    common = ["--url", docket_url, "--docket", docket.name]
    server = server_for()
    assert server is not None and isinstance(docket.adapter, ScriptedStore)
    channel = docket.adapter.layout.events_channel("watched")

    def watchers() -> int:
        _, count = command(server.data_ports()[0], "PUBSUB", "NUMSUB", channel)
        return int(count)

    watched: dict[str, subprocess.CompletedProcess[str]] = {}

    async def watch(how: str, **env: str) -> None:
        watched[how] = await anyio.to_thread.run_sync(
            lambda: run_cli("watch", "watched", *common, **env)
        )

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(watch, "piped")
            group.start_soon(lambda: watch("terminal", TTY_COMPATIBLE="1"))
            # the worker starts once both watchers follow the task (or ended):
            # their processes may take seconds to start on a loaded machine
            while await anyio.to_thread.run_sync(watchers) < 2 - len(watched):
                await anyio.sleep(0.05)
            worker = Worker(docket, minimum_check_interval=timedelta(milliseconds=10))
            await worker.run_until_finished()

    # printed to a pipe: only the final view
    piped = watched["piped"]
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.splitlines()
    assert lines[:3] == ["Task: watched", f"Docket: {docket.name}", "State: COMPLETED"]
    assert lines[3].startswith("Worker: ")
    assert "✓ Task completed successfully" in lines and "Result: 42" in lines
    (bar,) = [line for line in lines if "2/2" in line]
    assert bar.startswith("done") and "100%" in bar

    # on a terminal: redrawn at every change, the bar moving from 1/2 to 2/2
    terminal = watched["terminal"]
    assert terminal.returncode == 0, terminal.stderr
    frames = ANSI.sub("", terminal.stdout).splitlines()
    assert any(line.startswith("State: RUNNING") for line in frames)
    halfway = next(i for i, line in enumerate(frames) if "halfway" in line and "1/2" in line)
    done = next(i for i, line in enumerate(frames) if "done" in line and "2/2" in line)
    assert halfway < done
    assert frames.index("State: COMPLETED") > halfway
    assert "Result: 42" in frames


async def test_watch_of_a_failed_task_shows_its_error(docket: Docket, docket_url: str) -> None:
    common = ["--url", docket_url, "--docket", docket.name]
    added = run_cli("tasks", "fail", "it broke", *common)
    assert added.returncode == 0, added.stderr
    key = added.stdout.split("'")[1]
    with anyio.fail_after(10):
        await Worker(docket, minimum_check_interval=timedelta(milliseconds=10)).run_until_finished()
    result = run_cli("watch", key, *common)
    assert result.returncode == 0, result.stderr  # as pydocket: watching went fine
    lines = result.stdout.splitlines()
    assert "State: FAILED" in lines and "✗ Task failed" in lines
    (error,) = [line for line in lines if line.startswith("Error: ")]
    assert "it broke" in error


async def test_watch_of_an_unknown_key_says_so(docket: Docket, docket_url: str) -> None:
    result = run_cli("watch", "nope", "--url", docket_url, "--docket", docket.name)
    assert result.returncode == 0  # as pydocket
    assert result.stdout == "Error: Task with key 'nope' not found or function not registered\n"


async def test_the_tasks_command_adds_the_builtin_tasks(docket: Docket, docket_url: str) -> None:
    common = ["--url", docket_url, "--docket", docket.name]
    result = run_cli("tasks", "trace", "hello there", "--delay", "1h", *common)
    assert result.returncode == 0, result.stderr
    key = trace_key = result.stdout.strip().split("'")[1]
    assert result.stdout == f"Added trace task {key!r} to the docket {docket.name!r}\n"
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
    assert f"Workers in Docket: {docket.name}" in known.stdout
    (row,) = [line for line in known.stdout.splitlines() if "lister" in line]
    assert "ago" in row and "record_pid" in known.stdout
    assert unknown.returncode == 0, unknown.stderr
    assert "lister" not in unknown.stdout


async def test_the_worker_answers_its_healthcheck(docket: Docket, docket_url: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = cli_environment()
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
    env = cli_environment()
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
