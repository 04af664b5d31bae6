"""Reading a partitioned docket fairly (``PartitionedStore.read``).

A read asks every partition at once, without blocking, for its share of
``count`` (split evenly, the remainder to the first partitions, the first
partition rotating each read).  When all of them come back empty, it keeps
one blocking read going per partition and returns as soon as any of them
comes back (it brought something, or something changed there), or at
``block``.  The others are not cancelled: a
blocking ``XREADGROUP`` cancelled after the server answered would leave its
entries in this worker's pending list, unseen until the redelivery timeout.
They run on in the store's task group, and what they bring is kept here and
handed out by the next read (deliveries beyond ``count`` wait for the next).

On ``close`` the reads still out are cancelled, as when a worker dies in the
middle of a read: what they had taken comes back after the redelivery
timeout.  (Waiting for them instead would hold a closing docket for up to
``block`` seconds, and their deliveries would still go unclaimed.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import attrs
from anyio.abc import TaskGroup

from .adapter import ReadResult, StorageAdapter
from .sansio.values import Delivery, MalformedEntry


def shares(count: int, order: Sequence[int]) -> list[tuple[int, int]]:
    """``count`` split over the partitions of ``order``, the remainder to the
    first ones: ``(partition, share)`` with a share above 0."""
    if not order:
        return []
    base, extra = divmod(count, len(order))
    split = [(index, base + (1 if n < extra else 0)) for n, index in enumerate(order)]
    return [(index, share) for index, share in split if share > 0]


def prefixed(index: int, result: ReadResult) -> ReadResult:
    """``result`` with its delivery ids naming partition ``index``."""
    return ReadResult(
        deliveries=tuple(
            attrs.evolve(d, delivery_id=f"{index}/{d.delivery_id}") for d in result.deliveries
        ),
        next_due=result.next_due,
        malformed=tuple(
            attrs.evolve(m, delivery_id=f"{index}/{m.delivery_id}") for m in result.malformed
        ),
    )


def soonest(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


class FairReader:
    """The reads of one ``PartitionedStore`` (see the module docstring)."""

    def __init__(self, parts: Sequence[StorageAdapter], spawn: Callable[[], TaskGroup]) -> None:
        self._parts = parts
        self._spawn = spawn
        self._first = 0
        #: partitions whose blocking read is still out
        self._out: set[int] = set()
        #: partitions whose next read recovers what this worker holds
        self._recover: set[int] = set()
        #: what reads brought and nobody took yet
        self._kept: list[Delivery] = []
        self._kept_malformed: list[MalformedEntry] = []
        self._failure: Exception | None = None
        self._due: dict[int, float | None] = {}
        self._arrived = anyio.Event()

    def _order(self) -> list[int]:
        count = len(self._parts)
        first, self._first = self._first, (self._first + 1) % count
        return [(first + n) % count for n in range(count)]

    def _keep(self, index: int, result: ReadResult) -> None:
        result = prefixed(index, result)
        self._kept.extend(result.deliveries)
        self._kept_malformed.extend(result.malformed)
        self._due[index] = result.next_due

    def _hand_out(self, count: int) -> ReadResult:
        deliveries, self._kept = self._kept[:count], self._kept[count:]
        malformed, self._kept_malformed = self._kept_malformed, []
        return ReadResult(
            deliveries=tuple(deliveries),
            next_due=soonest(*self._due.values()),
            malformed=tuple(malformed),
        )

    async def read(
        self,
        *,
        worker: str,
        count: int,
        now: float,
        redelivery_timeout: float,
        block: float,
        recover: bool = False,
    ) -> ReadResult:
        if recover:
            self._recover.update(range(len(self._parts)))
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        options: dict[str, Any] = {
            "worker": worker,
            "now": now,
            "redelivery_timeout": redelivery_timeout,
        }
        if not self._kept and not self._kept_malformed:
            idle = [index for index in self._order() if index not in self._out]
            await self._read_now(shares(count, idle), options)
        if self._kept or self._kept_malformed or block <= 0:
            return self._hand_out(count)
        # nothing anywhere: one blocking read per partition, the first to
        # bring something ends the wait (never past the soonest due time)
        due = soonest(*self._due.values())
        wait = block if due is None else min(block, max(due - now, 0.0))
        self._arrived = anyio.Event()
        idle = [index for index in self._order() if index not in self._out]
        share = max(count // max(len(idle), 1), 1)
        for index in idle:
            self._out.add(index)
            self._spawn().start_soon(self._read_blocking, index, share, wait, options)
        with anyio.move_on_after(wait):
            await self._arrived.wait()
        if self._failure is not None and not self._kept and not self._kept_malformed:
            failure, self._failure = self._failure, None
            raise failure
        return self._hand_out(count)

    async def _read_now(self, plan: list[tuple[int, int]], options: dict[str, Any]) -> None:
        """One read without blocking per partition of ``plan``, side by side;
        a failure of any drops what the others brought (the next read
        recovers it from every partition) and is raised."""
        results: dict[int, ReadResult] = {}
        failures: list[Exception] = []

        async def one(index: int, share: int) -> None:
            recover = index in self._recover
            try:
                results[index] = await self._parts[index].read(
                    count=share, block=0, recover=recover, **options
                )
            except Exception as error:
                failures.append(error)
            else:
                self._recover.discard(index)

        async with anyio.create_task_group() as group:
            for index, share in plan:
                group.start_soon(one, index, share)
        if failures:
            self._recover.update(results)
            raise failures[0]
        for index, _ in plan:
            self._keep(index, results[index])

    async def _read_blocking(
        self, index: int, share: int, wait: float, options: dict[str, Any]
    ) -> None:
        """A blocking read of one partition, in the store's task group: what
        it brings is kept for whichever read comes next."""
        recover = index in self._recover
        try:
            result = await self._parts[index].read(
                count=share, block=wait, recover=recover, **options
            )
        except Exception as error:
            self._recover.add(index)
            self._failure = self._failure or error
            self._arrived.set()
            return
        finally:
            self._out.discard(index)
        self._recover.discard(index)
        self._keep(index, result)
        # (back early with nothing: something changed there, as a wake-up
        # for a sooner schedule; the caller reads again)
        self._arrived.set()
