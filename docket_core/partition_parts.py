"""The partition count of a docket, and its concurrency limits across partitions.

- ``settle_layout``: record the count a docket is opened with, or refuse it
  while the partitions of the recorded count hold tasks (tasks are never
  moved); the old layout's partitions are closed to new tasks first, so a
  producer still open with the old count cannot strand one.  The steps and
  their order are the core's (``sansio.layout_change``); this carries them
  out through the ``StorageAdapter`` protocol (``record_partitions``,
  ``forget_leaving``, ``sibling``, ``close_partition``).
  ``PartitionedStore`` runs it on open with N partitions, ``Docket`` with
  one; ``finish_leaving`` seals what a change that died left open.
- ``spanning_limits``: a task's policy with its unscoped concurrency limit
  and admission controls (``Debounce``, ``Cooldown``, ``RateLimit``) scoped
  to the docket's name, so each spans the partitions (docs/cluster.md,
  section 5).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import attrs

from .adapter import StorageAdapter
from .sansio.errors import UsageError
from .sansio.layout_change import (
    Answer,
    AskCount,
    CountRecorded,
    LayoutChange,
    LeavingForgotten,
    PartitionsStepped,
    Step,
    StepPartitions,
    layout_names,
)
from .sansio.values import TaskPolicy

#: how long (s) a change of the partition count may take between closing the
#: old layout and recording the new count (``settle_layout``)
CLOSE_LEASE = 30.0

logger = logging.getLogger("docket")

_T = TypeVar("_T")


#: the store names of docket ``name``'s partitions: each tag's inner text
#: (``orders|0.1``, whose keys are ``{orders|0.1}:...``)
part_names = layout_names


async def settle_layout(home: StorageAdapter, partitions: int) -> None:
    """Record ``partitions`` as the count of ``home``'s docket (``home`` is
    the open store named after the docket), or raise ``UsageError`` when
    another count is recorded and its partitions hold tasks: the steps of
    ``sansio.layout_change.LayoutChange``, carried out one by one.  Two
    round trips when the count is the recorded one (one more per partition).
    A ``StoreError`` of a step ends it there, as a crash would."""
    await _carry_out(home, LayoutChange(home.name, partitions, owner=uuid.uuid4().hex))


async def finish_leaving(home: StorageAdapter, recorded: CountRecorded) -> None:
    """What ``LayoutChange.owed`` says a partitioned worker's heartbeat,
    which read ``recorded``, owes: seal the partitions of the count a change
    to ``recorded.count`` left, and forget it; or nothing."""
    change = LayoutChange.owed(home.name, recorded)
    if change is not None:
        await _carry_out(home, change)


async def _carry_out(home: StorageAdapter, change: LayoutChange) -> None:
    while (step := change.step) is not None:
        change.receive(await perform(home, step, time.time()))
        for strays in change.reports:
            logger.error(
                "docket %s: %d of its %d partitions (%s) took a task while its partition "
                "count changed to %d; open it with partitions=%d to run those tasks",
                strays.name,
                len(strays.names),
                strays.old,
                ", ".join(strays.names),
                strays.new,
                strays.old,
            )
        change.reports.clear()
    if change.refusal is not None:
        raise UsageError(change.refusal)


async def perform(home: StorageAdapter, step: Step, now: float) -> Answer:
    """Carry out one step of a ``LayoutChange`` through ``home`` (the open
    store named after the docket, and its siblings); its answer."""
    if isinstance(step, AskCount):
        return await home.record_partitions(step.expected, step.new, step.epoch)
    if isinstance(step, StepPartitions):

        async def one(store: StorageAdapter) -> bool:
            return await store.close_partition(
                step.op, step.count, step.epoch, CLOSE_LEASE, now, step.owner
            )

        return PartitionsStepped(results=tuple(await _on_each(home, step.names, one)))
    await home.forget_leaving(step.old, step.epoch)
    return LeavingForgotten()


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


def spanning_limits(policy: TaskPolicy, name: str) -> TaskPolicy:
    """``policy`` with an unscoped concurrency limit and unscoped admission
    controls scoped to ``name``: on a partitioned docket, their state lives in
    ``{name}`` and they take the scoped chain, so each spans every partition
    (a ``RateLimit(10, per=minute)`` admits 10 a minute, not 10 a partition)."""
    limit = policy.concurrency
    if limit is not None and limit.scope is None:
        policy = attrs.evolve(policy, concurrency=attrs.evolve(limit, scope=name))
    if any(control.scope is None for control in policy.admission):
        admission = tuple(
            control if control.scope is not None else attrs.evolve(control, scope=name)
            for control in policy.admission
        )
        policy = attrs.evolve(policy, admission=admission)
    return policy
