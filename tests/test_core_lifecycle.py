"""Table-driven tests of ``lifecycle.advance``: every row of ``TRANSITIONS``
moves where the table says, and every other (phase, step) pair is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from docket_core.sansio import lifecycle
from docket_core.sansio.errors import DocketError, InvalidTransition
from docket_core.sansio.lifecycle import TRANSITIONS, Phase, Step, advance

ALL_PAIRS = [(phase, step) for phase in Phase for step in Step]
MISSING = [pair for pair in ALL_PAIRS if pair not in TRANSITIONS]


@pytest.mark.parametrize(
    ("phase", "step", "expected"),
    [(phase, step, target) for (phase, step), target in TRANSITIONS.items()],
    ids=[f"{phase.value}-{step.value}" for phase, step in TRANSITIONS],
)
def test_every_row_of_the_table(phase: Phase, step: Step, expected: Phase) -> None:
    assert advance(phase, step) is expected


@pytest.mark.parametrize(
    ("phase", "step"), MISSING, ids=[f"{p.value}-{s.value}" for p, s in MISSING]
)
def test_every_missing_pair_is_refused(phase: Phase, step: Step) -> None:
    with pytest.raises(InvalidTransition) as caught:
        advance(phase, step)
    assert caught.value.phase is phase
    assert caught.value.event is step
    assert str(phase) in str(caught.value)
    assert str(step) in str(caught.value)


@given(st.sampled_from(Phase), st.sampled_from(Step))
def test_advance_matches_the_table(phase: Phase, step: Step) -> None:
    if (phase, step) in TRANSITIONS:
        assert advance(phase, step) is TRANSITIONS[(phase, step)]
    else:
        with pytest.raises(InvalidTransition) as caught:
            advance(phase, step)
        message = str(caught.value)
        assert str(phase) in message and str(step) in message
        assert isinstance(caught.value, DocketError)
        assert caught.value.__cause__ is None
        assert caught.value.__suppress_context__


def test_done_is_terminal() -> None:
    for step in Step:
        with pytest.raises(InvalidTransition):
            advance(Phase.DONE, step)


def test_every_phase_but_done_has_a_way_out() -> None:
    for phase in Phase:
        if phase is Phase.DONE:
            continue
        assert any(
            target is not phase for (source, _), target in TRANSITIONS.items() if source is phase
        ), phase


def test_done_is_reachable_from_every_phase() -> None:
    reaches = {Phase.DONE}
    changed = True
    while changed:
        changed = False
        for (source, _), target in TRANSITIONS.items():
            if target in reaches and source not in reaches:
                reaches.add(source)
                changed = True
    assert reaches == set(Phase)


def test_holding_and_executing_phases() -> None:
    assert Phase.DONE not in lifecycle.HOLDING
    assert Phase.ABANDONING not in lifecycle.HOLDING
    assert lifecycle.EXECUTING == {Phase.RUNNING, Phase.CANCELLING, Phase.ABANDONING}


def test_table_is_not_trivially_empty() -> None:
    assert TRANSITIONS
    assert len(MISSING) == len(ALL_PAIRS) - len(TRANSITIONS)
