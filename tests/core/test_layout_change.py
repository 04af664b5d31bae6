"""The steps of settling a docket's partition count (``sansio.layout_change``),
checked one by one: the machine alone, and the races between openers played
through the production step (``partition_parts.perform``) on the memory
store."""

from __future__ import annotations

import uuid

import pytest

from docket_core.partition_parts import perform
from docket_core.sansio import layout_change
from docket_core.sansio.layout_change import (
    AskCount,
    AskPending,
    CountRecorded,
    ForgetLeaving,
    LayoutChange,
    LeavingForgotten,
    PartitionsStepped,
    PendingCounted,
    Stage,
    StepPartitions,
    layout_names,
)
from docket_memory.simulate import drive as run
from docket_memory.store import MemoryStore

NAME = "orders"


def test_keeping_the_recorded_count_takes_two_steps() -> None:
    change = LayoutChange(NAME, 3)
    assert change.step == AskCount(expected=3, new=3)
    change.receive(CountRecorded(count=3, epoch=4))
    assert change.step == StepPartitions(names=layout_names(NAME, 3), op="unseal", epoch=4)
    change.receive(PartitionsStepped(results=(False, True, False)))
    assert change.done and change.refusal is None and change.step is None


def test_a_change_closes_checks_records_seals_forgets_and_opens() -> None:
    change = LayoutChange(NAME, 3)
    change.receive(CountRecorded(count=1, epoch=2))
    assert change.step == StepPartitions(names=(NAME,), op="close", count=3)
    change.receive(PartitionsStepped(results=(True,)))
    assert change.step == AskPending(names=())  # (1 and 3 share no partition)
    change.receive(PendingCounted(counts=()))
    assert change.step == AskCount(expected=1, new=3)
    change.receive(CountRecorded(count=1, epoch=2))  # (won: 3 recorded, epoch 3)
    assert change.step == StepPartitions(names=(NAME,), op="seal", count=3, epoch=3)
    change.receive(PartitionsStepped(results=(True,)))
    assert change.step == ForgetLeaving(old=1)
    change.receive(LeavingForgotten())
    assert change.step == AskCount(expected=3, new=3)
    change.receive(CountRecorded(count=3, epoch=3))
    assert change.step == StepPartitions(names=layout_names(NAME, 3), op="unseal", epoch=3)
    change.receive(PartitionsStepped(results=(False,) * 3))
    assert change.done and change.refusal is None and change.reports == []


@pytest.mark.parametrize("busy", ["closing", "shared"])
def test_a_change_over_tasks_is_undone_and_refused(busy: str) -> None:
    change = LayoutChange(NAME, 2)
    change.receive(CountRecorded(count=3))
    step = change.step
    assert isinstance(step, StepPartitions) and step.op == "close"
    only_three = step.names
    shared = tuple(n for n in layout_names(NAME, 3) if n not in only_three)
    if busy == "closing":
        results = (True,) * (len(only_three) - 1) + (False,)
        change.receive(PartitionsStepped(results=results))
        closed = only_three[:-1]
    else:
        change.receive(PartitionsStepped(results=(True,) * len(only_three)))
        assert change.step == AskPending(names=shared)
        change.receive(PendingCounted(counts=(0,) * (len(shared) - 1) + (1,)))
        closed = only_three
    assert change.step == StepPartitions(names=closed, op="undo", count=2)
    change.receive(PartitionsStepped(results=(True,) * len(closed)))
    assert change.done
    assert change.refusal is not None and "holds tasks in 3 partitions" in change.refusal


def test_a_lost_compare_and_set_undoes_and_looks_again_a_few_times() -> None:
    change = LayoutChange(NAME, 2)
    for _ in range(layout_change.SETTLE_ATTEMPTS):
        change.receive(CountRecorded(count=1))
        change.receive(PartitionsStepped(results=(True,)))
        change.receive(PendingCounted(counts=()))
        change.receive(CountRecorded(count=3))  # (lost: someone recorded 3)
        assert change.step == StepPartitions(names=(NAME,), op="undo", count=2)
        change.receive(PartitionsStepped(results=(True,)))
        assert change.step == AskCount(expected=2, new=2)
    change.receive(CountRecorded(count=1))
    assert change.done and change.refusal is not None and "keeps changing" in change.refusal


def test_a_seal_owed_is_paid_before_anything_else() -> None:
    change = LayoutChange(NAME, 2)
    change.receive(CountRecorded(count=3, leaving=1, epoch=7))
    assert change.step == StepPartitions(names=(NAME,), op="seal", count=3, epoch=7)
    change.receive(PartitionsStepped(results=(False,)))
    (strays,) = change.reports
    assert (strays.old, strays.new, strays.names) == (1, 3, (NAME,))
    assert change.step == ForgetLeaving(old=1)
    change.receive(LeavingForgotten())
    assert change.step == AskCount(expected=2, new=2)  # (then the change to 2)


def test_a_finishing_run_seals_forgets_and_opens_without_changing_the_count() -> None:
    change = LayoutChange.finishing(NAME, CountRecorded(count=3, leaving=2, epoch=5))
    only_two = tuple(n for n in layout_names(NAME, 2) if n not in layout_names(NAME, 3))
    assert change.step == StepPartitions(names=only_two, op="seal", count=3, epoch=5)
    change.receive(PartitionsStepped(results=(True,) * len(only_two)))
    assert change.step == ForgetLeaving(old=2)
    change.receive(LeavingForgotten())
    assert change.step == StepPartitions(names=layout_names(NAME, 3), op="unseal", epoch=5)
    change.receive(PartitionsStepped(results=(False,) * 3))
    assert change.done and change.refusal is None


def test_an_answer_to_a_settled_change_is_a_mistake() -> None:
    change = LayoutChange(NAME, 1)
    change.receive(CountRecorded(count=1))
    change.receive(PartitionsStepped(results=(False,)))
    with pytest.raises(RuntimeError, match="settled"):
        change.receive(CountRecorded(count=1))


def test_the_table_and_the_stages_agree() -> None:
    """Every stage but the end is left by some row, and reached by one."""
    sources = {source for source, _ in layout_change.TRANSITIONS}
    targets = set(layout_change.TRANSITIONS.values())
    assert sources == set(Stage) - {Stage.DONE}
    assert targets | {Stage.CHECKING, Stage.FINISH_SEALING} == set(Stage)
    assert len(layout_change.diagram().splitlines()) == len(layout_change.TRANSITIONS)


# -- races, through the production step ---------------------------------------------------


class Docket:
    """The partitions of ``NAME`` in a fresh memory location."""

    def __init__(self) -> None:
        self.location = f"races-{uuid.uuid4().hex}"
        self.home = MemoryStore(name=NAME, location=self.location)
        self.now = 1_000_000.0

    def step(self, change: LayoutChange, steps: int = 1) -> None:
        for _ in range(steps):
            assert change.step is not None
            change.receive(run(perform(self.home, change.step, self.now)))

    def settle(self, change: LayoutChange) -> None:
        while not change.done:
            self.step(change)
        assert change.refusal is None

    def closed(self, name: str) -> object:
        return MemoryStore(name=name, location=self.location).shelf.closed


def test_an_opener_that_looked_before_a_change_away_leaves_its_seals() -> None:
    """A reads 2, B changes 2 -> 3 all the way, then A removes the seals of
    its layout: only those of changes at its epoch or before, so B's stay
    and a producer of 2 cannot add where no worker of 3 reads."""
    docket = Docket()
    docket.settle(LayoutChange(NAME, 2))
    a = LayoutChange(NAME, 2)
    docket.step(a)  # (A: 2 recorded, epoch 1)
    assert a.stage is Stage.OPENING
    docket.settle(LayoutChange(NAME, 3))  # (B)
    only_two = [n for n in layout_names(NAME, 2) if n not in layout_names(NAME, 3)]
    assert only_two, "this name's layouts of 2 and 3 share every partition"
    sealed = {n: docket.closed(n) for n in only_two}
    assert all(c is not None and c[0] == "sealed" for c in sealed.values())  # type: ignore[index]
    docket.step(a)
    assert a.done
    assert {n: docket.closed(n) for n in only_two} == sealed


def test_a_change_that_died_after_its_compare_and_set_is_finished_by_the_next_opener() -> None:
    docket = Docket()
    dead = LayoutChange(NAME, 3)
    docket.step(dead, steps=4)  # (checked, closed, checked the shared, recorded)
    assert dead.stage is Stage.SEALING_LEFT
    docket.now += 3600  # (the close lease ran out long ago)
    assert docket.closed(NAME) is None or docket.closed(NAME)[0] == "lease"  # type: ignore[index]
    docket.settle(LayoutChange(NAME, 3))
    closed = docket.closed(NAME)
    assert closed is not None and closed[:2] == ("sealed", 3)  # type: ignore[index]
    assert docket.home.shelf.leaving is None


def test_a_change_that_lost_its_compare_and_set_leaves_the_winners_seals() -> None:
    """C and D both change 3 -> 1; C wins and seals 3's partitions before D
    closes them: D's close keeps the seals, so its undo opens nothing."""
    docket = Docket()
    docket.settle(LayoutChange(NAME, 3))
    c, d = LayoutChange(NAME, 1), LayoutChange(NAME, 1)
    docket.step(d)  # (D: 3 recorded; its close is next)
    docket.settle(c)
    docket.settle(d)
    for name in layout_names(NAME, 3):
        closed = docket.closed(name)
        assert closed is not None and closed[:2] == ("sealed", 1), name  # type: ignore[index]
