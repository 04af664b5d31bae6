"""The partition count of a docket, and its concurrency limits across partitions.

- ``settle_layout``: record the count a docket is opened with, or refuse it
  while the partitions of the recorded count hold tasks (tasks are never
  moved); the old layout's partitions are closed to new tasks first, so a
  producer still open with the old count cannot strand one.
  ``PartitionedStore`` runs it on open with N partitions, ``Docket`` with
  one; it asks only the ``StorageAdapter`` protocol (``record_partitions``,
  ``sibling``, ``close_partition``).
- ``spanning_limits``: a task's policy with its unscoped concurrency limit
  scoped to the docket's name, so it spans the partitions (docs/cluster.md,
  section 5).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import attrs

from .adapter import ClosingStep, StorageAdapter
from .sansio.errors import UsageError
from .sansio.partitions import partition_tags
from .sansio.values import TaskPolicy

#: how often the recorded count may change under an open before it gives up
SETTLE_ATTEMPTS = 5
#: how long (s) a change of the partition count may take between closing the
#: old layout and recording the new count (``settle_layout``)
CLOSE_LEASE = 30.0

logger = logging.getLogger("docket")

_T = TypeVar("_T")


def part_names(name: str, partitions: int) -> tuple[str, ...]:
    """The store names of docket ``name``'s partitions: each tag's inner
    text (``orders|0.1``, whose keys are ``{orders|0.1}:...``)."""
    return tuple(tag[1:-1] for tag in partition_tags(name, partitions))


async def settle_layout(home: StorageAdapter, partitions: int) -> None:
    """Record ``partitions`` as the count of ``home``'s docket (``home`` is
    the open store named after the docket), or raise ``UsageError`` when
    another count is recorded and its partitions hold tasks.  Two round
    trips when the count is the recorded one (one more per partition).

    A change from the recorded count R closes R's partitions first
    (``StorageAdapter.close_partition``): each, atomically, only if it holds
    no task, for ``CLOSE_LEASE`` seconds; a closed partition refuses new
    tasks with an error naming the new count.  (A partition both layouts
    share, ``{name|0.0}`` of 2 and 3 say, is only checked empty and stays
    open: the new count's workers read it, so a task an old producer adds
    there still runs, though a look-up by its key under the new count may
    miss it.)  Then the new count is
    recorded (compare-and-set: concurrent openers agree on one; a loser sees
    the new count and starts again), R's partitions are sealed (closed for
    good) and the new layout's old seals are removed.  So a producer still
    open with R can no longer add a task where no worker of the new count
    reads: its adds fail, and it must be opened with the new count.  An
    opener that dies between the steps leaves R closed for the lease at
    most, or the new layout sealed until the next opener of the recorded
    count removes the seals (the check below, which seals again if a change
    away ran meanwhile).  Only an opener stalled past the lease between the
    close and the compare-and-set lets a task in: it is counted and logged.
    The checks run per partition, since no script spans hash slots.  A
    partitioned worker also compares the recorded count with its own at each
    heartbeat and stops when they differ."""
    for _ in range(SETTLE_ATTEMPTS):
        recorded = await home.record_partitions(partitions, partitions)
        if recorded == partitions:
            if not any(await on_partitions(home, _names(home, partitions), "open", None)):
                return
            # (seals of a change that died before opening this layout, gone:
            # unless a change away ran meanwhile, whose seals they were)
            recorded = await home.record_partitions(partitions, partitions)
            if recorded == partitions:
                return
            await _seal(home, partitions, recorded)
            continue
        # (a partition both layouts share stays open: the new one reads it)
        new_names = _names(home, partitions)
        leaving = [n for n in _names(home, recorded) if n not in new_names]
        shared = [n for n in _names(home, recorded) if n in new_names]
        closed = await on_partitions(home, leaving, "close", partitions)
        if not all(closed) or not await _empty(home, shared):
            await on_partitions(home, leaving, "open", partitions)
            raise UsageError(
                f"docket {home.name} holds tasks in {recorded} partitions: open it with "
                f"partitions={recorded}, or drain it and stop its workers first"
            )
        if await home.record_partitions(recorded, partitions) != recorded:
            await on_partitions(home, leaving, "open", partitions)
            continue
        await _seal(home, recorded, partitions)
        await on_partitions(home, _names(home, partitions), "open", None)
        return
    raise UsageError(f"docket {home.name}: its partition count keeps changing")


def _names(home: StorageAdapter, partitions: int) -> tuple[str, ...]:
    """The store names of a ``partitions``-way layout (one: ``home``'s)."""
    return (home.name,) if partitions == 1 else part_names(home.name, partitions)


async def _seal(home: StorageAdapter, old: int, new: int) -> None:
    """Close the partitions only ``old`` has for good, now that ``new`` is
    recorded; log those a task came into (the lease ran out first)."""
    leaving = [n for n in _names(home, old) if n not in _names(home, new)]
    sealed = await on_partitions(home, leaving, "seal", new)
    if not all(sealed):
        logger.error(
            "docket %s: %d of its %d partitions took a task while its partition count "
            "changed to %d; open it with partitions=%d to run those tasks",
            home.name,
            sealed.count(False),
            old,
            new,
            old,
        )


async def _on_each(
    home: StorageAdapter, names: Sequence[str], ask: Callable[[StorageAdapter], Awaitable[_T]]
) -> list[_T]:
    """``ask`` each of the stores ``names``: ``home`` itself, or its siblings
    (opened for the question and closed after)."""
    answers = []
    for name in names:
        if name == home.name:
            answers.append(await ask(home))
            continue
        part = home.sibling(name)
        await part.open()
        try:
            answers.append(await ask(part))
        finally:
            await part.close()
    return answers


async def _empty(home: StorageAdapter, names: Sequence[str]) -> bool:
    """Whether none of the stores ``names`` holds a task."""

    async def pending(store: StorageAdapter) -> int:
        return await store.pending()

    return not any(await _on_each(home, names, pending))


async def on_partitions(
    home: StorageAdapter, names: Sequence[str], op: ClosingStep, count: int | None
) -> list[bool]:
    """``close_partition(op, count)`` on each of the stores ``names``."""
    now = time.time()

    async def step(store: StorageAdapter) -> bool:
        return await store.close_partition(op, count, CLOSE_LEASE, now)

    return await _on_each(home, names, step)


def spanning_limits(policy: TaskPolicy, name: str) -> TaskPolicy:
    """``policy`` with an unscoped concurrency limit scoped to ``name``: on a
    partitioned docket, the limit's slots live in ``{name}`` and it takes the
    scoped chain, so one limit spans every partition."""
    limit = policy.concurrency
    if limit is None or limit.scope is not None:
        return policy
    return attrs.evolve(policy, concurrency=attrs.evolve(limit, scope=name))
