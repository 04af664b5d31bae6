"""Table-driven tests of ``lifecycle.advance``: every row of ``TRANSITIONS``
moves where the table says, and every other (phase, step) pair is refused."""

from __future__ import annotations

import textwrap

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
    assert lifecycle.EXECUTING == {
        Phase.RUNNING,
        Phase.CANCELLING,
        Phase.TIMING_OUT,
        Phase.ABANDONING,
        Phase.EARLY_RUNNING,
        Phase.EARLY_CANCELLING,
    }
    assert lifecycle.STOPPABLE == lifecycle.EXECUTING - {Phase.ABANDONING}


STOPPED_BEFORE_START = {
    # (phase, the store's go-ahead) -> where the delivery goes instead of RUNNING
    (Phase.CLAIMING_CANCELLED, Step.CLAIMED): Phase.CANCELLING,
    (Phase.CLAIMING_LOST, Step.CLAIMED): Phase.ABANDONING,
    (Phase.ADMITTING_CANCELLED, Step.SLOT_ACQUIRED): Phase.CANCELLING,
    (Phase.ADMITTING_LOST, Step.SLOT_ACQUIRED): Phase.ABANDONING,
}


@pytest.mark.parametrize(("pair", "target"), STOPPED_BEFORE_START.items())
def test_a_delivery_stopped_before_it_starts_never_runs(
    pair: tuple[Phase, Step], target: Phase
) -> None:
    assert advance(*pair) is target


def test_a_stop_while_waiting_for_the_store_is_a_phase_of_its_own() -> None:
    """No stop is a self-loop while a ``Claim`` or ``AcquireSlot`` is out: the
    phase alone says what happens once the store answers."""
    for waiting, cancelled, lost in (
        (Phase.CLAIMING, Phase.CLAIMING_CANCELLED, Phase.CLAIMING_LOST),
        (Phase.ADMITTING, Phase.ADMITTING_CANCELLED, Phase.ADMITTING_LOST),
    ):
        assert advance(waiting, Step.CANCEL) is cancelled
        assert advance(waiting, Step.LEASE_LOST) is lost
        # a lost lease wins over a cancel, never the reverse
        assert advance(cancelled, Step.LEASE_LOST) is lost
        assert advance(lost, Step.CANCEL) is lost


def test_a_timeout_has_its_own_phase() -> None:
    assert advance(Phase.RUNNING, Step.TIMEOUT) is Phase.TIMING_OUT
    assert advance(Phase.TIMING_OUT, Step.CANCEL) is Phase.TIMING_OUT
    assert advance(Phase.TIMING_OUT, Step.LEASE_LOST) is Phase.ABANDONING
    assert advance(Phase.TIMING_OUT, Step.ENDED) is Phase.FINISHING


def test_the_docstring_diagram_is_the_table() -> None:
    """The diagram in ``lifecycle``'s docstring is exactly ``diagram()``:
    regenerate it with ``python -m docket_core.sansio --diagram``."""
    doc = lifecycle.__doc__
    assert doc is not None
    marker = "change nothing::\n\n"
    assert marker in doc
    drawn = textwrap.dedent(doc.split(marker, 1)[1]).strip("\n")
    assert drawn == lifecycle.diagram()


def test_the_diagram_names_every_row() -> None:
    drawn = lifecycle.diagram()
    for phase in Phase:
        assert phase.name in drawn
    rows = sum(line.count("|") + 1 for line in drawn.splitlines() if "(final)" not in line)
    assert rows == len(TRANSITIONS)


def test_table_is_not_trivially_empty() -> None:
    assert TRANSITIONS
    assert len(MISSING) == len(ALL_PAIRS) - len(TRANSITIONS)


def test_the_core_enums_hash_by_identity() -> None:
    """Every enum of the core is a ``Symbol``: its members hash by identity
    (``Enum.__hash__`` is a Python call, made about ten times a task), and a
    member still equals only itself, also after a round trip through pickle."""
    import enum
    import importlib
    import pickle
    import pkgutil

    import docket_core.sansio as sansio
    from docket_core.sansio.values import Symbol

    enums = []
    for module_info in pkgutil.iter_modules(sansio.__path__):
        module = importlib.import_module(f"docket_core.sansio.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, enum.Enum) and value is not Symbol:
                if value.__module__ == module.__name__:
                    enums.append(value)
    assert Phase in enums and Step in enums
    plain = [e.__qualname__ for e in enums if not issubclass(e, Symbol) and not issubclass(e, str)]
    assert plain == [], f"core enums that hash through Enum.__hash__: {plain}"
    for kind in enums:
        if issubclass(kind, Symbol):
            members = list(kind)
            index = {member: n for n, member in enumerate(members)}
            for n, member in enumerate(members):
                assert index[member] == n and index[kind(member.value)] == n
                assert hash(member) == object.__hash__(member)
                assert pickle.loads(pickle.dumps(member)) is member
