"""The partition count of a docket, and its concurrency limits across partitions.

- ``settle_layout``: record the count a docket is opened with, or refuse it
  while the partitions of the recorded count hold tasks (tasks are never
  moved, so none is stranded).  ``PartitionedStore`` runs it on open with
  N partitions, ``Docket`` with one; it asks only the ``StorageAdapter``
  protocol (``record_partitions``, ``sibling``, ``pending``).
- ``spanning_limits``: a task's policy with its unscoped concurrency limit
  scoped to the docket's name, so it spans the partitions (docs/cluster.md,
  section 5).
"""

from __future__ import annotations

import attrs

from .adapter import StorageAdapter
from .sansio.errors import UsageError
from .sansio.partitions import partition_tags
from .sansio.values import TaskPolicy

#: how often the recorded count may change under an open before it gives up
SETTLE_ATTEMPTS = 5


def part_names(name: str, partitions: int) -> tuple[str, ...]:
    """The store names of docket ``name``'s partitions: each tag's inner
    text (``orders|0.1``, whose keys are ``{orders|0.1}:...``)."""
    return tuple(tag[1:-1] for tag in partition_tags(name, partitions))


async def settle_layout(home: StorageAdapter, partitions: int) -> None:
    """Record ``partitions`` as the count of ``home``'s docket (``home`` is
    the open store named after the docket), or raise ``UsageError`` when
    another count is recorded and its partitions hold tasks.  One round
    trip when the count is the recorded one.

    The emptiness check and the compare-and-set (``layout.lua``) are two
    steps, not one, and cannot be one: the partitions of a recorded count
    above 1 live in other hash slots (other nodes) than ``{name}:partitions``,
    and no script spans slots.  The compare-and-set makes concurrent openers
    agree on one count (a loser sees the new count and checks it again).
    What the check cannot rule out, atomic or not, is a docket still open
    with the old count adding a task after the change (it checked the count
    when it opened): its task waits in a partition no worker of the new
    count reads, until a docket with the old count drains it.  Hence the
    README's rule (drain the docket and stop its workers and producers
    first), and a partitioned worker compares the recorded count with its
    own at each heartbeat and stops, with ``layout_changed``'s error, when
    they differ."""
    for _ in range(SETTLE_ATTEMPTS):
        recorded = await home.record_partitions(partitions, partitions)
        if recorded == partitions:
            return
        if not await layout_empty(home, recorded):
            raise UsageError(
                f"docket {home.name} holds tasks in {recorded} partitions: open it with "
                f"partitions={recorded}, or drain it and stop its workers first"
            )
        if await home.record_partitions(recorded, partitions) == recorded:
            return
    raise UsageError(f"docket {home.name}: its partition count keeps changing")


async def layout_empty(home: StorageAdapter, partitions: int) -> bool:
    """Whether no partition of a ``partitions``-way layout holds a message
    (one partition: ``home`` itself)."""
    if partitions == 1:
        return await home.pending() == 0
    for name in part_names(home.name, partitions):
        part = home.sibling(name)
        await part.open()
        try:
            if await part.pending() > 0:
                return False
        finally:
            await part.close()
    return True


def spanning_limits(policy: TaskPolicy, name: str) -> TaskPolicy:
    """``policy`` with an unscoped concurrency limit scoped to ``name``: on a
    partitioned docket, the limit's slots live in ``{name}`` and it takes the
    scoped chain, so one limit spans every partition."""
    limit = policy.concurrency
    if limit is None or limit.scope is not None:
        return policy
    return attrs.evolve(policy, concurrency=attrs.evolve(limit, scope=name))
