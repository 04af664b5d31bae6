"""Reading a partitioned docket fairly (``PartitionedStore.read``).

``sansio.fair_reads.FairReads`` decides which partitions a read asks, for
how many, and what it hands out (a busy docket is drained one partition a
read, in turn; otherwise every partition is asked side by side, then one
blocking read is kept out per partition).  ``FairReader`` carries that out,
with one ``FairReads`` a worker (several workers may share a store, and what
a read took is held by its worker's consumer): the reads of one step side
by side, the blocking ones in the store's task group.  A blocking read is
never cancelled by the read that started it: a blocking ``XREADGROUP``
cancelled after the server answered would leave its entries in this
worker's pending list, unseen until the redelivery timeout.  It runs on,
and what it brings is kept and handed out by the worker's next read.

On ``close`` the reads still out are cancelled, as when a worker dies in the
middle of a read: what they had taken comes back after the redelivery
timeout.  (Waiting for them instead would hold a closing docket for up to
``block`` seconds, and their deliveries would still go unclaimed.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
from anyio.abc import TaskGroup

from .adapter import ReadResult, StorageAdapter
from .sansio.fair_reads import FairReads, PartRead


class _Reads:
    """One worker's reads: its decisions, and what its blocking reads left."""

    def __init__(self, partitions: int, worker: str) -> None:
        self.decide = FairReads(partitions, worker)
        self.failure: Exception | None = None
        self.arrived = anyio.Event()

    def raise_failure(self) -> None:
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure


class FairReader:
    """The reads of one ``PartitionedStore`` (see the module docstring)."""

    def __init__(self, parts: Sequence[StorageAdapter], spawn: Callable[[], TaskGroup]) -> None:
        self._parts = parts
        self._spawn = spawn
        self._workers: dict[str, _Reads] = {}

    def forget(self, worker: str) -> None:
        """``worker`` left: its reads are over."""
        self._workers.pop(worker, None)

    async def read(
        self,
        *,
        worker: str,
        count: int,
        now: float,
        redelivery_timeout: float,
        block: float,
        recover: bool = False,
        stale_scan_every: float = 0.0,
    ) -> ReadResult:
        state = self._workers.get(worker)
        if state is None:
            state = self._workers[worker] = _Reads(len(self._parts), worker)
        reads = state.decide
        if state.failure is not None:  # (a blocking read's, since the last read)
            if recover:
                reads.recovering.update(range(len(self._parts)))
            state.raise_failure()
        options: dict[str, Any] = {
            "worker": worker,
            "now": now,
            "redelivery_timeout": redelivery_timeout,
            "stale_scan_every": stale_scan_every,
        }
        step = reads.first(count, recover)
        while step:
            await self._read_now(reads, step, options)
            step = reads.rest(count)
        if not reads.ready and block > 0:
            wait, blocking = reads.blocking(count, now, block)
            state.arrived = anyio.Event()
            for part_read in blocking:
                self._spawn().start_soon(self._read_blocking, state, part_read, wait, options)
            with anyio.move_on_after(wait):
                await state.arrived.wait()
            if not reads.ready:
                state.raise_failure()
        handout = reads.hand_out(count)
        return ReadResult(
            deliveries=handout.deliveries,
            next_due=handout.next_due,
            malformed=handout.malformed,
            fresh=handout.fresh,
        )

    async def _read_part(self, read: PartRead, block: float, options: dict[str, Any]) -> ReadResult:
        return await self._parts[read.partition].read(
            count=read.count, block=block, recover=read.recover, **options
        )

    async def _read_now(
        self, reads: FairReads, step: Sequence[PartRead], options: dict[str, Any]
    ) -> None:
        """The reads of ``step`` without blocking, side by side; a failure of
        any drops what the others brought (their partitions' next reads hand
        it back) and is raised."""
        if len(step) == 1:
            (read,) = step
            try:
                result = await self._read_part(read, 0, options)
            except Exception:
                reads.failed(read)
                raise
            reads.brought(read, result.deliveries, result.malformed, result.next_due)
            return
        results: dict[int, ReadResult] = {}
        failures: list[Exception] = []

        async def one(read: PartRead) -> None:
            try:
                results[read.partition] = await self._read_part(read, 0, options)
            except Exception as error:
                failures.append(error)

        async with anyio.create_task_group() as group:
            for read in step:
                group.start_soon(one, read)
        if failures:
            for read in step:
                reads.failed(read)
            raise failures[0]
        for read in step:
            result = results[read.partition]
            reads.brought(read, result.deliveries, result.malformed, result.next_due)

    async def _read_blocking(
        self, state: _Reads, read: PartRead, wait: float, options: dict[str, Any]
    ) -> None:
        """A blocking read of one partition, in the store's task group: what
        it brings is kept for the worker's next read."""
        try:
            result = await self._read_part(read, wait, options)
        except Exception as error:
            state.decide.failed(read)
            state.failure = state.failure or error
            state.arrived.set()
            return
        state.decide.brought(read, result.deliveries, result.malformed, result.next_due)
        # (back early with nothing: something changed there, as a wake-up
        # for a sooner schedule; the caller reads again)
        state.arrived.set()
