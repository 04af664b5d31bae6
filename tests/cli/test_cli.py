"""The ``docket`` command without a server: its commands, options,
environment variables and defaults as pydocket declares them, usage errors
(exit 2), an unreachable store (exit 1), ``memory://`` with its note, and
``python -m docket_core`` being ``docket``."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from servers import free_port

from docket_core.cli import MEMORY_NOTE, MEMORY_WORKER_NOTE, app, main

TESTS = Path(__file__).parent
DOCKET_SCRIPT = Path(sys.executable).with_name("docket")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m docket_core ARGS`` in a subprocess that can import ``cli_tasks``."""
    environment = dict(
        os.environ, PYTHONPATH=f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "docket_core", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        check=False,
    )


def parsed(*argv: str) -> dict[str, Any]:
    """The parameters a command gets from ``argv`` and the environment (its
    options parsed as typer declares them, nothing run)."""
    command: Any = typer.main.get_command(app)
    path = list(argv)
    while path and hasattr(command, "commands") and path[0] in command.commands:
        command = command.commands[path.pop(0)]
    return dict(command.make_context(command.name, path).params)


# -- commands, help, version ---------------------------------------------------------------------

COMMANDS = ["worker", "strike", "restore", "clear", "snapshot", "watch", "version", "dashboard"]
GROUPS = {
    "workers": ["ls", "for-task"],
    "tasks": ["trace", "fail", "sleep"],
    "dead-letters": ["ls", "replay", "drop"],
}


def test_every_command_is_there() -> None:
    group: Any = typer.main.get_command(app)
    assert set(group.commands) == {*COMMANDS, *GROUPS}
    for name, subcommands in GROUPS.items():
        assert sorted(group.commands[name].commands) == sorted(subcommands)


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in [*COMMANDS, *GROUPS]:
        assert command in out


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_a_group_without_its_command_shows_its_help(
    group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([group]) == 2
    captured = capsys.readouterr()
    shown = captured.out + captured.err
    assert f"Usage: docket {group}" in shown
    for subcommand in GROUPS[group]:
        assert subcommand in shown


def test_no_command_shows_the_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    captured = capsys.readouterr()
    assert "Usage: docket" in captured.out + captured.err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import docket_core

    assert main(["version"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == docket_core.__version__
    assert out.strip()


def test_python_dash_m_is_the_docket_command() -> None:
    assert DOCKET_SCRIPT.exists(), "the docket script is installed with the package"
    for argv in (["version"], ["--help"], ["workers", "--help"]):
        module = run_cli(*argv)
        script = subprocess.run(
            [str(DOCKET_SCRIPT), *argv], capture_output=True, text=True, timeout=60, check=False
        )
        assert module.returncode == script.returncode == 0, module.stderr + script.stderr
        assert module.stdout == script.stdout
        assert "docket_core" not in module.stdout.replace("docket_core.tasks", "")


# -- options, environment variables and defaults ---------------------------------------------

ALL_ENVIRONMENT = [
    "DOCKET_URL",
    "DOCKET_REDIS_URL",
    "DOCKET_NAME",
    "DOCKET_TASKS",
    "DOCKET_LOGGING_LEVEL",
    "DOCKET_LOGGING_FORMAT",
    "DOCKET_FALLBACK_TASK",
    "DOCKET_DASHBOARD_HOST",
    "DOCKET_DASHBOARD_PORT",
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name in ALL_ENVIRONMENT or name.startswith("DOCKET_WORKER_"):
            monkeypatch.delenv(name)


def test_worker_defaults_are_pydockets() -> None:
    params = parsed("worker")
    assert params["url"] == "redis://localhost:6379/0"
    assert params["docket_"] == "docket"
    assert params["tasks"] == ["docket_core.tasks:standard_tasks"]
    assert params["name"] is None  # the worker names itself HOSTNAME#PID
    assert params["logging_level"].value == "INFO"
    assert params["logging_format"].value == "plain"  # not a terminal
    assert params["concurrency"] == 10
    assert params["message_batch"] == 1000
    assert params["redelivery_timeout"] == timedelta(minutes=5)
    assert params["reconnection_delay"] == timedelta(seconds=5)
    assert params["minimum_check_interval"] == timedelta(milliseconds=100)
    assert params["scheduling_resolution"] == timedelta(milliseconds=250)
    assert params["schedule_automatic_tasks"] is True
    assert params["enable_internal_instrumentation"] is False
    assert params["until_finished"] is False
    assert params["healthcheck_port"] is None
    assert params["metrics_port"] is None
    assert params["fallback_task"] is None
    assert params["dependencies"] is None


@pytest.mark.parametrize(
    ("variable", "text", "parameter", "expected"),
    [
        ("DOCKET_URL", "redis://example:6379/1", "url", "redis://example:6379/1"),
        ("DOCKET_NAME", "orders", "docket_", "orders"),
        ("DOCKET_TASKS", "a.b:c d:e", "tasks", ["a.b:c", "d:e"]),
        ("DOCKET_WORKER_NAME", "w1", "name", "w1"),
        ("DOCKET_LOGGING_LEVEL", "DEBUG", "logging_level", "DEBUG"),
        ("DOCKET_LOGGING_FORMAT", "json", "logging_format", "json"),
        ("DOCKET_WORKER_CONCURRENCY", "3", "concurrency", 3),
        ("DOCKET_WORKER_MESSAGE_BATCH", "50", "message_batch", 50),
        ("DOCKET_WORKER_REDELIVERY_TIMEOUT", "01:00", "redelivery_timeout", timedelta(minutes=1)),
        ("DOCKET_WORKER_RECONNECTION_DELAY", "2s", "reconnection_delay", timedelta(seconds=2)),
        ("DOCKET_WORKER_MINIMUM_CHECK_INTERVAL", "10ms", "minimum_check_interval",
         timedelta(milliseconds=10)),
        ("DOCKET_WORKER_SCHEDULING_RESOLUTION", "1", "scheduling_resolution", timedelta(seconds=1)),
        ("DOCKET_WORKER_SCHEDULE_AUTOMATIC_TASKS", "false", "schedule_automatic_tasks", False),
        ("DOCKET_WORKER_ENABLE_INTERNAL_INSTRUMENTATION", "true",
         "enable_internal_instrumentation", True),
        ("DOCKET_WORKER_HEALTHCHECK_PORT", "8081", "healthcheck_port", 8081),
        ("DOCKET_WORKER_METRICS_PORT", "9001", "metrics_port", 9001),
        ("DOCKET_FALLBACK_TASK", "m:f", "fallback_task", "m:f"),
        ("DOCKET_WORKER_FALLBACK_TASK", "m:g", "fallback_task", "m:g"),
        ("DOCKET_WORKER_DEPENDENCIES", "m:deps", "dependencies", "m:deps"),
    ],
)  # fmt: skip
def test_worker_options_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, variable: str, text: str, parameter: str, expected: object
) -> None:
    monkeypatch.setenv(variable, text)
    value = parsed("worker")[parameter]
    assert getattr(value, "value", value) == expected


def test_worker_options_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKET_URL", "redis://example:6379/1")
    monkeypatch.setenv("DOCKET_WORKER_REDELIVERY_TIMEOUT", "01:00")
    params = parsed(
        "worker",
        *("--url", "redis://other/2", "--tasks", "a.b:c", "--tasks", "d:e"),
        *("--concurrency", "3", "--redelivery-timeout", "2m", "--scheduling-resolution", "1s"),
        *("--no-schedule-automatic-tasks", "--until-finished", "--logging-level", "DEBUG"),
        *("--logging-format", "json", "--name", "w"),
    )
    assert params["url"] == "redis://other/2"
    assert params["tasks"] == ["a.b:c", "d:e"]
    assert params["concurrency"] == 3
    assert params["redelivery_timeout"] == timedelta(minutes=2)
    assert params["scheduling_resolution"] == timedelta(seconds=1)
    assert params["schedule_automatic_tasks"] is False
    assert params["until_finished"] is True
    assert params["logging_level"].value == "DEBUG"
    assert params["logging_format"].value == "json"
    assert params["name"] == "w"


@pytest.mark.parametrize(
    "argv",
    [
        ["strike", "t"],
        ["restore", "t"],
        ["clear"],
        ["snapshot"],
        ["workers", "ls"],
        ["workers", "for-task", "t"],
        ["tasks", "trace"],
        ["tasks", "fail"],
        ["tasks", "sleep"],
        ["dead-letters", "ls"],
        ["dead-letters", "drop", "--all"],
        ["dashboard"],
    ],
)
def test_every_command_takes_docket_url_and_docket_name(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    params = parsed(*argv)
    assert params["url"] == "redis://localhost:6379/0"
    assert params["docket_"] == "docket"
    monkeypatch.setenv("DOCKET_URL", "redis://elsewhere:6379/3")
    monkeypatch.setenv("DOCKET_NAME", "orders")
    params = parsed(*argv)
    assert params["url"] == "redis://elsewhere:6379/3"
    assert params["docket_"] == "orders"


def test_watch_takes_pydockets_short_options_and_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    params = parsed("watch", "k")
    assert (params["url"], params["docket_name"]) == ("redis://localhost:6379/0", "docket")
    assert parsed("watch", "k", "-u", "redis://a/1", "-d", "n")["url"] == "redis://a/1"
    monkeypatch.setenv("DOCKET_URL", "redis://b/2")
    assert parsed("watch", "k")["url"] == "redis://b/2"
    monkeypatch.setenv("DOCKET_REDIS_URL", "redis://c/3")  # pydocket's variable for watch
    assert parsed("watch", "k")["url"] == "redis://c/3"


def test_the_builtin_tasks_defaults() -> None:
    assert parsed("tasks", "trace")["message"] == "Howdy!"
    assert parsed("tasks", "fail")["message"] == "Howdy!"
    assert parsed("tasks", "sleep")["seconds"] == 1
    assert parsed("tasks", "trace", "--delay", "5m")["delay"] == timedelta(minutes=5)


def test_snapshot_options() -> None:
    params = parsed("snapshot")
    assert params["tasks"] == ["docket_core.tasks:standard_tasks"]
    assert params["stats"] is False
    assert params["limit"] == 1000


def test_the_dashboard_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    params = parsed("dashboard")
    assert (params["host"], params["port"]) == ("127.0.0.1", 8080)
    monkeypatch.setenv("DOCKET_DASHBOARD_PORT", "9090")
    assert parsed("dashboard")["port"] == 9090
    assert main(["dashboard", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--url", "--docket", "--host", "--port", "8080"):
        assert option in out


# -- usage errors, failures -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["worker", "--concurrency", "0"], "--concurrency"),
        (["worker", "--redelivery-timeout", "soon"], "invalid duration 'soon'"),
        (["worker", "--logging-format", "xml"], "--logging-format"),
        (["worker", "--tasks", "no_such_module_here:tasks"], "No module named"),
        (["worker", "--tasks", "cli_tasks:nothing"], "module:attribute"),
        (["strike"], "Must provide either a function and/or a parameter"),
        (["strike", "*", "*"], "Must provide either a function and/or a parameter"),
        (["strike", "task", "param", "~=", "1"], "'~='"),
        (["strike", "task", "n", "between", "int:1"], "'between' needs two values"),
        (["restore", "task", "n", "==", "int:x"], "invalid int value"),
        (["dead-letters", "replay"], "name dead letter ids, or --all"),
        (["dead-letters", "drop", "1-0", "--all"], "not both"),
        (["snapshot", "--limit", "0"], "--limit"),
        (["nope"], "No such command"),
    ],
)
def test_usage_errors_exit_2(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    assert main([*argv, "--url", "memory://usage"] if argv[0] != "nope" else argv) == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.replace("│", " ").split())


def test_the_worker_command_leaves_the_root_logger_as_it_found_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run in-process (a test, a notebook), the command takes its handler off
    the root logger again, whether the worker ran or the command failed: a
    handler left behind would write to a stream that has since closed."""
    monkeypatch.syspath_prepend(str(TESTS))
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    ran = ["worker", "--url", "memory://left", "--until-finished", "--tasks", "cli_tasks:tasks"]
    failed = ["worker", "--url", "memory://left", "--tasks", "cli_tasks:nothing"]
    for argv, status in ((ran, 0), (failed, 2)):
        assert main([*argv, "--logging-level", "DEBUG"]) == status
        assert root.handlers == handlers
        assert root.level == level


def test_an_unreachable_store_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["snapshot", "--url", f"redis://127.0.0.1:{free_port()}/0"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("Error: cannot reach Redis")
    assert captured.out == ""


def test_an_option_the_worker_cannot_honour_is_refused() -> None:
    from docket_core.cli.worker_command import _optional

    options: dict[str, Any] = {}
    _optional(options, {"message_batch"}, "message_batch", 5, 1000)
    _optional(options, set(), "enable_internal_instrumentation", False, False)
    assert options == {"message_batch": 5}
    with pytest.raises(typer.Exit) as stop:
        _optional(options, set(), "dependencies", "m:deps", None)
    assert stop.value.exit_code == 2


# -- memory:// ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "output"),
    [
        (["snapshot"], "0 workers, 0/0 running"),
        (["clear"], "Cleared 0 tasks from docket 'docket'"),
        (["workers", "ls"], "Workers in Docket: docket"),
        (["workers", "for-task", "t"], "Workers in Docket: docket"),
        (["strike", "example_task"], "Striking example_task"),
        (["restore", "*", "customer_id", "==", "int:5"], "Restoring (all tasks) customer_id == 5"),
        (["tasks", "trace", "hi"], "Added trace task '"),
        (["dead-letters", "ls"], "0 dead letter(s)"),
        (["watch", "nope"], "Task with key 'nope' not found or function not registered"),
    ],
)
@pytest.mark.parametrize("url", ["memory://cli-x", "memory://"])
def test_memory_dockets_are_accepted_with_a_note(
    argv: list[str], output: str, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--url", url]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip() == MEMORY_NOTE
    assert output in captured.out


def test_a_worker_on_memory_runs_only_this_process_tasks() -> None:
    result = run_cli(
        "worker", "--url", "memory://", "--until-finished", "--tasks", "cli_tasks:tasks"
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == MEMORY_WORKER_NOTE
    assert "Starting worker" in result.stdout  # plain logs, on standard output


@pytest.mark.parametrize("loop", ["asyncio", "uvloop", "trio"])
def test_a_worker_runs_on_the_loop_asked_for_with_a_drain_timeout(loop: str) -> None:
    result = run_cli(
        "worker",
        "--url",
        "memory://",
        "--until-finished",
        "--loop",
        loop,
        "--drain-timeout",
        "5s",
        "--tasks",
        "cli_tasks:tasks",
    )
    assert result.returncode == 0, result.stderr
    assert "Starting worker" in result.stdout


def test_an_unknown_loop_is_a_usage_error() -> None:
    result = run_cli("worker", "--url", "memory://", "--until-finished", "--loop", "nope")
    assert result.returncode == 2
    assert "unknown event loop 'nope'" in result.stderr


@pytest.mark.anyio
async def test_worker_run_opens_the_docket_and_registers_the_collections() -> None:
    """pydocket's ``Worker.run``: what ``docket worker`` calls, usable in code."""
    import uuid

    from cli_tasks import record_pid

    from docket_core import Docket, ExecutionState, Worker

    url, name = f"memory://{uuid.uuid4().hex}", "run-classmethod"
    async with Docket(name=name, url=url) as docket:
        docket.register(record_pid)
        execution = await docket.add(record_pid)(7)
        await Worker.run(
            docket_name=name,
            url=url,
            tasks=["cli_tasks:tasks"],
            until_finished=True,
            schedule_automatic_tasks=False,
        )
        stored = await docket.get_execution(execution.key)
        assert stored is not None and stored.state is ExecutionState.COMPLETED
        assert await execution.get_result() % 1000 == 7
