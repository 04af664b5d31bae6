"""Changes of a docket's partition count (``sansio.layout_change``), played
by hypothesis against the memory store, one step at a time through the
production step (``partition_parts.perform``): several openers with
different counts interleave their steps, die between any two, and the clock
jumps past the close lease; producers still open with any count that was
once opened add tasks; partitioned workers of the recorded count finish a
dead change's seal at their heartbeats, and drain their layout.

The invariants:

- no task is stranded silently: a partition outside the recorded layout
  that holds a task is one a seal is still owed on (the count that left is
  recorded), or one a seal reported (``Strays``);
- a producer of the recorded count is refused only by a lease of a change
  under way, or by a seal whose change was undone since (a fresh opener
  removes it);
- once every opener is gone and the lease ran out, one opener of the
  recorded count settles everything: no seal owed, and every partition of
  the recorded layout takes tasks.
"""

from __future__ import annotations

import itertools
import uuid

from core_harness import MACHINE_SETTINGS, run
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from docket_core.partition_parts import CLOSE_LEASE, perform
from docket_core.sansio.decisions import plan_add
from docket_core.sansio.effects import Cancel
from docket_core.sansio.errors import StoreError
from docket_core.sansio.layout_change import LayoutChange, layout_names
from docket_core.sansio.partitions import partition_of
from docket_core.sansio.values import ScheduleMode
from docket_memory import store as memory_store
from docket_memory.store import MemoryStore

NAME = "orders"
COUNTS = (1, 2, 3)
START = 1_000_000.0


class LayoutChanges(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.location = f"layout-{uuid.uuid4().hex}"
        self.home = MemoryStore(name=NAME, location=self.location)
        self.now = START
        #: openers and finishing runs under way
        self.changes: list[LayoutChange] = []
        #: the counts producers are open with (any count once opened)
        self.opened: set[int] = {1}
        #: partition -> keys it holds
        self.held: dict[str, set[str]] = {}
        #: partitions a seal reported tasks in
        self.reported: set[str] = set()
        self.serial = itertools.count()

    def teardown(self) -> None:
        try:
            self.everything_settles()
        finally:
            for key in [k for k in memory_store._SHELVES if k[0] == self.location]:
                del memory_store._SHELVES[key]

    def store(self, name: str) -> MemoryStore:
        return self.home if name == NAME else MemoryStore(name=name, location=self.location)

    @property
    def recorded(self) -> tuple[int, int | None]:
        shelf = self.home.shelf
        return shelf.partitions, shelf.leaving

    def step(self, change: LayoutChange) -> None:
        assert change.step is not None
        change.receive(run(perform(self.home, change.step, self.now)))
        for strays in change.reports:
            self.reported.update(strays.names)
        change.reports.clear()

    # -- rules -------------------------------------------------------------------

    @rule(count=st.sampled_from(COUNTS))
    def open_a_docket(self, count: int) -> None:
        self.changes.append(LayoutChange(NAME, count))

    @precondition(lambda self: self.changes)
    @rule(which=st.integers(0, 10), steps=st.integers(1, 4))
    def step_a_change(self, which: int, steps: int) -> None:
        change = self.changes[which % len(self.changes)]
        for _ in range(steps):
            self.step(change)
            if change.done:
                self.changes.remove(change)
                if change.refusal is None:
                    self.opened.add(change.partitions)
                return

    @precondition(lambda self: self.changes)
    @rule(which=st.integers(0, 10))
    def an_opener_dies(self, which: int) -> None:
        del self.changes[which % len(self.changes)]

    @rule(seconds=st.sampled_from([0.5, 5.0, CLOSE_LEASE + 1]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(data=st.data())
    def a_producer_adds(self, data: st.DataObject) -> None:
        """A producer open with some count adds a task to each of its partitions."""
        count = data.draw(st.sampled_from(sorted(self.opened)))
        names = layout_names(NAME, count)
        for index, target in enumerate(names):
            key = next(
                k
                for k in (f"k{next(self.serial)}" for _ in itertools.repeat(None))
                if partition_of(k, count) == index
            )
            effect = plan_add(
                key=key,
                function="f",
                payload=b"",
                when=self.now,
                mode=ScheduleMode.ADD,
                now=self.now,
            )
            try:
                run(self.store(target).execute([effect]))
            except StoreError as error:
                self.check_refusal(count, target, str(error))
                continue
            self.held.setdefault(target, set()).add(key)

    def check_refusal(self, count: int, target: str, error: str) -> None:
        """A producer of the recorded count is refused only by a change under
        way (a lease), or a seal of a change undone since."""
        recorded, _ = self.recorded
        if count != recorded or "changes to" in error:
            return
        closed = self.store(target).shelf.closed
        assert closed is not None and closed[0] == "sealed", error
        assert closed[1] != recorded, f"{target} sealed for the count recorded: {error}"

    @rule(count=st.sampled_from(COUNTS))
    def a_worker_heartbeats(self, count: int) -> None:
        recorded = run(self.home.record_partitions(count, count))
        if recorded.count == count and recorded.leaving is not None:
            self.changes.append(LayoutChange.finishing(NAME, recorded))

    @rule()
    def workers_drain_the_recorded_layout(self) -> None:
        recorded, _ = self.recorded
        for name in layout_names(NAME, recorded):
            for key in self.held.pop(name, set()):
                run(self.store(name).execute([Cancel(key=key, now=self.now, ttl=60.0)]))

    def everything_settles(self) -> None:
        """At the end: openers gone, the lease run out, one opener of the
        recorded count settles the docket alone."""
        self.changes.clear()
        self.now += CLOSE_LEASE + 1
        recorded, _ = self.recorded
        change = LayoutChange(NAME, recorded)
        for _ in range(20):
            if change.done:
                break
            self.step(change)
        assert change.done and change.refusal is None
        assert self.recorded == (recorded, None)
        for name in layout_names(NAME, recorded):
            closed = self.store(name).shelf.closed
            open_now = closed is None or (closed[0] == "lease" and closed[2] <= self.now)
            assert open_now, f"{name} of the recorded layout is closed: {closed}"

    # -- invariants --------------------------------------------------------------

    @invariant()
    def no_task_is_stranded_silently(self) -> None:
        recorded, leaving = self.recorded
        ours = set(layout_names(NAME, recorded))
        owed = set(layout_names(NAME, leaving)) if leaving is not None else set()
        for name, keys in self.held.items():
            assert run(self.store(name).pending()) == len(keys)
            if keys and name not in ours:
                assert name in owed or name in self.reported, (
                    f"{sorted(keys)} in {name}: outside the {recorded}-partition layout, "
                    f"no seal owed ({leaving}) and none reported"
                )


LayoutChanges.TestCase.settings = settings(MACHINE_SETTINGS, max_examples=1000)
test_partition_count_changes = LayoutChanges.TestCase
