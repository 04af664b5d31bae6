"""``docket_core.sansio.strikes`` on its own: a strike list is a pure function
of the instructions applied to it, in order."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from docket_core.sansio.strikes import Operator, StrikeInstruction, StrikeList, compare


def instruction(
    function: str | None = None,
    parameter: str | None = None,
    operator: Operator = Operator.EQUAL,
    value: Any = None,
    restore: bool = False,
) -> StrikeInstruction:
    return StrikeInstruction(
        function=function, parameter=parameter, operator=operator, value=value, restore=restore
    )


def applied(*instructions: StrikeInstruction) -> StrikeList:
    strikes = StrikeList()
    for each in instructions:
        strikes.apply(each)
    return strikes


class Incomparable:
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no")

    def __lt__(self, other: object) -> bool:
        raise RuntimeError("no")

    __hash__ = None  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("operator", "actual", "expected", "matches"),
    [
        (Operator.EQUAL, 3, 3, True),
        (Operator.EQUAL, 3, 4, False),
        (Operator.NOT_EQUAL, 3, 4, True),
        (Operator.NOT_EQUAL, 3, 3, False),
        (Operator.GREATER_THAN, 4, 3, True),
        (Operator.GREATER_THAN, 3, 3, False),
        (Operator.GREATER_THAN_OR_EQUAL, 3, 3, True),
        (Operator.LESS_THAN, 2, 3, True),
        (Operator.LESS_THAN, 3, 3, False),
        (Operator.LESS_THAN_OR_EQUAL, 3, 3, True),
        (Operator.BETWEEN, 5, (1, 10), True),
        (Operator.BETWEEN, 10, (1, 10), True),
        (Operator.BETWEEN, 11, (1, 10), False),
    ],
)
def test_each_operator(operator: Operator, actual: Any, expected: Any, matches: bool) -> None:
    assert compare(operator, actual, expected) is matches


@pytest.mark.parametrize(
    ("operator", "actual", "expected"),
    [
        (Operator.GREATER_THAN, "a", 1),
        (Operator.LESS_THAN_OR_EQUAL, None, 1),
        (Operator.BETWEEN, 5, None),
        (Operator.BETWEEN, 5, 7),
        (Operator.BETWEEN, 5, (1,)),
        (Operator.BETWEEN, 5, (1, 10, 20)),  # not a pair, even if 5 is in [1, 10]
        (Operator.BETWEEN, "c", (1, 10)),
        (Operator.EQUAL, Incomparable(), 1),
    ],
)
def test_values_that_cannot_be_compared_never_match_and_say_so(
    operator: Operator, actual: Any, expected: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="docket.execution"):
        assert compare(operator, actual, expected) is False
    (record,) = caplog.records
    assert record.name == "docket.execution"
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"Incompatible type for strike condition: {expected!r} {operator.value} {actual!r}"
    )
    assert record.exc_info is not None  # the comparison's error, for the log's traceback


def test_comparable_values_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        assert compare(Operator.BETWEEN, "b", ("a", "c"))
        assert not compare(Operator.EQUAL, "a", 1)  # == works across types
    assert caplog.records == []


def test_a_list_holding_an_incompatible_condition_still_matches_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strikes = applied(
        instruction(None, "n", Operator.GREATER_THAN, "text"),
        instruction(None, "n", Operator.BETWEEN, 3),
        instruction(None, "n", Operator.EQUAL, 7),
    )
    with caplog.at_level(logging.WARNING, logger="docket.execution"):
        assert strikes.is_struck("t", {"n": 7})
        assert not strikes.is_struck("t", {"n": 8})
    assert caplog.messages[0].startswith("Incompatible type for strike condition")


def test_operators_are_named_as_pydocket_names_them() -> None:
    assert [o.value for o in Operator] == ["==", "!=", ">", ">=", "<", "<=", "between"]


def test_a_new_list_is_empty_and_strikes_nothing() -> None:
    strikes = StrikeList()
    assert strikes.empty and strikes.applied == 0
    assert not strikes.is_struck("anything", {"x": 1})


def test_a_function_strike_stops_every_call_of_that_task_only() -> None:
    strikes = applied(instruction("send"))
    assert not strikes.empty
    assert strikes.is_struck("send", {})
    assert strikes.is_struck("send", {"customer": 1})
    assert not strikes.is_struck("other", {})


def test_a_parameter_strike_stops_any_task_called_with_a_matching_value() -> None:
    strikes = applied(instruction(None, "customer", Operator.GREATER_THAN, 100))
    assert strikes.is_struck("send", {"customer": 101})
    assert strikes.is_struck("bill", {"customer": 500})
    assert not strikes.is_struck("send", {"customer": 100})
    assert not strikes.is_struck("send", {"region": 101})  # no such argument


def test_a_scoped_strike_stops_only_that_task_with_that_value() -> None:
    strikes = applied(instruction("send", "customer", Operator.EQUAL, 7))
    assert strikes.is_struck("send", {"customer": 7})
    assert not strikes.is_struck("bill", {"customer": 7})
    assert not strikes.is_struck("send", {"customer": 8})


def test_conditions_on_one_parameter_add_up() -> None:
    strikes = applied(
        instruction(None, "customer", Operator.EQUAL, 1),
        instruction(None, "customer", Operator.EQUAL, 2),
    )
    assert strikes.is_struck("t", {"customer": 1}) and strikes.is_struck("t", {"customer": 2})
    assert not strikes.is_struck("t", {"customer": 3})


def test_restore_lifts_exactly_the_strike_made_with_the_same_arguments() -> None:
    strikes = applied(
        instruction("send"),
        instruction(None, "customer", Operator.EQUAL, 1),
        instruction(None, "customer", Operator.EQUAL, 2),
        instruction(None, "customer", Operator.EQUAL, 1, restore=True),
        instruction("send", restore=True),
    )
    assert not strikes.is_struck("send", {"customer": 1})
    assert strikes.is_struck("send", {"customer": 2})
    strikes.apply(instruction(None, "customer", Operator.EQUAL, 2, restore=True))
    assert strikes.empty
    assert strikes.applied == 6


def test_restoring_with_another_operator_or_value_changes_nothing() -> None:
    strikes = applied(
        instruction(None, "n", Operator.EQUAL, 1),
        instruction(None, "n", Operator.NOT_EQUAL, 1, restore=True),
        instruction(None, "n", Operator.EQUAL, 2, restore=True),
        instruction("t", "n", Operator.EQUAL, 1, restore=True),
    )
    assert strikes.is_struck("t", {"n": 1})


def test_striking_twice_needs_one_restore() -> None:
    strikes = applied(
        instruction(None, "n", Operator.EQUAL, 1),
        instruction(None, "n", Operator.EQUAL, 1),
        instruction(None, "n", Operator.EQUAL, 1, restore=True),
    )
    assert strikes.empty


def test_restoring_what_was_never_struck_is_harmless() -> None:
    strikes = applied(instruction("t", restore=True), instruction(None, "n", restore=True))
    assert strikes.empty and strikes.applied == 2


def test_an_instruction_naming_nothing_is_counted_and_ignored() -> None:
    strikes = applied(instruction())
    assert strikes.empty and strikes.applied == 1


def test_values_with_a_broken_equality_can_still_be_struck_and_restored() -> None:
    odd = Incomparable()
    strikes = applied(instruction(None, "n", Operator.LESS_THAN, odd))
    assert not strikes.is_struck("t", {"n": 1})
    strikes.apply(instruction(None, "n", Operator.LESS_THAN, odd, restore=True))
    assert not strikes.empty  # an unequal value cannot lift it


def test_the_same_instructions_give_every_process_the_same_list() -> None:
    log = [
        instruction("a"),
        instruction(None, "n", Operator.BETWEEN, (1, 5)),
        instruction("a", restore=True),
        instruction("b", "m", Operator.EQUAL, "x"),
    ]
    first, second = applied(*log), applied(*log)
    assert first == second
    calls = [("a", {"n": 3}), ("a", {"n": 9}), ("b", {"m": "x"}), ("c", {"m": "x"})]
    assert [first.is_struck(f, a) for f, a in calls] == [True, False, True, False]
