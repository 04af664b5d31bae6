"""The command line's parsing helpers, on their own: durations, typed strike
values, the strike operators, and task collection paths."""

from __future__ import annotations

import decimal
from datetime import timedelta

import pytest

from docket_core.cli.parsing import (
    OPERATORS,
    describe_strike,
    parse_duration,
    parse_operator,
    parse_strike_value,
    parse_value,
    split_task_paths,
    wildcard,
)
from docket_core.sansio.strikes import Operator


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
        ("123m", timedelta(minutes=123)),
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


def test_a_timedelta_passes_through() -> None:
    assert parse_duration(timedelta(seconds=7)) == timedelta(seconds=7)


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
        ("datetime.timedelta:30", timedelta(seconds=30)),
        ("decimal.Decimal:1.25", decimal.Decimal("1.25")),
        # a dotted prefix that names no importable type is just text
        ("example.com:8080", "example.com:8080"),
        ("os.getcwd:x", "os.getcwd:x"),
    ],
)
def test_parse_value(text: str, expected: object) -> None:
    value = parse_value(text)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    "text",
    ["int:five", "float:x", "bool:maybe", "int:", "decimal.Decimal:x", "datetime.timedelta:"],
)
def test_parse_value_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid"):
        parse_value(text)


def test_every_pydocket_operator_is_known() -> None:
    assert OPERATORS == ("==", "!=", ">", ">=", "<", "<=", "between")
    for text in OPERATORS:
        assert parse_operator(text).value == text
    assert parse_operator(Operator.BETWEEN) is Operator.BETWEEN
    with pytest.raises(ValueError, match="unknown operator '~='"):
        parse_operator("~=")


@pytest.mark.parametrize(
    ("operator", "text", "expected"),
    [
        (Operator.EQUAL, "int:5", 5),
        (Operator.NOT_EQUAL, "bob", "bob"),
        (Operator.GREATER_THAN, "float:1.5", 1.5),
        (Operator.LESS_THAN_OR_EQUAL, "str:1,2", "1,2"),  # only "between" splits
        (Operator.BETWEEN, "int:1,int:10", (1, 10)),
        (Operator.BETWEEN, "float:0.5, float:2", (0.5, 2.0)),
        (Operator.BETWEEN, "a,m", ("a", "m")),
        (Operator.EQUAL, None, None),
    ],
)
def test_parse_strike_value(operator: Operator, text: str | None, expected: object) -> None:
    assert parse_strike_value(operator, text) == expected


@pytest.mark.parametrize("text", ["int:1", "int:1,int:2,int:3", "int:x,int:2"])
def test_between_needs_two_values(text: str) -> None:
    with pytest.raises(ValueError, match=r"'between' needs two values|invalid int"):
        parse_strike_value(Operator.BETWEEN, text)


def test_wildcards() -> None:
    assert wildcard("*") is None
    assert wildcard("") is None
    assert wildcard(" * ") is None
    assert wildcard(None) is None
    assert wildcard("send_report") == "send_report"


def test_how_a_strike_is_described() -> None:
    assert describe_strike("send", None, Operator.EQUAL, None) == "send"
    assert describe_strike("send", "n", Operator.GREATER_THAN, 5) == "send n > 5"
    assert describe_strike(None, "who", Operator.EQUAL, "bob") == "(all tasks) who == 'bob'"
    assert describe_strike(None, "n", Operator.BETWEEN, (1, 9)) == "(all tasks) n between (1, 9)"


def test_task_paths_split_on_commas_and_spaces() -> None:
    assert split_task_paths(["a:b, c.d:e,,", "f:g h:i"]) == ["a:b", "c.d:e", "f:g", "h:i"]
    assert split_task_paths([]) == []
    assert split_task_paths([" "]) == []
