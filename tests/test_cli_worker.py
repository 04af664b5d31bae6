"""``docket worker`` and the inspection commands, against real servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from docket_core import Disposition, Docket, ExecutionState

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
