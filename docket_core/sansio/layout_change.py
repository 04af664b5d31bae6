"""A docket's partition count, settled by whoever opens it: the steps of
keeping it, or of changing it without stranding a task (pure).

Theory of operation
-------------------
The home store records the count a docket's producers and workers use
(absent: 1), and, after a change, the count that left (``leaving``) until
that count's partitions are sealed. Every add names its producer's count,
and a partition a change closed takes adds of one count only: a producer
still open with an old count would add where no worker of the new count
reads, or, in a partition both layouts share (their tags can be the same),
where a worker reads it but the new count's lookups by key (``cancel``,
``get_execution``, a duplicate key) do not look. So a change from the
recorded count R to N first *closes* all of R's partitions to every add
(each atomically, only if it holds no task, under a lease of ``CLOSE_LEASE``
seconds that carries the change's ``owner``: another change's undo removes
only its own lease, and a seal stays under them, so a change that gives up
never opens what another change closed or sealed; closed, a partition
refuses adds with an error naming N), then records N by compare-and-set (of
the count and the ``epoch`` it read: a count that went away and came back
since is not the one it closed; it also records ``leaving = R``, and fails
while an earlier change's seal is pending), *seals* R's partitions for N
(for good, every lease removed: the ones N has not take nothing, the shared
ones N's adds only; a change still under way loses its compare-and-set, the
epoch having moved) and forgets ``leaving`` (if the epoch is still its
change's: a late forget leaves a later change's ``leaving``). Each change
counts one more ``epoch``, and its seals carry it. Last, any opener of the
recorded count gives the seals of other counts its own layout carries, from
its epoch or before (a change away that was undone since), to its count; a
seal of a change away that ran after it read the count is later, so it
stays.

Crashes: every step is one atomic call, and an opener may die between any
two.  Before the compare-and-set, R stays recorded and its closed
partitions open again when the lease runs out.  After it, ``leaving`` says
a seal is owed: the next opener, and every partitioned worker at its
heartbeat (``LayoutChange.finishing``), seals R's partitions before going
on, so the lease is not what keeps old producers out.  A seal finds a task
without its lease only where the lease ran out first (an opener stalled
past it): in a partition N has not, the task is reported (``Strays``),
never silently left; in a shared one it runs under N (whose producers may
have added it), so nothing is reported.

One ``LayoutChange`` is one opener's attempt.  The driver
(``partition_parts.settle_layout``) carries out ``step``, hands its answer
to ``receive`` and logs the ``reports``, until ``done``; ``refusal`` then
says why the count cannot change (tasks in the recorded layout).  The
stages move only through ``TRANSITIONS``; the answer is first classified
into an ``Outcome``, and entering a stage makes its step.
"""

from __future__ import annotations

from typing import Literal

import attrs

from .partitions import partition_tags
from .values import Symbol

#: how often the recorded count may change under an opener before it gives up
SETTLE_ATTEMPTS = 5

ClosingStep = Literal["close", "undo", "seal", "unseal"]


def layout_names(name: str, partitions: int) -> tuple[str, ...]:
    """The store names of docket ``name``'s partitions (one: ``name``)."""
    return tuple(tag[1:-1] for tag in partition_tags(name, partitions))


# -- the steps, and their answers ----------------------------------------------------


@attrs.frozen(slots=True, kw_only=True)
class AskCount:
    """``StorageAdapter.record_partitions(expected, new, epoch)``: the
    recorded count (set to ``new`` when it is ``expected``, no seal is owed
    and, given, the count changed ``epoch`` times)."""

    expected: int
    new: int
    epoch: int | None = None


@attrs.frozen(slots=True, kw_only=True)
class StepPartitions:
    """``close_partition(op, count=, epoch=, owner=)`` on each of the stores
    ``names`` (``owner``: the change's id, whose close leases these are)."""

    names: tuple[str, ...]
    op: ClosingStep
    count: int = 0
    epoch: int = 0
    owner: str = ""


@attrs.frozen(slots=True, kw_only=True)
class ForgetLeaving:
    """``StorageAdapter.forget_leaving(old, epoch)``: ``old``'s partitions
    are sealed (by the change that made the count's ``epoch``th change)."""

    old: int
    epoch: int | None = None


Step = AskCount | StepPartitions | ForgetLeaving


@attrs.frozen(slots=True, kw_only=True)
class CountRecorded:
    """The answer to ``AskCount``: the count recorded before the call, the
    count a change left whose seal is owed (``None``: none), and how many
    times the count changed (``epoch``)."""

    count: int
    leaving: int | None = None
    epoch: int = 0


@attrs.frozen(slots=True, kw_only=True)
class PartitionsStepped:
    """The answer to ``StepPartitions``: one result per name."""

    results: tuple[bool, ...]


@attrs.frozen(slots=True, kw_only=True)
class LeavingForgotten:
    """The answer to ``ForgetLeaving``."""


Answer = CountRecorded | PartitionsStepped | LeavingForgotten


@attrs.frozen(slots=True, kw_only=True)
class Strays:
    """A seal found tasks: the partitions ``names`` of count ``old`` took
    tasks while the count changed to ``new`` (they run only under ``old``)."""

    name: str
    old: int
    new: int
    names: tuple[str, ...]


# -- stages, outcomes and the table ------------------------------------------------------


class Stage(Symbol):
    #: asked the recorded count (``AskCount(N, N)``)
    CHECKING = "checking"
    #: sealing the partitions of a count a change left (its seal was owed)
    SEALING_LEFT = "sealing_left"
    #: forgetting the count that left, its partitions sealed
    FORGETTING = "forgetting"
    #: the recorded count is ours: giving it the seals of changes away from
    #: it, undone since (those of its epoch or before)
    OPENING = "opening"
    #: closing the recorded layout's partitions to any count but ours
    CLOSING = "closing"
    #: recording our count by compare-and-set
    RECORDING = "recording"
    #: the change cannot go on: opening again what we closed, then refusing
    UNDOING = "undoing"
    #: lost the compare-and-set: opening again what we closed, then retrying
    BACKING_OFF = "backing_off"
    #: a heartbeat's finishing run: sealing, forgetting, then ``OPENING``
    FINISH_SEALING = "finish_sealing"
    FINISH_FORGETTING = "finish_forgetting"
    #: settled (``refusal`` is set when it was refused)
    DONE = "done"


class Outcome(Symbol):
    #: the count is ours, no seal owed
    OURS = "ours"
    #: another count is recorded, no seal owed
    OTHER = "other"
    #: a seal is owed (a change left a count behind)
    OWED = "owed"
    #: the compare-and-set recorded our count
    WON = "won"
    #: the compare-and-set found another count, or a seal owed
    LOST = "lost"
    #: every partition of the step did it
    ALL = "all"
    #: some did not (closing: a partition holds tasks)
    NOT_ALL = "not_all"
    #: a step whose answer decides nothing (a seal, a forget)
    ANSWERED = "answered"
    #: too many retries
    GIVE_UP = "give_up"


S, R = Stage, Outcome

TRANSITIONS: dict[tuple[Stage, Outcome], Stage] = {
    (S.CHECKING, R.OWED): S.SEALING_LEFT,
    (S.CHECKING, R.OURS): S.OPENING,
    (S.CHECKING, R.OTHER): S.CLOSING,
    (S.CHECKING, R.GIVE_UP): S.DONE,
    (S.SEALING_LEFT, R.ANSWERED): S.FORGETTING,
    (S.FORGETTING, R.ANSWERED): S.CHECKING,
    (S.OPENING, R.ANSWERED): S.DONE,
    (S.CLOSING, R.ALL): S.RECORDING,
    (S.CLOSING, R.NOT_ALL): S.UNDOING,
    (S.RECORDING, R.WON): S.SEALING_LEFT,
    (S.RECORDING, R.LOST): S.BACKING_OFF,
    (S.UNDOING, R.ANSWERED): S.DONE,
    (S.BACKING_OFF, R.ANSWERED): S.CHECKING,
    (S.FINISH_SEALING, R.ANSWERED): S.FINISH_FORGETTING,
    (S.FINISH_FORGETTING, R.ANSWERED): S.OPENING,
}


class LayoutChange:
    """One opener's settling of docket ``name`` on ``partitions`` (module
    docstring): ``step`` to carry out, ``receive`` its answer."""

    def __init__(self, name: str, partitions: int, owner: str = "") -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, not {partitions}")
        self.name = name
        self.partitions = partitions
        #: this change's id (the driver's: unique among the openers), which
        #: its close leases carry, so another change's undo keeps them
        self.owner = owner
        self.stage = Stage.CHECKING
        self.step: Step | None = AskCount(expected=partitions, new=partitions)
        #: why the count cannot change (set with ``done``)
        self.refusal: str | None = None
        #: what the driver logs (and clears)
        self.reports: list[Strays] = []
        #: the count recorded, and its epoch, as last read
        self._recorded = partitions
        self._epoch = 0
        #: a seal under way: the count whose partitions it closes, the count
        #: it is for, and the epoch of that count
        self._sealing: tuple[int, int, int] = (partitions, partitions, 0)
        #: the partitions this change closed (opened again if it cannot go on)
        self._closed: tuple[str, ...] = ()
        self._attempts = 1

    @classmethod
    def owed(cls, name: str, recorded: CountRecorded) -> LayoutChange | None:
        """What a partitioned worker does after its heartbeat's check read
        ``recorded`` (its own count): ``finishing`` when a seal is owed,
        else nothing."""
        if recorded.leaving is None or recorded.leaving == recorded.count:
            return None
        return cls.finishing(name, recorded)

    @classmethod
    def finishing(cls, name: str, recorded: CountRecorded) -> LayoutChange:
        """A partitioned worker's run at its heartbeat, which read
        ``recorded`` with a seal owed: seal the leaving count's partitions,
        forget it, remove the seals of changes away undone since from the
        recorded layout; change no count."""
        assert recorded.leaving is not None
        change = cls(name, recorded.count)
        change._sealing = (recorded.leaving, recorded.count, recorded.epoch)
        change._recorded, change._epoch = recorded.count, recorded.epoch
        change._enter(Stage.FINISH_SEALING)
        return change

    @property
    def done(self) -> bool:
        return self.stage is Stage.DONE

    def _names(self, count: int) -> tuple[str, ...]:
        return layout_names(self.name, count)

    # -- answers -------------------------------------------------------------------

    def receive(self, answer: Answer) -> None:
        """The answer to ``step``; makes the next one (or ``done``)."""
        stage = self.stage
        if stage is Stage.DONE:
            raise RuntimeError("the layout is settled: no step is out")
        outcome = self._classify(stage, answer)
        target = TRANSITIONS.get((stage, outcome))
        if target is None:
            raise RuntimeError(f"no move from {stage.name} on {outcome.name}")
        if stage is Stage.BACKING_OFF:
            self._attempts += 1
        self._enter(target)

    def _classify(self, stage: Stage, answer: Answer) -> Outcome:
        step = self.step
        if isinstance(answer, CountRecorded):
            assert isinstance(step, AskCount)
            return self._count(stage, answer)
        if isinstance(answer, PartitionsStepped):
            assert isinstance(step, StepPartitions)
            results = answer.results
            if len(results) != len(step.names):
                raise ValueError("one result per partition stepped")
            if stage is Stage.CLOSING:
                self._closed = tuple(n for n, ok in zip(step.names, results, strict=True) if ok)
                return R.ALL if all(results) else R.NOT_ALL
            if step.op == "seal" and not all(results):
                old, new, _ = self._sealing
                kept = set(self._names(new))  # (their tasks run under ``new``)
                names = tuple(
                    n for n, ok in zip(step.names, results, strict=True) if not ok and n not in kept
                )
                if names:
                    self.reports.append(Strays(name=self.name, old=old, new=new, names=names))
            return R.ANSWERED
        assert isinstance(step, ForgetLeaving)
        return R.ANSWERED

    def _count(self, stage: Stage, answer: CountRecorded) -> Outcome:
        count, leaving = answer.count, answer.leaving
        if stage is Stage.RECORDING:
            if count == self._recorded and leaving is None and answer.epoch == self._epoch:
                # (the store recorded our count, with ``_recorded`` leaving:
                # the change's epoch is the next one)
                self._sealing = (self._recorded, self.partitions, answer.epoch + 1)
                return R.WON
            return R.LOST
        self._recorded, self._epoch = count, answer.epoch
        if leaving is not None and leaving != count:
            self._sealing = (leaving, count, answer.epoch)
            return R.OWED
        if count == self.partitions:
            return R.OURS
        if self._attempts > SETTLE_ATTEMPTS:
            self.refusal = f"docket {self.name}: its partition count keeps changing"
            return R.GIVE_UP
        return R.OTHER

    # -- entering a stage makes its step -------------------------------------------------

    def _enter(self, stage: Stage) -> None:
        self.stage = stage
        n = self.partitions
        step: Step | None
        if stage is Stage.CHECKING:
            step = AskCount(expected=n, new=n)
        elif stage is Stage.RECORDING:
            step = AskCount(expected=self._recorded, new=n, epoch=self._epoch)
        elif stage is Stage.SEALING_LEFT or stage is Stage.FINISH_SEALING:
            old, new, epoch = self._sealing
            step = StepPartitions(
                names=self._names(old), op="seal", count=new, epoch=epoch, owner=self.owner
            )
        elif stage is Stage.FORGETTING or stage is Stage.FINISH_FORGETTING:
            step = ForgetLeaving(old=self._sealing[0], epoch=self._sealing[2])
        elif stage is Stage.OPENING:
            step = StepPartitions(names=self._names(n), op="unseal", count=n, epoch=self._epoch)
        elif stage is Stage.CLOSING:
            step = StepPartitions(
                names=self._names(self._recorded), op="close", count=n, owner=self.owner
            )
        elif stage is Stage.UNDOING or stage is Stage.BACKING_OFF:
            if stage is Stage.UNDOING:
                self.refusal = (
                    f"docket {self.name} holds tasks in {self._recorded} partitions: open it "
                    f"with partitions={self._recorded}, or drain it and stop its workers first"
                )
            step = StepPartitions(names=self._closed, op="undo", count=n, owner=self.owner)
        else:
            step = None
        self.step = step


def diagram() -> str:
    """``TRANSITIONS`` as text: one line a move."""
    return "\n".join(
        f"{source.name:<18} {outcome.name:<13} -> {target.name}"
        for (source, outcome), target in TRANSITIONS.items()
    )
