"""Strikes: pausing tasks by function, by argument value, or both.

A strike list is a replayable log of instructions.  Every process of a docket
applies the same instructions in the same order, so all of them agree on what
is struck.  Matching is a pure function of the list, the function name and the
call's arguments by parameter name.

A condition whose value cannot be compared with the argument's (``"a" > 1``,
a ``between`` whose value is not a pair) does not match; ``compare`` logs a
warning on ``docket.execution``, pydocket's logger for it, with pydocket's
wording.  The warning is the core's one side effect: it needs no clock and no
I/O of its own, and it keeps every caller of ``is_struck`` (the producer, a
batch, the worker) from having to report it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .values import Symbol

logger = logging.getLogger("docket.execution")


class Operator(Symbol):
    EQUAL = "=="
    NOT_EQUAL = "!="
    GREATER_THAN = ">"
    GREATER_THAN_OR_EQUAL = ">="
    LESS_THAN = "<"
    LESS_THAN_OR_EQUAL = "<="
    BETWEEN = "between"


_COMPARE: dict[Operator, Callable[[Any, Any], bool]] = {
    Operator.EQUAL: lambda a, b: bool(a == b),
    Operator.NOT_EQUAL: lambda a, b: bool(a != b),
    Operator.GREATER_THAN: lambda a, b: bool(a > b),
    Operator.GREATER_THAN_OR_EQUAL: lambda a, b: bool(a >= b),
    Operator.LESS_THAN: lambda a, b: bool(a < b),
    Operator.LESS_THAN_OR_EQUAL: lambda a, b: bool(a <= b),
    Operator.BETWEEN: lambda a, b: _between(a, *b),
}


def _between(actual: Any, lower: Any, upper: Any) -> bool:
    """The closed range ``[lower, upper]`` (a value of any other length than
    two does not unpack: a ``TypeError``, so no match)."""
    return bool(lower <= actual <= upper)


@attrs.frozen(slots=True, kw_only=True)
class StrikeInstruction:
    """Strike (or, with ``restore``, lift) a condition.

    ``function`` alone strikes every call of that task; ``parameter`` alone
    strikes any task called with a matching value for that parameter; both
    strike only that task with that value."""

    function: str | None
    parameter: str | None
    operator: Operator
    value: Any
    restore: bool = False


def compare(operator: Operator, actual: Any, expected: Any) -> bool:
    """Whether ``actual <operator> expected`` holds.  Values that cannot be
    compared never match, and say so in a warning."""
    try:
        return _COMPARE[operator](actual, expected)
    except Exception:
        logger.warning(
            "Incompatible type for strike condition: %r %s %r",
            expected,
            operator.value,
            actual,
            exc_info=True,
        )
        return False


@attrs.define(slots=True)
class StrikeList:
    """The strikes in effect, built by applying instructions in order."""

    #: whole-task strikes
    functions: set[str] = attrs.field(factory=set)
    #: (function or None, parameter) -> [(operator, value), ...]
    conditions: dict[tuple[str | None, str], list[tuple[Operator, Any]]] = attrs.field(factory=dict)
    #: how many instructions have been applied
    applied: int = 0

    def apply(self, instruction: StrikeInstruction) -> None:
        self.applied += 1
        if instruction.parameter is None:
            if instruction.function is None:
                return
            if instruction.restore:
                self.functions.discard(instruction.function)
            else:
                self.functions.add(instruction.function)
            return
        scope = (instruction.function, instruction.parameter)
        entry = (instruction.operator, instruction.value)
        existing = self.conditions.setdefault(scope, [])
        if instruction.restore:
            self.conditions[scope] = [e for e in existing if not _same(e, entry)]
            if not self.conditions[scope]:
                del self.conditions[scope]
        elif not any(_same(e, entry) for e in existing):
            existing.append(entry)

    @property
    def empty(self) -> bool:
        return not self.functions and not self.conditions

    def is_struck(self, function: str, arguments: Mapping[str, Any]) -> bool:
        """Whether a call of ``function`` with these arguments is struck."""
        if function in self.functions:
            return True
        if not self.conditions:
            return False
        for (scope_function, parameter), entries in self.conditions.items():
            if scope_function is not None and scope_function != function:
                continue
            if parameter not in arguments:
                continue
            actual = arguments[parameter]
            for operator, expected in entries:
                if compare(operator, actual, expected):
                    return True
        return False


def _same(a: tuple[Operator, Any], b: tuple[Operator, Any]) -> bool:
    if a[0] is not b[0]:
        return False
    try:
        return bool(a[1] == b[1])
    except Exception:
        return False
