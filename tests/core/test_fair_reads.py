"""How a partitioned docket's reads choose their partitions
(``docket_core.sansio.fair_reads``): a busy docket is drained one partition
a read, in turn; a partition that runs dry makes the read sweep the others;
partitions with a blocking read out are left alone; recovering reads ask
every partition; what is handed out names its partition."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from docket_core.sansio.fair_reads import FairReads, PartRead, shares
from docket_core.sansio.values import Delivery, MalformedEntry, TaskMessage

ENTRIES = itertools.count()


def deliveries(partition: int, n: int) -> list[Delivery]:
    """``n`` deliveries of ``partition``, with fresh entry ids."""
    message = TaskMessage(key="k", function="f", payload=b"", when=0.0)
    return [Delivery(delivery_id=f"{next(ENTRIES)}-0", message=message) for _ in range(n)]


def answer(reads: FairReads, step: tuple[PartRead, ...], queues: list[int]) -> None:
    """Answer ``step`` from ``queues`` (how many messages each partition holds)."""
    for read in step:
        n = min(read.count, queues[read.partition])
        queues[read.partition] -= n
        reads.brought(read, deliveries(read.partition, n), (), None)


def one_read(reads: FairReads, count: int, queues: list[int]) -> list[tuple[PartRead, ...]]:
    """One read without blocking: its steps."""
    steps = []
    step = reads.first(count)
    while step:
        steps.append(step)
        answer(reads, step, queues)
        step = reads.rest(count)
    return steps


def test_the_first_read_asks_every_partition_a_share() -> None:
    reads = FairReads(3)
    assert reads.first(10) == (
        PartRead(partition=0, count=4),
        PartRead(partition=1, count=3),
        PartRead(partition=2, count=3),
    )
    assert shares(2, [2, 0, 1]) == [(2, 1), (0, 1)]


def test_a_busy_docket_is_read_one_partition_a_read_in_turn() -> None:
    reads, queues = FairReads(3), [1000, 1000, 1000]
    one_read(reads, 99, queues)  # a sweep: each had all it was asked for
    assert reads.hand_out(99).deliveries[0].delivery_id.startswith("0/")
    asked = []
    for _ in range(6):
        (step,) = one_read(reads, 100, queues)
        assert len(step) == 1 and step[0].count == 100
        asked.append(step[0].partition)
        handout = reads.hand_out(100)
        assert {d.delivery_id.split("/")[0] for d in handout.deliveries} == {str(asked[-1])}
    assert asked == [1, 2, 0, 1, 2, 0]


def test_a_partition_that_runs_dry_makes_the_read_sweep_the_others() -> None:
    reads, queues = FairReads(3), [1000, 1000, 1000]
    one_read(reads, 30, queues)
    reads.hand_out(30)
    queues[1] = 40
    steps = one_read(reads, 100, queues)  # partition 1's turn: 40 there
    assert steps == [
        (PartRead(partition=1, count=100),),
        (PartRead(partition=2, count=30), PartRead(partition=0, count=30)),
    ]
    handout = reads.hand_out(100)
    assert len(handout.deliveries) == 100
    assert Counter(d.delivery_id.split("/")[0] for d in handout.deliveries) == {
        "1": 40,
        "2": 30,
        "0": 30,
    }
    # partition 1 is swept with the others from now on, until it has a backlog again
    assert one_read(reads, 90, queues)[0] == (
        PartRead(partition=2, count=90),
    )  # (2 had all it was asked for)


def test_partitions_with_a_blocking_read_out_are_left_alone() -> None:
    reads = FairReads(3)
    assert len(reads.first(9)) == 3
    for partition in range(3):
        reads.brought(PartRead(partition=partition, count=3), (), (), 50.0 + partition)
    assert reads.rest(9) == () and not reads.ready
    wait, blocking = reads.blocking(9, now=45.0, block=10.0)
    assert wait == 5.0  # never past the soonest due time
    assert [r.partition for r in blocking] == [0, 1, 2] and {r.count for r in blocking} == {3}
    assert reads.out == {0, 1, 2}
    (one,) = deliveries(2, 1)
    reads.brought(blocking[2], [one], (), None)  # partition 2 brought one
    assert reads.out == {0, 1} and reads.ready
    handout = reads.hand_out(9)
    assert [d.delivery_id for d in handout.deliveries] == [f"2/{one.delivery_id}"]
    assert handout.next_due == 50.0
    # the next read asks partition 2 alone: the others answer when something comes
    assert reads.first(9) == (PartRead(partition=2, count=9),)
    reads.brought(PartRead(partition=2, count=9), (), (), None)
    assert reads.rest(9) == ()
    wait, blocking = reads.blocking(9, now=45.0, block=10.0)
    assert [r.partition for r in blocking] == [2] and blocking[0].count == 9


def test_a_recovering_read_asks_every_partition_once() -> None:
    reads, queues = FairReads(3), [1000, 1000, 1000]
    one_read(reads, 30, queues)
    reads.hand_out(30)
    step = reads.first(30, recover=True)  # backlogs everywhere, but recovering
    assert [(r.partition, r.recover) for r in step] == [(1, True), (2, True), (0, True)]
    answer(reads, step[:2], queues)
    reads.failed(step[2])  # partition 0's reply was lost
    assert reads.recovering == {0}
    reads.hand_out(30)
    step = reads.first(30)
    assert [(r.partition, r.recover) for r in step] == [(2, False), (0, True), (1, False)]


def test_a_blocking_read_started_before_a_recovery_leaves_it_pending() -> None:
    reads = FairReads(2)
    reads.first(4)
    for partition in range(2):
        reads.brought(PartRead(partition=partition, count=2), (), (), None)
    _, blocking = reads.blocking(4, now=0.0, block=1.0)
    assert reads.first(4, recover=True) == ()  # every partition has a blocking read out
    reads.brought(blocking[0], (), (), None)  # not a recovering read
    assert reads.recovering == {0, 1}
    assert reads.first(4) == (PartRead(partition=0, count=4, recover=True),)


def test_hand_out_keeps_what_is_beyond_count_and_every_malformed_entry_goes() -> None:
    reads = FairReads(2)
    step = reads.first(4)
    bad = MalformedEntry(delivery_id="9-9", reason="no fields")
    zero, one = deliveries(0, 2), deliveries(1, 2)
    reads.brought(step[0], zero, (bad,), 7.0)
    reads.brought(step[1], one, (), None)
    ids = [f"0/{d.delivery_id}" for d in zero] + [f"1/{d.delivery_id}" for d in one]
    first = reads.hand_out(3)
    assert [d.delivery_id for d in first.deliveries] == ids[:3]
    assert [m.delivery_id for m in first.malformed] == ["0/9-9"]
    assert first.next_due == 7.0
    assert reads.ready and reads.first(4) == ()  # what is kept goes first
    second = reads.hand_out(3)
    assert [d.delivery_id for d in second.deliveries] == ids[3:] and not second.malformed
    assert not reads.ready


def test_a_hand_out_is_fresh_only_when_this_read_brought_all_of_it() -> None:
    """What an earlier read (or a blocking read it left running) brought, or
    a recovering read handed back, was handed out by the store before this
    read began: such a hand-out is not ``fresh`` (its claim renews)."""
    reads = FairReads(2)
    step = reads.first(4)
    reads.brought(step[0], deliveries(0, 3), (), None)
    reads.brought(step[1], deliveries(1, 3), (), None)
    first = reads.hand_out(4)
    assert len(first.deliveries) == 4 and first.fresh
    assert reads.first(4) == ()  # the two kept go first
    kept = reads.hand_out(4)
    assert len(kept.deliveries) == 2 and not kept.fresh

    reads = FairReads(2)
    for read in reads.first(4):
        reads.brought(read, (), (), None)
    _, blocking = reads.blocking(4, now=0.0, block=1.0)
    assert reads.hand_out(4).deliveries == ()
    assert reads.first(4) == ()  # both blocking reads still out
    reads.brought(blocking[0], deliveries(0, 1), (), None)  # left by the read before
    late = reads.hand_out(4)
    assert len(late.deliveries) == 1 and not late.fresh
    # a blocking read this read started brings fresh deliveries
    reads.brought(blocking[1], (), (), None)
    for read in reads.first(4):
        reads.brought(read, (), (), None)
    _, blocking = reads.blocking(4, now=0.0, block=1.0)
    reads.brought(blocking[0], deliveries(0, 1), (), None)
    assert reads.hand_out(4).fresh

    reads = FairReads(1)
    (read,) = reads.first(2, recover=True)
    reads.brought(read, deliveries(0, 1), (), None)
    assert not reads.hand_out(2).fresh


@given(
    st.integers(min_value=2, max_value=5),
    st.integers(min_value=1, max_value=50),
    st.lists(st.integers(min_value=0, max_value=300), min_size=5, max_size=5),
)
def test_every_message_is_read_once_and_no_partition_waits_long(
    partitions: int, count: int, sizes: list[int]
) -> None:
    queues = sizes[:partitions]
    total = sum(queues)
    reads = FairReads(partitions)
    handed: list[str] = []
    #: reads since each partition holding messages was last asked
    waited = [0] * partitions
    while any(queues):
        holding = [q > 0 for q in queues]
        steps = one_read(reads, count, queues)
        asked = {r.partition for step in steps for r in step}
        for p in range(partitions):
            waited[p] = 0 if p in asked or not holding[p] else waited[p] + 1
            assert waited[p] < partitions, f"partition {p} waited {waited[p]} reads"
        handout = reads.hand_out(count)
        # (empty only when a share of count could not go to every partition)
        assert 0 < len(handout.deliveries) <= count or count < partitions
        handed += [d.delivery_id for d in handout.deliveries]
    assert len(handed) == total == len(set(handed))
    assert not reads.ready and reads.hand_out(count).deliveries == ()


def test_workers_start_on_their_own_partitions() -> None:
    names = [f"host#{pid}" for pid in range(4000, 4010)]
    firsts = {w: FairReads(3, w).first(30)[0].partition for w in names}
    assert set(firsts.values()) == {0, 1, 2}, firsts
    assert firsts[names[0]] == FairReads(3, names[0]).first(30)[0].partition  # (always)


def test_fewer_than_one_partition_is_refused() -> None:
    with pytest.raises(ValueError):
        FairReads(0)
