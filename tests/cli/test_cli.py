"""The ``docket`` command: argument parsing, ``version``, and the memory:// guard."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from docket_core.cli import MEMORY_ONLY_IN_PROCESS, build_parser, main, parse_duration, parse_value

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", timedelta(0)),
        ("123", timedelta(seconds=123)),
        ("123s", timedelta(seconds=123)),
        ("1.5s", timedelta(seconds=1.5)),
        ("123ms", timedelta(milliseconds=123)),
        ("100ms", timedelta(milliseconds=100)),
        ("5m", timedelta(minutes=5)),
        ("2h", timedelta(hours=2)),
        (" 30S ", timedelta(seconds=30)),
        ("01:30", timedelta(minutes=1, seconds=30)),
        ("90:00", timedelta(minutes=90)),
        ("1:02:03", timedelta(hours=1, minutes=2, seconds=3)),
        ("00:00:00.5", timedelta(milliseconds=500)),
    ],
)
def test_parse_duration(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text", ["", "abc", "5x", "-5", "5 minutes", "1:2:3:4", "1:60", "1:60:00", "ms", "m5"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("int:5", 5),
        ("int:-5", -5),
        ("float:1.5", 1.5),
        ("bool:true", True),
        ("bool:True", True),
        ("bool:1", True),
        ("bool:false", False),
        ("bool:no", False),
        ("str:x", "x"),
        ("str:int:5", "int:5"),
        ("str:", ""),
        ("hello", "hello"),
        ("5", "5"),
        ("customer:42", "customer:42"),
        ("redis://host:6379", "redis://host:6379"),
    ],
)
def test_parse_value(text: str, expected: object) -> None:
    value = parse_value(text)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize("text", ["int:five", "float:x", "bool:maybe", "int:"])
def test_parse_value_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid"):
        parse_value(text)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import docket_core

    assert main(["version"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == docket_core.__version__
    assert out.strip()


@pytest.mark.parametrize(
    "argv",
    [
        ["snapshot"],
        ["clear"],
        ["workers", "ls"],
        ["strike", "example_task"],
        ["restore", "*", "customer_id", "==", "int:5"],
    ],
)
@pytest.mark.parametrize("url", ["memory://x", "MEMORY://"])
def test_memory_dockets_are_refused(
    argv: list[str], url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--url", url]) == 2
    captured = capsys.readouterr()
    assert MEMORY_ONLY_IN_PROCESS in captured.err
    assert captured.out == ""


def test_memory_is_the_default_url(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DOCKET_URL", raising=False)
    assert main(["snapshot"]) == 2
    assert "memory:// dockets live inside one process" in capsys.readouterr().err


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: docket" in capsys.readouterr().err


def test_help_exits_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("version", "worker", "strike", "restore", "clear", "snapshot", "workers"):
        assert command in out


def test_worker_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "DOCKET_URL",
        "DOCKET_NAME",
        "DOCKET_TASKS",
        "DOCKET_WORKER_NAME",
        "DOCKET_WORKER_CONCURRENCY",
        "DOCKET_WORKER_REDELIVERY_TIMEOUT",
        "DOCKET_WORKER_SCHEDULE_AUTOMATIC_TASKS",
        "DOCKET_LOGGING_LEVEL",
    ):
        monkeypatch.delenv(name, raising=False)
    args = build_parser().parse_args(["worker"])
    assert args.url == "memory://"
    assert args.docket == "docket"
    assert args.tasks is None
    assert args.name is None
    assert args.concurrency == 10
    assert args.redelivery_timeout == timedelta(minutes=5)
    assert args.reconnection_delay == timedelta(seconds=5)
    assert args.minimum_check_interval == timedelta(milliseconds=100)
    assert args.scheduling_resolution == timedelta(milliseconds=250)
    assert args.schedule_automatic_tasks is True
    assert args.until_finished is False
    assert args.logging_level == "INFO"


def test_worker_options_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKET_URL", "redis://example:6379/1")
    monkeypatch.setenv("DOCKET_NAME", "orders")
    monkeypatch.setenv("DOCKET_WORKER_REDELIVERY_TIMEOUT", "01:00")
    args = build_parser().parse_args(
        [
            "worker",
            "--tasks",
            "a.b:c",
            "--tasks",
            "d:e",
            "--concurrency",
            "3",
            "--scheduling-resolution",
            "1s",
            "--no-schedule-automatic-tasks",
            "--until-finished",
            "--logging-level",
            "debug",
        ]
    )
    assert args.url == "redis://example:6379/1"
    assert args.docket == "orders"
    assert args.tasks == ["a.b:c", "d:e"]
    assert args.concurrency == 3
    assert args.redelivery_timeout == timedelta(minutes=1)
    assert args.scheduling_resolution == timedelta(seconds=1)
    assert args.schedule_automatic_tasks is False
    assert args.until_finished is True
    assert args.logging_level == "DEBUG"


def test_tasks_from_environment_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    from docket_core.cli import _split_tasks

    monkeypatch.setenv("DOCKET_TASKS", "a:b, c.d:e,,")
    assert _split_tasks(None) == ["a:b", "c.d:e"]
    assert _split_tasks(["x:y,z:w"]) == ["x:y", "z:w"]


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--concurrency", "0"],
        ["worker", "--redelivery-timeout", "soon"],
        ["strike", "task", "param", "~=", "1"],
    ],
)
def test_bad_options_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "usage: docket" in capsys.readouterr().err


def test_python_dash_m() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "docket_core", "snapshot", "--url", "memory://"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2
    assert MEMORY_ONLY_IN_PROCESS in result.stderr


def _strike(argv: list[str]) -> tuple[object, ...]:
    from docket_core.cli.commands import _strike_arguments

    return _strike_arguments(build_parser().parse_args(["strike", *argv]))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["greet"], ("greet", None, "==", None)),
        (["greet", "*"], ("greet", None, "==", None)),
        (["*", "customer_id", "==", "int:5"], (None, "customer_id", "==", 5)),
        (["", "customer_id", ">=", "float:1.5"], (None, "customer_id", ">=", 1.5)),
        (["greet", "name", "!=", "bob"], ("greet", "name", "!=", "bob")),
        (["greet", "n", "between", "int:1,int:10"], ("greet", "n", "between", (1, 10))),
    ],
)
def test_strike_arguments(argv: list[str], expected: tuple[object, ...]) -> None:
    assert _strike(argv) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "name a task, a parameter, or both"),
        (["*", "*"], "name a task, a parameter, or both"),
        (["greet", "name"], "needs a value"),
        (["greet", "n", "==", "int:x"], "invalid int value"),
        (["greet", "n", "between", "int:1"], "'between' needs two values"),
    ],
)
def test_strike_arguments_rejects(argv: list[str], message: str) -> None:
    from docket_core.sansio.errors import UsageError

    with pytest.raises(UsageError, match=message):
        _strike(argv)


def test_relative_times() -> None:
    from datetime import UTC, datetime

    from docket_core.cli.commands import _relative

    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert _relative(now, now) == "now"
    assert _relative(now + timedelta(milliseconds=250), now) == "in 250ms"
    assert _relative(now - timedelta(seconds=2.5), now) == "2.5s ago"
    assert _relative(now + timedelta(minutes=1, seconds=30), now) == "in 1m30s"
    assert _relative(now - timedelta(hours=1, seconds=5), now) == "1h00m05s ago"


def test_table_aligns_columns() -> None:
    from docket_core.cli.commands import _table

    assert _table(["A", "LONGER"], [["xyz", "1"]]).splitlines() == [
        "A    LONGER",
        "---  ------",
        "xyz  1",
    ]


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
