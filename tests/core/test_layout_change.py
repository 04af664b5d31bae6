"""The steps of settling a docket's partition count (``sansio.layout_change``),
checked one by one: the machine alone, and the races between openers played
through the production step (``partition_parts.perform``) on the memory
store."""

from __future__ import annotations

import uuid

import pytest

from docket_core.partition_parts import CLOSE_LEASE, perform
from docket_core.sansio import layout_change
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.errors import StoreError
from docket_core.sansio.layout_change import (
    AskCount,
    CountRecorded,
    ForgetLeaving,
    LayoutChange,
    LeavingForgotten,
    PartitionsStepped,
    Stage,
    StepPartitions,
    layout_names,
)
from docket_core.sansio.partitions import partition_of
from docket_core.sansio.values import ScheduleMode
from docket_memory.simulate import drive as run
from docket_memory.store import MemoryStore

NAME = "orders"


def test_keeping_the_recorded_count_takes_two_steps() -> None:
    change = LayoutChange(NAME, 3)
    assert change.step == AskCount(expected=3, new=3)
    change.receive(CountRecorded(count=3, epoch=4))
    assert change.step == StepPartitions(names=layout_names(NAME, 3), op="unseal", count=3, epoch=4)
    change.receive(PartitionsStepped(results=(False, True, False)))
    assert change.done and change.refusal is None and change.step is None


def test_a_change_closes_records_seals_forgets_and_opens() -> None:
    change = LayoutChange(NAME, 3)
    change.receive(CountRecorded(count=1, epoch=2))
    assert change.step == StepPartitions(names=(NAME,), op="close", count=3)
    change.receive(PartitionsStepped(results=(True,)))
    assert change.step == AskCount(expected=1, new=3, epoch=2)  # (the epoch read)
    change.receive(CountRecorded(count=1, epoch=2))  # (won: 3 recorded, epoch 3)
    assert change.step == StepPartitions(names=(NAME,), op="seal", count=3, epoch=3)
    change.receive(PartitionsStepped(results=(True,)))
    assert change.step == ForgetLeaving(old=1, epoch=3)
    change.receive(LeavingForgotten())
    assert change.step == AskCount(expected=3, new=3)
    change.receive(CountRecorded(count=3, epoch=3))
    assert change.step == StepPartitions(names=layout_names(NAME, 3), op="unseal", count=3, epoch=3)
    change.receive(PartitionsStepped(results=(False,) * 3))
    assert change.done and change.refusal is None and change.reports == []


def test_a_change_closes_and_seals_the_partitions_both_layouts_share_too() -> None:
    """``orders`` has partition 1 of 2 in its layout of 3: an old producer
    adding there would put a key where 3's lookups by key do not look."""
    shared = set(layout_names(NAME, 2)) & set(layout_names(NAME, 3))
    assert shared, "this name's layouts of 2 and 3 share no partition"
    change = LayoutChange(NAME, 3)
    change.receive(CountRecorded(count=2, epoch=4))
    assert change.step == StepPartitions(names=layout_names(NAME, 2), op="close", count=3)
    change.receive(PartitionsStepped(results=(True, True)))
    change.receive(CountRecorded(count=2, epoch=4))  # (won)
    assert change.step == StepPartitions(names=layout_names(NAME, 2), op="seal", count=3, epoch=5)
    # a seal that found tasks without its lease reports only the partitions
    # 3 has not: a shared one's tasks run under 3
    change.receive(PartitionsStepped(results=(False, False)))
    (strays,) = change.reports
    assert set(strays.names) == set(layout_names(NAME, 2)) - shared


@pytest.mark.parametrize("busy", ["only", "shared"])
def test_a_change_over_tasks_is_undone_and_refused(busy: str) -> None:
    change = LayoutChange(NAME, 2)
    change.receive(CountRecorded(count=3))
    names = layout_names(NAME, 3)
    assert change.step == StepPartitions(names=names, op="close", count=2)
    two = layout_names(NAME, 2)
    busy_at = next(i for i, n in enumerate(names) if (n in two) == (busy == "shared"))
    results = tuple(i != busy_at for i in range(len(names)))
    change.receive(PartitionsStepped(results=results))
    closed = tuple(n for n, ok in zip(names, results, strict=True) if ok)
    assert change.step == StepPartitions(names=closed, op="undo", count=2)
    change.receive(PartitionsStepped(results=(True,) * len(closed)))
    assert change.done
    assert change.refusal is not None and "holds tasks in 3 partitions" in change.refusal


def test_a_lost_compare_and_set_undoes_and_looks_again_a_few_times() -> None:
    change = LayoutChange(NAME, 2)
    for _ in range(layout_change.SETTLE_ATTEMPTS):
        change.receive(CountRecorded(count=1))
        change.receive(PartitionsStepped(results=(True,)))
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
    assert change.step == ForgetLeaving(old=1, epoch=7)
    change.receive(LeavingForgotten())
    assert change.step == AskCount(expected=2, new=2)  # (then the change to 2)


def test_a_finishing_run_seals_forgets_and_opens_without_changing_the_count() -> None:
    change = LayoutChange.finishing(NAME, CountRecorded(count=3, leaving=2, epoch=5))
    two = layout_names(NAME, 2)
    assert change.step == StepPartitions(names=two, op="seal", count=3, epoch=5)
    change.receive(PartitionsStepped(results=(True,) * len(two)))
    assert change.step == ForgetLeaving(old=2, epoch=5)
    change.receive(LeavingForgotten())
    assert change.step == StepPartitions(names=layout_names(NAME, 3), op="unseal", count=3, epoch=5)
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

    def sealed(self, name: str) -> tuple[int, int] | None:
        """``(count, epoch)`` of ``name``'s seal."""
        return MemoryStore(name=name, location=self.location).shelf.sealed

    def closing(self, name: str) -> set[tuple[int, str]]:
        """The close leases of ``name`` that hold, as ``(count, owner)``."""
        return MemoryStore(name=name, location=self.location).shelf.leases(self.now)


def test_an_opener_that_looked_before_a_change_away_leaves_its_seals() -> None:
    """A reads 2, B changes 2 -> 3 all the way, then A gives 2 the seals of
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
    sealed = {n: docket.sealed(n) for n in only_two}
    assert all(c is not None and c[0] == 3 for c in sealed.values())
    docket.step(a)
    assert a.done
    assert {n: docket.sealed(n) for n in only_two} == sealed


def test_a_change_that_died_after_its_compare_and_set_is_finished_by_the_next_opener() -> None:
    docket = Docket()
    dead = LayoutChange(NAME, 3)
    docket.step(dead, steps=3)  # (checked, closed, recorded)
    assert dead.stage is Stage.SEALING_LEFT
    docket.now += 3600  # (the close lease ran out long ago)
    assert not docket.closing(NAME) and docket.sealed(NAME) is None
    docket.settle(LayoutChange(NAME, 3))
    sealed = docket.sealed(NAME)
    assert sealed is not None and sealed[0] == 3
    assert docket.home.shelf.leaving is None


def test_a_change_that_lost_its_compare_and_set_leaves_the_winners_seals() -> None:
    """C and D both change 3 -> 1; C wins and seals 3's partitions before D
    closes them: D's close keeps the seals, so its undo opens nothing."""
    docket = Docket()
    docket.settle(LayoutChange(NAME, 3))
    c, d = LayoutChange(NAME, 1, owner="c"), LayoutChange(NAME, 1, owner="d")
    docket.step(d)  # (D: 3 recorded; its close is next)
    docket.settle(c)
    docket.settle(d)
    for name in layout_names(NAME, 3):
        sealed = docket.sealed(name)
        assert sealed is not None and sealed[0] == 1, name
        assert not docket.closing(name), name  # (D's lease undone)


def test_a_change_that_backs_off_leaves_the_leases_of_another_change() -> None:
    """B changes 2 -> 3 up to its compare-and-set; C (to 1) closes 2's
    partitions too, loses and undoes: B's leases stay, so until B seals, a
    producer still open with 2 adds nowhere (found by the hypothesis machine:
    in a partition 2 and 3 share, its key was where 3 does not look)."""
    docket = Docket()
    docket.settle(LayoutChange(NAME, 2, owner="a"))
    b, c = LayoutChange(NAME, 3, owner="b"), LayoutChange(NAME, 1, owner="c")
    docket.step(c)  # (C: 2 recorded; its close is next)
    docket.step(b, steps=3)  # (B: checked, closed, recorded)
    assert b.stage is Stage.SEALING_LEFT
    docket.step(c, steps=3)  # (C: closed, lost, undone)
    assert c.stage is Stage.CHECKING
    for name in layout_names(NAME, 2):
        assert docket.closing(name) == {(3, "b")}, name
        producer = MemoryStore(name=name, location=docket.location, partitions=2)
        with pytest.raises(StoreError, match="while the docket changes to 3 partitions"):
            producer.shelf.refuse_closed(2, docket.now)
    docket.settle(b)
    docket.settle(c)  # (C: 3 recorded now, with no task: 3 -> 1)
    for name in layout_names(NAME, 3):
        assert docket.sealed(name) is not None and docket.sealed(name)[0] == 1  # type: ignore[index]


def add_to(docket: Docket, name: str, count: int, index: int, avoid: str = "") -> str:
    """A producer of ``count`` adds a key of partition ``index`` to ``name``
    (one ``avoid``'s layout of 3 does not put there, when given); the key."""
    key = next(
        k
        for k in (f"k{n}" for n in range(10_000))
        if partition_of(k, count) == index
        and (not avoid or layout_names(NAME, 3)[partition_of(k, 3)] != avoid)
    )
    producer = MemoryStore(name=name, location=docket.location, partitions=count)
    add = plan_add(
        key=key, function="f", payload=b"", when=docket.now, mode=ScheduleMode.ADD, now=docket.now
    )
    run(producer.execute([add]))
    return key


def test_a_change_whose_count_went_away_and_came_back_records_nothing() -> None:
    """A (to 3) reads 2 and closes 2's partitions; B changes 2 -> 3 (its
    seals remove A's leases), C changes 3 -> 2, and a producer of 2 adds to
    a partition 2 and 3 share.  A's compare-and-set names the epoch it read:
    it records nothing, and A is refused (2 holds a task) instead of putting
    that key where 3 does not look (found by a review)."""
    docket = Docket()
    docket.settle(LayoutChange(NAME, 2, owner="first"))
    a = LayoutChange(NAME, 3, owner="a")
    docket.step(a, steps=2)  # (checked: 2 at epoch 1; closed)
    assert a.stage is Stage.RECORDING
    docket.settle(LayoutChange(NAME, 3, owner="b"))
    docket.settle(LayoutChange(NAME, 2, owner="c"))
    (shared,) = set(layout_names(NAME, 2)) & set(layout_names(NAME, 3))
    add_to(docket, shared, 2, layout_names(NAME, 2).index(shared), avoid=shared)
    while not a.done:
        docket.step(a)
    assert a.refusal is not None and "holds tasks in 2 partitions" in a.refusal
    assert (docket.home.shelf.partitions, docket.home.shelf.leaving) == (2, None)


def test_a_late_forget_leaves_the_leaving_count_of_a_later_change() -> None:
    """A changes 2 -> 3 and stalls before its forget; B, C and D change the
    count 3 -> 2 -> 1, D dying before its seal (2 leaving).  A's late
    forget of 2 names its own epoch: D's seal stays owed, so the next opener
    seals 2's partitions, and a task a producer of 2 put there once D's lease
    ran out is reported, not stranded silently (found by a review)."""
    docket = Docket()
    docket.settle(LayoutChange(NAME, 2, owner="first"))
    a = LayoutChange(NAME, 3, owner="a")
    docket.step(a, steps=4)  # (checked, closed, recorded, sealed)
    assert a.stage is Stage.FORGETTING
    docket.settle(LayoutChange(NAME, 3, owner="b"))
    docket.settle(LayoutChange(NAME, 2, owner="c"))
    d = LayoutChange(NAME, 1, owner="d")
    docket.step(d, steps=3)  # (checked, closed, recorded: dies)
    docket.step(a)  # (A's forget of 2)
    assert docket.home.shelf.leaving == 2
    docket.now += CLOSE_LEASE + 1
    name = layout_names(NAME, 2)[0]
    add_to(docket, name, 2, 0)
    e = LayoutChange(NAME, 1, owner="e")
    reported = []
    while not e.done:
        docket.step(e)
        reported += e.reports
        e.reports.clear()
    assert e.refusal is None
    assert [r.names for r in reported] == [(name,)]
