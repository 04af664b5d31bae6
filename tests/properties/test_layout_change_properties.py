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
- a task in a partition of the recorded layout is one its key routes there
  under the recorded count (so ``cancel`` and ``get_execution`` find it),
  unless a close lease ran out while a change was under way (an opener
  stalled past it);
- a producer of the recorded count is refused only by a lease of a change
  under way, or by a seal of another count whose change was undone since (a
  fresh opener gives it to the recorded count);
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
        #: a close lease ran out while a change was under way
        self.lapsed = False
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
        self.changes.append(LayoutChange(NAME, count, owner=f"o{next(self.serial)}"))

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
        if seconds > CLOSE_LEASE:
            _, leaving = self.recorded
            names = {n for count in COUNTS for n in layout_names(NAME, count)}
            if leaving is not None or any(self.store(n).shelf.leases(self.now) for n in names):
                self.lapsed = True
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
                producer = MemoryStore(name=target, location=self.location, partitions=count)
                run(producer.execute([effect]))
            except StoreError as error:
                self.check_refusal(count, target, str(error))
                continue
            self.held.setdefault(target, set()).add(key)

    def check_refusal(self, count: int, target: str, error: str) -> None:
        """A producer of the recorded count is refused only by a change under
        way (a lease), or a seal of another count of a change undone since."""
        recorded, _ = self.recorded
        if count != recorded or "changes to" in error:
            return
        sealed = self.store(target).shelf.sealed
        assert sealed is not None, error
        assert sealed[0] != recorded, f"{target} sealed for the count recorded: {error}"

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
        change = LayoutChange(NAME, recorded, owner="last")
        for _ in range(20):
            if change.done:
                break
            self.step(change)
        assert change.done and change.refusal is None
        assert self.recorded == (recorded, None)
        for name in layout_names(NAME, recorded):
            shelf = self.store(name).shelf
            leases, sealed = shelf.leases(self.now), shelf.sealed
            assert not leases, f"{name} is closing: {leases}"
            assert sealed is None or sealed[0] == recorded, f"{name} is sealed: {sealed}"

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

    @invariant()
    def a_key_is_where_the_recorded_count_looks(self) -> None:
        if self.lapsed:
            return
        recorded, _ = self.recorded
        names = layout_names(NAME, recorded)
        for name in names:
            for key in self.held.get(name, ()):
                assert names[partition_of(key, recorded)] == name, (
                    f"{key} in {name}: the {recorded}-partition layout looks for it in "
                    f"{names[partition_of(key, recorded)]}"
                )


LayoutChanges.TestCase.settings = settings(MACHINE_SETTINGS, max_examples=1000)
test_partition_count_changes = LayoutChanges.TestCase
