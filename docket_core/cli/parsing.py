"""Reading what the ``docket`` command line is given: durations, typed strike
values, strike operators and task collection paths.

Pure functions, free of typer and of any store, so they are tested on their
own; the commands turn their ``ValueError`` into a usage error (exit 2).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from ..sansio.strikes import Operator

__all__ = [
    "OPERATORS",
    "describe_strike",
    "parse_duration",
    "parse_operator",
    "parse_strike_value",
    "parse_value",
    "split_task_paths",
    "wildcard",
]

#: the strike operators, as written on the command line
OPERATORS = tuple(operator.value for operator in Operator)


# -- durations ---------------------------------------------------------------------------------

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_WITH_UNIT = re.compile(r"(?P<number>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>ms|s|m|h)?")
_CLOCK = re.compile(r"(?:(?P<hours>\d+):)?(?P<minutes>\d+):(?P<seconds>\d+(?:\.\d+)?)")


def parse_duration(text: str | timedelta) -> timedelta:
    """Read a duration: ``123`` or ``123s`` (seconds), ``123ms``, ``5m``,
    ``2h``, ``mm:ss`` or ``hh:mm:ss`` (a ``timedelta`` passes through).
    Raises ``ValueError`` on anything else."""
    if isinstance(text, timedelta):
        return text
    cleaned = text.strip().lower()
    match = _WITH_UNIT.fullmatch(cleaned)
    if match:
        seconds = float(match["number"]) * _UNIT_SECONDS[match["unit"] or "s"]
        return timedelta(seconds=seconds)
    match = _CLOCK.fullmatch(cleaned)
    if match:
        minutes = int(match["minutes"])
        seconds = float(match["seconds"])
        if seconds >= 60 or (match["hours"] is not None and minutes >= 60):
            raise ValueError(f"invalid duration {text!r}: minutes and seconds must be below 60")
        hours = int(match["hours"] or 0)
        return timedelta(hours=hours, minutes=minutes, seconds=seconds)
    raise ValueError(
        f"invalid duration {text!r}; use e.g. 30, 30s, 250ms, 5m, 2h, 01:30 or 01:00:00"
    )


# -- strike values -----------------------------------------------------------------------------

_TRUE = {"true", "t", "yes", "y", "on", "1"}
_FALSE = {"false", "f", "no", "n", "off", "0"}


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"invalid bool {text!r}; use true or false")


def _parse_timedelta(text: str) -> timedelta:
    return timedelta(seconds=float(text))


_BUILTIN_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "bool": _parse_bool,
    "str": str,
}
#: types named by their dotted path that take a special reading
_SPECIAL_TYPES: dict[type, Callable[[str], Any]] = {timedelta: _parse_timedelta}
_DOTTED = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+")


def _dotted_type(path: str) -> Callable[[str], Any] | None:
    """The reader for a type named ``module.Name`` (``datetime.timedelta``,
    ``decimal.Decimal``), or None when the path names no importable type."""
    if not _DOTTED.fullmatch(path):
        return None
    module_name, _, name = path.rpartition(".")
    try:
        member = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return None
    if not isinstance(member, type):
        return None
    return _SPECIAL_TYPES.get(member, member)


def parse_value(text: str) -> Any:
    """Read a strike value written ``TYPE:TEXT``: ``int:5``, ``float:1.5``,
    ``bool:true``, ``str:x``, or a dotted type such as
    ``datetime.timedelta:30`` (seconds) or ``decimal.Decimal:1.5``.  Without
    a prefix naming a type the whole text is a string (``customer:42``
    stays as it is).  Raises ``ValueError`` when the text does not fit the
    type it names."""
    prefix, colon, rest = text.partition(":")
    if not colon:
        return text
    reader = _BUILTIN_TYPES.get(prefix) or _dotted_type(prefix)
    if reader is None:
        return text
    try:
        return reader(rest)
    except (ValueError, ArithmeticError, TypeError):
        raise ValueError(f"invalid {prefix} value {rest!r} in {text!r}") from None


def parse_operator(text: str | Operator) -> Operator:
    """``==``, ``!=``, ``>``, ``>=``, ``<``, ``<=`` or ``between``."""
    if isinstance(text, Operator):
        return text
    try:
        return Operator(text.strip())
    except ValueError:
        raise ValueError(f"unknown operator {text!r}; use one of {', '.join(OPERATORS)}") from None


def parse_strike_value(operator: Operator, text: str | None) -> Any:
    """The value a strike condition compares with: ``None`` when none is
    given; for ``between``, the closed range ``LOW,HIGH`` as a 2-tuple
    (``int:1,int:10``); otherwise one typed value (``parse_value``)."""
    if text is None:
        return None
    if operator is not Operator.BETWEEN:
        return parse_value(text)
    bounds = text.split(",")
    if len(bounds) != 2:
        raise ValueError(f"'between' needs two values, LOW,HIGH (got {text!r})")
    low, high = (parse_value(bound.strip()) for bound in bounds)
    return (low, high)


def wildcard(text: str | None) -> str | None:
    """``*`` or an empty string means "any"."""
    if text is None or text.strip() in ("", "*"):
        return None
    return text


def describe_strike(
    function: str | None, parameter: str | None, operator: Operator, value: Any
) -> str:
    """How ``strike`` and ``restore`` name what they act on: the task, or
    ``TASK PARAMETER OP VALUE`` (``(all tasks)`` standing for any task)."""
    if parameter is None:
        return str(function)
    return f"{function or '(all tasks)'} {parameter} {operator.value} {value!r}"


# -- task collections --------------------------------------------------------------------------


def split_task_paths(values: Iterable[str]) -> list[str]:
    """Task collection paths given as repeated options or in one variable,
    separated by commas or white space; blanks dropped."""
    return [part for value in values for part in re.split(r"[\s,]+", value) if part]
