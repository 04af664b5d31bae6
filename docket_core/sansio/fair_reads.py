"""Which partitions a partitioned docket's read asks, and what it hands out.

The decisions of ``PartitionedStore.read`` (``docket_core.partition_reads``
carries them out): pure state, fed with what each partition's read brought.

One ``read(count)`` is at most three steps:

1. **Without blocking.**  The partitions whose blocking read is out are left
   alone (they answer as soon as something arrives there).  Of the others,
   taken in an order that rotates by one each read:

   - the first alone, for all of ``count``, when its last read brought all it
     asked for (it has a backlog): a busy docket is drained one partition a
     read, in turn, so each read, claim and finish is one call to one
     partition, batches as big as with one partition;
   - else all of them side by side, ``count`` split evenly (the remainder to
     the first ones).  A read that recovers what this worker holds (after a
     failed read) asks every partition that must recover.
2. **The rest.**  When a first partition read alone brought fewer than it
   asked for, the other partitions are asked side by side for the rest, in
   the same read: its backlog ran out, so the others are swept.
3. **Blocking.**  When nothing came and the caller may wait: one blocking
   read per partition without one out (a share of ``count`` each), ending
   the wait when the first brings something or something changes there,
   never past the soonest due time the partitions reported.

Whatever reads brought beyond ``count`` (blocking reads go on after the wait
ended) is kept, in arrival order, and handed out first by the next reads of
the same worker (the store's consumer that holds them).  A hand-out is
``fresh`` when each of its deliveries came from a read of the same call that
recovered nothing: the store handed them out after the call began, so their
leases are no older than it (``Claim.renew``).  Delivery ids are
prefixed with their partition (``partitions.delivery_id``).  Each worker's
order starts at its own partition (``crc32`` of its name), so that workers
do not all read the same partition in step.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

import attrs

from .values import Delivery, MalformedEntry


@attrs.frozen(slots=True, kw_only=True)
class PartRead:
    """One partition's read: ``count`` deliveries at most, first handing back
    what this worker holds there when ``recover``."""

    partition: int
    count: int
    recover: bool = False
    #: the number of the worker's read (``FairReads.first``) that sent it
    call: int = attrs.field(default=0, eq=False)


@attrs.frozen(slots=True, kw_only=True)
class Handout:
    """What one read hands the worker (a ``ReadResult``'s fields)."""

    deliveries: tuple[Delivery, ...]
    next_due: float | None
    malformed: tuple[MalformedEntry, ...] = ()
    #: every delivery came from this read's own part-reads, none recovering
    fresh: bool = True


def shares(count: int, order: Sequence[int]) -> list[tuple[int, int]]:
    """``count`` split over the partitions of ``order``, the remainder to the
    first ones: ``(partition, share)`` with a share above 0."""
    if not order:
        return []
    base, extra = divmod(count, len(order))
    split = [(index, base + (1 if n < extra else 0)) for n, index in enumerate(order)]
    return [(index, share) for index, share in split if share > 0]


def soonest(times: Iterable[float | None]) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


class FairReads:
    """The read decisions of one worker on a partitioned docket (see the
    module docstring): what its reads keep is held by its consumer, so it
    is handed to its reads alone.  Each read: ``first(count, recover)``, then ``rest(count)``
    after each step's reads were ``brought`` (or ``failed``), until it is
    empty; then ``hand_out`` when ``ready`` or not blocking, else
    ``blocking`` and, once a blocking read answered or the wait ran out,
    ``hand_out``."""

    def __init__(self, partitions: int, worker: str = "") -> None:
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, not {partitions}")
        self.partitions = partitions
        #: the partition the next read's order starts with (workers start
        #: apart, rather than all on partition 0 together)
        self._first = zlib.crc32(worker.encode()) % partitions
        #: partitions whose blocking read is out
        self.out: set[int] = set()
        #: partitions whose next read hands back what this worker holds there
        self.recovering: set[int] = set()
        #: partitions whose last read brought all it asked for
        self._backlog = [False] * partitions
        #: the soonest due time each partition reported last
        self._due: dict[int, float | None] = {}
        #: what reads brought and no read handed out yet
        self._kept: list[Delivery] = []
        self._kept_malformed: list[MalformedEntry] = []
        #: for each kept delivery, the read (``call``) that brought it; -1
        #: for one a recovering read handed back
        self._kept_from: list[int] = []
        #: the number of the worker's current read
        self._call = 0
        #: this read's order of the partitions, those it asked already, and
        #: the one it asked alone
        self._order: list[int] = []
        self._asked: set[int] = set()
        self._alone: PartRead | None = None

    @property
    def ready(self) -> bool:
        """Whether there is something to hand out."""
        return bool(self._kept or self._kept_malformed)

    def _idle(self) -> list[int]:
        """This read's order of the partitions without a blocking read out."""
        return [p for p in self._order if p not in self.out]

    def _reads(self, count: int, order: Sequence[int]) -> tuple[PartRead, ...]:
        self._asked.update(order)
        return tuple(
            PartRead(partition=p, count=share, recover=p in self.recovering, call=self._call)
            for p, share in shares(count, order)
        )

    def first(self, count: int, recover: bool = False) -> tuple[PartRead, ...]:
        """Step 1: the reads without blocking to send now, side by side
        (none when something is kept from earlier reads: it goes first)."""
        n = self.partitions
        self._call += 1
        self._asked, self._alone = set(), None
        if recover:
            self.recovering.update(range(n))
        if self.ready or count < 1:
            self._order = []
            return ()
        self._order = [(self._first + k) % n for k in range(n)]
        self._first = (self._first + 1) % n
        order = self._idle()
        if not order:
            return ()
        head = order[0]
        if self._backlog[head] and not self.recovering.intersection(order):
            self._alone = PartRead(partition=head, count=count, call=self._call)
            self._asked.add(head)
            return (self._alone,)
        return self._reads(count, order)

    def rest(self, count: int) -> tuple[PartRead, ...]:
        """Step 2: after the reads of the step before were answered, the
        reads to send next (none: the read is done with reading now)."""
        alone, self._alone = self._alone, None
        if alone is None or self._backlog[alone.partition]:
            return ()
        wanted = count - len(self._kept)
        others = [p for p in self._idle() if p not in self._asked]
        return self._reads(wanted, others) if wanted > 0 else ()

    def brought(
        self,
        read: PartRead,
        deliveries: Sequence[Delivery],
        malformed: Sequence[MalformedEntry],
        next_due: float | None,
    ) -> None:
        """What ``read`` brought (entry ids as the partition names them)."""
        p = read.partition
        self.out.discard(p)
        if read.recover:
            self.recovering.discard(p)
        self._backlog[p] = len(deliveries) + len(malformed) >= read.count
        self._due[p] = next_due
        prefix = f"{p}/"
        self._kept_from += [-1 if read.recover else read.call] * len(deliveries)
        self._kept += [
            Delivery(
                delivery_id=prefix + d.delivery_id, message=d.message, redelivered=d.redelivered
            )
            for d in deliveries
        ]
        self._kept_malformed += [
            attrs.evolve(m, delivery_id=prefix + m.delivery_id) for m in malformed
        ]

    def failed(self, read: PartRead) -> None:
        """``read`` failed, or what it brought is dropped (another read of
        its step failed): what it took, the partition's next read hands back."""
        self.out.discard(read.partition)
        self.recovering.add(read.partition)
        self._backlog[read.partition] = False

    def blocking(self, count: int, now: float, block: float) -> tuple[float, tuple[PartRead, ...]]:
        """Step 3: how long to wait, and the blocking reads to start (they
        run on after the wait; the partitions are marked as having one out)."""
        due = soonest(self._due.values())
        wait = block if due is None else min(block, max(due - now, 0.0))
        order = self._idle()
        share = max(count // max(len(order), 1), 1)
        reads = tuple(
            PartRead(partition=p, count=share, recover=p in self.recovering, call=self._call)
            for p in order
        )
        self.out.update(order)
        return wait, reads

    def hand_out(self, count: int) -> Handout:
        """Up to ``count`` deliveries kept, the oldest first, every malformed
        entry kept, and the soonest due time any partition reported."""
        deliveries, self._kept = self._kept[:count], self._kept[count:]
        came_from, self._kept_from = self._kept_from[:count], self._kept_from[count:]
        malformed, self._kept_malformed = self._kept_malformed, []
        return Handout(
            deliveries=tuple(deliveries),
            next_due=soonest(self._due.values()),
            malformed=tuple(malformed),
            fresh=all(call == self._call for call in came_from),
        )


__all__ = ["FairReads", "Handout", "PartRead", "shares", "soonest"]
